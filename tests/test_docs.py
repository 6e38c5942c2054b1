"""docs/core.md lists every registered entry and preset."""

from pathlib import Path

from rlpost.core import PRESETS, REGISTRIES

DOC = (Path(__file__).resolve().parents[1] / "docs" / "core.md").read_text()


def test_every_registry_entry_and_preset_is_documented():
    missing = [
        f"{kind}:{name}"
        for kind, reg in REGISTRIES.items()
        for name in reg.names()
        if f"`{name}`" not in DOC
    ]
    missing += [f"preset:{name}" for name in PRESETS if f"`{name}`" not in DOC]
    assert not missing, f"add to docs/core.md: {missing}"
