"""Runs of several trainers (CoPD's experts, Mutual RL's policies, federated clients):
Ray, imported on first use with an error that says how to get it, and the run directory
that holds one sub-run per actor."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def import_ray(who: str):
    """The ``ray`` module; ``who`` (e.g. ``"copd"``) names the feature in the error
    (a ``ValueError``: the command line prints it as one line)."""
    try:
        import ray
    except ImportError:
        from rlpost.core import MissingDependency

        raise MissingDependency(  # the command line prints it as one line
            f"{who} runs on Ray, which is not installed: pip install 'rlpost-llm[ray]' "
            "(or uv sync, whose dev group has it), or use the local backend"
        ) from None
    return ray


@contextmanager
def local_ray(num_cpus: int, who: str) -> Iterator:
    """Ray for the ``with`` block: the cluster this process already joined
    (``ray.init(address=...)`` before the run), else a local one with ``num_cpus`` CPUs
    on the loopback (:func:`rlpost.core.ray_local.init_local_ray`), shut down at the end
    of the block."""
    from rlpost.core.ray_local import init_local_ray

    ray = import_ray(who)
    owned = None if ray.is_initialized() else init_local_ray(ray, num_cpus=num_cpus)
    try:
        yield ray
    finally:
        if owned is not None:
            ray.shutdown()
            owned.stop()


def claim_run_dir(root: Path, sub: str, what: str, *, resume: bool, overwrite: bool) -> None:
    """One run per run directory: ``root / sub`` (the actors' sub-runs) may already hold a
    ``what`` run only to be continued (``resume``) or replaced (``overwrite``). The whole
    root is locked for this process first, so a live run's is never replaced (the
    actors' sub-runs lock their own folders)."""
    from rlpost.core.io.rundir import lock_run_dir

    root.mkdir(parents=True, exist_ok=True)
    lock_run_dir(root)
    held = root / sub
    if held.is_dir() and any(held.iterdir()):
        if overwrite:
            shutil.rmtree(held)
        elif not resume:
            raise ValueError(
                f"run.dir {root} holds a {what} run: --resume continues it (each of its "
                f"{sub} from its newest checkpoint), --overwrite replaces it"
            )
    root.mkdir(parents=True, exist_ok=True)


__all__ = ["claim_run_dir", "import_ray", "local_ray"]
