"""Dynamic Latent Routing (DLR, catalog 000-22): discrete latent codes, a routing policy
and the model's parameters learned together by search, select, update.

The model gets ``K`` new tokens, the codes ``<z0>`` .. ``<zK-1>``. A training example
``(x, y)`` is written ``x <z> y <eos>``: the code is a latent choice of sub-policy made
before the answer, and the model's own next-token distribution over the codes after
``x`` is the routing policy ``pi(z | x)`` (renormalised over the ``K`` codes). Each step:

* **search**: every code is tried on every example of the batch, one no-grad forward of
  ``B * K`` sequences: ``log p(y | x, z)`` and ``log pi(z | x)``;
* **select**: each example's code ``z* = argmax_z log p(y | x, z) + log pi(z | x)`` (the
  posterior mode, the cheapest path in GDS's terms; ``select: likelihood`` drops the
  routing term);
* **update**: one gradient step on ``-log p(y | x, z*) - routing_coef * log pi(z* | x)``:
  the selected sub-policy and the router move together, in one stage.

At inference the router picks ``argmax_z pi(z | x)`` and the model answers after it.
``codes: 0`` is plain supervised fine-tuning through the same trainer (the baseline).

By default (``placement: delimiter``) a code takes the place of the prompt's last token,
the task's delimiter (``"12+34="`` is trained as ``"12+34<z3>46"``), and every code
starts at the delimiter's embedding plus a little seeded noise (identical codes would tie
in the search forever): untrained codes then leave the model as it was. A fresh code
appended after the prompt drops the tiny 2-digit base from 34 % to 1 % held-out accuracy
before any training; in the delimiter's place it keeps 34 %. :class:`DLRTrainer` trains on a small fixed set of a task's
examples (the low-data regime of the abstract) and reports held-out greedy accuracy;
checkpoints are the trainer's atomic ones (``from_pretrained`` loads them, codes in the
tokenizer) and ``--resume`` continues exactly.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from rlpost.core.io.checkpoint import load_checkpoint, save_checkpoint
from rlpost.core.io.config import ConfigError, load_validated
from rlpost.core.io.curves import write_summary
from rlpost.core.io.metrics import MetricsLogger, read_metrics
from rlpost.core.io.rundir import due, open_run_dir, releases_run_dir, resume_checkpoint
from rlpost.core.io.schema import Strict as _Strict
from rlpost.llm.data.tasks import Example, make_task
from rlpost.llm.model.config import ModelConfig
from rlpost.llm.model.policy import load_policy, save_pretrained_files
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.tools.runlog import plot_curves, summary_table
from rlpost.llm.train.config import OptimConfig, RunConfig
from rlpost.llm.train.optim import build_optimizer, lr_schedule

__all__ = [
    "ConfigError",
    "DLRConfig",
    "DLRTrainer",
    "add_codes",
    "load_dlr_config",
    "search_codes",
    "select_codes",
]


# ------------------------------------------------------------------- config
class DLRDataConfig(_Strict):
    task: Literal["arithmetic", "countdown"] = "arithmetic"
    """The built-in task: its examples (prompt, reference answer) and its verifier."""
    task_params: dict[str, Any] = Field(default_factory=dict)
    train_size: int = Field(256, ge=1)
    """Training examples (a fixed set, reused every epoch: the low-data regime)."""
    eval_size: int = Field(256, ge=1)
    eval_max_new_tokens: int = Field(6, ge=1)
    seed: int = 0


class LatentConfig(_Strict):
    codes: int = Field(8, ge=0)
    """``K`` discrete codes (0: plain SFT, the baseline)."""
    select: Literal["posterior", "likelihood"] = "posterior"
    """The selected code: ``argmax log p(y | x, z) + log pi(z | x)``, or without the router."""
    routing_coef: float = Field(1.0, ge=0)
    """Weight of the router's cross-entropy toward the selected code."""
    placement: Literal["delimiter", "append"] = "delimiter"
    """``delimiter``: the code takes the place of the prompt's last token (the task's
    delimiter, ``=`` / ``:``) and starts from its embedding, so untrained codes leave the
    model's behaviour as it was; ``append``: after the whole prompt, from the mean
    embedding."""
    init_noise: float = Field(0.05, gt=0)
    """Std of the new code embeddings' noise, in units of the embeddings' std."""


class DLRTrainConfig(_Strict):
    steps: int = Field(400, ge=1)
    batch_size: int = Field(32, ge=1)


class DLRConfig(_Strict):
    model: ModelConfig = ModelConfig()
    data: DLRDataConfig = DLRDataConfig()
    latent: LatentConfig = LatentConfig()
    optim: OptimConfig = OptimConfig(lr=1e-3)
    train: DLRTrainConfig = DLRTrainConfig()
    run: RunConfig = RunConfig(dir="runs/dlr")


