"""The diffusion post-training loop: one trainer for every method.

The method (``algo.method``, an entry of :data:`rlpost.diffusion.methods.METHODS`) names
its sampler, its training family, its advantage, its loss, what the loss reads and its
regularisers; the trainer dispatches through those registries and holds no method,
sampler or family names. Each step:

1. draw ``prompts.per_step`` prompts and ``group_size`` samples per prompt;
2. sample with the method's sampler (:data:`rlpost.diffusion.samplers.SAMPLERS`: an SDE
   recording the per-step log-probabilities, or the deterministic ODE);
3. decode, score with the reward, compute the method's advantage (core ``ADVANTAGES``);
4. update through the method's family (:data:`rlpost.diffusion.families.FAMILIES`): its
   plan, drawn before any update, orders the positions to train; each micro-batch's loss
   is the family's (``sde_replay``: the stored transitions of the trained denoising steps
   replayed; ``renoise``: each clean endpoint re-noised ``K`` times, the velocity
   regressed there), the run's regularisers (:data:`rlpost.diffusion.regularizers.
   REGULARIZERS`: the KL to the reference, NormGuard) added at every velocity it evaluates;
5. log metrics; every ``eval_every`` steps sample fixed prompts with fixed noise using
   the ODE and log reward, extra quality metrics and the velocity-norm ratio
   ``||v_theta|| / ||v_ref||`` along the model's own trajectories.

Checkpoints (model, optimizer, RNG) are atomic and resume exactly.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlpost.core import pick_device
from rlpost.core.advantages import AdvantageInput
from rlpost.core.guard import UpdateGuard, all_finite, training_loop
from rlpost.core.io.checkpoint import load_checkpoint, load_weights, save_checkpoint
from rlpost.core.io.curves import write_summary
from rlpost.core.io.metrics import MetricsLogger, read_metrics
from rlpost.core.io.rundir import (
    due,
    notice,
    open_run_dir,
    releases_run_dir,
    resume_checkpoint,
)
from rlpost.diffusion.config import Config
from rlpost.diffusion.families import FAMILIES
from rlpost.diffusion.models.base import Cond, FlowPolicy, cond_repeat
from rlpost.diffusion.regularizers import REGULARIZERS
from rlpost.diffusion.rewards import RewardFn, RewardScorer, quality_metrics
from rlpost.diffusion.runlog import plot_curves, save_grid, summary_table
from rlpost.diffusion.sampler import flow_sigmas
from rlpost.diffusion.samplers import Trajectory, sample


def load_policy(cfg: Config, device: torch.device) -> FlowPolicy:
    """The generator named by ``cfg.model`` (embedded digits model or an SD3 checkpoint)."""
    m = cfg.model
    if m.name == "digits":
        from rlpost.diffusion.models.digits import DigitsPolicy

        return DigitsPolicy.pretrained(progress=cfg.run.progress).to(device)
    if m.name == "digits-random":
        from rlpost.diffusion.models.digits import DigitsPolicy

        return DigitsPolicy.random(seed=cfg.run.seed).to(device)
    from rlpost.diffusion.models.sd3 import LoraSpec, SD3Policy

    lora = LoraSpec(r=m.lora.r, alpha=m.lora.alpha, dropout=m.lora.dropout) if m.lora else None
    return SD3Policy.from_pretrained(
        m.path,
        dtype=m.dtype,
        device=device,
        lora=lora if m.lora else LoraSpec(),
        guidance_scale=m.guidance_scale,
        resolution=m.resolution,
    )


@dataclass
class Batch:
    prompts: list[Any]
    cond: Cond
    group_ids: Tensor  # [B]
    traj: Trajectory
    rewards: Tensor  # [B]
    advantages: Tensor  # [B] (a weighting advantage: non-negative weights)
    metrics: dict[str, float]
    skip: str | None = None  # why this batch must not train (non-finite samples / rewards)
    diverged: bool = False  # the samples themselves are not finite: the last update's doing


class Trainer:
    """Runs ``cfg.train.steps`` steps of the configured method and writes ``cfg.run.dir``."""

    def __init__(
        self,
        cfg: Config,
        policy: FlowPolicy | None = None,
        reward: RewardFn | None = None,
        metrics: dict[str, RewardFn] | None = None,
    ):
        self.cfg = cfg
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.device = pick_device(cfg.run.device)
        torch.manual_seed(cfg.run.seed)
        self.policy = policy if policy is not None else load_policy(cfg, self.device)
        self.scorer: RewardScorer | None = None
        self.reward = reward if reward is not None else cfg.reward.load()
        self.quality = metrics if metrics is not None else quality_metrics(cfg.model.name)
        self.method = cfg.algo.bound_method()
        self.sampler_name, self.sampler_params = cfg.sampler_kind, cfg.sampler_params()
        self.family = FAMILIES.get(self.method.method.family.name)
        self.family_params = cfg.algo.family_params()
        self.regularizers = [(REGULARIZERS.get(r.name), REGULARIZERS.params(r.name, r.params))
                             for r in cfg.algo.regularizers()]  # fmt: skip
        self.regularizer_names = REGULARIZERS.names()  # (each logged, 0 when off)
        self.params = self.policy.trainable_parameters()
        self.opt = torch.optim.AdamW(
            self.params,
            lr=cfg.optim.lr,
            betas=cfg.optim.betas,
            weight_decay=cfg.optim.weight_decay,
        )
        self.guard = UpdateGuard.configured(self.params, [self.opt], cfg.train.guard)
        self._applied = False  # the last update was applied, not yet confirmed by sampling
        self._failed: str | None = None  # why the current step applied nothing
        self.run_dir = Path(cfg.run.dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.step = 0
        self.sigmas = flow_sigmas(cfg.sampler.steps, cfg.sampler.shift).to(self.device)
        self._eval_noise: Tensor | None = None
        #: decoded eval samples of the first and the latest evaluation (for figures)
        self.eval_images: dict[str, Tensor] = {}
        # LoRA on a frozen base: checkpoints hold the adapters only
        self._adapters_only = any(
            not p.requires_grad for p in self.policy.trainable_module().parameters()
        )

    @property
    def reward(self) -> RewardFn:
        return self.scorer.fn

    @reward.setter
    def reward(self, fn: RewardFn) -> None:
        """The reward, scored through a :class:`RewardScorer` (replaced with it)."""
        if self.scorer is not None:
            self.scorer.close()
        rc = self.cfg.reward
        self.scorer = RewardScorer(
            fn,
            rc.name.rpartition(":")[2],
            workers=rc.resolved_workers(),
            timeout_s=rc.timeout_s,
            memory_mb=rc.memory_mb,
        )

    # ------------------------------------------------------------------ rollouts

    def _draw_prompts(self) -> list[Any]:
        pool = self.cfg.prompts.prompts
        n = self.cfg.prompts.per_step
        # without replacement while the pool lasts
        many = n > len(pool)
        idx = torch.randint(len(pool), (n,)) if many else torch.randperm(len(pool))[:n]
        return [pool[int(i)] for i in idx]

    def _velocity(self, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        return self.policy.velocity(x, sigma, cond)

    @torch.no_grad()
    def collect(self) -> Batch:
        cfg, G = self.cfg, self.cfg.prompts.group_size
        prompts = self._draw_prompts()
        cond = cond_repeat(self.policy.encode(prompts), G)
        group_ids = torch.arange(len(prompts), device=self.device).repeat_interleave(G)
        shape = tuple(self.policy.sample_shape)
        noise = torch.randn((len(prompts) * G, *shape), device=self.device)
        if cfg.algo.resolved_shared_noise():
            noise = noise[::G].repeat_interleave(G, 0)
        traj = sample(
            self._velocity,
            cond,
            shape,
            kind=self.sampler_name,
            params=self.sampler_params,
            num_steps=cfg.sampler.steps,
            shift=cfg.sampler.shift,
            init_noise=noise,
            device=self.device,
        )
        flat_prompts = [p for p in prompts for _ in range(G)]
        if not all_finite([traj.x0]):
            n = int((~torch.isfinite(traj.x0.flatten(1))).any(1).sum())
            nan = torch.full((len(flat_prompts),), math.nan, device=self.device)
            why = f"{n} of {len(flat_prompts)} samples are not finite: the model diverged"
            m = {"reward/mean": math.nan}
            return Batch(flat_prompts, cond, group_ids, traj, nan, nan, m, skip=why, diverged=True)
        images = self.policy.decode(traj.x0)
        scored = self.scorer(images, flat_prompts)
        rewards = scored.rewards
        metrics = dict(scored.metrics)
        for name, fn in self.quality.items():
            metrics[name] = fn(images, flat_prompts).float().mean().item()
        if scored.bad:
            metrics["reward/mean"] = float(rewards.nanmean())  # NaN when all failed
            why = (
                f"{scored.bad} of {len(rewards)} rewards failed ({'; '.join(scored.failures[:2])})"
            )
            return Batch(flat_prompts, cond, group_ids, traj, rewards, rewards, metrics, skip=why)
        adv = self.method.advantage(AdvantageInput(rewards, group_ids)).advantages
        metrics.update(
            {
                "reward/mean": rewards.mean().item(),
                "reward/std": rewards.std().item(),
                "adv/abs_mean": adv.abs().mean().item(),
            }
        )
        return Batch(flat_prompts, cond, group_ids, traj, rewards, adv, metrics)

    # ------------------------------------------------------------------ updates

    def update(self, b: Batch) -> dict[str, float]:
        cfg = self.cfg
        plan = self.family.plan(self, b, self.family_params)  # (drawn before any update)
        chunks = plan.order.chunk(cfg.optim.minibatches)
        acc: dict[str, list[float]] = {}
        losses, norms = [], []
        bad: list[str] = []  # why minibatch updates were skipped
        for chunk in chunks:
            self.opt.zero_grad(set_to_none=True)
            denom = len(chunk)
            total = 0.0
            for mb in chunk.split(cfg.optim.micro_batch_size):
                loss, m = self.family.loss(self, b, plan, mb)
                (loss / denom).backward()
                total += loss.item() / denom
                for k, v in m.items():
                    acc.setdefault(k, []).append(v)
            if not math.isfinite(total) or not self.guard.grads_finite():
                self.opt.zero_grad(set_to_none=True)
                bad.append("non-finite loss or gradient")
                continue
            if cfg.optim.grad_clip is not None:
                norms.append(
                    float(torch.nn.utils.clip_grad_norm_(self.params, cfg.optim.grad_clip))
                )
            if not self.guard.step(self.opt.step):
                bad.append(self.guard.why)
                continue
            losses.append(total)
        out = {k: sum(v) / len(v) for k, v in acc.items()}
        out["skipped_nonfinite"] = float(len(bad))
        self._failed = bad[-1] if len(bad) == len(chunks) else None  # nothing applied
        if bad:
            notice(f"step {self.step + 1}: {len(bad)} of {len(chunks)} updates skipped: {bad[-1]}")
        self._applied = len(bad) < len(chunks)
        out["loss"] = sum(losses) / max(len(losses), 1)
        if norms:
            out["grad_norm"] = sum(norms) / len(norms)
        return out

    # ------------------------------------------------------------------ eval

    @torch.no_grad()
    def evaluate(self, save_grid_to: Path | None = None) -> dict[str, float]:
        """ODE samples for every prompt x ``eval_per_prompt`` with fixed noise."""
        cfg = self.cfg
        prompts = [p for p in cfg.prompts.prompts for _ in range(cfg.run.eval_per_prompt)]
        shape = tuple(self.policy.sample_shape)
        if self._eval_noise is None:
            g = torch.Generator().manual_seed(cfg.run.seed + 10_007)
            self._eval_noise = torch.randn((len(prompts), *shape), generator=g).to(self.device)
        traj = sample(
            self._velocity,
            self.policy.encode(prompts),
            shape,
            kind="ode",
            num_steps=cfg.sampler.eval_steps,
            shift=cfg.sampler.shift,
            init_noise=self._eval_noise,
            device=self.device,
            reference=self.policy.reference_velocity,
        )
        images = self.policy.decode(traj.x0)
        self.eval_images.setdefault("first", images)
        self.eval_images["last"] = images
        scored = self.scorer(images, prompts)
        out = {
            "eval/reward": float(scored.rewards.nanmean()) if scored.bad < len(prompts) else 0.0,
            "eval/reward_failed": float(scored.bad),
            "eval/vnorm_ratio": traj.velocity_norm_ratio.mean().item(),
        }
        for name, fn in self.quality.items():
            out[f"eval/{name}"] = fn(images, prompts).float().mean().item()
        if save_grid_to is not None:
            save_grid(images, prompts, save_grid_to, per_prompt=cfg.run.eval_per_prompt)
        return out

    # ------------------------------------------------------------------ loop

    def _state(self) -> dict[str, Any]:
        return {"method": self.cfg.algo.method}

    def _skip(self, why: str, diverged: bool) -> str:
        """A batch that must not train: say so; ``diverged`` (samples that are not finite)
        also undoes the last update (their cause). Returns the reason, for the guard's count."""
        if diverged and self._applied and self.guard.rollback():
            why += "; the last update was rolled back"
        self._applied = False
        notice(f"step {self.step + 1} skipped: {why}")
        return why

    @releases_run_dir(lambda self, *args, **kwargs: self.run_dir)
    def train(self, resume: bool = False, overwrite: bool = False) -> list[dict[str, Any]]:
        """Run the steps; ``resume`` continues the run in ``run.dir`` from its newest valid
        checkpoint, ``overwrite`` replaces it (with neither, a used ``run.dir`` is refused).
        The run directory is locked for the call and released after."""
        cfg = self.cfg
        open_run_dir(self.run_dir, cfg, resume=resume, overwrite=overwrite)
        ckpt = resume_checkpoint(self.run_dir) if resume else None
        if ckpt is not None:
            state = load_checkpoint(ckpt, self.policy.trainable_module(), self.opt, None)
            self.step = state["step"]
        logger = MetricsLogger.for_run(self.run_dir, cfg.run, self.step if ckpt else None)
        from tqdm.auto import tqdm

        bar = tqdm(
            total=cfg.train.steps,
            initial=self.step,
            disable=not cfg.run.progress,
            desc=f"{cfg.algo.method}",
            dynamic_ncols=True,
        )
        if self.step == 0:
            with _status(bar, f"{cfg.algo.method} (evaluating)"):
                before = self.run_dir / "samples_before.png"
                ev = self.evaluate(before) if cfg.run.eval_every else {}
            logger.log(0, ev)
        t0 = time.perf_counter()
        try:
            with training_loop():  # a ValueError raised here is a bug: its traceback
                while self.step < cfg.train.steps:
                    b = self.collect()
                    if b.skip is None:
                        if self._applied:  # the last update sampled finite images: it was good
                            self.guard.record(True)
                        m = {**b.metrics, **self.update(b), "skipped": 0.0}
                    else:
                        m = {**b.metrics, "skipped": 1.0}
                        self._failed = self._skip(b.skip, b.diverged)
                    self.step += 1
                    if due(cfg.run.eval_every, self.step, cfg.train.steps):
                        last = self.step == cfg.train.steps
                        with _status(bar, f"{cfg.algo.method} (evaluating)"):
                            grid = self.run_dir / "samples_after.png" if last else None
                            m.update(self.evaluate(grid))
                    m["time/elapsed_s"] = time.perf_counter() - t0
                    logger.log(self.step, m)
                    if self._failed is not None:  # after its row is logged: it may stop the run
                        self.guard.record(False, self._failed)
                    bar.update(1)
                    bar.set_postfix(reward=f"{m['reward/mean']:.3f}")
                    if due(cfg.run.save_every, self.step, cfg.train.steps):
                        save_checkpoint(
                            self.ckpt_dir,
                            self.step,
                            self.policy.trainable_module(),
                            self.opt,
                            None,
                            self._state(),
                            keep=cfg.run.keep_checkpoints,
                            trainable_only=self._adapters_only,
                        )
        finally:
            bar.close()
            logger.close()
            self.scorer.close()
        rows = read_metrics(self.run_dir)
        plot_curves(self.run_dir, title=f"{cfg.algo.method} on {cfg.reward.name}")
        (self.run_dir / "summary.txt").write_text(summary_table(rows) + "\n")
        write_summary(
            self.run_dir, "diffusion", rows, time.perf_counter() - t0, method=cfg.algo.method
        )
        return rows


def train_from_config(
    cfg: Config, resume: bool = False, overwrite: bool = False
) -> list[dict[str, Any]]:
    return Trainer(cfg).train(resume=resume, overwrite=overwrite)


@contextlib.contextmanager
def _status(bar: Any, what: str) -> Iterator[None]:
    """``what`` in the progress bar's description meanwhile."""
    if bar.disable:  # (a disabled bar has no description)
        yield
        return
    desc = bar.desc
    bar.set_description_str(what)
    try:
        yield
    finally:
        bar.set_description_str(desc)


def evaluate_checkpoint(
    cfg: Config, checkpoint: str | Path | None = None, grid: str | Path | None = None
) -> dict[str, float]:
    """ODE eval metrics of the base (``checkpoint=None``) or of a saved checkpoint folder
    (``.../checkpoints/step-000050``); loads weights through safetensors only."""
    t = Trainer(cfg)
    if checkpoint is not None:
        load_weights(Path(checkpoint), t.policy.trainable_module())
    return t.evaluate(Path(grid) if grid else None)
