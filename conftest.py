"""Settings every package's tests share.

The suite runs on two pytest-xdist workers (``-n 2`` in ``pyproject.toml``): on a 2-core
machine each worker, and every process a test starts, gets one torch / OpenMP thread,
or the two would oversubscribe the cores and both slow down many times over.
``uv run pytest -n 0`` runs in one process.

Ray's ``uv run`` hook is switched off (``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0``): under
``uv run pytest`` it would start every actor through ``uv run`` with the working
directory packaged as its runtime environment, about half a minute per Ray session on 2
cores, for workers that run on this machine in this same environment anyway.

``record_result``: a test that measures what a docs page quotes (a toy's final reward, an
estimator's spread) hands it the numbers; ``RLPOST_RESULTS=docs/results/tests uv run
pytest -n 0 TEST`` writes them there in the benchmarks' common shape, one file per name
(the rows of every test that recorded under it, in run order), for the page to cite.
Without the variable nothing is written.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_RECORDED: dict[str, dict] = {}  # name -> the file's fields, rows gathered in run order
TOOLS = Path(__file__).parent / "tools"


@pytest.fixture
def load_tool():
    """``load_tool(name)``: the module ``tools/<name>.py`` (registered in ``sys.modules``, as
    a dataclass in it needs; ``tools/`` on the path for its ``benchlib`` import)."""
    import importlib.util

    def load(name: str):
        if str(TOOLS) not in sys.path:
            sys.path.insert(0, str(TOOLS))
        spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load


def pytest_configure(config):
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before anything imports ray
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def record_result(request):
    """``record_result(name, rows, *, catalog_ids=(), config=None, seeds=())``: keep the
    test's measured rows (dicts) under ``name``; written at the session's end when
    ``RLPOST_RESULTS`` names a directory."""
    out = os.environ.get("RLPOST_RESULTS")
    if out and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail("RLPOST_RESULTS: run with -n 0 (one process writes each results file)")

    def record(name, rows, *, catalog_ids=(), config=None, seeds=()):
        entry = _RECORDED.setdefault(
            name, {"catalog_ids": [], "config": {}, "seeds": [], "rows": []}
        )
        entry["catalog_ids"] += [c for c in catalog_ids if c not in entry["catalog_ids"]]
        entry["config"].update(config or {})
        entry["seeds"] += [s for s in seeds if s not in entry["seeds"]]
        entry["rows"] += [{"test": request.node.nodeid, **r} for r in rows]

    return record if out else (lambda *a, **k: None)


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("RLPOST_RESULTS")
    if not (out and _RECORDED):
        return
    if exitstatus != 0:  # a failing test's numbers are not a result
        print(f"\nRLPOST_RESULTS: nothing written (pytest exit status {exitstatus})")
        return
    sys.path.insert(0, str(Path(__file__).parent / "tools"))
    from benchlib import HEADLINE_KEYS, write_result

    for name, entry in _RECORDED.items():
        headline = dict.fromkeys(HEADLINE_KEYS)  # (a test's rows are its result)
        path = write_result(Path(out) / f"{name}.json", name=name, headline=headline, **entry)
        print(f"\nwrote {path}")
