"""The GRPO-family trainer: rollout -> reward -> advantage -> micro-batched update.

One step::

    prompts  = source.next_batch(prompts_per_step)                 (resumable position)
    rollouts = engine.generate(prompts, n=group_size)              (+ engine log-probs)
    rewards  = RewardPool.score(...)                               (worker processes, time limit)
    dynamic sampling: drop groups whose rewards are all equal, refill up to max_refill rounds
    overlong masking: responses cut by max_new_tokens leave the loss (not the advantages)
    A        = recipe.advantages(rewards, groups, mask[, -beta KL token rewards])
    for each update and micro-batch:
        logp, H = trainer forward (chunked log-softmax at the sampling temperature)
        loss    = recipe.policy_loss(PolicyBatch(logp, old, A, mask, rollout_logp, ref_logp,
                                     ..., global_tokens, global_sequences))  # by role
        loss.backward()
    (all-reduce gradients across ranks) -> clip -> step (skipped if loss / grad is not finite)

Any :mod:`rlpost.core` preset plugs in unchanged: the trainer computes the optional inputs
the recipe's entries declare they read (:meth:`rlpost.core.presets.Recipe.reads`), and the
config refuses at load a recipe needing one it cannot provide
(:data:`rlpost.llm.config.PROVIDES`). Asynchronous "one-step-off" mode
generates step t+1's rollouts on a weight snapshot in a background thread while step t
trains; every batch carries the policy version that generated it and the staleness bound
is enforced. Data parallelism: rank 0 generates and scores, the batch is broadcast, each
rank trains on its slice, and gradients are summed with ``all_reduce`` so a W-process run
equals a 1-process run with the same global batch.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlpost.core.advantages import AdvantageInput, TrainingDynamics
from rlpost.core.contract import Coupling, Input
from rlpost.core.io.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rlpost.core.kl import kl_reward_penalty
from rlpost.core.masked import masked_mean
from rlpost.core.presets import PolicyBatch
from rlpost.llm.config import Config
from rlpost.llm.data import make_prompt_source
from rlpost.llm.engines.base import RolloutBatch, RolloutEngine, SamplingParams
from rlpost.llm.policy import (
    Reference,
    completion_logprobs,
    fused_head,
    load_policy,
    make_seq_batch,
)
from rlpost.llm.rewards import RewardPool, math_verify_reward
from rlpost.llm.runlog import MetricsLogger, plot_curves, read_metrics, summary_table
from rlpost.llm.tasks import Example


@dataclass
class Collected:
    batch: RolloutBatch
    examples: list[Example]  # one per row
    rewards: Tensor  # [N]
    accuracy: Tensor  # [N] verifier score
    metrics: dict[str, float]


def _lr_lambda(schedule: str, warmup: int, total: int):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - frac
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * frac))
        return 1.0

    return f


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


class Trainer:
    def __init__(
        self,
        cfg: Config,
        *,
        model: torch.nn.Module | None = None,
        tokenizer=None,
        engine: RolloutEngine | None = None,
        reward_fn=None,
        resume: bool = False,
    ):
        self.cfg = cfg
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.world, self.rank = 1, 0
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if dist.is_initialized():
            self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.main = self.rank == 0
        coupling = cfg.preset().build().coupling()
        if self.world > 1 and coupling > Coupling.ROW:
            raise ValueError(
                f"preset {cfg.preset().name!r}'s loss couples the rows of a {coupling}, but "
                "data-parallel ranks take strided rows: run it on one process"
            )
        self.run_dir = Path(cfg.run.dir)
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(cfg.to_yaml())
        torch.manual_seed(cfg.run.seed)
        if model is None:
            model, tokenizer = load_policy(cfg, progress=cfg.run.progress and self.main)
        self.model, self.tok = model, tokenizer
        self.preset = cfg.preset()
        self.recipe = self.preset.build()
        self.reads = set(self.recipe.reads())  # the optional inputs worth computing
        self.source = make_prompt_source(
            cfg.data.task,
            dict(cfg.data.task_params),
            cfg.data.path,
            cfg.data.eval_size,
            cfg.data.seed,
        )
        self.kl_in_loss = self.recipe.kl_in_loss
        self.kl_in_reward = self.recipe.kl_in_reward
        self.reference = Reference(model) if (self.kl_in_loss or self.kl_in_reward) else None
        params = [q for q in model.parameters() if q.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(o.schedule, o.warmup_steps, cfg.train.steps)
        )
        r = cfg.rollout
        self.sampling = SamplingParams(
            r.max_new_tokens, r.temperature, r.top_p, r.top_k, tuple(r.stop)
        )
        self.engine = engine
        self.pool = None
        if self.main:
            if self.engine is None:
                self.engine = self._make_engine()
            fn = reward_fn or (
                self.source.task.score if cfg.data.path is None else math_verify_reward
            )
            self.pool = RewardPool(
                {"correct": fn}, workers=cfg.reward.workers, timeout_s=cfg.reward.timeout_s
            )
        self.step, self.version = 0, 0
        self.skipped = 0
        self.initial_entropy: float | None = None  # first batch's sampled-token entropy
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        resumed = None
        if resume:
            resumed = self._resume()
        self.logger = (
            MetricsLogger(self.run_dir, cfg.run.tensorboard, resumed) if self.main else None
        )

    # ------------------------------------------------------------------ setup
    def _make_engine(self) -> RolloutEngine:
        cfg = self.cfg
        if cfg.rollout.engine == "vllm":
            from safetensors.torch import save_file

            from rlpost.llm.engines import make_vllm_engine

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
        from rlpost.llm.engines.hf import HFEngine

        return HFEngine(self.model, self.tok, own_copy=cfg.train.async_rollouts)

    def _resume(self) -> int | None:
        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        if ckpt is None:
            return None
        state = load_checkpoint(ckpt, self.model, self.optimizer, self.scheduler)
        self.step, self.version, self.skipped = state["step"], state["version"], state["skipped"]
        self.initial_entropy = state.get("initial_entropy")
        self.source.load_state_dict(state["data"])
        if self.engine is not None:
            self._sync_engine()
        return self.step

    def _sync_engine(self) -> None:
        eng = self.engine
        if eng is None:
            return
        own = getattr(eng, "own_copy", True)
        if own:  # an engine holding its own weights (async snapshot, vLLM)
            sd = (
                merged_state_dict(self.model)
                if self.cfg.rollout.engine == "vllm"
                else self.model.state_dict()
            )
            eng.update_weights(sd, self.version)
        else:
            eng.update_weights({}, self.version)

    # ---------------------------------------------------------------- rollouts
    def _score(
        self, batch: RolloutBatch, examples: list[Example]
    ) -> tuple[Tensor, dict[str, float]]:
        rows = [examples[g] for g in batch.group.tolist()]
        res = self.pool.score(batch.texts(self.tok), rows)
        return res.rewards, res.metrics

    def collect(self) -> Collected:
        """Generate, score, and (dynamic sampling) keep groups whose rewards differ."""
        p, want = self.preset, self.cfg.rollout.prompts_per_step
        t0 = time.perf_counter()
        parts: list[tuple[RolloutBatch, list[Example], Tensor]] = []
        kept, rounds, seen_groups, metrics = 0, 0, 0, {}
        while True:
            examples = self.source.next_batch(want - kept if rounds else want)
            prompts = [self.tok(e.prompt, add_special_tokens=False).input_ids for e in examples]
            batch = self.engine.generate(prompts, p.group_size, self.sampling)
            rewards, metrics_r = self._score(batch, examples)
            for k, v in metrics_r.items():
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
                        (batch.select(rows), [examples[g] for g in good.tolist()], rewards[rows])
                    )
                kept += len(good)
                if kept >= want or rounds > self.cfg.train.max_refill:
                    break
            else:
                parts.append((batch, examples, rewards))
                kept = len(examples)
                break
        if not parts:
            return Collected(batch, [], torch.zeros(0), torch.zeros(0), {"dynamic/kept_frac": 0.0})
        merged = RolloutBatch.concat([b for b, _, _ in parts])
        exs = [e for _, es, _ in parts for e in es]
        rew = torch.cat([r for _, _, r in parts])
        if kept > want:  # trim surplus groups
            rows = torch.nonzero(merged.group < want).flatten()
            merged, exs, rew = merged.select(rows), exs[:want], rew[rows]
        metrics["dynamic/kept_frac"] = kept / max(seen_groups, 1) if p.dynamic_sampling else 1.0
        metrics["dynamic/rounds"] = float(rounds)
        metrics["time/rollout"] = time.perf_counter() - t0
        acc = (rew >= 1.0).float()  # the single verifier's score is the reward
        return Collected(merged, [exs[g] for g in merged.group.tolist()], rew, acc, metrics)

    # ------------------------------------------------------------------ update
    @torch.no_grad()
    def _logprobs_nograd(self, model, batch: RolloutBatch, mask: Tensor, entropy: bool = False):
        """``[N, L]`` log-probs of the sampled tokens under ``model`` (and, with ``entropy``,
        the per-position entropy too), masked, in micro-batches."""
        out = torch.zeros_like(mask)
        ent = torch.zeros_like(mask) if entropy else None
        mbs = self.cfg.optim.micro_batch_size
        for s in range(0, len(batch), mbs):
            sl = slice(s, s + mbs)
            sb = make_seq_batch(
                batch.prompt_ids[sl],
                batch.completion_ids[sl],
                batch.mask[sl],
                batch.pad_id,
                pack=self.cfg.model.pack_prompts,
            )
            lp, h = completion_logprobs(
                model, sb, self.sampling.temperature, impl=self.cfg.model.logprob_impl
            )
            out[sl] = lp * batch.mask[sl]
            if ent is not None:
                ent[sl] = h * batch.mask[sl]
        return (out, ent) if entropy else out

    def _dynamics(self, batch: RolloutBatch) -> TrainingDynamics | None:
        """Training progress, the sampled tokens' mean -log-prob as the entropy estimate,
        and its first value (``None`` when the engine log-probs are not finite)."""
        m = batch.mask
        entropy = float(-(batch.logprobs * m).sum() / m.sum().clamp_min(1.0))
        if self.initial_entropy is None and math.isfinite(entropy):
            self.initial_entropy = entropy
        progress = min(1.0, self.step / max(1, self.cfg.train.steps - 1))
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
        for need, part in (
            (Input.PROMPT_FEATURES, "prompt"),
            (Input.COMPLETION_FEATURES, "completion"),
        ):
            if need in self.reads:
                extras[f"{part}_features"] = self._pooled_hidden(model, batch, part)
        return extras

    @torch.no_grad()
    def _pooled_hidden(self, model, batch: RolloutBatch, part: str) -> Tensor:
        """``[N, H]`` (CPU, float32) mean of the last hidden states over the prompt or the
        completion tokens. Uses the decoder alone when the model has one (no logits, no
        per-layer states kept), in eval mode (no dropout); every rank computes all rows,
        so ranks agree on the features."""
        dec = fused_head(model)
        body = dec[0] if dec is not None else model
        dev = next(model.parameters()).device
        was_training = model.training
        model.eval()
        out = []
        mbs = self.cfg.optim.micro_batch_size
        try:
            for s in range(0, len(batch), mbs):
                sl = slice(s, s + mbs)
                sb = make_seq_batch(
                    batch.prompt_ids[sl], batch.completion_ids[sl], batch.mask[sl], batch.pad_id
                )
                res = body(
                    input_ids=sb.input_ids.to(dev),
                    attention_mask=sb.attention_mask.to(dev),
                    position_ids=sb.position_ids.to(dev),
                    output_hidden_states=dec is None,
                )
                h = res.last_hidden_state if dec is not None else res.hidden_states[-1]
                cols = slice(0, sb.P) if part == "prompt" else slice(sb.P, None)
                w = sb.attention_mask[:, cols].to(dev, h.dtype)[..., None]
                pooled = (h[:, cols] * w).sum(1) / w.sum(1).clamp_min(1.0)
                out.append(pooled.float().cpu())
        finally:
            model.train(was_training)
        return torch.cat(out)

    def update(self, col: Collected) -> dict[str, float]:
        cfg, p, batch = self.cfg, self.preset, col.batch
        model = self.model
        model.train()
        t0 = time.perf_counter()
        mask = batch.mask.clone()
        truncated = torch.tensor([r == "length" for r in batch.finish_reasons])
        if cfg.train.overlong_mask:
            mask[truncated] = 0.0
        need_old = cfg.optim.updates_per_batch > 1 or self.kl_in_reward
        old_logp = self._logprobs_nograd(model, batch, batch.mask) if need_old else None
        ref_logp = ref_entropy = None
        if self.reference is not None:
            with self.reference.active(model) as ref:
                ref_logp, ref_entropy = self._logprobs_nograd(ref, batch, batch.mask, entropy=True)
        token_rewards = None
        if self.kl_in_reward:
            token_rewards = kl_reward_penalty(old_logp, ref_logp, batch.mask, p.kl_coef, p.kl.name)
        extras = self._advantage_extras(model, batch)
        adv_out = self.recipe.advantages(
            AdvantageInput(
                col.rewards, batch.group, batch.mask, token_rewards=token_rewards, **extras
            )
        )
        adv, clip_range = adv_out.advantages, adv_out.clip_range
        dynamics = extras.get("dynamics")
        global_tokens = float(mask.sum())
        global_seqs = float((mask.sum(1) > 0).sum())
        mine = torch.arange(len(batch))[self.rank :: self.world]  # this rank's rows
        mbs = cfg.optim.micro_batch_size
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        mism = {"abs": 0.0, "max": 0.0, "k3": 0.0, "tok": 0.0}
        ent_sum = 0.0
        bad, grad_norm = False, float("nan")
        params = [q for q in model.parameters() if q.requires_grad]
        for epoch in range(cfg.optim.updates_per_batch):
            for s in range(0, len(mine), mbs):
                idx = mine[s : s + mbs]
                sub = batch.select(idx) if len(idx) != len(batch) else batch
                sb = make_seq_batch(
                    sub.prompt_ids,
                    sub.completion_ids,
                    sub.mask,
                    batch.pad_id,
                    pack=cfg.model.pack_prompts,
                )
                logp, ent = completion_logprobs(
                    model, sb, self.sampling.temperature, impl=cfg.model.logprob_impl
                )
                m = mask[idx]
                old = old_logp[idx] if old_logp is not None else logp.detach()
                out = self.recipe.policy_loss(
                    PolicyBatch(
                        logp,
                        old,
                        adv[idx],
                        m,
                        rollout_logp=batch.logprobs[idx],
                        ref_logp=ref_logp[idx] if ref_logp is not None else None,
                        ref_entropy=ref_entropy[idx] if ref_entropy is not None else None,
                        entropy=ent,
                        clip_range=clip_range[idx] if clip_range is not None else None,
                        group_ids=batch.group[idx],
                        dynamics=dynamics,
                        global_tokens=global_tokens,
                        global_sequences=global_seqs,
                    )
                )
                if not torch.isfinite(out.loss):
                    bad = True
                    break
                out.loss.backward()
                for k, v in out.metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
                if epoch == 0:  # training-inference mismatch on the behaviour policy's tokens
                    bm = sub.mask
                    d = (logp.detach() - sub.logprobs) * bm
                    mism["abs"] += float(d.abs().sum())
                    mism["max"] = max(mism["max"], float(d.abs().max()) if d.numel() else 0.0)
                    mism["k3"] += float((((-d).exp() - 1 + d) * bm).sum())
                    mism["tok"] += float(bm.sum())
                    ent_sum += float((ent.detach() * bm).sum())
            if self.world > 1:
                flag = torch.tensor([float(bad)])
                dist.all_reduce(flag)
                bad = bool(flag.item())
                for q in params:
                    if q.grad is None:
                        q.grad = torch.zeros_like(q)
                    dist.all_reduce(q.grad)
            if not bad:
                clip = cfg.optim.grad_clip if cfg.optim.grad_clip is not None else float("inf")
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
                bad = not math.isfinite(grad_norm)
            if bad:
                self.optimizer.zero_grad(set_to_none=True)
                break
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if bad:  # the schedule advances with applied updates only
            self.skipped += 1
        else:
            self.version += 1
            self.scheduler.step()
        if self.world > 1:
            t = torch.tensor([mism["abs"], mism["k3"], mism["tok"], ent_sum])
            dist.all_reduce(t)
            mism["abs"], mism["k3"], mism["tok"], ent_sum = t.tolist()
        ntok = max(mism["tok"], 1.0)
        lengths = batch.mask.sum(1)
        metrics = {k: sums[k] / counts[k] for k in sums}
        metrics.update(
            {
                "entropy": ent_sum / ntok,
                "response_length": float(lengths.mean()),
                "truncated_frac": float(truncated.float().mean()),
                "grad_norm": grad_norm,
                "lr": self.scheduler.get_last_lr()[0],
                "mismatch/abs_mean": mism["abs"] / ntok,
                "mismatch/abs_max": mism["max"],
                "mismatch/k3": mism["k3"] / ntok,
                "adv_abs_mean": float(masked_mean(adv.abs(), batch.mask)),
                "skipped_steps": float(self.skipped),
                "tokens/trained": global_tokens,
                "tokens/generated": float(batch.mask.sum()),
                "time/update": time.perf_counter() - t0,
            }
        )
        return metrics

    # -------------------------------------------------------------------- loop
    def evaluate(self, examples: list[Example] | None = None) -> float:
        """Greedy held-out accuracy (via the engine, after syncing the current weights)."""
        examples = examples or self.source.eval_examples
        prompts = [self.tok(e.prompt, add_special_tokens=False).input_ids for e in examples]
        greedy = SamplingParams(self.sampling.max_new_tokens, 0.0, stop=self.sampling.stop)
        batch = self.engine.generate(prompts, 1, greedy)
        rewards, _ = self._score(batch, examples)
        return float((rewards >= 1.0).float().mean())

    def _broadcast(self, col: Collected | None) -> Collected:
        if self.world == 1:
            return col
        box = [col]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _next_collected(self) -> Collected | None:
        if not self.main:
            return None
        if not self.cfg.train.async_rollouts:
            return self.collect()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout")
        if self._pending is None:
            self._pending = self._executor.submit(self.collect)
        col = self._pending.result()
        return col

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        total = cfg.train.steps
        bar = None
        if self.main and cfg.run.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, initial=self.step, desc="grpo", unit="step", dynamic_ncols=True)
        t_start = time.perf_counter()
        if self.main and self.step == 0 and cfg.run.eval_every:
            self.logger.log(0, {"eval/accuracy": self.evaluate()})
        try:
            while self.step < total:
                col = self._broadcast(self._next_collected())
                staleness = self.version - col.batch.policy_version
                if staleness > cfg.train.max_staleness:
                    raise RuntimeError(
                        f"rollouts are {staleness} versions stale (max {cfg.train.max_staleness})"
                    )
                if self.main and cfg.train.async_rollouts and self.step + 1 < total:
                    self._pending = self._executor.submit(self.collect)  # overlaps the update
                metrics = dict(col.metrics)
                if len(col.batch) and len(col.rewards):
                    metrics.update(self.update(col))
                else:
                    self.skipped += 1
                if self.main:
                    if self._pending is not None:
                        self._pending.result()  # the engine's weights must not change mid-generation
                    self._sync_engine()  # weight sync (own-copy engines) and version bump
                self.step += 1
                if not self.main:
                    continue
                metrics.update(
                    {
                        "reward/mean": float(col.rewards.mean()) if len(col.rewards) else 0.0,
                        "reward/std": float(col.rewards.std()) if len(col.rewards) > 1 else 0.0,
                        "accuracy": float(col.accuracy.mean()) if len(col.accuracy) else 0.0,
                        "staleness": float(staleness),
                        "policy_version": float(self.version),
                    }
                )
                if cfg.run.eval_every and (
                    self.step % cfg.run.eval_every == 0 or self.step == total
                ):
                    metrics["eval/accuracy"] = self.evaluate()
                self.logger.log(self.step, metrics)
                if cfg.run.save_every and (
                    self.step % cfg.run.save_every == 0 or self.step == total
                ):
                    self.save()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(
                        reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.3f}"
                    )
        finally:
            if bar is not None:
                bar.close()
            self.close()
        result: dict[str, Any] = {"steps": self.step, "seconds": time.perf_counter() - t_start}
        if self.main:
            rows = read_metrics(self.run_dir)
            result["plot"] = str(
                plot_curves(self.run_dir, f"{self.preset.name} on {cfg.data.task}")
            )
            result["summary"] = summary_table(rows)
            ev = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
            if ev:
                result["eval_before"], result["eval_after"] = ev[0], ev[-1]
        return result

    def save(self) -> Path:
        state = {
            "version": self.version,
            "skipped": self.skipped,
            "data": self.source.state_dict(),
            "initial_entropy": self.initial_entropy,
        }
        return save_checkpoint(
            self.run_dir / "checkpoints",
            self.step,
            self.model,
            self.optimizer,
            self.scheduler,
            state,
            keep=self.cfg.run.keep_checkpoints,
        )

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.logger is not None:
            self.logger.close()
