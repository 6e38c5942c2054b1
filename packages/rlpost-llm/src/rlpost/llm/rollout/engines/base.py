"""The rollout-engine protocol shared by the HF and vLLM engines (and test fakes).

An engine turns prompts (token ids) into ``n`` sampled completions each and reports, for
every sampled token, the log-probability *the engine itself* assigned to it. The trainer
recomputes those log-probs with its own forward pass; the difference is the
training-inference mismatch (catalog 000-23 / 004-02) that TIS / MIS corrections address.
"""

from __future__ import annotations

import abc
import contextlib
import copy
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    stop: tuple[str, ...] = ()  # stop strings (the stop string itself is kept)
    min_new_tokens: int = 0  # EOS masked out until then (generate's min_new_tokens)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_new_tokens}"
            )
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"invalid sampling parameters {self}")


FinishReason = Literal["stop", "length"]


@dataclass
class RolloutBatch:
    """``N = len(prompts) * n`` completions, grouped: rows ``[i*n, (i+1)*n)`` share prompt i.

    * ``prompt_ids``: N token-id lists (unpadded);
    * ``completion_ids``: ``[N, L]`` int64, right-padded with ``pad_id``;
    * ``logprobs``: ``[N, L]`` float32 engine log-probs of the sampled tokens (0 on padding);
    * ``mask``: ``[N, L]`` float32, 1 on generated tokens (including a final EOS);
    * ``finish_reasons``: "stop" (EOS or stop string) or "length" (hit max_new_tokens);
    * ``group``: ``[N]`` int64 prompt index; ``policy_version``: weights version used;
    * ``context``: ``[N, L]`` 1 on every real completion token, where that differs from
      ``mask`` (a multi-turn episode's observation tokens: attended, never trained on);
      ``None``: ``mask``. :attr:`attention` is whichever applies;
    * ``versions``: ``[N]`` int64, the weights version of each row where rows of several
      versions were concatenated (DORA's multi-version batches); ``None``: all
      ``policy_version``. :attr:`row_versions` is whichever applies, and ``policy_version``
      of a concatenation is its oldest row's.
    """

    prompt_ids: list[list[int]]
    completion_ids: Tensor
    logprobs: Tensor
    mask: Tensor
    finish_reasons: list[FinishReason]
    group: Tensor
    pad_id: int
    policy_version: int = 0
    context: Tensor | None = None
    versions: Tensor | None = None

    @property
    def row_versions(self) -> Tensor:
        """``[N]`` int64: the weights version that generated each row."""
        if self.versions is not None:
            return self.versions
        return torch.full((len(self.prompt_ids),), self.policy_version, dtype=torch.long)

    @property
    def attention(self) -> Tensor:
        """``[N, L]``: the completion tokens a forward attends to (``context`` or ``mask``)."""
        return self.context if self.context is not None else self.mask

    @staticmethod
    def from_rows(
        rows: list[tuple[list[int], list[int], list[float], FinishReason]],
        n_prompts: int,
        n: int,
        pad_id: int,
        policy_version: int = 0,
    ) -> RolloutBatch:
        """Pad ``(prompt ids, completion ids, engine log-probs, finish reason)`` rows, grouped
        ``n`` per prompt in prompt order, into a batch (every engine returns through here)."""
        from rlpost.kernels.ops.shared_prompt import pad_rows

        L = max(1, max((len(r[1]) for r in rows), default=1))
        # every row at once through typed buffers (torch.tensor of nested Python lists
        # costs tens of nanoseconds an element: 50 ms at 256 rows of 512 tokens)
        ids, mask = pad_rows([r[1] for r in rows], pad_id, width=L)
        logprobs, _ = pad_rows([r[2] for r in rows], 0.0, torch.float64, width=L)
        dtype = torch.get_default_dtype()  # (torch.tensor's dtype for Python floats)
        logprobs, mask = logprobs.to(dtype), mask.to(dtype)
        return RolloutBatch(
            [r[0] for r in rows],
            ids,
            logprobs,
            mask,
            [r[3] for r in rows],
            torch.arange(n_prompts).repeat_interleave(n),
            pad_id,
            policy_version,
        )

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def lengths(self) -> Tensor:
        return self.attention.sum(1).long()

    def texts(self, tokenizer) -> list[str]:
        """The completions as text (special tokens such as EOS dropped), for verifiers."""
        lens = self.lengths.tolist()
        return [
            tokenizer.decode(self.completion_ids[i, : lens[i]].tolist(), skip_special_tokens=True)
            for i in range(len(self))
        ]

    def select(self, rows: Tensor | list[int]) -> RolloutBatch:
        """Rows ``rows`` (e.g. the groups that survive dynamic sampling), groups renumbered."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        _, group = torch.unique(self.group[idx], return_inverse=True)
        return RolloutBatch(
            [self.prompt_ids[i] for i in idx.tolist()],
            self.completion_ids[idx],
            self.logprobs[idx],
            self.mask[idx],
            [self.finish_reasons[i] for i in idx.tolist()],
            group,
            self.pad_id,
            int(self.versions[idx].min())
            if self.versions is not None and len(idx)
            else self.policy_version,
            self.context[idx] if self.context is not None else None,
            self.versions[idx] if self.versions is not None else None,
        )

    @staticmethod
    def concat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Concatenate (right-padding to the longest), keeping groups distinct."""
        if not batches:
            raise ValueError("nothing to concatenate")
        L = max(b.completion_ids.shape[1] for b in batches)

        def pad(t: Tensor, value: float) -> Tensor:
            return torch.nn.functional.pad(t, (0, L - t.shape[1]), value=value)

        groups, offset = [], 0
        for b in batches:
            groups.append(b.group + offset)
            offset += int(b.group.max()) + 1 if len(b) else 0
        first = batches[0]
        return RolloutBatch(
            [p for b in batches for p in b.prompt_ids],
            torch.cat([pad(b.completion_ids, first.pad_id) for b in batches]),
            torch.cat([pad(b.logprobs, 0.0) for b in batches]),
            torch.cat([pad(b.mask, 0.0) for b in batches]),
            [r for b in batches for r in b.finish_reasons],
            torch.cat(groups),
            first.pad_id,
            min(b.policy_version for b in batches),
            torch.cat([pad(b.attention, 0.0) for b in batches])
            if any(b.context is not None for b in batches)
            else None,
            torch.cat([b.row_versions for b in batches])
            if len({int(v) for b in batches for v in b.row_versions.unique()}) > 1
            else None,
        )


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a generator."""

    policy_version: int

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> RolloutBatch:
        """Sample ``n`` completions per prompt (token-id lists)."""

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Load the trainer's current weights (full, merged state dict) as ``version``."""

    def sleep(self) -> None:
        """Release accelerator memory between rollouts (colocated engines); no-op elsewhere."""

    def wake(self) -> None:
        """Undo :meth:`sleep`."""


