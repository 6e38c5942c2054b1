"""The GRPO-family trainer: rollout -> reward -> advantage -> micro-batched update.

One step::

    prompts  = source.next_batch(prompts_per_step)                 (resumable position)
    rollouts = engine.generate(prompts, n=group_size)              (+ engine log-probs)
    rewards  = RewardPool.score(...)             (reward.funcs in worker processes, time limit)
    dynamic sampling: drop groups whose rewards are all equal, refill up to max_refill rounds
    overlong masking: responses cut by max_new_tokens leave the loss (not the advantages)
    A        = recipe.advantages(rewards, groups, mask, + the inputs the estimator reads)
    for each update and micro-batch:
        logp, H = trainer forward (chunked log-softmax at the sampling temperature)
        loss    = recipe.policy_loss(PolicyBatch(logp, old, A, mask, ..., global counts))
        loss.backward()                    (and the critic's value loss, when there is one)
    (regulariser on the flat gradient) -> (all-reduce across ranks) -> clip -> step

Any :mod:`rlpost.core` preset plugs in unchanged: the trainer computes the optional inputs
the recipe's entries declare they read (:meth:`rlpost.core.presets.Recipe.reads`), and the
config refuses at load a recipe needing one it cannot provide
(:func:`rlpost.llm.config.provided_inputs`): critic values come from a value model built
when an entry needs them (:mod:`rlpost.llm.train.critic`), vector rewards from several
``reward.funcs``, per-token top-K distributions from the trainer's own forwards, features
and attention maps from no-grad forwards (:mod:`rlpost.llm.train.provide`). The preset's
schedules run here too: Mu-GRPO's large stages (``Preset.stages``) and REVA-PO's
validation-anchored reset (``Preset.validation_reset``), plus the optimiser choice
(``optim.name``), a gradient regulariser (``regularizer``) and a task curriculum
(``data.curriculum``).

Asynchronous "one-step-off" mode generates step t+1's rollouts on a weight snapshot in a
background thread while step t trains; every batch carries the policy version that
generated it and the staleness bound is enforced. Data parallelism: rank 0 generates and
scores, the batch is broadcast, each rank trains on its slice through torch's
``DistributedDataParallel`` (:mod:`rlpost.llm.train.parallel`: one bucketed all-reduce per
update, on the last micro-batch), so a W-process run equals a 1-process run with the same
global batch.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import queue
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlpost.core import pick_device
from rlpost.core.advantages import AdvantageInput, TrainingDynamics
from rlpost.core.aggregation import count_scale
from rlpost.core.contract import Coupling, Input
from rlpost.core.guard import NonFiniteError, RunStopped, UpdateGuard, all_finite
from rlpost.core.io.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_tensors,
    save_checkpoint,
)
from rlpost.core.io.config import import_object
from rlpost.core.io.curves import write_summary
from rlpost.core.io.rundir import due, notice, open_run_dir, resume_checkpoint
from rlpost.core.kl import kl_reward_penalty
from rlpost.core.masked import masked_mean
from rlpost.core.peers import BASELINE, OWN, TRAIN
from rlpost.core.presets import PolicyBatch
from rlpost.core.regularizers import REGULARIZERS, GradientInput, flat_grad, set_flat_grad_
from rlpost.core.weights import TOKEN_WEIGHTINGS, TokenWeightInput
from rlpost.llm.config import Config
from rlpost.llm.data.aux_data import AuxData, aux_gradients
from rlpost.llm.data.prompts import DomainScore, MixtureSource, encode_prompt, make_prompt_source
from rlpost.llm.data.tasks import Example, Task, format_reward, make_task
from rlpost.llm.methods.distill import Teachers, TeacherScores, student_distributions
from rlpost.llm.methods.memory import TeacherMemory
from rlpost.llm.model.policy import (
    Reference,
    completion_logprobs,
    is_peft,
    load_policy,
    make_seq_batch,
    save_pretrained_files,
)
from rlpost.llm.rollout.engines.base import RolloutBatch, RolloutEngine, SamplingParams
from rlpost.llm.rollout.rewards import RewardPool, as_verifier, math_verify_reward
from rlpost.llm.rollout.stream import ChunkStream
from rlpost.llm.tools.runlog import MetricsLogger, plot_curves, read_metrics, summary_table
from rlpost.llm.train.critic import ValueModel, explained_variance
from rlpost.llm.train.optim import build_optimizer, lr_schedule
from rlpost.llm.train.parallel import Learner
from rlpost.llm.train.provide import attention_token_entropy, pooled_hidden, token_distributions
from rlpost.llm.train.schedule import CurriculumSource, StageBuffer, StagedScore, ValidationAnchor


@dataclass
class Collected:
    batch: RolloutBatch
    examples: list[Example]  # one per row
    rewards: Tensor  # [N] weighted sum of the reward functions
    components: Tensor  # [N, K] one column per reward function (reward.funcs order)
    accuracy: Tensor  # [N] the verifier ("correct" component) solved the example
    metrics: dict[str, float]
    old_logp: Tensor | None = None  # [N, L] behaviour log-probs taken at generation (stages)
    # [N] Mutual RL: rlpost.core.peers' OWN / TRAIN / BASELINE per row (None: all own)
    roles: Tensor | None = None
    turn_ids: Tensor | None = None  # [N, L] multi-turn episodes: each token's turn (-1: env)
    turn_rewards: Tensor | None = None  # [N, U] each turn's signal (data.env.turn_signal)
    turn_stages: Tensor | None = None  # [N, U] each turn's stage (turn_signal: rubric)
    query_mask: Tensor | None = None  # [N, L] the action tokens of search turns

    def own(self) -> Tensor:
        """``[N]`` bool: the rows this policy generated itself."""
        if self.roles is None:
            return torch.ones(len(self.rewards), dtype=torch.bool)
        return self.roles == OWN

    # DORA's chunks: plain groups (the fields collect() fills), split and merged by group
    def n_groups(self) -> int:
        return int(self.batch.group.max()) + 1 if len(self.batch) else 0

    def split(self, k: int) -> tuple[Collected, Collected]:
        """The first ``k`` groups and the rest."""
        first = self.batch.group < k
        return self._rows(torch.nonzero(first).flatten()), self._rows(
            torch.nonzero(~first).flatten()
        )

    def _rows(self, rows: Tensor) -> Collected:
        return Collected(
            self.batch.select(rows),
            [self.examples[i] for i in rows.tolist()],
            self.rewards[rows],
            self.components[rows],
            self.accuracy[rows],
            dict(self.metrics),
        )

    @staticmethod
    def concat(parts: list[Collected]) -> Collected:
        """One batch of the parts' groups, in order (each part's metrics averaged, its
        rollout seconds summed)."""
        metrics: dict[str, float] = {}
        for c in parts:
            for k, v in c.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v
        for k in metrics:
            if k != "time/rollout":
                metrics[k] /= len(parts)
        return Collected(
            RolloutBatch.concat([c.batch for c in parts]),
            [e for c in parts for e in c.examples],
            torch.cat([c.rewards for c in parts]),
            torch.cat([c.components for c in parts]),
            torch.cat([c.accuracy for c in parts]),
            metrics,
        )


@dataclass
class Forward:
    """One no-grad pass of a policy over a rollout batch (all ``[N, L]``, masked)."""

    logp: Tensor
    entropy: Tensor | None = None
    dists: tuple[Tensor, Tensor] | None = None  # (ids, logp) [N, L, K]


@dataclass
class _Prepared:
    """A batch's inputs to the policy loss besides the training forward (the whole step's
    batch, or one of RolloutPipe's chunks of complete groups)."""

    col: Collected
    mask: Tensor  # [N, L] the loss mask (overlong and peer-baseline rows zeroed)
    truncated: Tensor  # [N] cut by max_new_tokens
    old: Forward | None
    old_logp: Tensor | None
    ref_logp: Tensor | None
    ref_entropy: Tensor | None
    adv: Tensor
    clip_range: Tensor | None
    dynamics: TrainingDynamics | None
    token_weights: Tensor | None
    teach: TeacherScores | None
    teacher_mask: Tensor | None
    old_values: Tensor | None
    returns: Tensor | None
    trained: Tensor  # [N] bool: the rows the policy loss sees
    metrics: dict[str, float]  # the advantage estimator's and the token weighting's

    @property
    def batch(self) -> RolloutBatch:
        return self.col.batch

    def counts(self) -> tuple[float, float]:
        """Valid tokens and responses: the loss normalisers' counts."""
        return float(self.mask.sum()), float((self.mask.sum(1) > 0).sum())


@dataclass
class _Accum:
    """One update's sums over micro-batches (and RolloutPipe's chunks)."""

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    mism: dict[str, float] = field(
        default_factory=lambda: {"abs": 0.0, "max": 0.0, "k3": 0.0, "tok": 0.0}
    )
    ent_sum: float = 0.0
    samples: list[Tensor] = field(default_factory=list)  # per-micro-batch gradients (GAC)
    bad: bool = False
    why: str = "non-finite loss or gradient"
    grad_norm: float = float("nan")

    def add(self, ms: dict[str, float]) -> None:
        for k, v in ms.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1


def to_host(x: Any) -> Any:
    """``x`` (a tensor, or tuples of them) on the CPU, where the trainer keeps its per-token
    state (masks, advantages, rewards); differentiable, so a loss computed there sends its
    gradient back to the model's device. A no-op for CPU tensors."""
    if isinstance(x, Tensor):
        return x if x.device.type == "cpu" else x.cpu()
    if isinstance(x, tuple):
        return tuple(to_host(v) for v in x)
    return x


