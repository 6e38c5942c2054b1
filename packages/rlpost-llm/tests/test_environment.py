import importlib.metadata as md

import rlpost.llm as domain


def test_environment_report_lists_engines_with_installed_versions():
    report = domain.environment_report()
    assert report["torch"] == md.version("torch")
    assert report["transformers"] == md.version("transformers")
    assert set(domain.ENGINES) <= set(report)


def test_llm_exposes_core_presets():
    from rlpost.llm.tools.presets import PRESETS, get_preset

    assert {"grpo", "dapo", "dr_grpo", "gspo", "rloo", "reinforce_pp", "ppo"} <= set(PRESETS)
    assert get_preset("dapo").objective.params["clip_high"] == 0.28
