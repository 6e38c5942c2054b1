"""The multi-policy runtimes' sections: ``copd``, ``federated`` and ``mutual``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlpost.core.contract import Property, Switch
from rlpost.core.io.schema import Strict as _Strict
from rlpost.core.registry import RegistryError


class CoPDConfig(_Strict):
    """Co-evolving policy distillation (catalog 001-26; ``rlpost.llm.runtimes.copd``): one expert per
    domain of ``data.mixture``, trained in parallel as Ray actors. Each expert runs RLVR on
    its own domain and on-policy distillation from the other experts on theirs; after every
    round the experts exchange weights (bidirectional OPD); at the end they are
    consolidated into one model."""

    experts: list[str] = []
    """The domains that get an expert (empty: every domain of ``data.mixture``)."""
    rounds: int = Field(5, ge=1)
    """Weight exchanges: each expert trains ``train.steps / rounds`` steps per round against
    the peers' weights of the round's start."""
    consolidate: Literal["mopd", "average", "none"] = "mopd"
    """``mopd``: distil the final experts into one student from ``model.path`` (each
    prompt to its domain's expert); ``average``: the experts' mean weights; ``none``."""
    consolidate_steps: int = Field(50, ge=1)
    workers: int = Field(0, ge=0)
    """CPUs Ray may use (0: one per expert)."""


class FederatedConfig(_Strict):
    """Federated post-training (catalog 001-07; ``rlpost.llm.runtimes.federated``): clients train
    locally on their own prompt streams and send compressed updates to the server."""

    clients: int = Field(4, ge=1)
    rounds: int = Field(10, ge=1)
    """Updates per client (each after ``local_steps`` steps from the weights it received)."""
    local_steps: int = Field(1, ge=1)
    compression: Literal["topk", "int8", "none"] = "topk"
    ratio: float = Field(0.1, gt=0, le=1)
    """top-k: the fraction of entries each update keeps (the rest wait in error feedback)."""
    staleness: float = Field(0.5, ge=0)
    """a of the asynchronous discount (1 + s)^-a of an update s server versions old."""
    backend: Literal["ray", "local"] = "ray"
    """``ray``: clients as Ray actors, updates applied as they arrive (asynchronous);
    ``local``: clients one after another in this process, synchronous FedAvg rounds."""
    workers: int = Field(0, ge=0)
    """CPUs Ray may use (0: one per client)."""
    eval_every: int = Field(0, ge=0)
    """Evaluate the server every this many rounds' worth of updates (``clients`` updates
    each; 0: before and after only): the summary's learning ``curve``."""


class MutualPolicyConfig(_Strict):
    """One policy of a Mutual RL run: its own weights (and so tokenizer), preset and
    learning rate; everything else is the run's config."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    path: str = "tiny"
    """``model.path`` of this policy: "tiny" (the character Qwen2 base), "tiny-bpe" (the
    BPE Llama base of the same task), a run directory's checkpoint folder, or a hub id."""
    preset: str | None = None
    """None: ``algo.preset``. A preset without peer sharing gives its experience to its
    peers and takes none (a control)."""
    lr: float | None = Field(None, gt=0)
    cpus: int = Field(1, ge=1)
    """Ray CPUs (and torch threads) of this policy's actor: Mutual RL's multi-worker
    resource allocation."""


class MutualConfig(_Strict):
    """Mutual RL (catalog 001-11; ``rlpost.llm.runtimes.mutual``): heterogeneous policies, each a
    Ray actor with its own parameters, objective and tokenizer, answer the same prompts
    every step and exchange their typed experience (prompt, response text, token-level
    log-probs with character offsets, reward) through a Ray actor; each uses its peers'
    responses as its preset's ``peers`` says (prp, xgrpo, sgt)."""

    policies: list[MutualPolicyConfig] = Field(min_length=2)
    backend: Literal["ray", "local"] = "ray"
    """``ray``: each policy a Ray actor, the exchange a Ray actor (local Ray, or the
    cluster ``ray.init`` connects to); ``local``: the policies in threads of this process
    (no Ray; they share its CPUs)."""
    member: str | None = None
    """Set by ``rlpost.llm.runtimes.mutual`` in each policy's own config: the policy it trains."""

    @model_validator(mode="after")
    def _names(self) -> MutualConfig:
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise ValueError(f"mutual.policies: names must be unique, got {names}")
        if self.member is not None and self.member not in names:
            raise ValueError(f"mutual.member {self.member!r} is not among {names}")
        return self


# ------------------------------------------------------------------- what they need
_ONE = {
    Property.ONE_POLICY: "runs one policy per trainer (copd, federated and mutual are exclusive)"
}
SWITCHES = (
    Switch.declare(
        "copd",
        lambda cfg: cfg.copd is not None,
        requires=_ONE,
        breaks={Property.ONE_POLICY: "trains one expert per domain"},
        example=[
            "copd={}",
            "algo.distill.name=topk",
            "data.mixture=[{task: arithmetic}, {task: countdown}]",
        ],
    ),
    Switch.declare(
        "federated",
        lambda cfg: cfg.federated is not None,
        requires=_ONE,
        breaks={Property.ONE_POLICY: "trains one policy per client"},
        example=["federated={}"],
    ),
)


def _copd(cfg: Any, preset: Any, recipe: Any) -> None:
    c = cfg.copd
    if c is None:
        return
    domains = {d.task for d in cfg.data.mixture}
    experts = c.experts or sorted(domains)
    if len(experts) < 2 or not set(experts) <= domains:
        raise ValueError(
            f"copd: needs data.mixture with two or more domains and experts among "
            f"them (experts {experts}, domains {sorted(domains) or 'none'})"
        )
    if preset.distill is None:
        raise ValueError(f"copd: preset {preset.name!r} has no distillation estimator")
    if cfg.train.steps % c.rounds:
        raise ValueError(
            f"copd: train.steps ({cfg.train.steps}) must be a multiple of copd.rounds ({c.rounds})"
        )


def _mutual(cfg: Any, preset: Any, recipe: Any) -> None:
    m = cfg.mutual
    if m is None:
        if preset.peers is not None:
            raise ValueError(
                f"preset {preset.name!r} trains beside peer policies ({preset.peers.mode} "
                "sharing): set mutual.policies (see the mutual_arithmetic recipe)"
            )
        return
    if m.member is None:  # the run: every policy's preset must exist (a run where none
        for p in m.policies:  # shares is the control: the same schedule, no exchange)
            try:
                pp = cfg.algo.model_copy(update={"preset": p.preset or cfg.algo.preset})
                pp.build_preset(cfg.rollout.group_size)
            except (RegistryError, ValueError, TypeError) as exc:
                raise ValueError(f"mutual.policies[{p.name}]: {exc}") from exc


#: these sections' checks of the whole config
CHECKS = (_copd, _mutual)
