"""Ray, where rlpost-llm runs actors (CoPD's experts, Mutual RL's policies, federated
clients): imported on first use, with an error that says how to get it."""

from __future__ import annotations


def import_ray(who: str):
    """The ``ray`` module; ``who`` (e.g. ``"copd"``) names the feature in the error
    (a ``ValueError``: the command line prints it as one line)."""
    try:
        import ray
    except ImportError:
        raise ValueError(  # a configuration the environment cannot run: a one-line error
            f"{who} runs on Ray, which is not installed: pip install 'rlpost-llm[ray]' "
            "(or uv sync, whose dev group has it), or use the local backend"
        ) from None
    return ray


__all__ = ["import_ray"]
