"""The micro-batched update: forward and backward of a step's rows, then one optimiser
step, with the step's components called at their phases (:mod:`.components`).

Gradients of the micro-batches are summed into ``.grad``, each loss normalised by the
whole step's valid tokens and responses, so the sum equals the full batch's gradient; a
non-finite loss stops the update and the step is skipped (data-parallel ranks agree on
it). A ``W``-rank run equals a 1-rank run: DDP / FSDP2 average over ranks while each
rank's loss is multiplied by the world size before its backward.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlpost.core.io.rundir import notice
from rlpost.core.masked import masked_mean
from rlpost.llm.rollout.sources.base import back_reference
from rlpost.llm.train.components import MicroBatch
from rlpost.llm.train.inputs import Role, StepInputs


@dataclass
class Accum:
    """One update's sums over micro-batches (and RolloutPipe's chunks)."""

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    mism: dict[str, float] = field(
        default_factory=lambda: {"abs": 0.0, "max": 0.0, "k3": 0.0, "tok": 0.0, "drifted": 0.0}
    )
    ent_sum: float = 0.0
    bad: bool = False
    why: str = "non-finite loss or gradient"
    grad_norm: float = float("nan")

    def add(self, ms: dict[str, float]) -> None:
        for k, v in ms.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1

    def mismatch(self, logp: Tensor, ent: Tensor, sub: Any, own: Tensor) -> None:
        """Training-inference mismatch on the behaviour policy's own tokens."""
        bm = sub.mask * own
        d = (logp.detach() - sub.logprobs) * bm
        m = self.mism
        m["abs"] += float(d.abs().sum())
        m["max"] = max(m["max"], float(d.abs().max()) if d.numel() else 0.0)
        m["k3"] += float((((-d).exp() - 1 + d) * bm).sum())
        m["tok"] += float(bm.sum())
        m["drifted"] += float(((d != 0) & (bm > 0)).sum())
        self.ent_sum += float((ent.detach() * bm).sum())


