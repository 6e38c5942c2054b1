"""The preference trainer: offline and online / iterative DPO-family training.

Offline, one step::

    idx       = next batch_size pairs of a seeded per-epoch permutation    (resumable)
    for each micro-batch of pairs (chosen and rejected rows in one forward):
        logp_w, logp_l = sum_t log pi(y_t | x, y_<t)   over completion tokens  [b]  (temperature 1)
        out  = loss(PreferenceInput(logp_w, logp_l, ref_w, ref_l, |y_w|, |y_l|))  [b]
        (out.loss.sum() / batch_size).backward()        # accumulation equals the full batch
    clip -> step (skipped if the loss or the gradient is not finite)

The reference's sequence log-probs ``ref_w, ref_l [N]`` of every training and held-out
pair are computed once, before the first step (no grad, micro-batched), and only when the
loss reads them (``Input.REF_LOGPROBS in loss.reads``: not for SimPO or xi-DPO); the
reference copy is then released. On resume they are recomputed from the same initial
weights, bit for bit.

Online, one step: draw prompts, sample ``samples_per_prompt`` completions each from the
current policy (HF engine), score them with the task's verifier, pair one correct (chosen)
with one wrong (rejected) completion per prompt (prompts without both are skipped and
counted; up to ``max_refill`` more rounds of fresh prompts), compute the reference
log-probs of the new pairs, and take the step above. ``refresh_reference`` (iterative
DPO, ED-iDPO's setting): every ``round_steps`` steps the reference becomes the current
policy; its weights are checkpointed beside each checkpoint.

Held-out evaluation (``run.eval_every``): the loss's implicit-reward accuracy and margin
on held-out pairs, the policy's log-prob preference accuracy and margin
(``log pi(y_w) > log pi(y_l)``, comparable across losses), and for task data the greedy
held-out task accuracy. Loss entries are called through the registry (``Bound``); the
trainer never branches on a loss name.
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlpost.core._env import fix_mmap_threshold
from rlpost.core.contract import Input
from rlpost.core.guard import UpdateGuard, training_loop
from rlpost.core.io.checkpoint import load_checkpoint, save_checkpoint
from rlpost.core.io.config import ConfigError
from rlpost.core.io.curves import write_summary
from rlpost.core.io.metrics import MetricsLogger, read_metrics
from rlpost.core.io.rundir import (
    due,
    notice,
    open_run_dir,
    releases_run_dir,
    resume_checkpoint,
)
from rlpost.core.preference import PreferenceInput, xi_from_initial
from rlpost.llm.data.prompts import PromptSource, make_prompt_source, split_eval
from rlpost.llm.model.policy import (
    Reference,
    completion_logprobs,
    load_policy,
    make_seq_batch,
    pack_layout,
    save_pretrained_files,
)
from rlpost.llm.preference.config import PreferenceConfig
from rlpost.llm.preference.pairs import (
    PreferencePair,
    TokenPairs,
    load_pair_file,
    sample_train_examples,
    task_pairs,
)
from rlpost.llm.rollout.engines.base import RolloutEngine, SamplingParams
from rlpost.llm.rollout.rewards import RewardPool
from rlpost.llm.tools.runlog import plot_curves, summary_table
from rlpost.llm.train.optim import build_optimizer, lr_schedule

PANELS = [
    ("loss", ("loss", "eval/loss")),
    ("reward margin (chosen - rejected)", ("margin", "eval/margin")),
    ("preference accuracy", ("reward_acc", "eval/reward_acc", "eval/pref_acc")),
    ("held-out greedy accuracy", ("eval/accuracy",)),
]
LABELS = {
    "loss": "train",
    "eval/loss": "held-out",
    "margin": "train (implicit reward)",
    "eval/margin": "held-out (implicit reward)",
    "reward_acc": "train (implicit reward)",
    "eval/reward_acc": "held-out (implicit reward)",
    "eval/pref_acc": "held-out (log pi(y_w) > log pi(y_l))",
    "eval/accuracy": "greedy, task verifier",
}


@dataclass
class PairData:
    """Training and held-out pairs, and the task's prompt source (held-out examples for
    the greedy accuracy, the online prompt stream) when they come from a task."""

    train: list[PreferencePair]
    eval: list[PreferencePair]
    source: PromptSource | None


def make_pair_data(cfg: PreferenceConfig) -> PairData:
    """The pairs a config describes (raises :class:`ConfigError` for a bad file)."""
    d = cfg.data
    if d.path is not None:
        rows = load_pair_file(d.path, progress=cfg.run.progress, max_row_mb=d.max_row_mb)
        try:  # (a file with no more rows than eval_size: a tenth held out, with a notice)
            train, held = split_eval(rows, d.eval_size, f"data.path: {d.path}")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return PairData(train, held, None)
    source = make_prompt_source(d.task, dict(d.task_params), None, d.eval_size, d.seed)
    held = source.eval_examples
    train: list[PreferencePair] = []
    if cfg.mode == "offline":
        exs = sample_train_examples(source.task, d.train_size, d.seed, {e.prompt for e in held})
        train = task_pairs(source.task, exs, d.seed)
    return PairData(train, task_pairs(source.task, held, d.seed + 1), source)


class _RefreshableReference(Reference):
    """A frozen copy of the policy that :meth:`refresh` resets to the current policy
    (iterative DPO); LoRA policies are copied whole, adapters included."""

    def __init__(self, model: torch.nn.Module):
        self.lora = False
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def refresh(self, policy: torch.nn.Module) -> None:
        self.model.load_state_dict(policy.state_dict())


class PreferenceTrainer:
    """DPO-family training of a causal LM on preference pairs (see the module docstring).

    ``model`` / ``tokenizer``: use these instead of loading ``cfg.model``; ``engine``: the
    rollout engine for online sampling and greedy evaluation (default: an HF engine on the
    policy); ``resume``: continue ``run.dir``'s newest valid checkpoint exactly;
    ``overwrite``: replace the run ``run.dir`` holds (without either, one is refused).
    """

    def __init__(
        self,
        cfg: PreferenceConfig,
        model: torch.nn.Module | None = None,
        tokenizer=None,
        resume: bool = False,
        engine: RolloutEngine | None = None,
        overwrite: bool = False,
    ):
        self.cfg = cfg
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        fix_mmap_threshold(cfg.run.malloc_mmap_kb)
        self.loss = cfg.loss.build()
        self.needs_ref = Input.REF_LOGPROBS in self.loss.reads
        self.data = make_pair_data(cfg)  # a bad data file fails before the model loads
        self.run_dir = open_run_dir(cfg.run.dir, cfg, resume=resume, overwrite=overwrite)
        torch.manual_seed(cfg.run.seed)
        if model is None:
            model, tokenizer = load_policy(cfg, progress=cfg.run.progress)
        self.model, self.tok = model, tokenizer
        self.train_pairs = TokenPairs.from_pairs(self.data.train, tokenizer)
        self.eval_pairs = TokenPairs.from_pairs(self.data.eval, tokenizer)
        self.auto: dict[str, float] = {}  # parameters set from the initial model
        if cfg.loss.auto_param() is not None:  # (before any checkpoint loads)
            self.loss = self._auto_loss()
        self.online = cfg.mode == "online"
        self.refresh = self.online and cfg.online.refresh_reference
        self.reference: Reference | None = None
        if self.needs_ref:  # the initial weights, copied before any checkpoint loads
            self.reference = _RefreshableReference(model) if self.refresh else Reference(model)
        self.ref_train: tuple[Tensor, Tensor] | None = None  # [N] chosen, rejected
        self.ref_eval: tuple[Tensor, Tensor] | None = None
        self.total = self._total_steps()
        self.optimizer = build_optimizer(model, cfg.optim)
        o = cfg.optim
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_schedule(o.schedule, o.warmup_steps, self.total)
        )
        self._setup_task(engine)
        self.step, self.skipped = 0, 0
        self.guard = UpdateGuard.configured(model.parameters(), [self.optimizer], cfg.train.guard)
        self._bad: str | None = None  # why the last step applied nothing
        self.epoch, self.pos = 0, 0  # offline pair stream
        self._order: list[int] = []
        self._shuffle()
        resumed = self._resume() if resume else None
        self.logger = MetricsLogger.for_run(self.run_dir, cfg.run, resumed)

    def _auto_loss(self):
        """The loss with its ``auto`` parameter set from the initial model: xi-DPO's ``xi``
        = :func:`xi_from_initial` (0.9 quantile of the per-token ratio margins) over the
        training pairs. Deterministic, so a resumed run gets the same value."""
        key = self.cfg.loss.auto_param()
        cw, cl, nw, nl = self.all_logprobs(self.model, self.train_pairs)
        self.auto = {key: xi_from_initial(cw, cl, nw, nl)}
        notice(f"loss {self.cfg.loss.name}: {key} = {self.auto[key]:.4f} from the initial model")
        return self.cfg.loss.build(**self.auto)

    def _total_steps(self) -> int:
        """The run's optimizer steps: ``train.steps``, or offline with ``train.epochs`` that
        many passes over the training pairs in batches of ``train.batch_size``."""
        t = self.cfg.train
        if not self.online and t.epochs is not None:
            return max(1, math.ceil(t.epochs * len(self.train_pairs) / t.batch_size))
        return t.steps

    def _setup_task(self, engine: RolloutEngine | None) -> None:
        """With task data: ``task``, the rollout ``engine`` (``engine``, by default an HF
        engine on the policy) and the reward ``pool`` of its verifier; without, no task
        and no pool."""
        cfg = self.cfg
        self.task = self.data.source.task if self.data.source is not None else None
        self.engine = engine
        if self.engine is None and self.task is not None:
            from rlpost.llm.rollout.engines import make_local_engine

            self.engine = make_local_engine("auto", self.model, self.tok)
        self.pool = None
        if self.task is not None:
            self.pool = RewardPool(
                {"correct": self.task.score},
                workers=cfg.reward.workers,
                timeout_s=cfg.reward.timeout_s,
                memory_mb=cfg.reward.memory_mb,
            )

    # ------------------------------------------------------------------ state
    def _shuffle(self) -> None:
        import random

        self._order = list(range(len(self.train_pairs)))
        random.Random(self.cfg.data.seed * 1_000_003 + self.epoch).shuffle(self._order)

    def _next_indices(self, n: int) -> list[int]:
        """The next ``n`` training pairs of the seeded per-epoch permutation."""
        out = []
        while len(out) < n:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._shuffle()
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def _ref_path(self, ckpt: Path) -> Path:
        return ckpt.parent / f"reference-{ckpt.name}.safetensors"

    def _resume(self) -> int | None:
        ckpt = resume_checkpoint(self.run_dir)
        if ckpt is None:
            return None
        state = load_checkpoint(ckpt, self.model, self.optimizer, self.scheduler)
        self.step, self.skipped = state["step"], state["skipped"]
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._shuffle()
        if self.online:
            self.data.source.load_state_dict(state["data"])
        if self.refresh and self._ref_path(ckpt).is_file():
            from safetensors.torch import load_model

            load_model(self.reference.model, str(self._ref_path(ckpt)), strict=True)
        return self.step

    def save(self) -> Path:
        root = self.run_dir / "checkpoints"
        state = {"skipped": self.skipped, "epoch": self.epoch, "pos": self.pos}
        if self.online:
            state["data"] = self.data.source.state_dict()
        if self.refresh:  # written before the checkpoint is published (atomic pair)
            from safetensors.torch import save_model

            root.mkdir(parents=True, exist_ok=True)
            final = self._ref_path(root / f"step-{self.step:06d}")
            tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
            save_model(self.reference.model, str(tmp))
            os.replace(tmp, final)
        path = save_checkpoint(
            root,
            self.step,
            self.model,
            self.optimizer,
            self.scheduler,
            state,
            keep=self.cfg.run.keep_checkpoints,
            write_extra=lambda folder: save_pretrained_files(self.model, self.tok, folder),
        )
        for f in root.glob("reference-step-*.safetensors"):  # orphans of pruned checkpoints
            if not (root / f.name.removeprefix("reference-").removesuffix(".safetensors")).is_dir():
                f.unlink(missing_ok=True)
        return path

    # --------------------------------------------------------------- log-probs
    def _sequence_logprobs(
        self, model: torch.nn.Module, pairs: TokenPairs, idx: list[int]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(log pi(y_w), log pi(y_l), |y_w|, |y_l|)``, each ``[b]`` for ``b = len(idx)``:
        sums over completion tokens of :func:`completion_logprobs` at temperature 1, one
        forward over the ``2b`` chosen and rejected rows."""
        prompts, comp, mask = pairs.rows(idx)
        sb = make_seq_batch(
            prompts,
            comp,
            mask,
            pairs.pad_id,
            pack=self.cfg.model.pack_prompts,
            layout=pack_layout(self.cfg.model.pack_layout, model),
        )
        logp, _ = completion_logprobs(model, sb, 1.0, impl=self.cfg.model.logprob_impl)
        m = mask.to(logp.device)
        seq = (logp * m).sum(1)  # [2b]
        lens = m.sum(1)
        b = len(idx)
        return seq[:b], seq[b:], lens[:b], lens[b:]

    @torch.no_grad()
    def all_logprobs(self, model: torch.nn.Module, pairs: TokenPairs) -> tuple[Tensor, ...]:
        """:meth:`_sequence_logprobs` of every pair, no grad, in eval mode, in micro-batches
        of ``optim.micro_batch_size`` pairs: four ``[N]`` float32 CPU tensors."""
        was = model.training
        model.eval()
        parts: list[tuple[Tensor, ...]] = []
        mbs = self.cfg.optim.micro_batch_size
        try:
            for s in range(0, len(pairs), mbs):
                idx = list(range(s, min(s + mbs, len(pairs))))
                parts.append(
                    tuple(t.float().cpu() for t in self._sequence_logprobs(model, pairs, idx))
                )
        finally:
            model.train(was)
        if not parts:
            return tuple(torch.zeros(0) for _ in range(4))
        return tuple(torch.cat(p) for p in zip(*parts, strict=True))

    def _reference_logprobs(self, pairs: TokenPairs) -> tuple[Tensor, Tensor]:
        """The reference's ``(log ref(y_w), log ref(y_l))`` ``[N]`` of ``pairs``."""
        with self.reference.active(self.model) as ref:
            c, r, _, _ = self.all_logprobs(ref, pairs)
        return c, r

    # ----------------------------------------------------------------- update
    def update(
        self, pairs: TokenPairs, idx: list[int], ref: tuple[Tensor, Tensor] | None
    ) -> dict[str, float]:
        """One optimizer step on the pairs ``idx`` (``ref``: their reference log-probs
        ``[len(idx)]`` each, or ``None`` for a reference-free loss)."""
        self.model.train()
        t0 = time.perf_counter()
        cols, entry, bad = self._accumulate(pairs, idx, ref)
        grad_norm = self._apply_step(bad)
        metrics = {
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "skipped_steps": float(self.skipped),
            "pairs": float(len(idx)),
            "time/update": time.perf_counter() - t0,
        }
        if cols["loss"]:
            metrics.update(self._loss_metrics(cols, entry))
        return metrics

    def _accumulate(
        self, pairs: TokenPairs, idx: list[int], ref: tuple[Tensor, Tensor] | None
    ) -> tuple[dict[str, list[Tensor]], dict[str, float], bool]:
        """The backward of the step's loss (the mean over its pairs), micro-batch by
        micro-batch: each micro-batch's per-pair columns (loss, implicit rewards, log-probs,
        lengths), the loss entry's own metrics averaged over the pairs, and whether a
        non-finite loss stopped it."""
        model = self.model
        B, mbs = len(idx), self.cfg.optim.micro_batch_size
        dev = next(model.parameters()).device
        cols: dict[str, list[Tensor]] = {
            k: [] for k in ("loss", "rc", "rr", "lc", "lr", "nc", "nr")
        }
        entry: dict[str, float] = {}
        for s in range(0, B, mbs):
            sub = idx[s : s + mbs]
            c, r, nc, nr = self._sequence_logprobs(model, pairs, sub)
            out = self.loss(
                PreferenceInput(
                    c,
                    r,
                    ref[0][s : s + mbs].to(dev) if ref is not None else None,
                    ref[1][s : s + mbs].to(dev) if ref is not None else None,
                    nc,
                    nr,
                )
            )
            loss = out.loss.sum() / B  # the mean over the step's pairs, split exactly
            if not torch.isfinite(loss):
                return cols, entry, True
            loss.backward()
            for k, v in zip(
                cols, (out.loss, out.chosen_reward, out.rejected_reward, c, r, nc, nr), strict=True
            ):
                cols[k].append(v.detach().float().cpu())
            for k, v in out.metrics.items():  # the entry's means, weighted by pair count
                if k not in ("reward_acc", "margin"):
                    entry[k] = entry.get(k, 0.0) + v * len(sub) / B
        return cols, entry, False

    def _apply_step(self, bad: bool) -> float:
        """Clip and apply the accumulated gradient, or skip the step (``bad``: a non-finite
        loss; also a non-finite gradient or an update the guard rolls back), counting and
        noting it; the gradient norm (``nan`` when the loss was not finite)."""
        params = [q for q in self.model.parameters() if q.requires_grad]
        grad_norm = float("nan")
        if not bad:
            o = self.cfg.optim
            clip = o.grad_clip if o.grad_clip is not None else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
            bad = not math.isfinite(grad_norm)
        why = "non-finite loss or gradient"
        if not bad and not self.guard.step(self.optimizer.step):
            bad, why = True, self.guard.why
        self.optimizer.zero_grad(set_to_none=True)
        self._bad = why if bad else None
        if bad:
            notice(f"step {self.step + 1}: update skipped: {why}")
            self.skipped += 1
        else:
            self.scheduler.step()
        return grad_norm

    @staticmethod
    def _loss_metrics(cols: dict[str, list[Tensor]], entry: dict[str, float]) -> dict[str, float]:
        """The step's loss, implicit-reward and log-prob metrics over its pairs, then the
        loss entry's own."""
        t = {k: torch.cat(v) for k, v in cols.items()}
        return {
            "loss": float(t["loss"].mean()),
            "reward_acc": float((t["rc"] > t["rr"]).float().mean()),
            "margin": float((t["rc"] - t["rr"]).mean()),
            "chosen_reward": float(t["rc"].mean()),
            "rejected_reward": float(t["rr"].mean()),
            "logp/chosen": float(t["lc"].mean()),
            "logp/rejected": float(t["lr"].mean()),
            "logp/margin": float((t["lc"] - t["lr"]).mean()),
            "tokens/trained": float(t["nc"].sum() + t["nr"].sum()),
            **entry,
        }

    # ----------------------------------------------------------------- online
    def collect(self) -> tuple[TokenPairs, dict[str, float]]:
        """Sample, score and pair: up to ``online.pairs_per_step`` pairs of (a correct, a
        wrong) completion of one prompt each, from the current policy."""
        o, src = self.cfg.online, self.data.source
        t0 = time.perf_counter()
        k = o.samples_per_prompt
        sampling = SamplingParams(o.max_new_tokens, o.temperature)
        got: tuple[list, list, list] = ([], [], [])
        prompts_seen = skipped = rounds = 0
        correct_sum = samples = 0.0
        while len(got[0]) < o.pairs_per_step and rounds <= o.max_refill:
            exs = src.next_batch(o.pairs_per_step - len(got[0]))
            ids = [self.tok(e.prompt, add_special_tokens=False).input_ids for e in exs]
            batch = self.engine.generate(ids, k, sampling)
            rows = [exs[g] for g in batch.group.tolist()]
            ok = (self.pool.score(batch.texts(self.tok), rows).rewards >= 1.0).view(len(exs), k)
            lens = batch.mask.sum(1).long().tolist()
            for g in range(len(exs)):
                good = torch.nonzero(ok[g]).flatten().tolist()
                wrong = torch.nonzero(~ok[g]).flatten().tolist()
                if not good or not wrong:
                    skipped += 1
                    continue
                w, lo = g * k + good[0], g * k + wrong[0]
                got[0].append(ids[g])
                got[1].append(batch.completion_ids[w, : lens[w]].tolist())
                got[2].append(batch.completion_ids[lo, : lens[lo]].tolist())
            prompts_seen += len(exs)
            correct_sum += float(ok.float().sum())
            samples += ok.numel()
            rounds += 1
        pairs = TokenPairs(*got, pad_id=int(self.tok.pad_token_id))
        metrics = {
            "online/pairs": float(len(pairs)),
            "online/skipped_prompts": float(skipped),
            "online/prompts": float(prompts_seen),
            "online/rounds": float(rounds),
            "online/sample_accuracy": correct_sum / max(samples, 1.0),
            "time/generate": time.perf_counter() - t0,
        }
        return pairs, metrics

    # ----------------------------------------------------------------- eval
    def evaluate(self) -> dict[str, float]:
        """Held-out metrics: the loss and its implicit-reward accuracy / margin, the
        log-prob preference accuracy / margin, and (task data) greedy task accuracy."""
        t0 = time.perf_counter()
        out: dict[str, float] = {}
        ev = self.eval_pairs
        if len(ev):
            if self.needs_ref and self.ref_eval is None:
                self.ref_eval = self._reference_logprobs(ev)
            c, r, nc, nr = self.all_logprobs(self.model, ev)
            ref = self.ref_eval if self.needs_ref else (None, None)
            with torch.no_grad():
                res = self.loss(PreferenceInput(c, r, ref[0], ref[1], nc, nr))
            out = {
                "eval/loss": float(res.loss.mean()),
                "eval/reward_acc": float((res.chosen_reward > res.rejected_reward).float().mean()),
                "eval/margin": float((res.chosen_reward - res.rejected_reward).mean()),
                "eval/pref_acc": float((c > r).float().mean()),
                "eval/logp_margin": float((c - r).mean()),
                "eval/logp_chosen": float(c.mean()),
            }
        if self.task is not None:
            out["eval/accuracy"] = self.greedy_accuracy()
        out["time/eval"] = time.perf_counter() - t0
        return out

    def greedy_accuracy(self) -> float:
        """Greedy held-out task accuracy (the engine's generation, the task's verifier)."""
        exs = self.data.source.eval_examples
        ids = [self.tok(e.prompt, add_special_tokens=False).input_ids for e in exs]
        sp = SamplingParams(self.cfg.data.eval_max_new_tokens, 0.0)
        batch = self.engine.generate(ids, 1, sp)
        return float((self.pool.score(batch.texts(self.tok), exs).rewards >= 1.0).float().mean())

    # ------------------------------------------------------------------- loop
    def _prepare(self) -> None:
        """Offline: the reference log-probs of every training and held-out pair, once; the
        reference copy is released afterwards."""
        if self.online or not self.needs_ref or self.ref_train is not None:
            return
        self.ref_train = self._reference_logprobs(self.train_pairs)
        self.ref_eval = self._reference_logprobs(self.eval_pairs)
        self.reference = None

    def train_step(self) -> dict[str, float]:
        """One step (offline batch or online round trip); returns its metrics."""
        if not self.online:
            idx = self._next_indices(self.cfg.train.batch_size)
            ref = None
            if self.needs_ref:
                sel = torch.tensor(idx)
                ref = (self.ref_train[0][sel], self.ref_train[1][sel])
            return self.update(self.train_pairs, idx, ref)
        metrics: dict[str, float] = {}
        if self.refresh and self.step > 0 and self.step % self.cfg.online.round_steps == 0:
            self.reference.refresh(self.model)
            self.ref_eval = None
        if self.refresh:
            metrics["reference/round"] = float(self.step // self.cfg.online.round_steps)
        pairs, m = self.collect()
        metrics.update(m)
        if not len(pairs):
            self.skipped += 1
            return {**metrics, "skipped_steps": float(self.skipped)}
        ref = self._reference_logprobs(pairs) if self.needs_ref else None
        return {**metrics, **self.update(pairs, list(range(len(pairs))), ref)}

    @releases_run_dir(lambda self: self.run_dir)
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        bar = None
        if cfg.run.progress:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=self.total,
                initial=self.step,
                desc=cfg.loss.name,
                unit="step",
                dynamic_ncols=True,
            )
        t_start = time.perf_counter()
        try:
            self._prepare()
            if self.step == 0 and cfg.run.eval_every:
                self.logger.log(0, self.evaluate())
            with training_loop():  # a ValueError raised here is a bug: its traceback
                while self.step < self.total:
                    t0 = time.perf_counter()
                    self._bad = None
                    metrics = self.train_step()
                    self.step += 1
                    if due(cfg.run.eval_every, self.step, self.total):
                        metrics.update(self.evaluate())
                    metrics["time/step"] = time.perf_counter() - t0
                    self.logger.log(self.step, metrics)
                    self.guard.record(self._bad is None, self._bad or "")  # may stop the run
                    if due(cfg.run.save_every, self.step, self.total):
                        self.save()
                    if bar is not None:
                        bar.update(1)
                        if "loss" in metrics:
                            bar.set_postfix(
                                loss=f"{metrics['loss']:.3f}", acc=f"{metrics['reward_acc']:.2f}"
                            )
        finally:
            if bar is not None:
                bar.close()
            self.close()
        rows = read_metrics(self.run_dir)
        result: dict[str, Any] = {"steps": self.step, "seconds": time.perf_counter() - t_start}
        title = f"{cfg.loss.name} ({cfg.mode})"
        result["plot"] = str(plot_curves(self.run_dir, title, PANELS, LABELS))
        result["summary"] = summary_table(rows, SUMMARY_KEYS)
        for key, name in (
            ("eval/accuracy", "eval"),
            ("eval/pref_acc", "pref_acc"),
            ("eval/logp_margin", "margin"),
            ("eval/margin", "reward_margin"),
        ):
            vals = [r[key] for r in rows if key in r]
            if vals:
                result[f"{name}_before"], result[f"{name}_after"] = vals[0], vals[-1]
        result.update(self.auto)
        extra = {k: v for k, v in result.items() if k not in ("summary", "steps", "seconds")}
        write_summary(self.run_dir, "llm-preference", rows, result["seconds"], **extra)
        return result

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.logger is not None:
            self.logger.close()


