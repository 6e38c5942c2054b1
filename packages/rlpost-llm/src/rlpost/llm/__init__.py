"""rlpost.llm: RL post-training of Hugging Face causal language models."""

__version__ = "0.1.0"

#: Distributions this domain builds on; ``rlpost-llm doctor`` prints their versions.
ENGINES = ["transformers", "peft", "datasets", "tokenizers", "vllm"]


def environment_report() -> dict[str, str]:
    """Installed version of every engine this domain uses (or 'not installed')."""
    from rlpost.core._env import versions  # lazy: worker processes import this package cheaply

    return versions(["torch", *ENGINES])