def load_dlr_config(path=None, overrides: list[str] | None = None) -> DLRConfig:
    """Defaults <- YAML recipe <- ``a.b=c`` overrides, validated (raises :class:`ConfigError`)."""
    return load_validated(DLRConfig, path, overrides)


# --------------------------------------------------------------------- math
def add_codes(
    model: torch.nn.Module, tok, k: int, noise: float = 0.05, seed: int = 0, like: int | None = None
) -> list[int]:
    """Add the ``k`` code tokens to ``tok`` and ``model`` (once; a tokenizer that has them
    keeps its ids), new embeddings at token ``like``'s (default: the mean embedding) plus
    ``noise`` x the embeddings' std of seeded noise."""
    names = [f"<z{i}>" for i in range(k)]
    new = [n for n in names if n not in tok.get_vocab()]
    if new:
        tok.add_special_tokens(
            {"additional_special_tokens": new}, replace_extra_special_tokens=False
        )
        old = model.get_input_embeddings().weight.shape[0]
        model.resize_token_embeddings(len(tok), mean_resizing=False)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for emb in {model.get_input_embeddings(), model.get_output_embeddings()} - {None}:
                w = emb.weight
                centre = w[like] if like is not None else w[:old].mean(0)
                fresh = torch.randn(w.shape[0] - old, w.shape[1], generator=gen)
                w[old:] = centre + noise * w[:old].std(0) * fresh
    return tok.convert_tokens_to_ids(names)