def host_logprobs(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """:func:`~rlpost.llm.model.policy.completion_logprobs` on the model's device (a GPU: the
    forward, the fused head and their backward run there), its ``[B, L]`` results on the
    host (:func:`to_host`)."""
    return to_host(completion_logprobs(model, *args, **kwargs))


def merged_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """Full weights for an external engine: LoRA adapters merged, PEFT prefixes removed."""
    if not hasattr(model, "merge_adapter"):
        return {k: v.detach() for k, v in model.state_dict().items()}
    model.merge_adapter()
    sd = {
        k.replace("base_model.model.", "", 1).replace(".base_layer", ""): v.detach().clone()
        for k, v in model.state_dict().items()
        if "lora_" not in k
    }
    model.unmerge_adapter()
    return sd


def _named(funcs) -> dict:
    """``{name: fn}`` of a list of reward callables (their ``__name__``, made unique) or a
    dict as it is."""
    if isinstance(funcs, dict):
        return dict(funcs)
    out: dict = {}
    for fn in funcs:
        base = getattr(fn, "__name__", type(fn).__name__)
        name, i = base, 1
        while name in out:
            i += 1
            name = f"{base}_{i}"
        out[name] = fn
    if not out:
        raise ValueError("reward_funcs: at least one reward function")
    return out


def import_reward(spec: str):
    """``"package.module:function"`` -> the function (a picklable module-level callable)."""
    return import_object(spec, "reward.funcs")


def _split_state(state: dict[str, Any], prefix: str) -> tuple[dict[str, Tensor], dict]:
    """A regulariser state as (tensors for safetensors, JSON for the rest)."""
    tensors = {f"{prefix}.{k}": v for k, v in state.items() if isinstance(v, Tensor)}
    rest = {k: v for k, v in state.items() if not isinstance(v, Tensor)}
    return tensors, rest


class Trainer:
    """The GRPO-family / PPO trainer (see the module docstring).

    ``model`` / ``tokenizer``: use these instead of loading ``cfg.model``; ``engine``: the
    rollout engine (default: HF ``generate`` or vLLM by ``cfg.rollout.engine``);
    ``reward_fn``: the "correct" verifier instead of the task's; ``reward_funcs``: reward
    callables (a list, or ``{name: fn}``) replacing ``cfg.reward.funcs``, verifiers or
    TRL-style batched functions, weighted by ``cfg.reward.weights``; ``train_dataset``: a
    ``datasets.Dataset`` with a "prompt" column (text or chat messages) instead of
    ``cfg.data``; ``resume`` / ``overwrite``: what to do with a run ``run.dir`` holds.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        model: torch.nn.Module | None = None,
        tokenizer=None,
        engine: RolloutEngine | None = None,
        reward_fn=None,
        resume: bool = False,
        overwrite: bool = False,
        train_dataset=None,
        reward_funcs=None,
    ):
        self.cfg = cfg
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.world, self.rank = 1, 0
        self._own_group = False  # this trainer started the process group (close ends it)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            self._own_group = True
        if dist.is_initialized():
            self.world, self.rank = dist.get_world_size(), dist.get_rank()
        device = pick_device(cfg.run.device)  # the policy's
        self._comm = torch.device("cpu")  # where the trainer's own collectives' tensors live
        if self.world > 1 and dist.get_backend() == "nccl":  # NCCL: on this rank's GPU
            self._comm = device
            torch.cuda.set_device(device)
        self.main = self.rank == 0
        self.preset = cfg.preset()
        self.recipe = self.preset.build()
        coupling = self.recipe.coupling()
        if self.world > 1 and coupling > Coupling.ROW:
            raise ValueError(
                f"preset {self.preset.name!r}'s loss couples the rows of a {coupling}, but "
                "data-parallel ranks take strided rows: run it on one process"
            )
        if self.world > 1 and cfg.regularizer is not None:
            raise ValueError("regularizer: supported on one process only")
        kv = cfg.rollout.kv_compression
        # the learner's view of a compressed-KV sampler: its attention pattern (or dense)
        self._kv = (kv.sink, kv.window) if kv is not None and kv.correction == "shadow" else None
        if self.world > 1 and kv is not None:
            raise ValueError("rollout.kv_compression: supported on one process only")
        if self.world > 1 and cfg.train.pipeline == "rolloutpipe":
            raise ValueError("train.pipeline rolloutpipe: supported on one process only")
        if self.world > 1 and cfg.train.mipu is not None:
            raise ValueError("train.mipu: supported on one process only")
        self.run_dir = Path(cfg.run.dir)
        if self.main:
            open_run_dir(self.run_dir, cfg, resume=resume, overwrite=overwrite)
        torch.manual_seed(cfg.run.seed)
        if model is None:
            model, tokenizer = load_policy(
                cfg, progress=cfg.run.progress and self.main, device=device
            )
        elif device.type != "cpu" and next(model.parameters()).device.type == "cpu":
            model = model.to(device)  # a model passed on the CPU goes where the run says
        self.model, self.tok = model, tokenizer
        self.reads = set(self.recipe.reads())  # the optional inputs worth computing
        self.curriculum = (
            CurriculumSource(list(cfg.data.curriculum), cfg.data.eval_size, cfg.data.seed)
            if cfg.data.curriculum
            else None
        )
        self.mixture = (
            MixtureSource(list(cfg.data.mixture), cfg.data.eval_size, cfg.data.seed)
            if cfg.data.mixture
            else None
        )
        self.source = (
            self.curriculum
            or self.mixture
            or make_prompt_source(
                cfg.data.task,
                dict(cfg.data.task_params),
                cfg.data.path,
                cfg.data.eval_size,
                cfg.data.seed,
                need_answer=reward_fn is None
                and reward_funcs is None
                and "correct" in [f.name for f in cfg.reward.funcs],
                dataset=train_dataset,
            )
        )
        self.total_steps = cfg.train_steps()
        self.kl_in_loss = self.recipe.kl_in_loss
        self.kl_in_reward = self.recipe.kl_in_reward
        self.reference = Reference(model) if (self.kl_in_loss or self.kl_in_reward) else None
        self.teachers = Teachers.from_config(cfg, tokenizer) if cfg.distill.teachers else None
        if self.teachers is not None and {Input.TEACHER_TOPK, Input.TEACHER_FULL} & self.reads:
            cross = [t.name for t in self.teachers.teachers if t.cross]
            if cross:
                raise ValueError(
                    f"{', '.join(cross)}: a tokenizer other than the student's supports the "
                    "sampled estimator only (algo.distill.name=sampled)"
                )
        self.memory = self._make_memory() if cfg.distill.memory is not None else None
        o = cfg.optim
        self._sharded = self.world > 1 and cfg.train.parallel == "fsdp2"
        self._early_engine = None
        if self._sharded and self.main and engine is None:  # its own whole copy, made
            self._early_engine = self._make_engine()  # before the weights are sharded
        # DDP (or FSDP2) when data-parallel: rank 0's weights everywhere
        self.learner = Learner(model, cfg.train.parallel)
        self.optimizer = build_optimizer(model, o)
        self.guard = UpdateGuard.configured(model.parameters(), [self.optimizer], cfg.train.guard)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_schedule(o.schedule, o.warmup_steps, self.total_steps)
        )
        self.critic = (
            ValueModel(cfg.critic, model, cfg.model.dtype) if Input.VALUES in self.reads else None
        )
        tw = cfg.algo.token_weights
        self.token_weighting = (
            TOKEN_WEIGHTINGS.build(tw.name, **dict(tw.params)) if tw is not None else None
        )
        rc = cfg.regularizer
        self.regularizer = REGULARIZERS.build(rc.name, **dict(rc.params)) if rc else None
        self.reg_state: dict[str, Any] = {}
        self.aux = AuxData(rc.data) if rc is not None and rc.data is not None else None
        self.stage_len = math.ceil(self.total_steps / self.preset.stages)
        self.stages = StageBuffer() if self.preset.stages > 1 else None
        self.anchor = ValidationAnchor(self.run_dir) if self.preset.validation_reset else None
        r = cfg.rollout
        self.sampling = SamplingParams(
            r.max_new_tokens, r.temperature, r.top_p, r.top_k, tuple(r.stop)
        )
        self.engine = engine
        self.pool = None
        if reward_funcs is not None:  # TRL's reward_funcs: callables given from Python
            given = _named(reward_funcs)
            if cfg.reward.weights is not None and len(cfg.reward.weights) != len(given):
                raise ValueError(
                    f"reward.weights: {len(cfg.reward.weights)} weights for "
                    f"{len(given)} reward_funcs"
                )
            ws = cfg.reward.weights or [1.0] * len(given)
            self.reward_weights = dict(zip(given, ws, strict=True))
        elif cfg.data.env is not None:  # the environment's reward is the only one
            given = None
            self.reward_weights = {"env": 1.0}
        else:
            given = None
            self.reward_weights = cfg.reward.weight_of()
        self.reward_names = list(self.reward_weights)
        self.env_next = 0  # the next training episode seed (multi-turn environments)
        if cfg.data.env is not None and cfg.data.env.chat:
            self._check_chat_template()
        self._made_engine = False  # close() closes an engine the trainer made
        if self.main:
            if self.engine is None:
                self.engine = self._early_engine or self._make_engine()
                self._made_engine = True
            fns = None  # an environment scores its episodes itself, in process
            if given is not None:
                fns = {name: as_verifier(fn) for name, fn in given.items()}
            elif cfg.data.env is None:
                fns = {n: self._reward_function(n, reward_fn) for n in self.reward_names}
            if fns is not None:
                self.pool = RewardPool(
                    fns,
                    workers=cfg.reward.workers,
                    timeout_s=cfg.reward.timeout_s,
                    memory_mb=cfg.reward.memory_mb,
                    weights=self.reward_weights,
                )
        self.step, self.version = 0, 0
        self.skipped = 0
        self.mipu_rejected = 0  # MIPU candidates undone so far
        self._applied = False  # the last update was applied and not yet confirmed
        self.initial_entropy: float | None = None  # first batch's sampled-token entropy
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._stream: ChunkStream | None = None  # DORA's generator (train.pipeline dora)
        self._gen_spans: list[tuple[float, float]] = []  # collect()'s wall-clock spans
        self.staleness_counts: dict[int, int] = {}  # staleness -> steps trained at it
        # Mutual RL: ``exchange(trainer, collected) -> collected`` adds the peers' responses
        # (rlpost.llm.runtimes.mutual sets it on each policy's trainer)
        self.exchange = None
        resumed = None
        if resume:
            resumed = self._resume()
        self.logger = MetricsLogger.for_run(self.run_dir, cfg.run, resumed) if self.main else None

    # ------------------------------------------------------------------ setup
    def _reward_function(self, name: str, override=None):
        if name == "correct":
            if override is not None:
                return override
            if self.curriculum is not None:
                return StagedScore(self.curriculum.tasks)
            if self.mixture is not None:
                return DomainScore(self.mixture.tasks, self.mixture.silent)
            task = getattr(self.source, "task", None)  # a task's own verifier, else math-verify
            return task.score if task is not None else math_verify_reward
        if name == "format":
            return format_reward
        return as_verifier(import_reward(name))

    def _make_engine(self) -> RolloutEngine:
        cfg = self.cfg
        if cfg.rollout.engine == "vllm":
            from safetensors.torch import save_file

            from rlpost.llm.rollout.engines import make_vllm_engine

            path = self.run_dir / "vllm-init"  # a loadable copy of the (merged) initial weights
            base = (
                self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            )
            base.config.save_pretrained(path)
            sd = {k: v.clone().contiguous() for k, v in merged_state_dict(self.model).items()}
            save_file(sd, str(path / "model.safetensors"))
            self.tok.save_pretrained(path)
            eng = make_vllm_engine(
                str(path), gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization
            )
            eng.update_weights(merged_state_dict(self.model), 0)
            return eng
        from rlpost.llm.rollout.engines import lean_unsupported, make_local_engine

        if cfg.rollout.workers:
            from rlpost.llm.rollout.engines.ray_workers import RayRolloutEngine

            eng = RayRolloutEngine(
                self.model,
                self.tok,
                cfg.rollout.workers,
                engine=cfg.rollout.engine,
                address=cfg.rollout.ray_address,
            )
            eng.update_weights(merged_state_dict(self.model), 0)
            return eng
        kv = cfg.rollout.kv_compression
        if kv is not None:
            from rlpost.llm.rollout.engines.kv_compressed import KVCompressedEngine

            return KVCompressedEngine(
                self.model, self.tok, kv.sink, kv.window, own_copy=cfg.train.overlapped
            )
        if cfg.train.pipeline == "bubblespec":  # drafts from a snapshot, verified here
            from rlpost.llm.rollout.engines.speculative import SpeculativeEngine

            self._draft_engine = make_local_engine(
                cfg.rollout.engine, self.model, self.tok, own_copy=True
            )
            return SpeculativeEngine(self.model, self.tok, None, k=cfg.train.draft_k)
        spec = cfg.rollout.speculative
        if spec is not None:
            from rlpost.llm.rollout.engines.speculative import SpeculativeEngine

            draft = spec.draft
            if isinstance(draft, str):
                from transformers import AutoModelForCausalLM

                try:
                    draft = AutoModelForCausalLM.from_pretrained(draft, dtype=self.model.dtype)
                except OSError as exc:
                    raise ValueError(f"rollout.speculative.draft {draft!r}: {exc}") from exc
                draft = draft.to(next(self.model.parameters()).device)
            return SpeculativeEngine(
                self.model, self.tok, draft, k=spec.k, own_copy=cfg.train.overlapped
            )

        why = lean_unsupported(self.model) if cfg.rollout.engine == "auto" else None
        if why is not None and self.main:
            notice(
                f"rollout.engine auto: the lean engine does not run this model ({why}); "
                "rollouts use transformers generate"
            )
        return make_local_engine(  # (FSDP2: the engine holds the whole weights)
            cfg.rollout.engine, self.model, self.tok, own_copy=cfg.train.overlapped or self._sharded
        )

    def _make_memory(self) -> TeacherMemory:
        """RESD's / PMD's memory, with each domain's task for the feedback reflector and
        the policy's greedy generation for the policy reflector."""
        mc = self.cfg.distill.memory
        assert mc is not None

        def generate(prompts: list[str]) -> list[str]:
            ids = [encode_prompt(self.tok, p) for p in prompts]
            greedy = SamplingParams(mc.reflect_tokens, 0.0, stop=self.sampling.stop)
            return self.engine.generate(ids, 1, greedy).texts(self.tok)

        return TeacherMemory(mc, self._tasks(), generate)

    def _tasks(self) -> dict[str, Task]:
        """The built-in task of each domain (``""``: the run's single task): the verifier
        feedback RESD's / PMD's reflector and FBOS-RL's guided round read."""
        cfg = self.cfg
        if cfg.data.mixture:
            return {d.task: make_task(d.task, **d.task_params) for d in cfg.data.mixture}
        if cfg.data.curriculum:
            c = cfg.data.curriculum[0]
            return {"": make_task(c.task, **c.task_params)}
        return {"": make_task(cfg.data.task, **cfg.data.task_params)}

    def _extras(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]]:
        return {"critic": (self.critic.module, self.critic.optimizer)} if self.critic else {}

    def _resume(self) -> int | None:
        ckpt = (
            resume_checkpoint(self.run_dir)
            if self.main
            else latest_checkpoint(self.run_dir / "checkpoints")
        )
        if ckpt is None:
            return None
        sharded = {}
        if self._sharded:  # whole weights and optimiser state, each rank keeping its shard
            sharded = {
                "load_model_state": self.learner.load_full_state_dict,
                "load_optimizer_state": lambda sd: self.learner.load_optimizer_state(
                    self.optimizer, sd
                ),
            }
        state = load_checkpoint(
            ckpt, self.model, self.optimizer, self.scheduler, self._extras(), **sharded
        )
        self.step, self.version, self.skipped = state["step"], state["version"], state["skipped"]
        self.initial_entropy = state.get("initial_entropy")
        self.env_next = int(state.get("env_next", 0))
        self.mipu_rejected = int(state.get("mipu_rejected", 0))
        self.source.load_state_dict(state["data"])
        tensors = load_tensors(ckpt)
        if self.regularizer is not None:
            reg = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("reg.")}
            self.reg_state = {**state["regularizer"], **reg}
        if self.aux is not None:
            self.aux.load_state_dict(state["aux_data"])
        if self.stages is not None:
            st = {k: v for k, v in tensors.items() if k.startswith("stage")}
            self.stages.load(st, state["stage_buffer"], self._collected)
        if self.anchor is not None:
            self.anchor.load_state_dict(state["vapr"])
        if self.memory is not None and "memory" in state:
            self.memory.load_state_dict(state["memory"])
        if self.engine is not None:
            self._sync_engine()
        elif self._sharded:
            self.learner.full_state_dict()  # (rank 0's engine sync gathers collectively)
        return self.step

    @staticmethod
    def _collected(batch, examples, rewards, components, accuracy, metrics, old_logp):
        return Collected(batch, examples, rewards, components, accuracy, metrics, old_logp)

    def _sync_engine(self) -> None:
        eng = self.engine
        if eng is None:
            return
        own = getattr(eng, "own_copy", True)
        if self._sharded:  # FSDP2: the whole weights gathered (every rank takes part)
            eng.update_weights(self.learner.full_state_dict(), self.version)
        elif own:  # an engine holding its own weights (async snapshot, vLLM)
            merged = self.cfg.rollout.engine == "vllm" or getattr(eng, "merged_weights", False)
            sd = merged_state_dict(self.model) if merged else self.model.state_dict()
            eng.update_weights(sd, self.version)
        else:
            eng.update_weights({}, self.version)

    # ---------------------------------------------------------------- rollouts
    def _score(self, batch: RolloutBatch, examples: list[Example]):
        rows = [examples[g] for g in batch.group.tolist()]
        return self.pool.score(batch.texts(self.tok), rows)

    def _accuracy(self, components: Tensor) -> Tensor:
        """The verifier's verdict: the "correct" component (else the first) at 1."""
        k = self.reward_names.index("correct") if "correct" in self.reward_names else 0
        return (components[:, k] >= 1.0).float()

    def _check_chat_template(self) -> None:
        """Chat episodes need a chat template; warn once if it is not append-only."""
        from rlpost.llm.data.envs import make_env
        from rlpost.llm.rollout.chat import append_only_violations

        env = self.cfg.data.env
        if not getattr(self.tok, "chat_template", None):
            raise ValueError(
                "data.env.chat: the tokenizer has no chat template (use a chat model, or "
                "set data.env.chat=false for plain-text episodes)"
            )
        self._chat_tools = getattr(make_env(env.name, **env.params), "tools", None)
        bad = append_only_violations(self.tok, self._chat_tools)
        if bad:
            warnings.warn(
                f"data.env.chat: the chat template is not append-only ({bad[0]}); turns "
                "after such a re-rendering are aligned at the first difference",
                stacklevel=2,
            )

    def _env_rollout(self, seeds: list[int], n: int, sampling: SamplingParams):
        from rlpost.llm.data.envs import make_env
        from rlpost.llm.rollout.agents import env_rollout

        env = self.cfg.data.env
        assert env is not None
        chat = None
        if env.chat:
            from rlpost.llm.rollout.chat import ChatFormat

            chat = lambda: ChatFormat(self.tok, env.system, self._chat_tools)  # noqa: E731
        return env_rollout(
            self.engine, self.tok, lambda: make_env(env.name, **env.params), seeds, n,
            sampling, env.max_turns, env.workers, chat,
        )  # fmt: skip

    def _collect_env(self) -> Collected:
        """One step of multi-turn episodes: ``prompts_per_step`` seeds, a group of
        ``group_size`` episodes each (training seeds count up from 0; held-out ones are
        offset by 10**9, never trained on)."""
        t0 = time.perf_counter()
        P, G = self.cfg.rollout.prompts_per_step, self.preset.group_size
        seeds = [self.cfg.data.seed * 10**6 + self.env_next + i for i in range(P)]
        self.env_next += P
        ro = self._env_rollout(seeds, G, self.sampling)
        b = ro.batch
        from rlpost.llm.rollout.agents import group_hindsight
        from rlpost.llm.train.provide import information_gain

        hints = group_hindsight(ro, G)
        examples = [
            Example(
                self.tok.decode(b.prompt_ids[i], skip_special_tokens=True),
                "",
                {"seed": seeds[i // G], "hindsight": hints[i]},
            )
            for i in range(len(b))
        ]
        steps = [x for ep in ro.infos for x in ep]
        metrics = {
            "env/turns": float(ro.turns.float().mean()),
            "env/solved": float(ro.solved.float().mean()),
            "time/rollout": time.perf_counter() - t0,
        }
        if steps and "valid" in steps[0]:
            metrics["env/valid_frac"] = sum(bool(x.get("valid")) for x in steps) / len(steps)
        if steps and "composed" in steps[0]:
            metrics["env/composed_per_episode"] = sum(x.get("composed", 0) for x in steps) / len(b)
        logged: dict[str, list[float]] = {}  # an environment's own "log/<name>" values
        for x in steps:
            for k, v in x.items():
                if k.startswith("log/"):
                    logged.setdefault(k[4:], []).append(float(v))
        metrics.update({f"env/{k}": sum(v) / len(v) for k, v in logged.items()})
        if self.cfg.data.env.params.get("shortcuts"):  # planted shortcuts (001-21)
            last = [ep[-1] for ep in ro.infos if ep]
            metrics["env/exploit_rate"] = sum(bool(x.get("exploit")) for x in last) / len(b)
        acc = (ro.rewards >= 1.0).float()
        turn_rewards = ro.turn_rewards
        if self.cfg.data.env.turn_signal == "ig" and Input.TURNS in self.reads:
            turn_rewards = information_gain(
                self.model, self.tok, ro, self.sampling.temperature,
                self.cfg.optim.micro_batch_size,
            )  # fmt: skip
            metrics["env/ig_abs_mean"] = float(turn_rewards.abs().mean())
        stages = None
        if self.cfg.data.env.turn_signal == "rubric":
            from rlpost.llm.data.envs.base import ENVIRONMENTS

            judge = ENVIRONMENTS[self.cfg.data.env.name].judge  # a static method
            stages = torch.full_like(turn_rewards, -1, dtype=torch.long)
            turn_rewards = torch.zeros_like(turn_rewards)
            for i, ep in enumerate(ro.infos):
                for u, info in enumerate(ep):
                    stages[i, u], turn_rewards[i, u] = judge(info)
            for s in range(int(stages.max()) + 1):
                on = stages == s
                if bool(on.any()):
                    metrics[f"env/rubric_stage{s}"] = float(turn_rewards[on].mean())
        return Collected(
            b, examples, ro.rewards, ro.rewards[:, None], acc, metrics,
            turn_ids=ro.turn_ids, turn_rewards=turn_rewards, query_mask=ro.query_mask,
            turn_stages=stages,
        )  # fmt: skip

    def _generate(self, prompts: list[list[int]], n: int, drafts=None) -> RolloutBatch:
        if drafts is not None:  # BubbleSpec: verify the given drafts
            batch = self.engine.generate_with_drafts(prompts, n, self.sampling, drafts)
        else:
            batch = self.engine.generate(prompts, n, self.sampling)
        if not all_finite([batch.logprobs[batch.mask > 0]]):  # engines without a guard
            raise NonFiniteError(
                "the engine's log-probs of the sampled tokens are not finite: the "
                "policy's weights have diverged"
            )
        return batch

    def _collect_feedback(self) -> Collected:
        """FBOS-RL (000-15): a plain round of ``G - m`` rollouts per prompt, a second round
        of ``m`` conditioned on a diagnosed failure (plain where there is none), assembled
        into EPA's and ECC's rows (:mod:`rlpost.llm.methods.feedback`). With the policy as
        reflector (RubricEM's reflection meta-policy, 000-30), each guided rollout reads a
        reflection the policy wrote on the first failure; under ``meta`` the reflections
        join the batch, a group per failure, rewarded by the attempts they guided."""
        from rlpost.core.feedback import rescued
        from rlpost.llm.methods.feedback import assemble, guided_contexts

        fb = self.preset.feedback
        assert fb is not None
        t0 = time.perf_counter()
        P = self.cfg.rollout.prompts_per_step
        n, m = fb.split(self.preset.group_size)
        examples = self.source.next_batch(P)
        prompts = [encode_prompt(self.tok, e.prompt) for e in examples]
        plain = self._generate(prompts, n)
        res1 = self._score(plain, examples)
        acc1 = self._accuracy(res1.components)
        by_domain = getattr(self.source, "tasks", None)  # a mixture's; else the current task
        by_domain = by_domain if isinstance(by_domain, dict) else None

        def task_of(e: Example):
            return by_domain.get(e.meta.get("domain")) if by_domain else self.source.task

        def feedback(text: str, e: Example) -> str:
            task = task_of(e)
            return task.feedback(text, e) if task is not None else ""

        texts = plain.texts(self.tok)
        reflections, reflected, metrics = None, [], {}
        if fb.reflector == "policy":  # RubricEM: the policy writes the guidance
            guided, second, reflections, reflected, metrics = self._reflect_round(
                fb, examples, prompts, texts, acc1 > 0, task_of
            )
            res2 = self._score(second, [e for e in examples for _ in range(m)])  # one a row
        else:
            ctx = guided_contexts(fb, examples, texts, acc1 > 0, feedback)
            guided = torch.tensor([c is not None for c in ctx])
            second_prompts = [
                encode_prompt(self.tok, c) if c is not None else prompts[i]
                for i, c in enumerate(ctx)
            ]
            second = self._generate(second_prompts, m)
            res2 = self._score(second, examples)  # verified against the original problem
        acc2 = self._accuracy(res2.components)
        out = assemble(fb, plain, second, prompts, guided, acc2 > 0)
        rewards = torch.cat([res1.rewards, res2.rewards])[out.source]
        comps = torch.cat([res1.components, res2.components])[out.source]
        batch, rows, roles = out.batch, [examples[i] for i in out.example], out.roles
        if fb.meta and reflections is not None:  # the meta-policy: a group per failure
            # (TRAIN: trained, but not rollouts of the task, so the rollout statistics,
            # accuracy and entropy among them, skip them; reflect/rows counts them)
            guided_rows = torch.tensor([i * m + j for i in reflected for j in range(m)])
            batch = RolloutBatch.concat([batch, reflections])
            rewards = torch.cat([rewards, res2.rewards[guided_rows]])
            comps = torch.cat([comps, res2.components[guided_rows]])
            rows += [examples[i] for i in reflected for _ in range(m)]
            roles = torch.cat([roles, torch.full((len(guided_rows),), TRAIN, dtype=roles.dtype)])
            metrics["reflect/rows"] = float(len(guided_rows))
        for k, v in {**res1.metrics, **res2.metrics}.items():
            both = k.endswith(("timeouts", "errors"))
            metrics[k] = res1.metrics.get(k, 0.0) + res2.metrics.get(k, 0.0) if both else v
        g2 = guided[:, None].expand(P, m).flatten()
        metrics.update(
            {
                "fbos/plain_accuracy": float(acc1.mean()),
                "fbos/guided_prompts": float(guided.float().mean()),
                "fbos/guided_accuracy": float(acc2[g2].mean()) if bool(g2.any()) else 0.0,
                "fbos/epa_rows": float(out.layout.epa.sum()),
                "fbos/rescued": float(rescued(acc1.view(P, n) > 0, out.layout, m).sum()),
                "time/rollout": time.perf_counter() - t0,
            }
        )
        return Collected(batch, rows, rewards, comps, self._accuracy(comps), metrics, roles=roles)

    def _reflect_round(self, fb, examples, prompts, texts, correct, task_of):
        """The policy as reflector: on each prompt's first failure (``texts`` /
        ``correct``: the plain round), ``m`` sampled reflections, and one guided rollout
        per reflection. Returns ``(guided [P], second [P * m], reflections, reflected,
        metrics)``: ``second`` prompt-major, the plain prompt where nothing failed;
        ``reflections`` ``m`` per prompt of ``reflected`` (None: nothing failed)."""
        from rlpost.llm.methods.feedback import first_failures

        P, m = len(examples), fb.split(self.preset.group_size)[1]
        failed = first_failures(examples, texts, correct)
        reflected = [i for i, f in enumerate(failed) if f is not None]
        second_prompts = [prompts[i] for i in range(P) for _ in range(m)]
        reflections, metrics, exact = None, {}, []
        if reflected:
            asks = [encode_prompt(self.tok, fb.reflect(examples[i].prompt, failed[i]))
                    for i in reflected]  # fmt: skip
            reflections = self._generate(asks, m)
            written = reflections.texts(self.tok)
            for k, i in enumerate(reflected):
                e, task = examples[i], task_of(examples[i])
                for j in range(m):
                    note = written[k * m + j]
                    guide = fb.prompt(e.prompt, failed[i], note)
                    second_prompts[i * m + j] = encode_prompt(self.tok, guide)
                    if task is not None and (d := task.feedback(failed[i], e)):
                        exact.append(float(note.strip() == task.lesson(d)))
        if exact:  # against the verifier's own diagnosis, where the task has one
            metrics["reflect/exact"] = sum(exact) / len(exact)
        guided = torch.tensor([f is not None for f in failed])
        return guided, self._generate(second_prompts, 1), reflections, reflected, metrics

    def collect(self, want: int | None = None, given=None) -> Collected:
        """Generate, score, and (dynamic sampling) keep groups whose rewards differ:
        ``want`` groups (default ``rollout.prompts_per_step``). ``given``: BubbleSpec's
        ``(examples, drafts)``, the step's prompts and the rows' drafts."""
        if self.cfg.data.env is not None:
            return self._collect_env()
        if self.preset.feedback is not None:
            return self._collect_feedback()
        p, want = self.preset, want or self.cfg.rollout.prompts_per_step
        if self.curriculum is not None:
            self.curriculum.set_step(self.step)
        t0 = time.perf_counter()
        parts: list[tuple[RolloutBatch, list[Example], Tensor, Tensor]] = []
        kept, rounds, seen_groups, metrics = 0, 0, 0, {}
        while True:
            if given is not None:
                examples = given[0]
            else:
                examples = self.source.next_batch(want - kept if rounds else want)
            prompts = [encode_prompt(self.tok, e.prompt) for e in examples]
            batch = self._generate(prompts, p.group_size, given[1] if given else None)
            res = self._score(batch, examples)
            rewards = res.rewards
            for k, v in res.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v if k.endswith(("timeouts", "errors")) else v
            seen_groups += len(examples)
            rounds += 1
            if p.dynamic_sampling:
                gstd = torch.zeros(len(examples)).index_add_(
                    0,
                    batch.group,
                    (rewards - rewards.view(len(examples), -1).mean(1)[batch.group]) ** 2,
                )
                good = torch.nonzero(gstd > 0).flatten()
                rows = torch.nonzero(torch.isin(batch.group, good)).flatten()
                if len(good):
                    parts.append(
                        (
                            batch.select(rows),
                            [examples[g] for g in good.tolist()],
                            rewards[rows],
                            res.components[rows],
                        )
                    )
                kept += len(good)
                if kept >= want or rounds > self.cfg.train.max_refill:
                    break
            else:
                parts.append((batch, examples, rewards, res.components))
                kept = len(examples)
                break
        if not parts:
            empty = torch.zeros(0)
            return Collected(
                batch, [], empty, torch.zeros(0, len(self.reward_names)), empty,
                {"dynamic/kept_frac": 0.0},
            )  # fmt: skip
        merged = RolloutBatch.concat([b for b, *_ in parts])
        exs = [e for _, es, _, _ in parts for e in es]
        rew = torch.cat([r for _, _, r, _ in parts])
        comp = torch.cat([c for *_, c in parts])
        if kept > want:  # trim surplus groups
            rows = torch.nonzero(merged.group < want).flatten()
            merged, exs, rew, comp = merged.select(rows), exs[:want], rew[rows], comp[rows]
        metrics["dynamic/kept_frac"] = kept / max(seen_groups, 1) if p.dynamic_sampling else 1.0
        metrics["dynamic/rounds"] = float(rounds)
        metrics["time/rollout"] = time.perf_counter() - t0
        if hasattr(self.engine, "restarts"):  # Ray rollout workers replaced so far
            metrics["rollout/worker_restarts"] = float(self.engine.restarts)
        st = getattr(self.engine, "stats", None)
        if st is not None and "cache_columns_max" in st:  # compressed-KV rollouts
            metrics["kv/cache_fraction"] = st["cache_columns_max"] / max(st["dense_columns_max"], 1)
        elif st is not None:  # speculative decoding, over the run so far
            metrics["spec/acceptance"] = st["accepted"] / max(st["proposed"], 1)
            metrics["spec/tokens_per_forward"] = st["tokens"] / max(st["row_rounds"], 1)
        return Collected(
            merged,
            [exs[g] for g in merged.group.tolist()],
            rew,
            comp,
            self._accuracy(comp),
            metrics,
        )

    # ------------------------------------------------------------------ update
    def _seq_batches(self, batch: RolloutBatch, pack: bool | None = None):
        mbs = self.cfg.optim.micro_batch_size
        pack = self.cfg.model.pack_prompts if pack is None else pack
        for s in range(0, len(batch), mbs):
            sl = slice(s, s + mbs)
            yield sl, make_seq_batch(
                batch.prompt_ids[sl], batch.completion_ids[sl], batch.mask[sl], batch.pad_id,
                pack=pack, layout=self.cfg.model.pack_layout, attend=batch.attention[sl],
                kv=self._kv,
            )  # fmt: skip

    @torch.no_grad()
    def _state_snapshot(self) -> tuple[dict, dict, dict]:
        """The policy's weights, the optimiser's and the schedule's state, copied."""
        weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return weights, copy.deepcopy(self.optimizer.state_dict()), self.scheduler.state_dict()

    def _mipu_accept(self, batch: RolloutBatch, mask: Tensor, adv: Tensor, snapshot) -> dict:
        """MIPU: the candidate just applied, synchronised to the engine, scored there; a
        rejected one is undone (weights, optimiser, schedule, version)."""
        from rlpost.core.mipu import inference_gap

        mc = self.cfg.train.mipu
        self._sync_engine()  # the candidate on the inference side
        eng_model = self.engine.model
        was = eng_model.training
        eng_model.eval()
        try:
            cand = self._forward_nograd(eng_model, batch).logp
        finally:
            eng_model.train(was)
        gap = inference_gap(cand, batch.logprobs, adv, mask)
        ok = gap.accepts(mc.penalty, mc.min_gain)
        if not ok:
            weights, opt_state, sched_state = snapshot
            self.model.load_state_dict(weights)
            self.optimizer.load_state_dict(opt_state)
            self.scheduler.load_state_dict(sched_state)
            self.version -= 1
            self._applied = False
            self.mipu_rejected += 1
            self._sync_engine()  # the engine back on the kept weights
        return {
            "mipu/accepted": float(ok),
            "mipu/gain": gap.gain,
            "mipu/kl": gap.kl,
            "mipu/rejected": float(self.mipu_rejected),
        }

    def _forward_nograd(
        self, model, batch: RolloutBatch, entropy: bool = False, dists: bool = False
    ) -> Forward:
        """Log-probs of the sampled tokens under ``model`` (and, on request, the
        per-position entropy and the top-``algo.topk`` distribution), in micro-batches."""
        mask = batch.mask
        out = torch.zeros_like(mask)
        ent = torch.zeros_like(mask) if entropy else None
        ids_parts, lp_parts = [], []
        sharded = self._sharded and model is self.model

        def forward(sb, **kw):  # (FSDP2: through the learner, which gathers the shards)
            if sharded:
                return self.learner(host_logprobs, sb, self.sampling.temperature, **kw)
            return host_logprobs(model, sb, self.sampling.temperature, **kw)

        for sl, sb in self._seq_batches(batch):
            res = forward(
                sb,
                impl=self.cfg.model.logprob_impl,
                dists=self.cfg.algo.topk if dists else None,
            )
            out[sl] = res[0] * mask[sl]
            if ent is not None:
                ent[sl] = res[1] * mask[sl]
            if dists:
                ids_parts.append(res[2][0])  # (host_logprobs: on the CPU already)
                lp_parts.append(res[2][1])
        d = (torch.cat(ids_parts), torch.cat(lp_parts)) if dists else None
        return Forward(out, ent, d)

    def _dynamics(self, batch: RolloutBatch) -> TrainingDynamics | None:
        """Training progress, the sampled tokens' mean -log-prob as the entropy estimate,
        and its first value (``None`` when the engine log-probs are not finite)."""
        m = batch.mask
        entropy = float(-(batch.logprobs * m).sum() / m.sum().clamp_min(1.0))
        if self.initial_entropy is None and math.isfinite(entropy):
            self.initial_entropy = entropy
        progress = min(1.0, self.step / max(1, self.total_steps - 1))
        if not math.isfinite(entropy):
            return None
        return TrainingDynamics(progress, max(entropy, 0.0), self.initial_entropy)

    def _advantage_extras(self, model, batch: RolloutBatch) -> dict[str, Any]:
        """The optional estimator inputs the recipe reads: behaviour log-probs, training
        dynamics, and mean-pooled last hidden states of the prompt / the completion as
        prompt / completion features (entries see only what they declare)."""
        extras: dict[str, Any] = {"logprobs": batch.logprobs * batch.mask}
        dyn = self._dynamics(batch)
        if dyn is not None:
            extras["dynamics"] = dyn
        mbs = self.cfg.optim.micro_batch_size
        for need, part in (
            (Input.PROMPT_FEATURES, "prompt"),
            (Input.COMPLETION_FEATURES, "completion"),
        ):
            if need in self.reads:
                extras[f"{part}_features"] = pooled_hidden(model, batch, part, mbs)
        return extras

    def _rewards_input(self, col: Collected) -> dict[str, Tensor]:
        """Vector rewards (components and weights) for estimators that read them, else the
        weighted sum."""
        if Input.VECTOR_REWARDS in self.reads:
            w = torch.tensor(list(self.reward_weights.values()))
            return {"rewards": col.components, "reward_weights": w}
        return {"rewards": col.rewards}

    def _flat_params(self, params: list[Tensor]) -> Tensor:
        return torch.cat([q.detach().reshape(-1) for q in params])

    def _regularize(
        self, params: list[Tensor], aux: Tensor | None, samples: list[Tensor], first: bool
    ) -> dict[str, float]:
        """Apply the configured gradient regulariser to ``p.grad`` in place."""
        g = flat_grad(params)
        events = self.curriculum.events(self.step) if (self.curriculum and first) else []
        kw: dict[str, Any] = {
            "aux_grads": aux,
            "grad_samples": torch.stack(samples) if len(samples) >= 2 else None,
            "parameters": self._flat_params(params),
        }
        for ev in events[:-1]:  # e.g. the previous task's end before this one's begin
            self.reg_state = self.regularizer(
                GradientInput(g, task_boundary=ev, state=self.reg_state, **kw)
            ).state
        out = self.regularizer(
            GradientInput(
                g, task_boundary=events[-1] if events else None, state=self.reg_state, **kw
            )
        )
        self.reg_state = out.state
        set_flat_grad_(params, out.grad)
        return out.metrics

    def _teacher_scores(
        self, col: Collected, mask: Tensor
    ) -> tuple[TeacherScores | None, Tensor | None]:
        """The teachers' scores of the batch and where they apply ``[N, L]`` (routed rows
        that pass the preset's row filter), or ``(None, None)`` without teachers."""
        if self.teachers is None:
            return None, None
        cfg = self.cfg
        examples = col.examples
        if self.memory is not None:  # this step's rollouts update it, then it fills contexts
            examples = self.memory.observe(
                examples, col.batch.texts(self.tok), col.accuracy.bool().tolist(), self.step
            )
        teach = self.teachers.score(
            col.batch,
            examples,
            self.model,
            temperature=self.sampling.temperature,
            topk=cfg.distill.topk if Input.TEACHER_TOPK in self.reads else None,
            full=Input.TEACHER_FULL in self.reads,
            micro_batch=cfg.optim.micro_batch_size,
            pack=cfg.model.pack_prompts,
            layout=cfg.model.pack_layout,
            impl=cfg.model.logprob_impl,
        )
        rows = teach.rows * self.recipe.distill_row_mask(col.accuracy)
        tokens = torch.ones_like(mask)
        if self.preset.distill_tokens == "queries":  # SD-Search: the search queries only
            if col.query_mask is None:
                raise ValueError("distill_tokens=queries needs multi-turn episodes (data.env)")
            tokens = col.query_mask
        return teach, rows[:, None] * tokens

    def _student_ids(self, teach: TeacherScores, idx: Tensor, sub: RolloutBatch) -> Tensor | None:
        """The ids the student's training forward scores differentiably: the vocabulary for
        the full estimator, the teacher's top-K for ``topk``, none for ``sampled``."""
        if teach.full is not None:
            v = teach.full.shape[-1]
            head = self.model.get_output_embeddings().weight.shape[0]
            if head != v:
                raise ValueError(
                    f"the full-vocabulary estimator: the student has {head} vocabulary rows, "
                    f"the teacher {v}"
                )
            return torch.arange(v).expand(*sub.completion_ids.shape, v)
        return teach.topk[0][idx] if teach.topk is not None else None

    def _prepare(self, col: Collected, sampler_ref: bool = False) -> _Prepared:
        """Everything the policy loss reads besides the training forward: the loss mask,
        the behaviour / reference / teacher passes, the advantages and token weights.
        ``sampler_ref`` (MIPU): the ratio is referenced to the sampler's own log-probs."""
        cfg, p, batch = self.cfg, self.preset, col.batch
        model = self.model
        mask = batch.mask.clone()
        truncated = torch.tensor([r == "length" for r in batch.finish_reasons])
        if cfg.train.overlong_mask:
            mask[truncated] = 0.0
        want_dists = Input.TOKEN_DISTS in self.reads
        rescored = Input.TEACHER_LOGPROBS in self.recipe.advantage.reads  # StepOPSD
        need_old = cfg.optim.updates_per_batch > 1 or self.kl_in_reward or want_dists or rescored
        old = None
        if col.old_logp is not None and not want_dists:
            old = Forward(col.old_logp)
        elif need_old:
            old = self._forward_nograd(model, batch, dists=want_dists)
        old_logp = old.logp if old is not None else None
        if sampler_ref:
            old_logp = batch.logprobs * batch.mask
        ref_logp = ref_entropy = None
        if self.reference is not None:
            with self.reference.active(model) as ref:
                fwd = self._forward_nograd(ref, batch, entropy=Input.REF_ENTROPY in self.reads)
                ref_logp, ref_entropy = fwd.logp, fwd.entropy
        token_rewards = None
        if self.kl_in_reward:
            token_rewards = kl_reward_penalty(old_logp, ref_logp, batch.mask, p.kl_coef, p.kl.name)
        old_values = None
        if self.critic is not None:
            parts = [sb for _, sb in self._seq_batches(batch, pack=False)]
            old_values = self.critic.values(parts) * batch.mask
        extras = self._advantage_extras(model, batch)
        teach, teacher_mask = self._teacher_scores(col, mask)
        if rescored:  # the teacher's and the student's log-probs from the same forward code,
            # so a context that tells the teacher nothing gives a gap of exactly 0
            if teach is None:
                raise ValueError(f"{self.recipe.advantage} needs distill.teachers")
            scored = teacher_mask > 0  # unscored rows: the student's own (gap 0)
            extras["logprobs"] = old_logp * batch.mask
            extras["teacher_logprobs"] = torch.where(scored, teach.logp, old_logp) * batch.mask
        turns = {}
        if col.turn_ids is not None and Input.TURNS in self.reads:
            turns = {
                "turn_ids": col.turn_ids,
                "turn_rewards": col.turn_rewards,
                "turn_stages": col.turn_stages,
            }
        adv_out = self.recipe.advantages(
            AdvantageInput(
                group_ids=batch.group,
                mask=batch.mask,
                token_rewards=token_rewards,
                values=old_values,
                **turns,
                **self._rewards_input(col),
                **extras,
            )
        )
        dynamics = extras.get("dynamics")
        token_weights, tw_metrics = None, {}
        if self.token_weighting is not None:
            att = attention_token_entropy(model, batch, cfg.optim.micro_batch_size)
            tw = self.token_weighting(TokenWeightInput(att, mask, dynamics))
            token_weights, tw_metrics = tw.weights, tw.metrics
        returns = adv_out.returns if self.critic is not None else None
        if self.critic is not None and returns is None:
            raise ValueError(f"{self.recipe.advantage} returns no value targets for the critic")
        trained = torch.ones(len(batch), dtype=torch.bool)
        if col.roles is not None:  # XGRPO's peer rows: in the advantage's baseline only
            trained = col.roles != BASELINE
            mask[~trained] = 0.0
        adv_metrics = {
            f"adv/{k}": v
            for k, v in adv_out.metrics.items()  # the estimator's own (turn groups, credit)
            if k not in ("reward_mean", "adv_abs_mean")
        }
        return _Prepared(
            col, mask, truncated, old, old_logp, ref_logp, ref_entropy, adv_out.advantages,
            adv_out.clip_range, dynamics, token_weights, teach, teacher_mask, old_values,
            returns, trained, {**tw_metrics, **adv_metrics},
        )  # fmt: skip

    def _backward(
        self,
        prep: _Prepared,
        rows: Tensor,
        epoch: int,
        counts: tuple[float, float],
        acc: _Accum,
        warmup: bool,
    ) -> None:
        """Forward and backward of ``rows`` of a prepared batch in micro-batches, gradients
        summed into ``.grad`` (normalised by ``counts``: the step's valid tokens and
        responses) and metrics into ``acc``; stops at a non-finite loss (``acc.bad``)."""
        cfg, batch, model = self.cfg, prep.batch, self.model
        global_tokens, global_seqs = counts
        own = prep.col.own().float().unsqueeze(1)  # the behaviour-mismatch metrics: own rows
        want_dists = Input.TOKEN_DISTS in self.reads
        reg_needs = self.regularizer.needs if self.regularizer is not None else frozenset()
        params = [q for q in model.parameters() if q.requires_grad]
        teach, mask, old = prep.teach, prep.mask, prep.old
        chunks = self.learner.micro_batches(
            rows, cfg.optim.micro_batch_size, torch.arange(len(batch))
        )
        n_mb = len(chunks)
        for j, (idx, weight) in enumerate(chunks):
            self.learner.sync(last=j == n_mb - 1)  # all-reduce on the last micro-batch
            sub = batch.select(idx) if len(idx) != len(batch) else batch
            if self.critic is not None:
                vsb = make_seq_batch(
                    sub.prompt_ids, sub.completion_ids, sub.mask, batch.pad_id,
                    attend=sub.attention,
                )  # fmt: skip
                self.critic.learner.sync(last=j == n_mb - 1)
                vloss, vm = self.critic.loss(
                    vsb, prep.old_values[idx], prep.returns[idx], mask[idx], global_tokens
                )
                (vloss * (weight * self.critic.learner.scale)).backward()
                if weight:
                    acc.add(vm)
            if warmup:
                continue
            sb = make_seq_batch(
                sub.prompt_ids,
                sub.completion_ids,
                sub.mask,
                batch.pad_id,
                pack=cfg.model.pack_prompts,
                layout=cfg.model.pack_layout,
                attend=sub.attention,
                kv=self._kv,
            )
            student_ids = self._student_ids(teach, idx, sub) if teach is not None else None
            res = self.learner(
                host_logprobs,
                sb,
                self.sampling.temperature,
                impl=cfg.model.logprob_impl,
                dists=old.dists[0][idx] if want_dists else None,
                student_ids=student_ids,
            )
            logp, ent = res[0], res[1]
            t_topk = t_full = None
            if teach is not None and student_ids is not None:
                t = teach.full[idx] if teach.full is not None else teach.topk[1][idx]
                d = student_distributions(res[-1], t, student_ids, sub.completion_ids)
                t_topk, t_full = (None, d) if teach.full is not None else (d, None)
            m = mask[idx]
            old_mb = prep.old_logp[idx] if prep.old_logp is not None else logp.detach()
            dists = None
            if want_dists:
                behaviour = (old.dists[0][idx], old.dists[1][idx])
                dists = token_distributions(res[2], behaviour, sub.completion_ids)

            def sl(t: Tensor | None, idx=idx) -> Tensor | None:
                return t[idx] if t is not None else None

            out = self.recipe.policy_loss(
                PolicyBatch(
                    logp,
                    old_mb,
                    prep.adv[idx],
                    m,
                    rollout_logp=batch.logprobs[idx],
                    ref_logp=sl(prep.ref_logp),
                    ref_entropy=sl(prep.ref_entropy),
                    entropy=ent,
                    clip_range=sl(prep.clip_range),
                    token_weights=sl(prep.token_weights),
                    group_ids=batch.group[idx],
                    token_dists=dists,
                    dynamics=prep.dynamics,
                    global_tokens=global_tokens,
                    global_sequences=global_seqs,
                    generation_budget=float(cfg.rollout.max_new_tokens),
                    teacher_logp=teach.logp[idx] if teach is not None else None,
                    teacher_topk=t_topk,
                    teacher_full=t_full,
                    teacher_mask=sl(prep.teacher_mask),
                    teacher_spans=teach.spans[idx]
                    if teach is not None and teach.spans is not None
                    else None,
                    turn_ids=sl(prep.col.turn_ids),
                )
            )
            loss = out.loss
            if self._kv is not None and cfg.rollout.kv_compression.distill > 0:
                loss = loss + self._shadow_distill(sub, logp, m, global_tokens, acc)
            if not torch.isfinite(loss):
                acc.bad = True
                if self.world == 1:
                    break  # (data-parallel ranks all take the synchronised backward)
            before = flat_grad(params) if Input.GRAD_SAMPLES in reg_needs else None
            scale = weight * self.learner.scale
            (loss * scale if scale != 1.0 else loss).backward()
            if before is not None:  # this micro-batch's share, rescaled to the batch
                acc.samples.append((flat_grad(params) - before) * n_mb)
            if not weight:
                continue  # a rank without rows: its zero-weight pass only syncs
            acc.add(out.metrics)
            if epoch == 0:  # training-inference mismatch on the behaviour policy's tokens
                bm = sub.mask * own[idx]
                d = (logp.detach() - sub.logprobs) * bm
                mism = acc.mism
                mism["abs"] += float(d.abs().sum())
                mism["max"] = max(mism["max"], float(d.abs().max()) if d.numel() else 0.0)
                mism["k3"] += float((((-d).exp() - 1 + d) * bm).sum())
                mism["tok"] += float(bm.sum())
                acc.ent_sum += float((ent.detach() * bm).sum())

    def _shadow_distill(
        self, sub: RolloutBatch, logp: Tensor, m: Tensor, global_tokens: float, acc: _Accum
    ) -> Tensor:
        """Compressed-KV rollouts (001-13): ``distill * 0.5 (log pi_shadow(y) - sg log
        pi_dense(y))^2`` over the sampled tokens, normalised by the step's valid tokens
        (so micro-batches sum to the full batch): the policy under the sampler's
        compressed context, the one being trained, pulled towards the full-context policy
        on its own samples, so the two views drift no further apart; 0 in value and
        gradient when they agree (no compression)."""
        cfg = self.cfg
        dense = make_seq_batch(
            sub.prompt_ids, sub.completion_ids, sub.mask, sub.pad_id, attend=sub.attention
        )
        with torch.no_grad():
            logp_d = host_logprobs(
                self.model, dense, self.sampling.temperature, impl=cfg.model.logprob_impl
            )[0]
        gap = (logp - logp_d) * m
        acc.add({"kv/dense_gap": float(gap.detach().abs().sum() / m.sum().clamp_min(1.0))})
        beta = cfg.rollout.kv_compression.distill
        return beta * 0.5 * (gap**2).sum() / max(global_tokens, 1.0)

    def _optimizer_step(self, acc: _Accum, aux: Tensor | None, epoch: int) -> None:
        """Regularise, clip and apply the summed gradients (or drop them: ``acc.bad``)."""
        params = [q for q in self.model.parameters() if q.requires_grad]
        if self.world > 1:
            flag = torch.tensor([float(acc.bad)], device=self._comm)
            dist.all_reduce(flag)
            acc.bad = bool(flag.item())
        if not acc.bad and self.regularizer is not None:
            acc.add(self._regularize(params, aux, acc.samples, first=epoch == 0))
        if not acc.bad:
            clip = self.cfg.optim.grad_clip
            clip = clip if clip is not None else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor (the global norm, replicated)
                norm = norm.full_tensor()
            acc.grad_norm = float(norm)
            acc.bad = not math.isfinite(acc.grad_norm)
        if not acc.bad and not self.guard.step(self.optimizer.step):
            acc.bad = True
            acc.why = "an update made parameters non-finite; it was rolled back"
        self.optimizer.zero_grad(set_to_none=True)

    def _close_update(self, acc: _Accum, warmup: bool) -> None:
        """The update's bookkeeping: a skipped one is recorded, an applied one advances the
        version and the schedule."""
        if acc.bad and not warmup:
            notice(f"step {self.step + 1}: update skipped: {acc.why}")
            self.guard.record(False, acc.why)
        self._applied = not acc.bad and not warmup  # confirmed by the next generation
        if warmup:
            pass  # only the critic trained: the policy and its schedule stay
        elif acc.bad:  # the schedule advances with applied updates only
            self.skipped += 1
        else:
            self.version += 1
            self.scheduler.step()

    def update(self, col: Collected) -> dict[str, float]:
        cfg, batch = self.cfg, col.batch
        self.model.train()
        t0 = time.perf_counter()
        mipu = cfg.train.mipu
        snapshot = self._state_snapshot() if mipu is not None else None
        prep = self._prepare(col, sampler_ref=mipu is not None)
        counts = prep.counts()
        mine = torch.nonzero(prep.trained).flatten()[self.rank :: self.world]  # this rank's
        params = [q for q in self.model.parameters() if q.requires_grad]
        warmup = self.critic is not None and self.step < cfg.critic.warmup_steps
        reg_needs = self.regularizer.needs if self.regularizer is not None else frozenset()
        acc = _Accum()
        for epoch in range(cfg.optim.updates_per_batch):
            aux = None
            if Input.AUX_GRADIENTS in reg_needs and not warmup:
                rc = cfg.regularizer
                aux, aux_loss = aux_gradients(
                    self.model, params, self.tok, self.aux, rc.batches, rc.batch_size
                )
                acc.add({"aux/loss": aux_loss})
            acc.samples = []
            self._backward(prep, mine, epoch, counts, acc, warmup)
            if self.critic is not None:
                acc.add({"value/grad_norm": self.critic.step()})
            if warmup:
                continue
            self._optimizer_step(acc, aux, epoch)
            if acc.bad:
                break
        self._close_update(acc, warmup)
        metrics = self._update_metrics([prep], acc, warmup, t0)
        if snapshot is not None and self._applied:
            metrics.update(self._mipu_accept(batch, prep.mask, prep.adv, snapshot))
        if self.critic is not None:
            metrics["value/explained_variance"] = explained_variance(
                prep.old_values, prep.returns, batch.mask
            )
        return metrics

    def _update_metrics(
        self, preps: list[_Prepared], acc: _Accum, warmup: bool, t0: float
    ) -> dict[str, float]:
        """The update's metrics over its prepared batches (one, or RolloutPipe's chunks)."""
        cfg = self.cfg
        mism = acc.mism
        if self.world > 1:
            t = torch.tensor([mism["abs"], mism["k3"], mism["tok"], acc.ent_sum], device=self._comm)
            dist.all_reduce(t)
            mism["abs"], mism["k3"], mism["tok"], acc.ent_sum = t.tolist()
        ntok = max(mism["tok"], 1.0)
        sums = dict(acc.sums)
        metrics = {k: sums[k] / acc.counts[k] for k in sums}
        global_tokens = sum(p.counts()[0] for p in preps)
        if "value/clip_tokens" in sums:  # a count: the fraction of clipped value tokens
            metrics["value/clip_frac"] = sums.pop("value/clip_tokens") / max(
                global_tokens * cfg.optim.updates_per_batch, 1.0
            )
            metrics.pop("value/clip_tokens", None)
        for p in preps:  # (the estimator's and token weighting's: their mean over chunks)
            for k, v in p.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v / len(preps)
        if self.memory is not None:
            metrics.update(self.memory.metrics())
        if not warmup:
            metrics.update(
                {
                    "entropy": acc.ent_sum / ntok,
                    "mismatch/abs_mean": mism["abs"] / ntok,
                    "mismatch/abs_max": mism["max"],
                    "mismatch/k3": mism["k3"] / ntok,
                    "grad_norm": acc.grad_norm,
                }
            )
        lengths = torch.cat([p.batch.mask.sum(1) for p in preps])
        truncated = torch.cat([p.truncated for p in preps]).float()
        adv_abs = sum(
            float(masked_mean(p.adv.detach().abs(), p.batch.mask)) * float(p.batch.mask.sum())
            for p in preps
        )
        own_tokens = sum(
            float((p.batch.mask * p.col.own().float().unsqueeze(1)).sum()) for p in preps
        )
        metrics.update(
            {
                "response_length": float(lengths.mean()),
                "truncated_frac": float(truncated.mean()),
                "lr": self.scheduler.get_last_lr()[0],
                "adv_abs_mean": adv_abs / max(float(lengths.sum()), 1.0),
                "skipped_steps": float(self.skipped),
                "tokens/trained": global_tokens,
                "tokens/generated": own_tokens,
                "time/update": time.perf_counter() - t0,
            }
        )
        return metrics

    # -------------------------------------------------------------------- loop
    def _eval_accuracy(self, examples: list[Example]) -> float:
        prompts = [encode_prompt(self.tok, e.prompt) for e in examples]
        greedy = SamplingParams(self.sampling.max_new_tokens, 0.0, stop=self.sampling.stop)
        batch = self.engine.generate(prompts, 1, greedy)
        task = getattr(self.source, "task", None)
        if task is not None and type(task).accuracy is not Task.accuracy:
            # a score-based task says what solving means (e.g. an optimal knapsack pick)
            texts = batch.texts(self.tok)
            return sum(task.accuracy(t, e) for t, e in zip(texts, examples, strict=True)) / max(
                len(examples), 1
            )
        return float(self._accuracy(self._score(batch, examples).components).mean())

    def evaluate(self, examples: list[Example] | None = None) -> float:
        """Greedy held-out accuracy (via the engine, after syncing the current weights); for
        an environment, the greedy success rate on ``data.eval_size`` held-out seeds."""
        if self.cfg.data.env is not None and examples is None:
            greedy = SamplingParams(self.sampling.max_new_tokens, 0.0, stop=self.sampling.stop)
            seeds = [10**9 + i for i in range(self.cfg.data.eval_size)]
            return float(self._env_rollout(seeds, 1, greedy).solved.float().mean())
        return self._eval_accuracy(examples or self.source.eval_examples)

    def _eval_metrics(self) -> dict[str, float]:
        """``eval/accuracy`` (the current task), every curriculum task's, each mixture
        domain's, and VAPR."""
        if self.curriculum is not None:
            self.curriculum.set_step(min(self.step, self.total_steps - 1))
        if self.mixture is not None:  # each domain's held-out set; the overall is their mean
            out = {
                f"eval/{name}/accuracy": self._eval_accuracy(held)
                for name, held in self.mixture.eval_sets.items()
            }
            out["eval/accuracy"] = sum(out.values()) / len(out)
        else:
            out = {"eval/accuracy": self.evaluate()}
        if self.curriculum is not None:
            for name, src in zip(self.curriculum.names(), self.curriculum.sources, strict=True):
                out[f"eval/{name}/accuracy"] = self._eval_accuracy(src.eval_examples)
        if self.anchor is not None and self.anchor.update(self.model, out["eval/accuracy"]):
            refs = [self.reference.model] if self.reference and not self.reference.lora else []
            self.anchor.restore(self.model, *refs)
            self._sync_engine()
            out["vapr/reset"] = 1.0
        if self.anchor is not None:
            out["vapr/best"] = float(self.anchor.best)
            out["vapr/resets"] = float(self.anchor.resets)
        return out

    def _broadcast(self, col: Collected | None) -> Collected:
        if self.world == 1:
            return col
        box = [col]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _next_staged(self) -> Collected:
        """Mu-GRPO: at a stage's first step, generate the whole stage's rollouts with the
        current policy (and its log-probs of them); then one per step."""
        if not len(self.stages):
            n = min(self.stage_len, self.total_steps - self.step)
            fill = []
            for _ in range(n):
                col = self.collect()
                col.old_logp = self._forward_nograd(self.model, col.batch).logp
                fill.append(col)
            self.stages.items = fill
        return self.stages.items.pop(0)

    def _next_collected(self) -> Collected | None:
        if not self.main:
            return None
        if self.stages is not None:
            return self._next_staged()
        if self.cfg.train.pipeline == "dora":
            return self._stream_next()
        if self.cfg.train.pipeline == "bubblespec":
            return self._bubble_next()
        if not self.cfg.train.async_rollouts:
            return self._timed_collect()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout")
        if self._pending is None:
            self._pending = self._executor.submit(self._timed_collect)
        col = self._pending.result()
        return col

    def _stream_next(self) -> Collected:
        """DORA: the next step's groups from the stream, none more than
        ``train.max_staleness`` versions old (rows of several versions may mix)."""
        t = self.cfg.train
        want = self.cfg.rollout.prompts_per_step
        if self._stream is None:
            chunk = t.stream_prompts or max(1, want // 4)
            self._stream = ChunkStream(
                lambda: self.collect(chunk),
                Collected.n_groups,
                lambda c: c.batch.policy_version,
                Collected.split,
                capacity=max(1, math.ceil(want / chunk) - 1),  # + the one in hand: a step ahead
            )
        parts, dropped = self._stream.take(want, self.version, t.max_staleness)
        col = Collected.concat(parts)
        v = col.batch.row_versions
        col.metrics["dora/dropped_groups"] = float(dropped)
        col.metrics["dora/versions"] = float(len(v.unique()))
        col.metrics["dora/staleness_mean"] = float((self.version - v).float().mean())
        return col

    def _pipe_step(self) -> tuple[Collected, dict[str, float], float]:
        """RolloutPipe (004-30): one step whose rollouts are generated in chunks of
        ``train.stream_prompts`` complete groups on a generator thread, at the step's fixed
        weights, while the trainer back-propagates each chunk as soon as it arrives.

        Complete-group pipelining: a chunk holds every sample of each of its groups
        (trainable ones only, under dynamic sampling), so it goes to the trainer FIFO the
        moment it is scored. Frontier-group dispatch: the generator admits the requests of
        the groups the batch still needs, in order, and no others, so ready groups arrive
        early and steadily. The loss normaliser counts the whole batch's tokens, unknown
        until its last group: chunks are back-propagated with unit counts and the summed
        gradient is rescaled once at the end (:func:`rlpost.core.aggregation.count_scale`),
        so the update equals the synchronous one on the same groups. Returns the step's
        rollouts, the update's metrics and the seconds the trainer waited for rollouts."""
        cfg = self.cfg
        want = cfg.rollout.prompts_per_step
        size = cfg.train.stream_prompts or max(1, want // 4)
        chunks: queue.Queue = queue.Queue()

        def produce() -> None:  # the frontier groups first: the next ones the batch needs
            have = 0
            try:
                while have < want:
                    ask = min(size, want - have)
                    t0 = time.perf_counter()
                    part = self.collect(ask)
                    self._gen_spans.append((t0, time.perf_counter()))
                    chunks.put(part)
                    have += part.n_groups()
                    if part.n_groups() < ask:  # dynamic sampling ran out of refill rounds
                        break
            except BaseException as exc:  # re-raised on the trainer's thread
                chunks.put(exc)
            finally:
                chunks.put(None)

        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rolloutpipe")
        done = self._executor.submit(produce)
        self.model.train()
        t0 = time.perf_counter()
        acc, preps, parts, waited, last = _Accum(), [], [], 0.0, None
        while True:
            t_wait = time.perf_counter()
            part = chunks.get()
            waited += time.perf_counter() - t_wait
            if part is None:
                break
            if isinstance(part, BaseException):
                done.result()
                self.optimizer.zero_grad(set_to_none=True)
                raise part
            last = part
            if not len(part.batch):
                continue  # (every group of the chunk was degenerate)
            parts.append(part)
            prep = self._prepare(part)
            preps.append(prep)
            if not acc.bad:
                rows = torch.nonzero(prep.trained).flatten()
                self._backward(prep, rows, 0, (1.0, 1.0), acc, False)
        done.result()
        if self._applied:  # the last update generated finite logits: it was good
            self.guard.record(True)
            self._applied = False
        if not parts:  # no trainable group: nothing to update
            self.optimizer.zero_grad(set_to_none=True)
            return last, {}, waited
        col = Collected.concat(parts)
        tokens = sum(p.counts()[0] for p in preps)
        seqs = sum(p.counts()[1] for p in preps)
        scale = count_scale(
            self.recipe.aggregation, tokens, seqs, float(cfg.rollout.max_new_tokens)
        )
        with torch.no_grad():
            for q in self.model.parameters():
                if q.grad is not None:
                    q.grad.mul_(scale)
        self._optimizer_step(acc, None, 0)
        self._close_update(acc, False)
        metrics = self._update_metrics(preps, acc, False, t0)
        metrics["pipe/chunks"] = float(len(parts))
        return col, metrics, waited

    def _bubble_next(self) -> Collected:
        """BubbleSpec: this step's rollouts verify drafts a snapshot generated for its
        prompts during the previous update; then the next step's drafts start on a snapshot
        of the weights, beside this step's update (the generator's idle window)."""
        want, G = self.cfg.rollout.prompts_per_step, self.preset.group_size
        if self._pending is not None:
            examples, drafts = self._pending.result()
            self._pending = None
        else:  # the first step (or after a resume): nothing was pre-generated
            examples = self.source.next_batch(want)
            drafts = [[] for _ in range(want * G)]
        t0 = time.perf_counter()
        col = self.collect(given=(examples, drafts))
        self._gen_spans.append((t0, time.perf_counter()))
        if self.step + 1 < self.total_steps:
            nxt = self.source.next_batch(want)
            self._draft_engine.update_weights(self.model.state_dict(), self.version)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafts")
            self._pending = self._executor.submit(self._drafts_for, nxt)
        return col

    def _drafts_for(self, examples: list[Example]) -> tuple[list[Example], list[list[int]]]:
        t0 = time.perf_counter()
        try:
            prompts = [encode_prompt(self.tok, e.prompt) for e in examples]
            b = self._draft_engine.generate(prompts, self.preset.group_size, self.sampling)
            lens = b.lengths.tolist()
            return examples, [b.completion_ids[i, : lens[i]].tolist() for i in range(len(b))]
        finally:
            self._gen_spans.append((t0, time.perf_counter()))

    def _generator_paused(self):
        """No rollout is being generated inside this block (DORA's weight loads)."""
        if self._stream is None:
            return contextlib.nullcontext()
        return self._stream.exclusive()

    def _timed_collect(self) -> Collected:
        """:meth:`collect`, its wall-clock span recorded (the generator's busy time)."""
        t0 = time.perf_counter()
        try:
            return self.collect()
        finally:
            self._gen_spans.append((t0, time.perf_counter()))

    def _pipeline_metrics(self, t0: float, waited: float, rows: int) -> dict[str, float]:
        """The step's pipeline: its seconds, the share of them the trainer waited for
        rollouts, the share the generator was not generating (busy spans intersected with
        the step), and rows generated per second."""
        t1 = time.perf_counter()
        dt = max(t1 - t0, 1e-9)
        spans = self._stream.busy if self._stream is not None else self._gen_spans
        busy = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in list(spans))
        if self._stream is None:  # (the stream's own list is only appended to)
            self._gen_spans = [(a, b) for a, b in self._gen_spans if b > t1]
        return {
            "time/step": dt,
            "time/trainer_idle": min(waited / dt, 1.0),
            "time/generator_idle": max(0.0, 1.0 - busy / dt),
            "time/rollouts_per_s": rows / dt,
        }

    def _out_of_time(self, t_start: float, budget: float) -> bool:
        """Past the wall-clock budget (rank 0's clock decides for every rank)."""
        flag = torch.tensor([float(time.perf_counter() - t_start >= budget)], device=self._comm)
        if self.world > 1:
            dist.broadcast(flag, src=0)
        return bool(flag.item())

    def _diverged(self, exc: NonFiniteError) -> None:
        """Generation met non-finite logits: undo the update that caused them (or stop)."""
        if self.world > 1 or self.cfg.train.overlapped or not self.guard.rollback():
            raise RunStopped(f"step {self.step + 1}: {exc}; lower optim.lr, then --resume")
        self._pending = None
        self._applied = False
        self.skipped += 1
        notice(f"step {self.step + 1}: {exc}; the last update was rolled back")
        if self.engine is not None:
            self._sync_engine()
        self.guard.record(False, f"{exc}, after rolling the update back")

    def train(self, until: int | None = None) -> dict[str, Any]:
        """Run to ``train.steps`` (or to step ``until``, then return with the run still open:
        call ``train`` again to continue; CoPD's rounds). Returns the summary when the run
        is finished, else ``{"steps", "seconds"}``."""
        cfg = self.cfg
        total = self.total_steps
        stop = total if until is None else min(until, total)
        bar = None
        if self.main and cfg.run.progress:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=total,
                initial=self.step,
                desc=self.preset.name,
                unit="step",
                dynamic_ncols=True,
            )
        t_start = time.perf_counter()
        if self.main and self.step == 0 and cfg.run.eval_every:
            self.logger.log(0, self._eval_metrics())
        max_stale = cfg.train.max_staleness
        budget = cfg.train.max_minutes * 60 if cfg.train.max_minutes else None
        if self.stages is not None:
            max_stale = max(max_stale, self.stage_len - 1)
        m = cfg.mutual
        if m is not None and m.member is not None and self.exchange is None:
            raise ValueError(
                f"mutual.member {m.member!r}: a Mutual RL policy trains beside its peers "
                "through rlpost.llm.runtimes.mutual.run_mutual (rlpost-llm train with the run's config)"
            )
        finished = False
        try:
            while self.step < stop:
                t_step = time.perf_counter()
                pipe = cfg.train.pipeline == "rolloutpipe"
                try:
                    if pipe:  # generation and the update interleaved, chunk by chunk
                        col, upd, waited = self._pipe_step()
                    else:
                        col = self._broadcast(self._next_collected())
                except NonFiniteError as exc:
                    self._diverged(exc)  # the last update rolled back: this step again
                    continue
                if not pipe:
                    waited = time.perf_counter() - t_step  # the trainer waited for rollouts
                if self.exchange is not None:
                    col = self.exchange(self, col)
                if self._applied and not pipe:  # the last update generated finite logits
                    self.guard.record(True)
                    self._applied = False
                # (RolloutPipe updated already, on rollouts of the weights it updated)
                staleness = 0 if pipe else self.version - col.batch.policy_version
                if staleness > max_stale:
                    raise RuntimeError(f"rollouts are {staleness} versions stale (max {max_stale})")
                if self.main and cfg.train.async_rollouts and self.step + 1 < stop:
                    # overlaps the update
                    self._pending = self._executor.submit(self._timed_collect)
                metrics = dict(col.metrics)
                if pipe and upd:
                    metrics.update(upd)
                elif len(col.batch) and len(col.rewards) and not pipe:
                    metrics.update(self.update(col))
                else:
                    self.skipped += 1
                if self.main:
                    if self._pending is not None:
                        t_wait = time.perf_counter()
                        self._pending.result()  # the engine's weights must not change mid-generation
                        waited += time.perf_counter() - t_wait
                    with self._generator_paused():  # DORA: between two chunks
                        self._sync_engine()  # weight sync (own-copy engines) and version bump
                elif self._sharded:
                    self.learner.full_state_dict()  # (rank 0's engine sync is collective)
                self.step += 1
                if budget is not None and self._out_of_time(t_start, budget):
                    stop = total = self.step  # the budget's end is the run's end
                if not self.main:
                    if self._sharded and due(cfg.run.save_every, self.step, total):
                        self.learner.optimizer_state(self.optimizer)  # (rank 0 saves it)
                    continue
                own = col.own()
                rew, acc = col.rewards[own], col.accuracy[own]
                metrics.update(
                    {
                        "reward/mean": float(rew.mean()) if len(rew) else 0.0,
                        "reward/std": float(rew.std()) if len(rew) > 1 else 0.0,
                        "accuracy": float(acc.mean()) if len(acc) else 0.0,
                        "staleness": float(staleness),
                        "policy_version": float(self.version),
                        **self._pipeline_metrics(t_step, waited, int(own.sum())),
                    }
                )
                self.staleness_counts[int(staleness)] = (
                    self.staleness_counts.get(int(staleness), 0) + 1
                )
                if due(cfg.run.eval_every, self.step, total):
                    with self._generator_paused():
                        metrics.update(self._eval_metrics())
                self.logger.log(self.step, metrics)
                if due(cfg.run.save_every, self.step, total):
                    self.save()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(
                        reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.3f}"
                    )
            finished = self.step >= total
            if finished and self._own_group:
                # every rank waits here for rank 0's last checkpoint: a rank that tore down
                # its gloo group while rank 0 still wrote once aborted ('terminate called
                # without an active exception')
                dist.barrier()
        except BaseException:
            finished = True  # a failed run is closed (its logger flushed, workers stopped)
            raise
        finally:
            if bar is not None:
                bar.close()
            if finished:
                self.close()
        result: dict[str, Any] = {"steps": self.step, "seconds": time.perf_counter() - t_start}
        result["staleness_histogram"] = dict(sorted(self.staleness_counts.items()))
        if self.main and finished:
            rows = read_metrics(self.run_dir)
            data = " + ".join(d.task for d in cfg.data.mixture) or cfg.data.task
            result["plot"] = str(plot_curves(self.run_dir, f"{self.preset.name} on {data}"))
            result["summary"] = summary_table(rows)
            ev = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
            if ev:
                result["eval_before"], result["eval_after"] = ev[0], ev[-1]
            write_summary(self.run_dir, "llm", rows, result["seconds"], preset=self.preset.name)
        return result

    def save(self) -> Path:
        state: dict[str, Any] = {
            "version": self.version,
            "skipped": self.skipped,
            "data": self.source.state_dict(),
            "initial_entropy": self.initial_entropy,
            "env_next": self.env_next,
            "mipu_rejected": self.mipu_rejected,
        }
        tensors: dict[str, Tensor] = {}
        if self.regularizer is not None:
            t, rest = _split_state(self.reg_state, "reg")
            tensors.update(t)
            state["regularizer"] = rest
        if self.aux is not None:
            state["aux_data"] = self.aux.state_dict()
        if self.stages is not None:
            t, metas = self.stages.state()
            tensors.update(t)
            state["stage_buffer"] = metas
        if self.anchor is not None:
            state["vapr"] = self.anchor.state_dict()
        if self.memory is not None:
            state["memory"] = self.memory.state_dict()
        model, optimizer_state = self.model, None
        if self._sharded:  # the engine holds the current whole weights (synced after the
            model = self.engine.model  # update); the optimiser state is gathered
            optimizer_state = self.learner.optimizer_state(self.optimizer)
        return save_checkpoint(
            self.run_dir / "checkpoints",
            self.step,
            model,
            self.optimizer,
            self.scheduler,
            state,
            keep=self.cfg.run.keep_checkpoints,
            # LoRA: the adapters only (the frozen base comes from model.path on resume),
            # not a full copy of the base per checkpoint
            trainable_only=is_peft(self.model),
            extras=self._extras(),
            tensors=tensors,
            write_extra=lambda folder: save_pretrained_files(model, self.tok, folder),
            optimizer_state=optimizer_state,
        )

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self._made_engine and hasattr(self.engine, "close"):
            self.engine.close()  # (Ray rollout workers)
            self._made_engine = False
        if self.logger is not None:
            self.logger.close()
        if self._own_group and dist.is_initialized():  # (no rank exits with gloo threads up)
            dist.destroy_process_group()
            self._own_group = False
