"""docs/core.md lists every registered entry and preset, and its contract table is current."""

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


def test_the_contract_table_matches_the_declarations():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tools" / "contract_table.py"
    spec = importlib.util.spec_from_file_location("contract_table", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    begin, end = "<!-- contract-table:begin -->\n", "\n<!-- contract-table:end -->"
    current = DOC[DOC.index(begin) + len(begin) : DOC.index(end)]
    assert current == mod.table(), "regenerate with: uv run python tools/contract_table.py"
