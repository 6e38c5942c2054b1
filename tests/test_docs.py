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


def test_the_readme_python_api_example_runs_as_written(tmp_path):
    import subprocess
    import sys

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    begin, end = "<!-- python-api:begin -->\n```python\n", "```\n<!-- python-api:end -->"
    code = readme[readme.index(begin) + len(begin) : readme.index(end)]
    (tmp_path / "example.py").write_text(code)
    out = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("2 steps;")
    ckpt = tmp_path / "runs/my-run/checkpoints/step-000002"
    assert (ckpt / "config.json").is_file() and (ckpt / "model.safetensors").is_file()