class Updater:
    """The update of a trainer (``t``: its policy, optimiser, learner, components)."""

    def __init__(self, trainer: Any):
        self.t = back_reference(trainer)

    @staticmethod
    def accumulator() -> Accum:
        return Accum()

    def params(self) -> list[Tensor]:
        return [q for q in self.t.model.parameters() if q.requires_grad]

    def backward(
        self,
        step: StepInputs,
        rows: Tensor,
        epoch: int,
        counts: tuple[float, float],
        acc: Accum,
        warmup: bool,
    ) -> None:
        """Forward and backward of ``rows`` of a step in micro-batches, gradients summed
        into ``.grad`` (normalised by ``counts``: the step's valid tokens and responses)
        and metrics into ``acc``; stops at a non-finite loss (``acc.bad``)."""
        t, batch = self.t, step.batch
        chunks = t.learner.micro_batches(
            rows, t.cfg.optim.micro_batch_size, torch.arange(len(batch))
        )
        own = step.col.own().float().unsqueeze(1)  # the behaviour-mismatch metrics: own rows
        for j, (idx, weight) in enumerate(chunks):
            last = j == len(chunks) - 1
            t.learner.sync(last=last)  # all-reduce on the last micro-batch
            sub = batch.select(idx) if len(idx) != len(batch) else batch
            mb = MicroBatch(step, idx, sub, weight, last, len(chunks))
            t.components.run("micro_batch", mb, acc)
            if warmup:
                continue
            if self._policy_backward(mb, epoch, counts, acc, own[idx]):
                break

    def _policy_backward(
        self, mb: MicroBatch, epoch: int, counts: tuple[float, float], acc: Accum, own: Tensor
    ) -> bool:
        """One micro-batch of the policy loss; True: stop the update (non-finite loss)."""
        t = self.t
        res = t.forwards.train(mb.sub, **t.components.forward_kwargs(mb))
        logp, ent = res[0], res[1]
        extra = t.components.from_forward(mb, res)
        out = t.recipe.policy_loss(mb.step.policy_batch(mb.idx, logp, ent, extra, counts))
        loss = out.loss
        term = t.components.extra_loss(mb, logp, acc)
        if term is not None:
            loss = loss + term
        if not torch.isfinite(loss):
            acc.bad = True
            if t.dist.world == 1:
                return True  # (data-parallel ranks all take the synchronised backward)
        t.components.run("before_backward", mb)
        scale = mb.weight * t.learner.scale
        (loss * scale if scale != 1.0 else loss).backward()
        t.components.run("after_backward", mb, acc)
        if not mb.weight:
            return False  # a rank without rows: its zero-weight pass only syncs
        acc.add(out.metrics)
        if epoch == 0:  # training-inference mismatch on the behaviour policy's tokens
            acc.mismatch(logp, ent, mb.sub, own)
        return False

    def optimizer_step(self, acc: Accum, epoch: int) -> None:
        """Regularise, clip and apply the summed gradients (or drop them: ``acc.bad``)."""
        t = self.t
        params = self.params()
        if t.dist.world > 1:
            flag = torch.tensor([float(acc.bad)], device=t.dist.comm)
            dist.all_reduce(flag)
            acc.bad = bool(flag.item())
        if not acc.bad:
            t.components.run("before_step", acc, epoch)
            clip = t.cfg.optim.grad_clip
            norm = torch.nn.utils.clip_grad_norm_(params, clip if clip is not None else math.inf)
            if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor (the global norm, replicated)
                norm = norm.full_tensor()
            acc.grad_norm = float(norm)
            acc.bad = not math.isfinite(acc.grad_norm)
        if not acc.bad and not t.guard.step(t.optimizer.step):
            acc.bad = True
            acc.why = t.guard.why
        t.optimizer.zero_grad(set_to_none=True)

    def close(self, acc: Accum, warmup: bool) -> None:
        """The update's bookkeeping: a skipped one is recorded, an applied one advances the
        version and the schedule (only the critic trained in a warm-up: nothing moves)."""
        t = self.t
        if acc.bad and not warmup:
            notice(f"step {t.step + 1}: update skipped: {acc.why}")
            t.guard.record(False, acc.why)
        t.applied = not acc.bad and not warmup  # confirmed by the next generation
        if warmup:
            return
        if acc.bad:  # the schedule advances with applied updates only
            t.skipped += 1
        else:
            t.version += 1
            t.scheduler.step()

    def run(self, step: StepInputs) -> tuple[Accum, bool]:
        """Every epoch of ``optim.updates_per_batch`` over this rank's rows of ``step``."""
        t = self.t
        counts = step.counts()
        mine = step.trained_rows()[t.dist.rank :: t.dist.world]
        warmup = not t.components.trains_policy()
        acc = Accum()
        for epoch in range(t.cfg.optim.updates_per_batch):
            if not warmup:
                t.components.run("begin_epoch", step, epoch, acc)
            self.backward(step, mine, epoch, counts, acc, warmup)
            t.components.run("end_epoch", acc)
            if warmup:
                continue
            self.optimizer_step(acc, epoch)
            if acc.bad:
                break
        self.close(acc, warmup)
        return acc, warmup

    def metrics(
        self, steps: list[StepInputs], acc: Accum, warmup: bool, t0: float
    ) -> dict[str, float]:
        """The update's metrics over its steps' inputs (one, or RolloutPipe's chunks)."""
        t = self.t
        mism = acc.mism
        if t.dist.world > 1:
            v = torch.tensor(
                [mism["abs"], mism["k3"], mism["tok"], acc.ent_sum], device=t.dist.comm
            )
            dist.all_reduce(v)
            mism["abs"], mism["k3"], mism["tok"], acc.ent_sum = v.tolist()
        sums = dict(acc.sums)
        metrics = {k: sums[k] / acc.counts[k] for k in sums}
        global_tokens = sum(s.counts()[0] for s in steps)
        if "value/clip_tokens" in sums:  # a count: the fraction of clipped value tokens
            metrics["value/clip_frac"] = sums.pop("value/clip_tokens") / max(
                global_tokens * t.cfg.optim.updates_per_batch, 1.0
            )
            metrics.pop("value/clip_tokens", None)
        for s in steps:  # (the estimator's and token weighting's: their mean over chunks)
            for k, v in s.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v / len(steps)
        if not warmup:
            ntok = max(mism["tok"], 1.0)
            metrics.update(
                {
                    "entropy": acc.ent_sum / ntok,
                    "mismatch/abs_mean": mism["abs"] / ntok,
                    "mismatch/abs_max": mism["max"],
                    "mismatch/k3": mism["k3"] / ntok,
                    # the share of tokens whose log-prob is not bitwise the engine's
                    "mismatch/drifted": mism["drifted"] / ntok,
                    "grad_norm": acc.grad_norm,
                }
            )
        metrics.update(self._batch_metrics(steps, global_tokens, t0))
        return metrics

    def _batch_metrics(self, steps: list[StepInputs], tokens: float, t0: float) -> dict:
        t = self.t
        lengths = torch.cat([s.batch.mask.sum(1) for s in steps])
        truncated = torch.cat([s[Role.TRUNCATED] for s in steps]).float()
        adv_abs = sum(
            float(masked_mean(s[Role.ADVANTAGES].detach().abs(), s.batch.mask))
            * float(s.batch.mask.sum())
            for s in steps
        )
        own_tokens = sum(
            float((s.batch.mask * s.col.own().float().unsqueeze(1)).sum()) for s in steps
        )
        return {
            "response_length": float(lengths.mean()),
            "truncated_frac": float(truncated.mean()),
            "lr": t.scheduler.get_last_lr()[0],
            "adv_abs_mean": adv_abs / max(float(lengths.sum()), 1.0),
            "skipped_steps": float(t.skipped),
            "tokens/trained": tokens,
            "tokens/generated": own_tokens,
            "time/update": time.perf_counter() - t0,
        }
