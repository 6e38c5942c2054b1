import importlib.metadata as md

import rlpost.diffusion as domain


def test_environment_report_lists_engines_with_installed_versions():
    report = domain.environment_report()
    assert report["torch"] == md.version("torch")
    assert report["diffusers"] == md.version("diffusers")
    assert set(domain.ENGINES) <= set(report)
