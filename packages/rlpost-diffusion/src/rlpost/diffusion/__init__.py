"""rlpost.diffusion: RL post-training of flow-matching / diffusion image generators."""

__version__ = "0.1.0"

#: Distributions this domain builds on; ``rlpost-diffusion doctor`` prints their versions.
ENGINES = ["diffusers", "scikit-learn"]


def environment_report() -> dict[str, str]:
    """Installed version of every engine this domain uses (or 'not installed')."""
    from rlpost.core._env import versions  # lazy: worker processes import this package cheaply

    return versions(["torch", *ENGINES])
