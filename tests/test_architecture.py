"""Dependency direction of DESIGN.md, enforced.

* import-linter contracts in the root pyproject.toml (layers apps -> domains -> core |
  kernels, domains independent, core/kernels free of heavy engines, apps free of torch);
* an allow-list on top: every import in rlpost.core is torch, numpy, the standard
  library or rlpost.core itself;
* heavy optional engines are imported lazily: importing the packages loads none of them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_import_linter_contracts_hold():
    proc = subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" in proc.stdout and " 0 broken" in proc.stdout


def test_core_imports_only_torch_numpy_stdlib():
    graph = grimp.build_graph("rlpost.core", include_external_packages=True)
    allowed = {"torch", "numpy", *sys.stdlib_module_names}
    # departure 8 (docs/architecture.md): run I/O shared by every domain
    extra = {
        "rlpost.core.io.checkpoint": {"safetensors"},
        "rlpost.core.io.config": {"yaml", "omegaconf", "pydantic"},
    }
    bad = {}
    for module in graph.find_descendants("rlpost.core") | {"rlpost.core"}:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith("rlpost.core"):
                continue
            if imported.split(".")[0] not in allowed | extra.get(module, set()):
                bad.setdefault(module, []).append(imported)
    assert not bad, (
        f"rlpost.core may import only torch, numpy and the stdlib (core.io: see departure 8): {bad}"
    )


def _loaded(imports: str, names: list[str]) -> list[str]:
    code = f"import sys, {imports}\nprint([m for m in {names!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return eval(out.stdout)  # a printed list of str


def test_core_and_kernels_load_no_engine():
    heavy = ["triton", "vllm", "lerobot", "transformers", "diffusers", "gymnasium", "mujoco", "ray"]
    assert _loaded("rlpost.core, rlpost.kernels", heavy) == []


def test_optional_engines_are_imported_lazily():
    optional = ["triton", "vllm", "lerobot"]
    pkgs = "rlpost.llm, rlpost.diffusion, rlpost.robot, rlpost.apps.llm.cli, rlpost.apps.robot.cli"
    assert _loaded(pkgs, optional) == []
