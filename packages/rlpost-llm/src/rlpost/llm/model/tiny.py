"""The embedded default model: a tiny character-level Qwen2, pre-trained locally.

Nothing is downloaded.  :func:`build_base` builds a character-level tokenizer
over :data:`rlpost.llm.data.tasks.CHARSET`, a randomly initialised ~1M-parameter
Qwen2, and supervised-fine-tunes it on a built-in task until its greedy
held-out accuracy lands in a *partly right* band (by default 25-60 %): clearly
better than chance, far from perfect, so RL post-training has room to improve
it.  The result is a regular Hugging Face checkpoint (``save_pretrained``) in a
cache directory, reloadable with :func:`load_base` or any
``AutoModelForCausalLM`` / ``AutoTokenizer`` code.

Typical use::

    path = build_base("arithmetic")        # a few minutes the first time, cached after
    model, tokenizer = load_base(path)
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlpost.core.io.cache import cache_lock, default_cache_dir, publish_directory
from rlpost.llm.data.tasks import CHARSET, Example, Task, make_task

__all__ = [
    "BASE_RECIPES",
    "BASE_VERSION",
    "SIZES",
    "SPECIAL_TOKENS",
    "base_path",
    "build_base",
    "build_bpe_tokenizer",
    "build_tokenizer",
    "default_cache_dir",
    "greedy_accuracy",
    "greedy_scores",
    "load_base",
    "sft_train",
    "tiny_config",
]

log = logging.getLogger(__name__)

#: Bumped whenever the recipe changes in a way that invalidates cached bases.
BASE_VERSION = 2

#: Special tokens of the character tokenizer, in id order (``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2).
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")

#: Positions the tiny model is configured for (prompts + completions are far shorter).
MAX_POSITIONS = 64

#: Architecture presets for :func:`tiny_config` (hidden size, layers, heads, kv heads).
SIZES: dict[str, dict[str, int]] = {
    "micro": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
    "small": {
        "hidden_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "default": {
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "large": {
        "hidden_size": 192,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
    },
}

#: Per-task defaults of :func:`build_base`: ``task`` (task parameters) and ``train``
#: (training parameters).  Explicit arguments override them.
BASE_RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    # 2-digit addition: reaches the band in ~400-900 steps for every seed tried
    # (3-digit often plateaus for >1500 steps; lr 3e-3 sometimes gets stuck).
    "arithmetic": {
        "task": {"digits": 2, "ops": "+"},
        "train": {"round_steps": 50, "max_steps": 1500, "batch_size": 32, "lr": 1e-3},
    },
    "countdown": {
        "task": {"n_numbers": 3, "max_number": 9},
        "train": {"round_steps": 50, "max_steps": 1500, "batch_size": 32, "lr": 1e-3},
    },
}

#: Common training defaults of :func:`build_base` (overridden by a recipe, then by arguments).
_TRAIN_DEFAULTS: dict[str, Any] = {
    "round_steps": 50,
    "max_steps": 1500,
    "batch_size": 32,
    "lr": 1e-3,
    "heldout": 256,
    "band": (0.25, 0.6),
    "seed": 0,
    "size": "default",
    "tokenizer": "char",
    "feedback": 0.0,
    "reflect": 0.0,
}

#: Tokenizers of :func:`build_base`: ``char`` (one token per character, Qwen2) and
#: ``bpe`` (a byte-level BPE trained on the task's text, Llama): two model families with
#: different vocabularies, for cross-tokenizer distillation and Mutual RL.
TOKENIZERS = ("char", "bpe")


# ----------------------------------------------------------------------------- tokenizer


# The split regex of Qwen2's tokenizer (GPT-style); with no BPE merges it only affects
# how text is chunked before being cut into single characters, never the ids.
_QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-character table used by byte-level tokenizers."""
    bs = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _fast(backend):
    """The transformers tokenizer of a ``tokenizers`` backend, with our special tokens."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )


def build_tokenizer():
    """A character-level tokenizer over :data:`~rlpost.llm.data.tasks.CHARSET`.

    Every character is one token; ids 0, 1, 2 are ``<pad>``, ``<eos>``, ``<unk>``
    and the characters of ``CHARSET`` follow in order.  Encoding adds no special
    tokens (no BOS/EOS); decoding joins tokens with no separator, so
    ``tok.decode(tok.encode(s)) == s`` for any ``s`` over ``CHARSET``.
    Characters outside ``CHARSET`` are dropped on encode.

    It is built as a byte-level BPE with an empty merge list and Qwen2's
    normaliser / pre-tokeniser / decoder.  That is deliberate: for a checkpoint
    whose ``config.json`` says ``model_type: qwen2``, transformers 5's
    ``AutoTokenizer`` always rebuilds a ``Qwen2Tokenizer`` from the saved
    vocabulary and merges, imposing exactly that pipeline; a plain WordLevel
    tokenizer would silently lose its spaces on reload.  With no merges, every
    pre-token falls apart into single characters, so the saved and the
    reloaded tokenizer give identical ids.

    Returns:
        a ``transformers.PreTrainedTokenizerFast`` with ``pad_token="<pad>"``,
        ``eos_token="<eos>"``, ``unk_token="<unk>"``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    byte_char = _bytes_to_unicode()
    pieces = [byte_char[b] for c in CHARSET for b in c.encode()]
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *pieces])}
    backend = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[],
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return _fast(backend)


