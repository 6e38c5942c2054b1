"""The trainer's sections: the recipe (``algo``), the optimiser (``optim``), the step
schedule (``train``), the critic, a gradient regulariser and the run (``run``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import Field, model_validator

from rlpost.core.contract import Declares, Party, Property, Switch
from rlpost.core.distill import DistillSchedule
from rlpost.core.io import schema
from rlpost.core.io.schema import Strict as _Strict
from rlpost.core.optim import OPTIMIZERS
from rlpost.core.presets import Choice, Preset, get_preset
from rlpost.core.registry import RegistryError
from rlpost.llm.data.config import AuxDataConfig
from rlpost.llm.model.config import LoraConfig
from rlpost.llm.rollout import sources
from rlpost.llm.rollout.sources import ASYNC_PIPELINE, SYNC_PIPELINE, get_source
from rlpost.llm.rollout.sources.base import SCHEDULE
from rlpost.llm.train import hooks


class ChoiceConfig(_Strict):
    name: str
    params: dict[str, Any] = {}


class CriticConfig(_Strict):
    """The value model, built when the recipe needs critic values (``gae``: PPO, SAO)."""

    model: str = "policy"
    """"policy": a copy of the policy's decoder (its weights at the start); else a local
    path or hub id of a causal LM whose decoder carries the value head."""
    lora: LoraConfig | None = None
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    clip: float | None = Field(0.2, gt=0)
    """PPO value clipping: V stays within +-clip of the values the advantages used."""
    grad_clip: float | None = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    """Steps at the start during which only the critic trains (the policy is not updated)."""


class RegularizerConfig(_Strict):
    """A gradient regulariser (``rlpost.core.regularizers.REGULARIZERS``: gac,
    dr_post_training, cpo) applied to every policy update."""

    name: str
    params: dict[str, Any] = {}
    data: AuxDataConfig | None = None
    """The auxiliary data set for entries that need auxiliary gradients (GAC's SFT data,
    Dr. Post-Training's general data)."""
    batches: int = Field(4, ge=1)
    """M: auxiliary batches (one gradient each) per update."""
    batch_size: int = Field(16, ge=1)


# the inputs of the method/trainer contract (rlpost.core.contract) this trainer computes


class AlgoConfig(_Strict):
    preset: str = "grpo"
    advantage: ChoiceConfig | None = None
    ratio: ChoiceConfig | None = None
    correction: ChoiceConfig | None = None
    objective: ChoiceConfig | None = None
    aggregation: ChoiceConfig | None = None
    kl: ChoiceConfig | None = None
    kl_coef: float | None = Field(None, ge=0)
    entropy_coef: float | None = None
    dynamic_sampling: bool | None = None
    stages: int | None = Field(None, ge=1)
    """Mu-GRPO's large generation-optimisation stages (None: the preset's)."""
    validation_reset: bool | None = None
    """REVA-PO's VAPR (None: the preset's)."""
    token_weights: ChoiceConfig | None = None
    """Per-token loss weights from attention entropy (catalog 001-08): an
    ``rlpost.core.weights.TOKEN_WEIGHTINGS`` entry (anchors, explorers, random_subset,
    dynamic); the maps come from an extra no-grad forward with eager attention."""
    topk: int = Field(16, ge=1)
    """K of the per-token top-K distributions for entries that read them
    (``predictive_divergence_mask``)."""
    distill: ChoiceConfig | None = None
    """The distillation estimator (``rlpost.core.distill.DISTILL_ESTIMATORS``: full, topk,
    sampled; None: the preset's)."""
    distill_rows: Literal["all", "correct", "incorrect"] | None = None
    """Which responses are distilled (OPSD's filters; None: the preset's)."""
    distill_schedule: dict[str, Any] | None = None
    """The weights of the distillation and RL terms over training
    (``rlpost.core.distill.DistillSchedule`` fields, e.g. ``{kind: anneal, horizon: 0.5}``;
    None: the preset's)."""

    pilot_commit: dict[str, Any] | bool | None = None
    """Pilot-Commit (000-05): ``{fraction, samples, budget}`` (``{}``: the defaults 0.5, 2,
    prompts_per_step x group_size rollouts); a pilot round estimates each candidate
    prompt's reward variance, the rest of the step's rollout budget goes to the most
    varied (rlpost.llm.rollout.sources.pilot_commit); False: off."""
    lze: dict[str, Any] | bool | None = None
    """LZE (000-18): ``{keep, alpha, beta, tau, patience, replay, pool}`` (``{}``: the
    defaults); the step's groups with the highest learning-zone energy are trained on,
    persistently solved prompts pruned with replay (rlpost.llm.rollout.sources.lze);
    False: off."""
    armor: dict[str, Any] | bool | None = None
    """ARMOR (004-06): ``{anchors}`` (``{}``: 2) rollouts of each group's prompt sampled from
    the frozen reference policy join the group, trained off-policy with the reference's
    log-probs as their pi_old (rlpost.llm.rollout.sources.armor); False: off."""
    rac: dict[str, Any] | bool | None = None
    """RAC (000-19): ``{rank, pair, margin, pair_sample, mask_rate, mask}`` (``{}``: 0.1,
    0.1, 0, true, 0.5, " "); the ranking-aware and clean/corrupted confidence losses on the
    mean token log-probability, added to the policy loss (rlpost.llm.train.hooks.rac)."""
    astor: dict[str, Any] | bool | None = None
    """ASTOR (001-18): ``{tau, floor, lam, beta, synergy_every, oversample, adaptive_kl,
    kl_min, kl_max}`` (``{}``: the defaults) over ``data.mixture``'s tasks: the step's
    prompts routed by task utility (learning potential x (1 + synergy)), then to each
    task's most informative prompts, and each task's KL coefficient scaled by its state
    (rlpost.llm.rollout.sources.astor); False: off."""
    vigor: dict[str, Any] | bool | None = None
    """VIGOR (001-03): ``{signal, mix, length_correction, chunk}`` (``{}``: grad_norm, 0,
    true, 8); each
    completion's reward is the rank, within its group, of its sqrt(T)-corrected per-sample
    NLL gradient norm (smallest best), plus ``mix`` x the run's own reward
    (rlpost.llm.train.hooks.vigor)."""
    feedback: dict[str, Any] | None = None
    """FBOS-RL's guided round (``rlpost.core.feedback.FeedbackExploration`` fields: share,
    epa, ecc, template, reflector, reflect_template, meta; merged over the preset's;
    None: the preset's)."""
    episode_reflection: dict[str, Any] | bool | None = None
    """RubricEM's reflection on judged episodes (``rlpost.core.feedback.EpisodeReflection``
    fields: share, meta; merged over the preset's, e.g. ``rubricem_episodes``'); needs
    ``data.env`` with an environment that renders judged episodes; False: off."""

    def build_preset(self, group_size: int | None = None) -> Preset:
        """The preset with this section's changes, validated (its rollout sources' and
        step hooks' params included)."""
        p = get_preset(self.preset)
        changes: dict[str, Any] = {}
        for key in (
            "advantage",
            "ratio",
            "correction",
            "objective",
            "aggregation",
            "kl",
            "distill",
        ):
            c = getattr(self, key)
            if c is not None:
                changes[key] = Choice(c.name, dict(c.params))
        if self.distill_schedule is not None:
            base = dataclasses.asdict(p.distill_schedule)
            changes["distill_schedule"] = DistillSchedule(**{**base, **self.distill_schedule})
        changes["rollout"] = sources.apply_options(self, p.rollout)
        changes["hooks"] = hooks.apply_options(self, p.hooks)
        for key in ("kl_coef", "entropy_coef", "distill_rows"):
            if getattr(self, key) is not None:
                changes[key] = getattr(self, key)
        if group_size is not None:
            changes["group_size"] = group_size
        p = p.replace(**changes)
        p.build()
        sources.validate(p)
        for c in p.hooks:
            hooks.STEP_HOOKS.get(c.name)
        return p


class OptimConfig(schema.OptimConfig):
    name: str = "adamw"
    """An ``rlpost.core.optim.OPTIMIZERS`` entry: ``adamw``, ``muon`` or ``pion`` (the matrix
    optimisers update hidden-layer matrices at ``params.matrix_lr`` and the embeddings,
    head, norms and biases with AdamW at ``lr``)."""
    params: dict[str, Any] = {}
    betas: tuple[float, float] = (0.9, 0.99)  # AdamW's (also the matrix optimisers' AdamW part)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    updates_per_batch: int = Field(1, ge=1)
    skip_inert_rows: bool = True
    """Leave out of the training forward and backward the rows that add exactly nothing to
    the gradient (all-zero advantages, or an empty loss mask) when the objective is linear
    in the advantage and no KL, entropy or distillation term reads them
    (``rlpost.llm.train.inert``). The gradient equals the full batch's up to float
    rounding; the update's metrics (entropy, clip fractions) are then over the trained
    rows, and ``update/skipped_rows`` logs the share left out."""

    @model_validator(mode="after")
    def _check_optimizer(self) -> OptimConfig:
        try:
            self.entry_params()
        except RegistryError as exc:
            raise ValueError(f"optim: {exc}") from exc
        return self

    def entry_params(self) -> dict[str, Any]:
        """The validated parameters of the ``OPTIMIZERS`` entry (``betas`` from here unless
        ``params`` sets them)."""
        params = {"betas": tuple(self.betas), **self.params}
        OPTIMIZERS.build(self.name, **params)
        return params


class MipuConfig(_Strict):
    """MIPU (004-26): each update is a candidate, its ratios referenced to the sampler's
    own log-probs; it is synchronised to the rollout engine and kept only if the engine's
    log-probs of the batch say the inference policy improved (``rlpost.core.mipu``:
    ``gain - penalty * kl >= min_gain``); a rejected candidate leaves the weights, the
    optimiser and the schedule as they were."""

    penalty: float = Field(0.0, ge=0)
    """Weight of the inference-side KL(mu || mu') subtracted from the surrogate gain."""
    min_gain: float = 0.0


class TrainConfig(_Strict):
    steps: int = Field(50, ge=1)
    overlong_mask: bool = True
    """Exclude responses cut by max_new_tokens from the loss (they still count in advantages)."""
    max_refill: int = Field(3, ge=0)
    """Dynamic sampling: extra generation rounds to refill dropped zero-variance groups."""
    async_rollouts: bool = False
    """One-step-off: generate step t+1's rollouts while training on step t's (the same as
    ``pipeline: one_step_off``)."""
    pipeline: str = SYNC_PIPELINE
    """How generation and training overlap. ``sync``: generate, then train. ``one_step_off``:
    step t+1's batch is generated on a weight snapshot while step t trains. ``dora``
    (DORA's multi-version streaming, 001-29): a generator streams chunks of
    ``stream_prompts`` groups without pause, each chunk wholly from one weights version
    (new weights load between chunks); a step trains on the next ``prompts_per_step``
    groups in arrival order, so its rows may come from several versions, and groups more
    than ``max_staleness`` versions old are dropped (``dora/dropped_groups``).
    ``bubblespec`` (BubbleSpec, 001-05): while step t trains, a weight snapshot generates
    rollouts of step t+1's prompts; at step t+1 they serve as drafts that the updated policy
    verifies (``draft_k`` tokens a forward), so the rollouts stay exactly on-policy.
    ``rolloutpipe`` (RolloutPipe, 004-30): a step's groups are generated at its fixed
    weights in chunks of ``stream_prompts`` complete groups, the groups the batch needs
    first, and each chunk is back-propagated as soon as it is scored while later ones
    generate; one optimiser step at the end, equal to the synchronous update."""
    draft_k: int = Field(4, ge=1)
    """BubbleSpec: draft tokens verified per target forward."""
    stream_prompts: int | None = Field(None, ge=1)
    """DORA and RolloutPipe: prompts (groups) per generation chunk; None: a quarter of a
    step's."""
    max_staleness: int = Field(1, ge=0)
    mipu: MipuConfig | None = None
    """Accept an update only if the inference policy improves (MIPU, 004-26)."""
    max_minutes: float | None = Field(None, gt=0)
    """A wall-clock budget: the run ends after the first step past it (its last step is
    evaluated and saved like a final one); None: run all ``steps``."""
    guard: schema.GuardConfig = schema.GuardConfig()
    """Non-finite steps: skipped or rolled back, and too many in a row stop the run."""
    parallel: Literal["ddp", "fsdp2"] = "ddp"
    """Several processes (``torchrun``): ``ddp`` replicates the weights and all-reduces the
    gradients; ``fsdp2`` shards weights, gradients and optimiser state over the ranks
    (``torch.distributed.fsdp.fully_shard``), gathering whole weights only for the rollout
    engine and checkpoints. One process: no difference."""

    @model_validator(mode="before")
    @classmethod
    def _pipeline(cls, data: Any) -> Any:
        """``async_rollouts`` and ``pipeline: one_step_off`` say the same thing."""
        if not isinstance(data, dict):
            return data
        a, pipe = data.get("async_rollouts", False), data.get("pipeline", SYNC_PIPELINE)
        if a in (True, "true", "True") and pipe not in (SYNC_PIPELINE, ASYNC_PIPELINE):
            raise ValueError(f"train.async_rollouts is the {ASYNC_PIPELINE} pipeline, not {pipe}")
        if a in (True, "true", "True"):
            pipe = ASYNC_PIPELINE
        return {**data, "pipeline": pipe, "async_rollouts": pipe == ASYNC_PIPELINE}

    @model_validator(mode="after")
    def _schedule(self) -> TrainConfig:
        try:
            cls = get_source(self.pipeline)
        except RegistryError as exc:
            raise ValueError(f"train.pipeline: {exc}") from None
        if cls.layer != SCHEDULE:
            raise ValueError(
                f"train.pipeline: {self.pipeline!r} is a rollout source, not a schedule"
            )
        return self

    @property
    def overlapped(self) -> bool:
        """Generation runs beside training (on a snapshot of the weights)."""
        return getattr(get_source(self.pipeline), "overlapped", False)


class RunConfig(schema.CheckpointedRunConfig):
    dir: str = "runs/llm"


class TrainRunConfig(RunConfig, schema.DeviceRunConfig):
    """The RL trainer's run settings: :class:`RunConfig` and the device. The policy (and
    its reference copy and critic) live there, rollouts run on the model's device, and
    the trainer's per-token bookkeeping (advantages, masks, the policy loss) stays on the
    host."""

    traces: bool = False
    """Append every trained row (prompt, completion, reward, advantage, version) to
    ``traces.jsonl`` with a per-step index; ``rlpost-llm traces RUN`` shows a step's best
    and worst groups."""
    flops: bool = True
    """RACE's FLOP accounting (004-01): ``flops/rollout``, ``flops/update``,
    ``flops/feedback`` per step and the run's totals (``rlpost-llm flops RUN``)."""


# -------------------------------------------------------------- what these sections switch on
SWITCHES = (
    Switch.declare(
        "optim.updates_per_batch > 1",
        lambda cfg: cfg.optim.updates_per_batch > 1,
        requires={Property.WHOLE_BATCH: "re-trains the whole step batch"},
        example=["optim.updates_per_batch=2"],
    ),
)

#: what each ``train.parallel`` mode declares
PARALLEL = {
    "ddp": Declares(),
    "fsdp2": Declares(
        requires={Property.FULL_WEIGHTS: "shards whole weights (not adapters) yet"},
        breaks={Property.UNSHARDED: "shards the weights over the ranks"},
    ),
}


def parties(cfg: Any, preset: Any, recipe: Any) -> list[Party]:
    """The learner's parallel mode."""
    return [Party(f"train.parallel {cfg.train.parallel}", PARALLEL[cfg.train.parallel])]
