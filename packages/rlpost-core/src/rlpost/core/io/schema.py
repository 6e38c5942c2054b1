"""Config bases shared by every domain's run config (pydantic, the ``config`` extra).

A domain's config subclasses these and keeps only what is its own: its sections, its
defaults (a subclass may override a default) and its cross-field checks. Load with
:func:`rlpost.core.io.config.load_validated`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "CheckpointedRunConfig",
    "GuardConfig",
    "LoraConfig",
    "OptimConfig",
    "RunConfig",
    "Strict",
]


class Strict(BaseModel):
    """Frozen; an unknown field is an error that names it, and so is an infinite or NaN
    number (``optim.lr=inf`` would train nothing and checkpoint non-finite weights)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True
    )  # (the docstring under a field is its description: ``rlpost-<domain> config``)

    def to_yaml(self) -> str:
        """The config as YAML, in field order (what a run writes to ``config.yaml``)."""
        import yaml

        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


class LoraConfig(Strict):
    """LoRA adapters (peft's ``LoraConfig``: rank, alpha, dropout)."""

    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)


class OptimConfig(Strict):
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = Field(1.0, gt=0)
    micro_batch_size: int = Field(64, ge=1)


class RunConfig(Strict):
    """Where a run writes, its seed, progress bars, torch threads and where its metrics go."""

    dir: str = "runs/run"
    seed: int = 0
    progress: bool = True
    threads: int | None = Field(None, ge=1)
    malloc_mmap_kb: int | None = Field(None, ge=1)
    """glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` (KiB), fixed for the run by the
    LLM trainers (``None``, the default: glibc's own, which rise as large blocks are freed
    but stop at 32 MiB, so every larger tensor is mapped afresh each time and pays a page
    fault per page). A large value (``1048576``, 1 GiB) keeps every block below it in the
    heap and freed memory in the process for the next step: on the full-length GRPO grid
    1.25-1.43x TRL against 1.12-1.28x, but peak memory up to 1.15x TRL's at 512 tokens,
    G = 16, where glibc's default stays below (``docs/llm.md``, "At full length"). A small
    value returns large blocks to the system when freed: less resident memory, more faults
    (``128`` cut the 512-token full-length peak RSS by about 15 % and cost about 20 % more
    update time). No effect off glibc."""
    report_to: list[Literal["jsonl", "tensorboard", "wandb"]] = ["jsonl", "tensorboard"]
    """Where metrics go (TRL's ``report_to``). ``metrics.jsonl`` is always written (resume,
    curves and the summary read it); ``wandb`` needs the ``rlpost-core[wandb]`` extra."""
    wandb_project: str = "rlpost"
    wandb_mode: Literal["offline", "online"] = "offline"
    """``offline`` (default: never touches the network; ``wandb sync <run.dir>/wandb/...``
    uploads later) or ``online``."""

    @model_validator(mode="after")
    def _check_wandb(self) -> RunConfig:
        if "wandb" in self.report_to:
            import importlib.util

            if importlib.util.find_spec("wandb") is None:
                raise ValueError(
                    "run.report_to: wandb is not installed (pip install 'rlpost-core[wandb]')"
                )
        return self


class CheckpointedRunConfig(RunConfig):
    """A step-based run: held-out evaluation and atomic checkpoints every few steps."""

    eval_every: int = Field(10, ge=0)
    save_every: int = Field(10, ge=0)
    keep_checkpoints: int = Field(2, ge=1)
    tensorboard: bool = True


class DeviceRunConfig(CheckpointedRunConfig):
    """A run whose model may live on a GPU (:func:`rlpost.core.pick_device`)."""

    device: str = "auto"
    """``auto`` is the GPU when one is visible (``cuda:$LOCAL_RANK`` under torchrun), else
    the CPU; or ``cpu``, ``cuda``, ``cuda:N``."""

    @model_validator(mode="after")
    def _device(self) -> DeviceRunConfig:
        from rlpost.core._env import pick_device

        pick_device(self.device)  # an unknown name or a missing GPU: one line, at load
        return self


class GuardConfig(Strict):
    """Non-finite steps (:class:`rlpost.core.guard.UpdateGuard`): a step whose loss or
    gradient is not finite is skipped; one that makes a parameter non-finite is rolled
    back, as is one that explodes the weights (``max_growth``); ``max_consecutive`` bad
    steps in a row stop the run with a message."""

    rollback: bool = True
    """Keep a copy of the trainable state before each step to undo a bad one (memory: one
    more copy of the trainable parameters and optimiser state). Off: such a step stops."""
    max_consecutive: int = Field(3, ge=1)
    max_growth: float | None = Field(10.0, gt=1.0)
    """A step that multiplies the global norm of the trainable weights by more than this is
    rolled back like a non-finite one (finite but exploded weights never reach a
    checkpoint); null: no such check."""