def build_bpe_tokenizer(task: Task, vocab_size: int = 160, seed: int = 0):
    """A byte-level BPE tokenizer trained on ``task``'s text (prompts and answers of 4,000
    examples drawn with ``seed``), its alphabet the bytes of
    :data:`~rlpost.llm.data.tasks.CHARSET`: merges join digits and operators, so it cuts the
    task's text unlike the character tokenizer. Deterministic for a task and seed; ids 0,
    1, 2 are ``<pad>``, ``<eos>``, ``<unk>`` as in :func:`build_tokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    byte_char = _bytes_to_unicode()
    alphabet = sorted({byte_char[b] for c in CHARSET for b in c.encode()})
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    rng = random.Random(f"bpe-{seed}")
    backend.train_from_iterator([e.prompt + e.answer for e in task.sample(4000, rng)], trainer)
    return _fast(backend)


# ----------------------------------------------------------------------------- model


def tiny_config(
    tokenizer, size: str = "default", family: str = "qwen2", positions: int = MAX_POSITIONS
):
    """A small Qwen2 (or, ``family="llama"``, Llama) configuration sized for
    ``tokenizer``'s vocabulary.

    Args:
        tokenizer: provides ``len(tokenizer)``, ``pad_token_id``, ``eos_token_id``.
        size: a key of :data:`SIZES`; ``"default"`` has ~1M parameters (hidden 128,
            4 layers, 4 heads, 2 KV heads, MLP 4x, tied embeddings).
        family: ``"qwen2"`` or ``"llama"`` (the BPE base's: transformers' Qwen2
            tokenizer class would rebuild a saved BPE without its merges).
        positions: the context length (``max_position_embeddings``; default 64).

    Returns:
        a ``transformers`` config.
    """
    from transformers import LlamaConfig, Qwen2Config

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; valid sizes: {', '.join(SIZES)}")
    families = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if family not in families:
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(families)}")
    dims = SIZES[size]
    return families[family](
        vocab_size=len(tokenizer),
        intermediate_size=4 * dims["hidden_size"],
        max_position_embeddings=positions,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        use_cache=True,
        **dims,
    )


def _count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# ----------------------------------------------------------------------------- SFT


def _sft_batch(tokenizer, examples: list[Example]) -> dict[str, torch.Tensor]:
    """Right-padded teacher-forcing batch for ``prompt + answer + <eos>``.

    Returns ``input_ids``, ``attention_mask`` and ``labels``, each ``[B, T]``;
    labels are ``-100`` on prompt and padding positions, so the loss covers
    only the answer tokens and the final ``<eos>``.
    """
    prompts = tokenizer([e.prompt for e in examples], add_special_tokens=False)["input_ids"]
    answers = tokenizer([e.answer for e in examples], add_special_tokens=False)["input_ids"]
    seqs = [p + a + [tokenizer.eos_token_id] for p, a in zip(prompts, answers, strict=True)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (p, s) in enumerate(zip(prompts, seqs, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        labels[i, len(p) : len(s)] = ids[i, len(p) : len(s)]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def sft_optimizer(model, lr: float, total: int, weight_decay: float = 0.01):
    """``(optimizer, scheduler)`` of an SFT of ``total`` steps: AdamW (betas 0.9, 0.98), its
    learning rate warmed up linearly over ``min(100, total // 10)`` steps (at least 1),
    then cosine-decayed from ``lr`` to ``lr / 10`` at ``total``."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay
    )
    warmup = max(1, min(100, total // 10))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def sft_step(model, optimizer, scheduler, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One SFT step on ``batch`` (the gradient norm clipped to 1, the schedule advanced);
    the step's loss."""
    loss = model(**batch).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    return loss


class _SFTRun:
    """Resumable SFT state: one AdamW optimizer and one warmup + cosine schedule.

    :func:`sft_train` uses one for a single call; :func:`build_base` calls
    :meth:`train` repeatedly (in rounds) so the schedule spans the whole budget.
    """

    def __init__(
        self,
        model,
        tokenizer,
        task: Task,
        total_steps: int,
        batch_size: int,
        lr: float,
        rng_seed: int,
        exclude_prompts: frozenset[str] = frozenset(),
        weight_decay: float = 0.01,
        feedback: float = 0.0,
        reflect: float = 0.0,
    ):
        self.model, self.tokenizer, self.task = model, tokenizer, task
        self.feedback, self.reflect = feedback, reflect
        self.batch_size = batch_size
        self.rng = random.Random(rng_seed)
        self.exclude = exclude_prompts
        self.total = max(1, total_steps)
        self.step = 0
        self.optimizer, self.scheduler = sft_optimizer(model, lr, self.total, weight_decay)

    def _examples(self) -> list[Example]:
        """A training batch, avoiding held-out prompts where the task space allows."""
        n = self.batch_size
        out = [e for e in self.task.sample(n, self.rng) if e.prompt not in self.exclude]
        for _ in range(20):
            if len(out) >= n:
                break
            out += [e for e in self.task.sample(n, self.rng) if e.prompt not in self.exclude]
        else:  # (almost) every prompt is held out: a tiny task space, train on it anyway
            out += self.task.sample(n - len(out), self.rng)
        return [self._with_feedback(e) for e in out[:n]]

    def _with_feedback(self, e: Example) -> Example:
        """With probability ``feedback``: the problem prefixed by a wrong attempt's
        diagnosis in FBOS-RL's guided format (``"57+10>12+34="``), the answer unchanged.
        Before that, with probability ``reflect``: a reflection example instead, the wrong
        attempt in the reflector's format (``"12+34=57:"``) and the lesson of its diagnosis
        as the answer (``"+10"``), what RubricEM's reflection meta-policy writes."""
        if self.reflect and self.rng.random() < self.reflect:
            return self._reflection(e)
        if not self.feedback or self.rng.random() >= self.feedback:
            return e
        wrong = self.task.wrong_attempt(e, self.rng)
        diagnosis = self.task.feedback(wrong, e) if wrong is not None else ""
        if not diagnosis:
            return e
        from rlpost.core.feedback import FeedbackExploration

        return Example(FeedbackExploration().prompt(e.prompt, wrong, diagnosis), e.answer, e.meta)

    def _reflection(self, e: Example) -> Example:
        from rlpost.core.feedback import FeedbackExploration

        wrong = self.task.wrong_attempt(e, self.rng)
        lesson = self.task.lesson(self.task.feedback(wrong, e)) if wrong is not None else ""
        if not lesson:
            return e
        ask = FeedbackExploration(reflector="policy").reflect(e.prompt, wrong)
        return Example(ask, lesson, e.meta)

    def train(self, steps: int, progress: bool = True, desc: str = "sft") -> list[float]:
        """Run ``steps`` optimizer steps; returns the per-step training losses."""
        self.model.train()
        losses: list[float] = []
        bar = tqdm(range(steps), desc=desc, disable=not progress, leave=False, file=sys.stderr)
        for _ in bar:
            batch = _sft_batch(self.tokenizer, self._examples())
            loss = sft_step(self.model, self.optimizer, self.scheduler, batch)
            self.step += 1
            losses.append(loss.item())
            if progress:
                bar.set_postfix(
                    loss=f"{losses[-1]:.4f}", lr=f"{self.scheduler.get_last_lr()[0]:.2e}"
                )
        bar.close()
        self.model.eval()
        return losses


def sft_train(
    model,
    tokenizer,
    task: Task,
    steps: int,
    batch_size: int,
    lr: float,
    rng_seed: int,
    progress: bool = True,
) -> list[float]:
    """Teacher-forced supervised training on ``task`` examples.

    Each step draws ``batch_size`` fresh examples, trains on
    ``prompt + answer + <eos>`` with the cross-entropy loss on the answer and
    ``<eos>`` tokens only (prompt and padding labels are ``-100``), and takes
    one AdamW step (gradient norm clipped to 1; linear warmup then cosine decay
    of the learning rate from ``lr`` to ``lr / 10`` over ``steps``).

    Args:
        model: a Hugging Face causal LM (trained in place; left in eval mode).
        tokenizer: its tokenizer (needs ``eos_token_id`` and ``pad_token_id``).
        task: draws the training examples.
        steps, batch_size, lr: optimisation budget.
        rng_seed: seeds the example stream (model init is the caller's).
        progress: show a tqdm bar with the running loss.

    Returns:
        the training loss of every step (length ``steps``).
    """
    run = _SFTRun(model, tokenizer, task, steps, batch_size, lr, rng_seed)
    return run.train(steps, progress=progress)


# ----------------------------------------------------------------------------- evaluation


@torch.inference_mode()
def greedy_accuracy(
    model,
    tokenizer,
    task: Task,
    examples: list[Example],
    batch_size: int = 256,
    max_new_tokens: int | None = None,
) -> float:
    """Mean ``task.accuracy`` of greedy completions of ``examples``' prompts (the score,
    for tasks whose score is right / wrong): the mean of :func:`greedy_scores` (0.0 for no
    examples)."""
    scores = greedy_scores(model, tokenizer, task, examples, batch_size, max_new_tokens)
    return sum(scores) / len(scores) if scores else 0.0


@torch.inference_mode()
def greedy_scores(
    model,
    tokenizer,
    task: Task,
    examples: list[Example],
    batch_size: int = 256,
    max_new_tokens: int | None = None,
) -> list[float]:
    """``task.accuracy`` of the greedy completion of each of ``examples``' prompts.

    Prompts are left-padded into batches of ``batch_size`` (with an attention
    mask) and completed with ``model.generate(do_sample=False)``; only the new
    tokens are decoded (special tokens skipped) and scored.

    Args:
        max_new_tokens: generation budget; default: the longest reference answer
            in tokens + 2 (room for ``<eos>`` and one stray token).
    """
    if not examples:
        return []
    if max_new_tokens is None:
        answers = tokenizer([e.answer for e in examples], add_special_tokens=False)["input_ids"]
        max_new_tokens = max(map(len, answers)) + 2
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    scores: list[float] = []
    try:
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            enc = tokenizer(
                [e.prompt for e in chunk],
                add_special_tokens=False,
                padding=True,
                return_tensors="pt",
            )
            enc = {k: v.to(device) for k, v in enc.items()}
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(
                out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
            )
            scores += [task.accuracy(t, e) for t, e in zip(texts, chunk, strict=True)]
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return scores


# ----------------------------------------------------------------------------- cache


def _resolve(task_name: str, task_params: dict[str, Any], train: dict[str, Any]):
    """Merge recipe defaults with explicit arguments: ``(task params, train params)``."""
    if task_name not in BASE_RECIPES:
        make_task(task_name)  # raises the ValueError listing valid names
    recipe = BASE_RECIPES.get(task_name, {"task": {}, "train": {}})
    tp = {**recipe["task"], **task_params}
    tr = {**_TRAIN_DEFAULTS, **recipe["train"]}
    tr.update({k: v for k, v in train.items() if v is not None})
    tr["band"] = tuple(tr["band"])
    if tr["tokenizer"] not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tr['tokenizer']!r}; valid: {', '.join(TOKENIZERS)}")
    return tp, tr


def base_path(
    task_name: str = "arithmetic",
    cache_dir: str | os.PathLike | None = None,
    *,
    train: dict[str, Any] | None = None,
    **task_params: Any,
) -> Path:
    """Where :func:`build_base` with the same arguments stores its result.

    The folder is ``<cache_dir>/llm/tiny-<task>-<hash>``, the hash covering the
    task, its parameters, the training parameters and :data:`BASE_VERSION`.
    """
    tp, tr = _resolve(task_name, task_params, train or {})
    keyed = dict(tr)
    if keyed["tokenizer"] == "char":  # the original bases keep their cache folders
        del keyed["tokenizer"]
    for k in ("feedback", "reflect"):  # (the bases without them keep their cache folders)
        if not keyed[k]:
            del keyed[k]
    key = json.dumps(
        {"task": task_name, "params": tp, "train": keyed, "version": BASE_VERSION},
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    kind = "" if tr["tokenizer"] == "char" else f"{tr['tokenizer']}-"
    return root / "llm" / f"tiny-{kind}{task_name}-{digest}"


def _is_complete(path: Path) -> bool:
    return (path / "base_info.json").is_file()


# ----------------------------------------------------------------------------- build


def build_base(
    task_name: str = "arithmetic",
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
    *,
    max_steps: int | None = None,
    round_steps: int | None = None,
    heldout: int | None = None,
    band: tuple[float, float] | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    seed: int | None = None,
    size: str | None = None,
    tokenizer: str | None = None,
    feedback: float | None = None,
    reflect: float | None = None,
    **task_params: Any,
) -> Path:
    """Build (or find in the cache) a partly-trained tiny base model for a task.

    If ``base_path(...)`` already holds a finished build (it has ``base_info.json``) and
    ``force`` is false, that path is returned at once.  Otherwise: seeded random init of a
    :func:`tiny_config` Qwen2, then SFT on the task in rounds of ``round_steps`` steps; after
    each round the greedy accuracy on a fixed held-out set (``heldout`` examples from a
    separate seed, excluded from training) is measured, and training stops as soon as it lies
    in ``band`` (default 0.25-0.6) or ``max_steps`` is reached.  If a round jumps past the
    band, the round checkpoint closest to the band is kept.

    The model and tokenizer are saved (``save_pretrained``, safetensors) with a
    ``base_info.json`` (task, params, train, steps, heldout_accuracy, seconds, parameters,
    history) into a temporary sibling directory that is renamed into place only when
    complete, so an interrupted build never leaves a half-written cache entry.

    Args:
        task_name: a key of :data:`rlpost.llm.data.tasks.TASKS`.
        cache_dir: cache root (default :func:`default_cache_dir`).
        force: rebuild even if a cached build exists (it is replaced).
        progress: show progress bars and per-round accuracy on stderr.
        max_steps, round_steps, heldout, band, batch_size, lr, seed, size: training
            parameters; ``None`` takes the task's :data:`BASE_RECIPES` default.
        tokenizer: ``"char"`` (default: the character tokenizer and a Qwen2) or ``"bpe"``
            (:func:`build_bpe_tokenizer` and a Llama of the same size).
        feedback: the fraction of SFT examples shown after a wrong attempt's diagnosis
            (:meth:`Task.wrong_attempt`, FBOS-RL's guided format): a base that can read
            feedback, as a pretrained LLM can (default 0: none). The band is measured
            on the bare problems.
        reflect: the fraction of SFT examples replaced, before ``feedback`` applies, by a
            wrong attempt in the policy reflector's format with the lesson of its
            diagnosis as the target (``"12+34=57:"`` -> ``"+10"``): a base that can write
            guidance, for RubricEM's reflection meta-policy (default 0: none).
        **task_params: task constructor parameters (default: the recipe's).

    Returns:
        the directory of the finished build (loadable with :func:`load_base`).
    """
    train = {"max_steps": max_steps, "round_steps": round_steps, "heldout": heldout}
    train |= {"band": band, "batch_size": batch_size, "lr": lr, "seed": seed, "size": size}
    train |= {"tokenizer": tokenizer, "feedback": feedback, "reflect": reflect}
    return _cached_or_built(task_name, task_params, train, cache_dir, force, progress)


def _cached_or_built(
    task_name: str,
    task_params: dict[str, Any],
    train: dict[str, Any],
    cache_dir: str | os.PathLike | None,
    force: bool,
    progress: bool,
) -> Path:
    """:func:`build_base` on its gathered arguments (``train``: the training parameters,
    ``None`` where not given): the cached build unless ``force``, else a new one."""
    tp, tr = _resolve(task_name, task_params, train)
    target = base_path(task_name, cache_dir, train=tr, **tp)
    if _is_complete(target) and not force:
        log.info("using cached base %s", target)
        return target
    with cache_lock(target):  # one builder per entry; the others wait and reuse it
        if _is_complete(target) and not force:
            return target
        return _build(task_name, tp, tr, target, force, progress)


def _say(msg: str, progress: bool) -> None:
    """Log a build's message, and write it on stderr (above the progress bars) when
    ``progress``."""
    log.info(msg)
    if progress:
        tqdm.write(msg, file=sys.stderr)


def init_model(cls, config, tokenizer, seed: int):
    """A ``cls`` of ``config``, randomly initialised under ``seed`` (the global torch RNG
    left as it was), generating with ``tokenizer``'s padding and EOS."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def _new_base(task: Task, tr: dict[str, Any]):
    """``(tokenizer, model)`` of a new, untrained base for ``task``: the character
    tokenizer and a Qwen2, or (``tokenizer: bpe``) a BPE trained on the task's text and a
    Llama, of ``tr``'s size, initialised under ``tr``'s seed."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    bpe = tr["tokenizer"] == "bpe"
    tokenizer = build_bpe_tokenizer(task, seed=tr["seed"]) if bpe else build_tokenizer()
    family, cls = ("llama", LlamaForCausalLM) if bpe else ("qwen2", Qwen2ForCausalLM)
    model = init_model(cls, tiny_config(tokenizer, tr["size"], family), tokenizer, tr["seed"])
    model.generation_config.bos_token_id = None
    return tokenizer, model


def _train_to_band(
    run: _SFTRun, heldout_set: list[Example], tr: dict[str, Any], progress: bool
) -> tuple[int, float, list[dict[str, float]]]:
    """SFT in rounds of ``round_steps`` steps, each followed by the greedy accuracy on
    ``heldout_set``, until it reaches the band (or passes it) or ``max_steps`` are done.
    The round closest to the band is kept (loaded back into the model when a later round
    overshot): ``(its step, its accuracy, the history of every round)``."""
    model, tokenizer, task = run.model, run.tokenizer, run.task
    lo, hi = tr["band"]

    def distance(acc: float) -> float:
        return max(lo - acc, acc - hi, 0.0)

    history: list[dict[str, float]] = []
    best: tuple[float, int, float, dict] | None = None  # (distance, step, acc, state)
    while run.step < tr["max_steps"]:
        steps = min(tr["round_steps"], tr["max_steps"] - run.step)
        losses = run.train(steps, progress=progress, desc=f"sft {run.step}/{tr['max_steps']}")
        acc = greedy_accuracy(model, tokenizer, task, heldout_set)
        loss = sum(losses) / len(losses)
        history.append({"step": run.step, "loss": loss, "heldout_accuracy": acc})
        _say(f"  step {run.step:5d}  loss {loss:.4f}  held-out accuracy {acc:.3f}", progress)
        if best is None or distance(acc) < best[0]:
            best = (distance(acc), run.step, acc, copy.deepcopy(model.state_dict()))
        if acc >= lo:
            break  # in the band, or past it (then the closest checkpoint is kept)
    assert best is not None
    _, steps_done, acc, state = best
    if steps_done != run.step:
        model.load_state_dict(state)
        msg = f"  overshot the band; keeping the step-{steps_done} checkpoint (accuracy {acc:.3f})"
        _say(msg, progress)
    return steps_done, acc, history


def publish_base(target: Path, model, tokenizer, info: dict[str, Any], force: bool) -> None:
    """Save ``model``, ``tokenizer`` and ``info`` (as ``base_info.json``, which marks the
    build complete) into ``target``, through a temporary sibling directory renamed into
    place (:func:`~rlpost.core.io.cache.publish_directory`)."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "base_info.json").write_text(json.dumps(info, indent=2) + "\n")

    publish_directory(target, "base_info.json", write, force)


def _build(
    task_name: str,
    tp: dict[str, Any],
    tr: dict[str, Any],
    target: Path,
    force: bool,
    progress: bool,
) -> Path:
    """Build the base of ``task_name`` (task parameters ``tp``, training parameters ``tr``)
    into ``target`` as :func:`build_base` describes: a new base (:func:`_new_base`), SFT up
    to the band (:func:`_train_to_band`), then published with its ``base_info.json``."""
    t0 = time.perf_counter()
    task = make_task(task_name, **tp)
    tokenizer, model = _new_base(task, tr)
    n_params = _count_parameters(model)
    heldout_set = task.sample(tr["heldout"], random.Random(f"heldout-{tr['seed']}"))
    run = _SFTRun(
        model,
        tokenizer,
        task,
        tr["max_steps"],
        tr["batch_size"],
        tr["lr"],
        rng_seed=tr["seed"],
        exclude_prompts=frozenset(e.prompt for e in heldout_set),
        feedback=tr["feedback"],
        reflect=tr["reflect"],
    )
    _say(
        f"building tiny {task_name} base ({n_params:,} params, {tr['tokenizer']} tokenizer, "
        f"{tp}) -> {target}",
        progress,
    )
    steps_done, acc, history = _train_to_band(run, heldout_set, tr, progress)
    lo, hi = tr["band"]
    if not lo <= acc <= hi:
        log.warning("held-out accuracy %.3f is outside the band %s", acc, tr["band"])
    seconds = time.perf_counter() - t0
    info = {
        "task": task_name,
        "params": tp,
        "train": {**tr, "band": list(tr["band"])},
        "version": BASE_VERSION,
        "steps": steps_done,
        "heldout_accuracy": acc,
        "in_band": lo <= acc <= hi,
        "seconds": round(seconds, 2),
        "parameters": n_params,
        "history": history,
    }
    publish_base(target, model, tokenizer, info, force)
    _say(
        f"saved {target} (step {steps_done}, held-out accuracy {acc:.3f}, {seconds:.0f} s)",
        progress,
    )
    return target


def load_base(path: str | os.PathLike):
    """Load a built base: ``(model, tokenizer)`` via the ``Auto*`` classes.

    The tokenizer is checked to decode its encoding of :data:`~rlpost.llm.data.tasks.CHARSET`
    back exactly, one token per character for a character base (a corrupted or foreign
    tokenizer raises ``ValueError``).  Returns the model in eval mode.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    info = Path(path) / "base_info.json"
    kind = (
        json.loads(info.read_text()).get("train", {}).get("tokenizer", "char")
        if info.is_file()
        else "char"
    )
    ids = tokenizer.encode(CHARSET, add_special_tokens=False)
    if (kind == "char" and len(ids) != len(CHARSET)) or tokenizer.decode(ids) != CHARSET:
        raise ValueError(f"tokenizer in {path} does not round-trip the task charset")
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return model, tokenizer