def _sequences(
    prompts: list[list[int]], codes: list[int | None], answers: list[list[int]], pad: int
):
    """Right-padded ``x [z] y`` ids, attention mask, the answer tokens' positions (target
    mask) and each row's routing position (the last prompt token)."""
    seqs = [
        p + ([c] if c is not None else []) + a
        for p, c, a in zip(prompts, codes, answers, strict=True)
    ]
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    att = torch.zeros(len(seqs), L, dtype=torch.long)
    tgt = torch.zeros(len(seqs), L)
    for i, (s, p, c) in enumerate(zip(seqs, prompts, codes, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
        tgt[i, len(p) + (c is not None) : len(s)] = 1.0
    route = torch.tensor([len(p) - 1 for p in prompts])
    return ids, att, tgt, route


def _token_logp(model, ids: Tensor, att: Tensor) -> tuple[Tensor, Tensor]:
    """``(log p of each token given its prefix [B, L] (0 at position 0), logits [B, L, V])``."""
    logits = model(input_ids=ids, attention_mask=att).logits.float()
    lp = torch.zeros(ids.shape, dtype=torch.float32)
    lp[:, 1:] = logits[:, :-1].log_softmax(-1).gather(2, ids[:, 1:, None])[..., 0]
    return lp, logits


def search_codes(model, prompts, answers, code_ids: list[int], pad: int) -> tuple[Tensor, Tensor]:
    """``(log p(y | x, z), log pi(z | x))``, both ``[B, K]``: every code on every example,
    one no-grad forward of ``B * K`` sequences."""
    B, K = len(prompts), len(code_ids)
    rows_p = [p for p in prompts for _ in range(K)]
    rows_a = [a for a in answers for _ in range(K)]
    rows_c = [c for _ in prompts for c in code_ids]
    ids, att, tgt, route = _sequences(rows_p, rows_c, rows_a, pad)
    with torch.no_grad():
        lp, logits = _token_logp(model, ids, att)
    lp_y = (lp * tgt).sum(1).view(B, K)
    at = logits[torch.arange(B * K), route][:, code_ids].log_softmax(-1)  # [B*K, K]
    lp_z = at.view(B, K, K)[:, 0, :]  # the routing distribution is the same for every row
    return lp_y, lp_z


def select_codes(lp_y: Tensor, lp_z: Tensor, select: str = "posterior") -> Tensor:
    """``[B]`` index of each example's selected code (first on ties)."""
    score = lp_y + lp_z if select == "posterior" else lp_y
    return score.argmax(1)


# ------------------------------------------------------------------ trainer
class DLRTrainer:
    """Search-select-update on a fixed set of a task's examples (see the module docstring).
    ``resume``: continue ``run.dir``'s newest checkpoint exactly; ``overwrite``: replace
    the run there (without either, a used run directory is refused)."""

    def __init__(self, cfg: DLRConfig, resume: bool = False, overwrite: bool = False):
        self.cfg = cfg
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.task = make_task(cfg.data.task, **cfg.data.task_params)
        self.run_dir = open_run_dir(cfg.run.dir, cfg, resume=resume, overwrite=overwrite)
        torch.manual_seed(cfg.run.seed)
        self.model, self.tok = load_policy(cfg, progress=cfg.run.progress)
        lc = cfg.latent
        held = self.task.sample(cfg.data.eval_size, random.Random(f"dlr-heldout-{cfg.data.seed}"))
        seen = {e.prompt for e in held}
        rng, train = random.Random(f"dlr-train-{cfg.data.seed}"), []
        while len(train) < cfg.data.train_size:
            train += [e for e in self.task.sample(cfg.data.train_size, rng) if e.prompt not in seen]
        self.train_set, self.eval_set = train[: cfg.data.train_size], held
        self.replace_last = lc.codes > 0 and lc.placement == "delimiter"
        like = None
        if self.replace_last:  # the most common last prompt token: the task's delimiter
            last = [self.tok(e.prompt, add_special_tokens=False).input_ids[-1] for e in train]
            like = max(set(last), key=last.count)
        self.codes = add_codes(self.model, self.tok, lc.codes, lc.init_noise, cfg.run.seed, like)
        self.pad = int(self.tok.pad_token_id)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        o = cfg.optim
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_schedule(o.schedule, o.warmup_steps, cfg.train.steps)
        )
        self.step, self.epoch, self.pos = 0, 0, 0
        self.engine = None
        self._order: list[int] = []
        self._shuffle()
        resumed = self._resume() if resume else None
        self.logger = MetricsLogger.for_run(self.run_dir, cfg.run, resumed)

    # ------------------------------------------------------------------ state
    def _shuffle(self) -> None:
        self._order = list(range(len(self.train_set)))
        random.Random(self.cfg.data.seed * 1_000_003 + self.epoch).shuffle(self._order)

    def _batch(self) -> list[Example]:
        out = []
        while len(out) < self.cfg.train.batch_size:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._shuffle()
            out.append(self.train_set[self._order[self.pos]])
            self.pos += 1
        return out

    def _resume(self) -> int | None:
        ckpt = resume_checkpoint(self.run_dir)
        if ckpt is None:
            return None
        state = load_checkpoint(ckpt, self.model, self.optimizer, self.scheduler)
        self.step, self.epoch, self.pos = state["step"], state["epoch"], state["pos"]
        self._shuffle()
        return self.step

    def save(self):
        return save_checkpoint(
            self.run_dir / "checkpoints", self.step, self.model, self.optimizer, self.scheduler,
            {"epoch": self.epoch, "pos": self.pos}, keep=self.cfg.run.keep_checkpoints,
            write_extra=lambda folder: save_pretrained_files(self.model, self.tok, folder),
        )  # fmt: skip

    # ------------------------------------------------------------------- step
    def _encode(self, exs: list[Example]) -> tuple[list[list[int]], list[list[int]]]:
        enc = lambda s: self.tok(s, add_special_tokens=False).input_ids  # noqa: E731
        eos = int(self.tok.eos_token_id)
        cut = 1 if self.replace_last else 0  # the code stands where the delimiter was
        prompts = [enc(e.prompt) for e in exs]
        return [p[: len(p) - cut] for p in prompts], [[*enc(e.answer), eos] for e in exs]

    def update(self, exs: list[Example]) -> dict[str, float]:
        """One search-select-update step on ``exs``."""
        lc, model = self.cfg.latent, self.model
        prompts, answers = self._encode(exs)
        metrics: dict[str, float] = {}
        chosen: list[int | None] = [None] * len(exs)
        if self.codes:
            model.eval()
            lp_y, lp_z = search_codes(model, prompts, answers, self.codes, self.pad)
            z = select_codes(lp_y, lp_z, lc.select)
            chosen = [self.codes[i] for i in z.tolist()]
            use = torch.bincount(z, minlength=len(self.codes)).float() / len(exs)
            metrics |= {
                "dlr/route_acc": float((lp_z.argmax(1) == z).float().mean()),
                "dlr/code_entropy": float(-(use * use.clamp_min(1e-12).log()).sum()),
                "dlr/codes_used": float((use > 0).sum()),
                "dlr/search_gain": float((lp_y.max(1).values - lp_y.mean(1)).mean()),
            }
        model.train()
        ids, att, tgt, route = _sequences(prompts, chosen, answers, self.pad)
        lp, logits = _token_logp(model, ids, att)
        nll = -(lp * tgt).sum() / tgt.sum()
        loss = nll
        if self.codes:
            at = logits[torch.arange(len(exs)), route][:, self.codes].log_softmax(-1)
            target = torch.tensor([self.codes.index(c) for c in chosen])
            route_ce = -at.gather(1, target[:, None]).mean()
            loss = nll + lc.routing_coef * route_ce
            metrics["dlr/route_ce"] = float(route_ce.detach())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip = self.cfg.optim.grad_clip or float("inf")
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        loss, nll = loss.detach(), nll.detach()
        if not (math.isfinite(float(loss)) and math.isfinite(float(gn))):
            raise FloatingPointError("non-finite DLR loss or gradient: lower optim.lr")
        self.optimizer.step()
        self.scheduler.step()
        return {**metrics, "loss": float(loss), "nll": float(nll), "grad_norm": float(gn)}

    def route(self, exs: list[Example]) -> list[list[int]]:
        """The prompts with the router's greedy code appended (unchanged without codes)."""
        prompts, _ = self._encode(exs)
        if not self.codes:
            return prompts
        ids, att, _, route = _sequences(prompts, [None] * len(exs), [[] for _ in exs], self.pad)
        with torch.no_grad():
            logits = self.model(input_ids=ids, attention_mask=att).logits
        pick = logits[torch.arange(len(exs)), route][:, self.codes].argmax(-1).tolist()
        return [[*p, self.codes[k]] for p, k in zip(prompts, pick, strict=True)]

    def evaluate(self) -> dict[str, float]:
        """Held-out greedy accuracy (route, then answer) and the codes the router uses."""
        from rlpost.llm.rollout.engines import make_local_engine

        self.model.eval()
        routed = self.route(self.eval_set)
        if self.engine is None:  # colocated: it generates with the training module itself
            self.engine = make_local_engine("auto", self.model, self.tok)
        sp = SamplingParams(self.cfg.data.eval_max_new_tokens, 0.0)
        texts = self.engine.generate(routed, 1, sp).texts(self.tok)
        acc = sum(self.task.score(t, e) >= 1.0 for t, e in zip(texts, self.eval_set, strict=True))
        out = {"eval/accuracy": acc / len(self.eval_set)}
        if self.codes:
            out["eval/codes_used"] = float(len({r[-1] for r in routed}))
        return out

    @releases_run_dir(lambda self: self.run_dir)
    def train(self) -> dict[str, Any]:
        cfg, total = self.cfg, self.cfg.train.steps
        bar = None
        if cfg.run.progress:
            from tqdm.auto import tqdm

            name = f"dlr (K={len(self.codes)})" if self.codes else "sft"
            bar = tqdm(total=total, initial=self.step, desc=name, unit="step", dynamic_ncols=True)
        t_start = time.perf_counter()
        try:
            if self.step == 0 and cfg.run.eval_every:
                self.logger.log(0, self.evaluate())
            while self.step < total:
                t0 = time.perf_counter()
                metrics = self.update(self._batch())
                self.step += 1
                if due(cfg.run.eval_every, self.step, total):
                    metrics.update(self.evaluate())
                metrics["time/step"] = time.perf_counter() - t0
                self.logger.log(self.step, metrics)
                if due(cfg.run.save_every, self.step, total):
                    self.save()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{metrics['loss']:.3f}")
        finally:
            if bar is not None:
                bar.close()
            self.logger.close()
        rows = read_metrics(self.run_dir)
        result: dict[str, Any] = {"steps": self.step, "seconds": time.perf_counter() - t_start}
        title = f"DLR, {len(self.codes)} codes" if self.codes else "SFT (DLR with 0 codes)"
        result["plot"] = str(plot_curves(self.run_dir, title, PANELS, LABELS))
        result["summary"] = summary_table(rows, SUMMARY_KEYS)
        vals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
        if vals:
            result["eval_before"], result["eval_after"] = vals[0], vals[-1]
        extra = {k: v for k, v in result.items() if k not in ("summary", "steps", "seconds")}
        write_summary(self.run_dir, "llm-dlr", rows, result["seconds"], **extra)
        return result


PANELS = [
    ("loss", ("loss", "nll", "dlr/route_ce")),
    ("held-out greedy accuracy", ("eval/accuracy",)),
    ("codes in use", ("dlr/codes_used", "eval/codes_used")),
]
LABELS = {
    "loss": "total",
    "nll": "answer NLL",
    "dlr/route_ce": "router CE",
    "eval/accuracy": "held-out",
    "dlr/codes_used": "selected (train batch)",
    "eval/codes_used": "routed (held-out)",
}
SUMMARY_KEYS = ["loss", "nll", "dlr/route_ce", "dlr/route_acc", "dlr/codes_used", "eval/accuracy"]


def run(cfg: DLRConfig, *, resume: bool = False, overwrite: bool = False) -> str:
    """The ``dlr`` runtime (``rlpost-llm dlr``): :class:`DLRTrainer`, reported as the
    GRPO-family trainer's runs are."""
    from rlpost.llm.runtimes.grpo import report

    return report(DLRTrainer(cfg, resume=resume, overwrite=overwrite).train())
