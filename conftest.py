"""Settings every package's tests share.

The suite runs on two pytest-xdist workers (``-n 2`` in ``pyproject.toml``): on a 2-core
machine each worker, and every process a test starts, gets one torch / OpenMP thread,
or the two would oversubscribe the cores and both slow down many times over.
``uv run pytest -n 0`` runs in one process.

Ray's ``uv run`` hook is switched off (``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0``): under
``uv run pytest`` it would start every actor through ``uv run`` with the working
directory packaged as its runtime environment, about half a minute per Ray session on 2
cores, for workers that run on this machine in this same environment anyway.
"""

from __future__ import annotations

import os


def pytest_configure(config):
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before anything imports ray
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import torch

    torch.set_num_threads(1)