# ------------------------------------------------------------------- outputs
SUMMARY_KEYS = [
    "loss",
    "reward_acc",
    "margin",
    "logp/chosen",
    "logp/rejected",
    "online/sample_accuracy",
    "eval/loss",
    "eval/reward_acc",
    "eval/margin",
    "eval/pref_acc",
    "eval/logp_margin",
    "eval/accuracy",
]


def run(cfg: PreferenceConfig, *, resume: bool = False, overwrite: bool = False) -> str:
    """The ``preference`` runtime (``rlpost-llm dpo``): the summary, held-out accuracy and
    preference margin before and after."""
    result = PreferenceTrainer(cfg, resume=resume, overwrite=overwrite).train()
    lines = [result.get("summary", "")]
    if "eval_before" in result:
        lines.append(
            f"held-out greedy accuracy: {result['eval_before']:.3f} -> {result['eval_after']:.3f}"
        )
    if "margin_before" in result:
        lines.append(
            f"preference margin: {result['margin_before']:.3f} -> {result['margin_after']:.3f} "
            "(held-out log pi(chosen) - log pi(rejected), nats); preference accuracy: "
            f"{result['pref_acc_before']:.3f} -> {result['pref_acc_after']:.3f}"
        )
    lines.append(
        f"{result['steps']} steps in {result['seconds']:.0f} s of training; curves: {result.get('plot')}"
    )
    return "\n".join(lines)
