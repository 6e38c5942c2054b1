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


PACKAGES = [
    "rlpost.core",
    "rlpost.kernels",
    "rlpost.llm",
    "rlpost.diffusion",
    "rlpost.robot",
    "rlpost.apps.common",
    "rlpost.apps.llm",
    "rlpost.apps.diffusion",
    "rlpost.apps.robot",
]


def import_cycles(graph) -> list[list[str]]:
    """The strongly connected components (more than one module) of ``graph``'s imports,
    module-level and lazy (in-function) alike (Tarjan's algorithm, iterative)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & set(modules)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(edges[v]):
                work.append((v, i + 1))
                w = edges[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return cycles


def test_import_cycle_finder_finds_a_cycle():
    class Graph:
        def __init__(self):
            self.modules = {"a", "b", "c", "d"}
            self._edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, m):
            return self._edges.get(m, set())

    assert import_cycles(Graph()) == [["a", "b", "c"]]


def test_no_import_cycle_anywhere():
    """No module imports itself through others, counting lazy imports inside functions
    (the graph is built without grimp's cache, so it sees the current sources)."""
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    assert "rlpost.diffusion.models.digits" in graph.modules  # subpackages are all seen
    assert import_cycles(graph) == []


def test_core_imports_only_torch_numpy_stdlib():
    graph = grimp.build_graph("rlpost.core", include_external_packages=True)
    allowed = {"torch", "numpy", *sys.stdlib_module_names}
    # departure 8 (docs/architecture.md): run I/O shared by every domain
    extra = {
        "rlpost.core.io.checkpoint": {"safetensors"},
        "rlpost.core.io.config": {"yaml", "omegaconf", "pydantic"},
        "rlpost.core.io.schema": {"yaml", "pydantic"},
        "rlpost.core.io.curves": {"matplotlib"},
        "rlpost.core.io.metrics": {"wandb", "yaml"},  # run.report_to=[wandb] (departure 16)
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
