"""The GRPO-family trainer: rollout -> reward -> advantage -> micro-batched update.

One step::

    col     = rollouts.step()            the rollout source: generate and score groups
                                         (when, and how, is the source's: sync, one step
                                         off, DORA, BubbleSpec, RolloutPipe, stages, ...)
    step    = providers(col)             the step's inputs the recipe reads (reference,
                                         critic values, features, teachers, ...)
    A       = recipe.advantages(step.advantage_input())
    update  = for each micro-batch: recipe.policy_loss(step.policy_batch(...)).backward()
              then one optimiser step      (step hooks around it: MIPU, a regulariser, ...)
    log, evaluate, checkpoint

What varies between methods is a registered component, never a branch here: rollout
sources (:mod:`rlpost.llm.rollout.sources`), input providers
(:mod:`rlpost.llm.train.providers`), step hooks (:mod:`rlpost.llm.train.hooks`); the
update itself is :mod:`rlpost.llm.train.update`. Any :mod:`rlpost.core` preset plugs in
unchanged: the config refuses at load a recipe needing an input no provider supplies and
any two components that cannot run together (:mod:`rlpost.llm.train.compat`).

Data parallelism: rank 0 generates and scores, the batch is broadcast, each rank trains
on its slice through torch's ``DistributedDataParallel`` (or FSDP2), so a W-process run
equals a 1-process run with the same global batch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlpost.core._env import fix_mmap_threshold
from rlpost.core.contract import Coupling
from rlpost.core.guard import NonFiniteError, RunStopped, UpdateGuard, training_loop
from rlpost.core.io.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_tensors,
    save_checkpoint,
)
from rlpost.core.io.curves import write_summary
from rlpost.core.io.rundir import (
    due,
    notice,
    open_run_dir,
    resume_checkpoint,
    unlock_run_dir,
)
from rlpost.core.peers import BASELINE
from rlpost.llm.config import Config
from rlpost.llm.data.prompts import make_prompts
from rlpost.llm.model.policy import is_peft, load_policy, save_pretrained_files
from rlpost.llm.rollout import sources
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.engines.base import RolloutEngine, SamplingParams
from rlpost.llm.rollout.engines.build import make_engine, sync_weights
from rlpost.llm.rollout.scoring import Scorer
from rlpost.llm.tools.runlog import MetricsLogger, plot_curves, read_metrics, summary_table
from rlpost.llm.train import compat, hooks, providers
from rlpost.llm.train.components import Components
from rlpost.llm.train.forward import Forwards, merged_state_dict
from rlpost.llm.train.inert import inert_rows, why_not
from rlpost.llm.train.inputs import Role, StepInputs
from rlpost.llm.train.optim import build_optimizer, lr_schedule
from rlpost.llm.train.parallel import Learner, Ranks, shards
from rlpost.llm.train.update import Updater

__all__ = ["Collected", "Trainer"]


class Trainer:
    """The GRPO-family / PPO trainer (see the module docstring).

    ``model`` / ``tokenizer``: use these instead of loading ``cfg.model``; ``engine``: the
    rollout engine (default: the one ``cfg.rollout`` describes); ``reward_fn``: the
    "correct" verifier instead of the task's; ``reward_funcs``: reward callables (a list,
    or ``{name: fn}``) replacing ``cfg.reward.funcs``, verifiers or TRL-style batched
    functions, weighted by ``cfg.reward.weights``; ``train_dataset``: a
    ``datasets.Dataset`` with a "prompt" column (text or chat messages) instead of
    ``cfg.data``; ``resume`` / ``overwrite``: what to do with a run ``run.dir`` holds.
    """

    _progress: Any = None  # the progress bar while train() runs (None: no bar)

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
        self.cfg, self._t_created = cfg, time.perf_counter()  # (the report counts set-up)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        fix_mmap_threshold(cfg.run.malloc_mmap_kb)
        self.dist = Ranks(cfg.run.device)
        self.main = self.dist.main
        self.preset = cfg.preset()
        self.recipe = self.preset.build()
        if self.dist.world > 1:  # what data-parallel ranks break (checked at start)
            compat.check(cfg, self.preset, self.recipe, [compat.data_parallel(self.dist.world)])
        self.run_dir = Path(cfg.run.dir)
        # the data first: a bad file or task is one line before the run directory exists
        need_answer = Scorer.needs_answer(cfg, reward_fn, reward_funcs)
        self.prompts = make_prompts(cfg, need_answer, train_dataset)
        if self.main:
            open_run_dir(self.run_dir, cfg, resume=resume, overwrite=overwrite)
        torch.manual_seed(cfg.run.seed)
        self.model, self.tok = self._policy(model, tokenizer)
        self.reads = providers.step_reads(cfg, self.recipe)  # what a step computes
        self.total_steps = cfg.train_steps()
        r = cfg.rollout
        self.sampling = SamplingParams(
            r.max_new_tokens, r.temperature, r.top_p, r.top_k, tuple(r.stop), r.min_new_tokens
        )
        self.step, self.version, self.skipped = 0, 0, 0
        self.applied = False  # the last update was applied and not yet confirmed
        self.staleness_counts: dict[int, int] = {}  # staleness -> steps trained at it
        self.components = Components([*providers.active(self), *hooks.active(self)])
        self.skips: bool | None = None  # whole groups only? (None: every row trains)
        if why_not(cfg, self.recipe, self.components, self.dist.world) is None:
            self.skips = self.recipe.coupling() == Coupling.GROUP
        self.rollouts = sources.build(self)
        sharded = shards(cfg.train.parallel, self.dist.world)
        early = self._make_engine(sharded) if sharded and self.main and engine is None else None
        self.learner = Learner(self.model, cfg.train.parallel)  # rank 0's weights everywhere
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.guard = UpdateGuard.configured(
            self.model.parameters(), [self.optimizer], cfg.train.guard
        )
        o = cfg.optim
        schedule = lr_schedule(o.schedule, o.warmup_steps, self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        shadow = r.kv_compression.shadow if r.kv_compression is not None else None
        self.forwards = Forwards(cfg, self.learner, self.model, r.temperature, shadow)
        self.updater = Updater(self)
        self.scorer = Scorer(cfg, self.prompts, self.tok, reward_fn, reward_funcs, pool=self.main)
        self.engine, self._made_engine = engine, False  # close() closes one it made
        if self.main and engine is None:
            self.engine, self._made_engine = early or self._make_engine(sharded), True
        resumed = self._resume() if resume else None
        self.logger = MetricsLogger.for_run(self.run_dir, cfg.run, resumed) if self.main else None

    # ------------------------------------------------------------------ setup
    def _policy(self, model, tokenizer) -> tuple[torch.nn.Module, Any]:
        cfg, device = self.cfg, self.dist.device
        if model is None:
            return load_policy(cfg, progress=cfg.run.progress and self.main, device=device)
        if device.type != "cpu" and next(model.parameters()).device.type == "cpu":
            model = model.to(device)  # a model passed on the CPU goes where the run says
        return model, tokenizer

    def _make_engine(self, sharded: bool) -> RolloutEngine:
        """The rollout source's own engine (BubbleSpec's), else the configured one (FSDP2:
        made before the weights are sharded, holding the whole weights)."""
        eng = self.rollouts.make_engine()
        if eng is not None:
            return eng
        own = self.cfg.train.overlapped or sharded
        return make_engine(
            self.cfg, self.model, self.tok, self.run_dir, merged_state_dict, own_copy=own,
            say=self.main,
        )  # fmt: skip

    def sync_engine(self) -> None:
        """The engine on the current weights (and the version they are)."""
        if self.engine is not None:
            sync_weights(
                self.engine, self.cfg, self.model, self.learner, self.version, merged_state_dict
            )

    # ---------------------------------------------------------------- rollouts
    def collect(self, want: int | None = None, given=None) -> Collected:
        """Generate and score ``want`` groups now (default ``rollout.prompts_per_step``),
        through the run's rollout sources (``given``: BubbleSpec's prompts and drafts)."""
        return self.rollouts.collect(want, given)

    def evaluate(self, examples: list | None = None) -> float:
        """Greedy held-out accuracy (via the engine, on its current weights); for an
        environment, the greedy success rate on ``data.eval_size`` held-out seeds."""
        return self.rollouts.evaluate(examples)

    # ------------------------------------------------------------------ update
    def step_inputs(self, col: Collected) -> StepInputs:
        """Everything the policy loss reads besides the training forward: the providers'
        inputs, the advantages, and the rows the loss sees (a peer's baseline rows not)."""
        step = StepInputs(col, col.batch.mask.clone())
        self.components.run("provide", step)
        out = self.recipe.advantages(step.advantage_input())
        step[Role.ADVANTAGES] = out.advantages
        skip = ("reward_mean", "adv_abs_mean")  # (the trainer logs its own)
        step.metrics.update({f"adv/{k}": v for k, v in out.metrics.items() if k not in skip})
        self.components.run("advantaged", step, out)
        trained = torch.ones(len(col.batch), dtype=torch.bool)
        if col.roles is not None:  # XGRPO's peer rows: in the advantage's baseline only
            trained = col.roles != BASELINE
            step.mask[~trained] = 0.0
        step[Role.TRAINED] = trained
        if self.skips is not None:  # rows adding nothing to the gradient: not forwarded
            adv = step[Role.ADVANTAGES]  # (as the hooks left them: what the loss reads)
            skip = inert_rows(step.mask, adv, col.batch.group, trained, self.skips)
            step[Role.SKIPPED] = skip
            step.metrics["update/skipped_rows"] = float(skip.float().mean())
        return step

    def update(self, col: Collected) -> dict[str, float]:
        """One update on ``col``: its inputs, every epoch of micro-batches, the hooks."""
        self.model.train()
        t0 = time.perf_counter()
        self.components.run("begin_update", col)
        step = self.step_inputs(col)
        acc, warmup = self.updater.run(step)
        metrics = self.updater.metrics([step], acc, warmup, t0)
        self.components.run("end_update", step, metrics)
        return metrics

    def confirm_update(self) -> None:
        """The last update generated finite logits: it was good."""
        if self.applied:
            self.guard.record(True)
            self.applied = False

    def _diverged(self, exc: NonFiniteError) -> None:
        """Generation met non-finite logits: undo the update that caused them (or stop)."""
        if self.dist.world > 1 or self.cfg.train.overlapped or not self.guard.rollback():
            raise RunStopped(f"step {self.step + 1}: {exc}; lower optim.lr, then --resume")
        self.rollouts.reset()
        self.applied = False
        self.skipped += 1
        notice(f"step {self.step + 1}: {exc}; the last update was rolled back")
        self.sync_engine()
        self.guard.record(False, f"{exc}, after rolling the update back")

    # -------------------------------------------------------------------- loop
    def eval_metrics(self) -> dict[str, float]:
        """``eval/accuracy`` (the current task), every curriculum task's, each mixture
        domain's (the overall: their mean), and what the hooks add (VAPR)."""
        p = self.prompts
        p.set_step(min(self.step, self.total_steps - 1))
        with self._status("evaluating held-out"):
            out = {} if p.mean_of_sets else {"eval/accuracy": self.evaluate()}
            for name, held in p.named_eval_sets().items():
                out[f"eval/{name}/accuracy"] = self.evaluate(held)
        if p.mean_of_sets:
            out["eval/accuracy"] = sum(out.values()) / len(out)
        self.components.run("evaluated", out)
        return out

    @contextlib.contextmanager
    def _status(self, what: str) -> Iterator[None]:
        """Say ``what`` the run is doing in its progress bar's description meanwhile."""
        bar = self._progress
        if bar is None:
            yield
            return
        bar.set_description_str(f"{self.preset.name} ({what})")
        try:
            yield
        finally:
            bar.set_description_str(self.preset.name)

    def _pipeline_metrics(self, t0: float, waited: float, rows: int) -> dict[str, float]:
        """The step's seconds, the share of them the trainer waited for rollouts, the share
        the generator was not generating, and rows generated per second."""
        t1 = time.perf_counter()
        dt = max(t1 - t0, 1e-9)
        busy = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in list(self.rollouts.busy_spans()))
        self.rollouts.forget_spans(t1)
        return {
            "time/step": dt,
            "time/trainer_idle": min(waited / dt, 1.0),
            "time/generator_idle": max(0.0, 1.0 - busy / dt),
            "time/rollouts_per_s": rows / dt,
        }

    def _train_step(self, stop: int, max_stale: int) -> tuple[Collected, dict, float] | None:
        """One step's rollouts and update (None: the last update diverged and was rolled
        back; this step again). Returns the rollouts, the metrics and the staleness."""
        t0 = time.perf_counter()
        try:
            got = self.rollouts.step(stop)
        except NonFiniteError as exc:
            self._diverged(exc)
            return None
        col = self.components.collected(got.col)
        staleness = 0  # (a source that trains as it generates updated on its own weights)
        if got.update is None:
            self.confirm_update()
            staleness = self.version - col.batch.policy_version
            if staleness > max_stale:
                raise RuntimeError(f"rollouts are {staleness} versions stale (max {max_stale})")
        self.rollouts.start_next(stop)  # (one step off: the next rollouts beside this update)
        metrics = dict(col.metrics)
        upd = got.update
        if upd is None and len(col.batch) and len(col.rewards):
            upd = self.update(col)
        if upd:
            metrics.update(upd)
        else:
            self.skipped += 1
        waited = got.waited
        if self.main:
            waited += self.rollouts.finish()  # the engine's weights must not change mid-generation
            with self.rollouts.syncing():  # DORA: between two chunks (or published only)
                self.sync_engine()  # weight sync (own-copy engines) and version bump
            if hasattr(self.engine, "sent"):  # Ray workers: the sync's size (LoRA: adapters)
                metrics["rollout/sync_mb"] = self.engine.sent[1] / 2**20
        elif self.learner.sharded:
            self.learner.full_state_dict()  # (rank 0's engine sync is collective)
        metrics.update(self._pipeline_metrics(t0, waited, int(col.own().sum())))
        return col, metrics, staleness

    def _log_step(self, col: Collected, metrics: dict, staleness: int, total: int) -> None:
        """Rank 0: the step's metrics (and evaluation when due), logged; a checkpoint."""
        own = col.own()
        rew, acc = col.rewards[own], col.accuracy[own]
        metrics.update(
            {
                "reward/mean": float(rew.mean()) if len(rew) else 0.0,
                "reward/std": float(rew.std()) if len(rew) > 1 else 0.0,
                "accuracy": float(acc.mean()) if len(acc) else 0.0,
                "staleness": float(staleness),
                "policy_version": float(self.version),
            }
        )
        self.staleness_counts[staleness] = self.staleness_counts.get(staleness, 0) + 1
        if due(self.cfg.run.eval_every, self.step, total):
            with self.rollouts.paused():
                metrics.update(self.eval_metrics())
        self.logger.log(self.step, metrics)
        if due(self.cfg.run.save_every, self.step, total):
            with self.rollouts.paused():  # DORA: its chunks, data position and RNG agree
                self.save()

    def _bar(self):
        if not (self.main and self.cfg.run.progress):
            return contextlib.nullcontext()
        from tqdm.auto import tqdm

        return tqdm(
            total=self.total_steps, initial=self.step, desc=self.preset.name, unit="step",
            dynamic_ncols=True,
        )  # fmt: skip

    def train(self, until: int | None = None) -> dict[str, Any]:
        """Run to ``train.steps`` (or to step ``until``, then return with the run still open:
        call ``train`` again to continue; CoPD's rounds). Returns the summary when the run
        is finished, else ``{"steps", "seconds"}``."""
        cfg = self.cfg
        total = self.total_steps
        stop = total if until is None else min(until, total)
        t_start = time.perf_counter()
        max_stale = self.rollouts.max_staleness(cfg.train.max_staleness)
        budget = cfg.train.max_minutes * 60 if cfg.train.max_minutes else None
        finished = False
        try:
            with self._bar() as bar, training_loop():  # a ValueError here is a bug
                self._progress = bar
                if self.main and self.step == 0 and cfg.run.eval_every:
                    self.logger.log(0, self.eval_metrics())
                while self.step < stop:
                    done = self._train_step(stop, max_stale)
                    if done is None:
                        continue
                    self.step += 1
                    if budget is not None and self.dist.past(t_start, budget):
                        stop = total = self.step  # the budget's end is the run's end
                    if not self.main:
                        if self.learner.sharded and due(cfg.run.save_every, self.step, total):
                            self.learner.optimizer_state(self.optimizer)  # (rank 0 saves it)
                        continue
                    col, metrics, staleness = done
                    self._log_step(col, metrics, staleness, total)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(
                            reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.3f}"
                        )
            finished = self.step >= total
            if finished:
                self.dist.finish()
        except BaseException:  # a failed run is closed (its logger flushed, workers stopped,
            self.close()  # its directory released)
            raise
        if not finished:
            return self._result(t_start, finished)
        self.close(release=False)  # the summary and plot are still to be written
        try:
            return self._result(t_start, finished)
        finally:
            self._release()

    def _result(self, t_start: float, finished: bool) -> dict[str, Any]:
        result: dict[str, Any] = {"steps": self.step, "seconds": time.perf_counter() - t_start}
        result["seconds_setup"] = t_start - self._t_created  # model, data, engine, workers
        result["staleness_histogram"] = dict(sorted(self.staleness_counts.items()))
        if self.main and finished:
            rows = read_metrics(self.run_dir)
            title = f"{self.preset.name} on {self.cfg.data.describe()}"
            result["plot"] = str(plot_curves(self.run_dir, title))
            result["summary"] = summary_table(rows)
            ev = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
            if ev:
                result["eval_before"], result["eval_after"] = ev[0], ev[-1]
            write_summary(self.run_dir, "llm", rows, result["seconds"], preset=self.preset.name)
        return result

    # ------------------------------------------------------------------ state
    def _stateful(self) -> list:
        return [c for c in [*self.components, *self.rollouts.chain()] if c.state_key]

    def save(self) -> Path:
        state: dict[str, Any] = {
            "version": self.version,
            "skipped": self.skipped,
            "data": self.prompts.state_dict(),
        }
        tensors: dict[str, Tensor] = {}
        for c in self._stateful():
            state[c.state_key], t = c.state_dict()
            tensors.update(t)
        model, optimizer_state = self.model, None
        if self.learner.sharded:  # the engine holds the current whole weights (synced after
            model = self.engine.model  # the update); the optimiser state is gathered
            optimizer_state = self.learner.optimizer_state(self.optimizer)
        return save_checkpoint(
            self.run_dir / "checkpoints", self.step, model, self.optimizer, self.scheduler,
            state, keep=self.cfg.run.keep_checkpoints,
            # LoRA: the adapters only (the frozen base comes from model.path on resume)
            trainable_only=is_peft(self.model), extras=self.components.checkpoint_extras(),
            tensors=tensors, optimizer_state=optimizer_state,
            write_extra=lambda folder: save_pretrained_files(model, self.tok, folder),
        )  # fmt: skip

    def _resume(self) -> int | None:
        if self.main:
            ckpt = resume_checkpoint(self.run_dir)
        else:
            ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        if ckpt is None:
            return None
        sharded = {}
        if self.learner.sharded:  # whole weights and optimiser state, each rank its shard
            sharded = {
                "load_model_state": self.learner.load_full_state_dict,
                "load_optimizer_state": lambda sd: self.learner.load_optimizer_state(
                    self.optimizer, sd
                ),
            }
        extras = self.components.checkpoint_extras()
        state = load_checkpoint(ckpt, self.model, self.optimizer, self.scheduler, extras, **sharded)
        self.step, self.version, self.skipped = state["step"], state["version"], state["skipped"]
        self.prompts.load_state_dict(state["data"])
        tensors = load_tensors(ckpt)
        for c in self._stateful():
            if c.state_key in state:
                c.load_state_dict(state[c.state_key], tensors)
        if self.engine is not None:
            self.sync_engine()
        elif self.learner.sharded:
            self.learner.full_state_dict()  # (rank 0's engine sync gathers collectively)
        return self.step

    def close(self, release: bool = True) -> None:
        """End the run: workers stopped, the logger closed, the process group destroyed, and
        (``release``) the run directory's lock released for other processes."""
        self.rollouts.close()
        self.scorer.close()
        for c in self.components:
            c.close()
        if self._made_engine and hasattr(self.engine, "close"):
            self.engine.close()  # (Ray rollout workers)
            self._made_engine = False
        if self.logger is not None:
            self.logger.close()
        self.dist.close()
        if release:
            self._release()

    def _release(self) -> None:
        if self.main:
            unlock_run_dir(self.run_dir)