class LocalEngine(abc.ABC):
    """What the in-process engines (HF ``generate``, the lean loop) share: the model used
    as is (``own_copy=False``: the colocated case, where the trainer's module *is* the
    engine's and weight sync is free) or deep-copied (``own_copy=True``: asynchronous
    rollouts from a frozen snapshot, updated by :meth:`update_weights`); prompts decoded
    at most ``batch_size`` completions at a time by the subclass's ``_generate_chunk``,
    inside its ``_context()``."""

    def __init__(
        self, model: torch.nn.Module, tokenizer, own_copy: bool = False, batch_size: int = 256
    ):
        self.model = copy.deepcopy(model) if own_copy else model
        self.own_copy = own_copy
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.policy_version = 0
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs a pad token for batched generation")
        self.pad_id = int(tokenizer.pad_token_id)
        eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        if self.own_copy:
            self.model.load_state_dict(state_dict, strict=True)
        self.policy_version = version

    def sleep(self) -> None:  # noqa: B027 (a no-op on purpose, not abstract)
        """Nothing to release: CPU memory, or a module shared with the trainer."""

    def wake(self) -> None:  # noqa: B027
        """Undo :meth:`sleep` (nothing to undo)."""

    def _context(self) -> contextlib.AbstractContextManager:
        return torch.no_grad()

    @abc.abstractmethod
    def _generate_chunk(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams
    ) -> list[tuple[list[int], list[int], list[float], FinishReason]]:
        """``n`` completions of each prompt as ``from_rows`` rows, grouped by prompt."""

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> RolloutBatch:
        rows: list[tuple[list[int], list[int], list[float], FinishReason]] = []
        per_call = max(1, self.batch_size // n)
        with self._context():
            for s in range(0, len(prompts), per_call):
                rows.extend(self._generate_chunk(prompts[s : s + per_call], n, sampling))
        return RolloutBatch.from_rows(rows, len(prompts), n, self.pad_id, self.policy_version)
