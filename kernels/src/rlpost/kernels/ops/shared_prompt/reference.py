"""Shared-prompt attention (catalog 000-21, DualKV) and group packing: torch reference.

A GRPO group is ``N`` responses to one prompt. Laid out as ``N`` sequences
``[prompt; response_i]``, every per-token op (embeddings, norms, MLPs, projections) and
the prompt's attention run ``N`` times on identical prompt tokens. Packed, the group is
one sequence ``[prompt; response_1; ...; response_N]`` of ``P + N R`` tokens in which

* prompt token ``t`` attends to prompt tokens ``<= t`` (causal), position ``t``;
* response ``i``'s token ``t`` attends to the whole prompt and to response ``i``'s tokens
  ``<= t``, position ``P + t`` (as in its own sequence),

so every output equals the unpacked one while per-token work drops by
``rho = N (P + R) / (P + N R)``.

:func:`shared_prompt_attention` is the attention itself with the prompt's keys and
values held once (``[H, P, d]``) and the responses batched (``[N, H, R, d]``): it is
mathematically causal attention over each ``[prompt; response_i]``; its gradient with
respect to the prompt's keys and values sums over the responses.
:func:`pack_group` / :func:`pack_groups` build the packed token layout, position ids and
attention structure for any model that accepts a 4D attention mask.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor


def shared_prompt_attention(
    q_p: Tensor,
    k_p: Tensor,
    v_p: Tensor,
    q_r: Tensor,
    k_r: Tensor,
    v_r: Tensor,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """``(out_prompt [H, P, d], out_responses [N, H, R, d])``.

    Prompt ``q_p, k_p, v_p`` ``[H, P, d]``; responses ``q_r, k_r, v_r`` ``[N, H, R, d]``.
    """
    P, R = q_p.shape[-2], q_r.shape[-2]
    scale = 1.0 / math.sqrt(q_p.shape[-1]) if scale is None else scale
    causal_p = torch.ones(P, P, dtype=torch.bool, device=q_p.device).tril()
    s_pp = (q_p @ k_p.transpose(-1, -2)) * scale
    out_p = s_pp.masked_fill(~causal_p, -torch.inf).softmax(-1) @ v_p
    s_rp = (q_r @ k_p.transpose(-1, -2)) * scale  # [N, H, R, P]: every prompt key
    causal_r = torch.ones(R, R, dtype=torch.bool, device=q_r.device).tril()
    s_rr = ((q_r @ k_r.transpose(-1, -2)) * scale).masked_fill(~causal_r, -torch.inf)
    w = torch.cat([s_rp, s_rr], dim=-1).softmax(-1)
    out_r = w[..., :P] @ v_p + w[..., P:] @ v_r
    return out_p, out_r


@dataclass
class PackedGroups:
    """Packed groups, right-padded to ``T``: ``input_ids [G, T]``, ``position_ids [G, T]``,
    ``segments`` (the group and segment of every slot, ``[G, T]`` each, whence
    :attr:`allow`), ``gather [B, L]``
    (flat index into ``G * T`` of the position whose output predicts each completion
    token), ``tokens`` (real tokens per packed sequence), ``layout`` (``(P, N, L)`` of each
    packed sequence: prompt length, responses, response length; ``None`` for the ragged
    layout, which ``allow`` describes), ``seqs`` (ragged only: each response's own
    sequence ``[its prompt's slots; its slots]`` as flat indices into ``G * T``, in the
    batch's order), ``sequences`` (ragged only: whether it attends by sequence, each
    response's own causal sequence padded to the longest of its length bucket; decided
    when built, :func:`pack_groups`' ``sequences`` and :func:`attends_by_sequence`: then
    ``allow`` is ``None`` and no group is split)."""

    input_ids: Tensor
    position_ids: Tensor
    segments: tuple[Tensor, Tensor] | None
    gather: Tensor
    tokens: list[int]
    layout: list[tuple[int, int, int]] | None
    seqs: list[list[int]] | None = None
    sequences: bool = False
    _allow: Tensor | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def allow(self) -> Tensor | None:
        """``[G, T, T]`` bool: query row may attend to key column (``None`` when attending
        by sequence). Built on first use: the shared-prompt attention of the uniform layout
        never reads it (at 16 groups of 3,041 tokens it is 148 MB, 0.44 s to build)."""
        if self.segments is None:
            return None
        if self._allow is None:
            self._allow = _allow(*self.segments, self.input_ids.shape[1])
        return self._allow

    def additive_mask(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """``[G, 1, T, T]``: 0 where allowed, the dtype's minimum elsewhere (HF 4D mask)."""
        if self.allow is None:
            raise ValueError("this ragged layout attends by sequence: it has no dense mask")
        m = torch.zeros(self.allow.shape, dtype=dtype)
        m.masked_fill_(~self.allow, torch.finfo(dtype).min)
        return m[:, None]


def pack_group(prompt: list[int], responses: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One group: ``(ids [P + N L], positions, allow [T, T])`` for ``responses [N, L]``."""
    P = len(prompt)
    N, L = responses.shape
    T = P + N * L
    ids = torch.cat([torch.tensor(prompt, dtype=torch.long), responses.reshape(-1).long()])
    pos = torch.cat([torch.arange(P)] + [torch.arange(P, P + L)] * N)
    allow = torch.zeros(T, T, dtype=torch.bool)
    allow[:P, :P] = torch.ones(P, P, dtype=torch.bool).tril()
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    for i in range(N):
        s = P + i * L
        allow[s : s + L, :P] = True
        allow[s : s + L, s : s + L] = causal
    return ids, pos, allow


def _split_long_groups(packs: list, kept: list[int], row_tokens: int) -> list:
    """Groups longer than ``max(row_tokens, 2 x the longest [prompt; response])`` split into
    several, each with the prompt."""
    longest = max(len(p) + kept[b] for p, rows in packs for b in rows)
    cap = max(row_tokens, 2 * longest)
    split = []
    for p, rows in packs:
        cur, size = [], len(p)
        for b in rows:
            if cur and size + kept[b] > cap:
                split.append((p, cur))
                cur, size = [], len(p)
            cur.append(b)
            size += kept[b]
        split.append((p, cur))
    return split


def _first_fit(sizes: list[int], T: int) -> list[list[int]]:
    """Groups (by index) into rows of ``T`` tokens, first-fit decreasing."""
    bins: list[list[int]] = []
    free: list[int] = []
    for g in sorted(range(len(sizes)), key=lambda g: -sizes[g]):
        for r, room in enumerate(free):
            if sizes[g] <= room:
                bins[r].append(g)
                free[r] -= sizes[g]
                break
        else:
            bins.append([g])
            free.append(T - sizes[g])
    return bins


def _plan(
    prompt_ids: list[list[int]],
    B: int,
    L: int,
    lengths: Tensor | None,
    row_tokens: int | None,
    last_token: bool,
):
    """How :func:`pack_groups` lays ``B`` responses out, before anything is built:
    ``(packs [(prompt, rows)], response lengths, tokens kept per response, bins [packs
    per row], row length T, tokens dropped per response)``."""
    order: dict[tuple[int, ...], list[int]] = {}
    for b, p in enumerate(prompt_ids):
        order.setdefault(tuple(p), []).append(b)
    packs = [(list(p), rows) for p, rows in order.items()]
    lens_all = [L] * B if lengths is None else [max(1, n) for n in lengths.tolist()]
    drop = 0 if last_token or (lengths is None and L == 1) else 1
    kept = [n - drop for n in lens_all]  # tokens of each response in the packed input
    if lengths is not None and row_tokens:  # split groups longer than a row
        packs = _split_long_groups(packs, kept, row_tokens)
    sizes = [len(p) + sum(kept[b] for b in rows) for p, rows in packs]
    T = max(sizes)
    # one group per row (uniform), or first-fit decreasing into rows of T (ragged)
    bins = [[g] for g in range(len(packs))] if lengths is None else _first_fit(sizes, T)
    return packs, lens_all, kept, bins, T, drop


BUCKET_RATIO = 0.75  # a sequence shorter than this share of its bucket's longest ...
MAX_BUCKETS = 4  # ... starts a new bucket, up to this many


def length_buckets(seq_lens: list[int]) -> list[list[int]]:
    """The sequences (by index) in buckets of similar length, longest first: each bucket
    is padded to its own longest, one fused attention call each."""
    buckets: list[list[int]] = []
    for i in sorted(range(len(seq_lens)), key=lambda i: -seq_lens[i]):
        top = seq_lens[buckets[-1][0]] if buckets else 0
        if not buckets or (seq_lens[i] < BUCKET_RATIO * top and len(buckets) < MAX_BUCKETS):
            buckets.append([])
        buckets[-1].append(i)
    return buckets


def ragged_pairs(rows: int, T: int, seq_lens: list[int]) -> tuple[float, float]:
    """The ragged layout's attention as ``(dense, by_sequence)`` (query, key) pairs:
    ``rows`` packed rows of ``T`` attended densely under their mask (``T^2`` a row, as a
    masked fused attention computes them), or each response's ``[prompt; response]`` as
    its own causal sequence (lengths ``seq_lens``), padded to the longest of its
    :func:`length_buckets` bucket (the causal ``S (S + 1) / 2`` pairs of a sequence of
    ``S``, as a causal fused attention computes them, the masked blocks skipped)."""
    by_seq = 0.0
    for bucket in length_buckets(seq_lens):
        longest = seq_lens[bucket[0]]
        by_seq += len(bucket) * longest * (longest + 1) / 2
    return float(rows * T * T), by_seq


MIN_SEQUENCE = 64  # by sequence only where the sequences average at least this many tokens
SEQUENCE_GAIN = 2.0  # ... and the dense rows compute at least this many times the pairs


def attends_by_sequence(rows: int, T: int, seq_lens: list[int]) -> bool:
    """Whether the ragged layout attends by sequence: where the sequences are long enough
    that the fused kernel's cost per sequence does not dominate (on average
    ``MIN_SEQUENCE`` tokens) and the dense rows compute ``SEQUENCE_GAIN`` times the pairs
    (:func:`ragged_pairs`). Measured on CPU (the tiny model, one thread, attention forward
    and backward, ``tools/bench_ragged_attention.py``): responses of up to 8 tokens ran
    1.6-1.7x slower by sequence with under a third of the pairs, responses of up to 128
    tokens after short prompts 1.41-1.70x faster."""
    if not seq_lens or sum(seq_lens) < MIN_SEQUENCE * len(seq_lens):
        return False
    dense, by_seq = ragged_pairs(rows, T, seq_lens)
    return SEQUENCE_GAIN * by_seq <= dense


def _ragged_plan(prompt_ids, B, L, lengths, row_tokens, last_token, sequences):
    """:func:`_plan` of the ragged layout and whether it attends by sequence: only where
    the caller can (``sequences``) and :func:`attends_by_sequence` takes it against the
    dense rows of the split plan; its groups are then not split (the split repeats the
    prompt only to keep dense masks small), one response's sequence being the same
    either way."""
    plan = _plan(prompt_ids, B, L, lengths, row_tokens, last_token)
    if not sequences:
        return plan, False
    packs, _, kept, bins, T, _ = plan
    if not attends_by_sequence(len(bins), T, _seq_lens(packs, kept)):
        return plan, False
    return _plan(prompt_ids, B, L, lengths, None, last_token), True


def _seq_lens(packs: list, kept: list[int]) -> list[int]:
    """Each response's ``[prompt; response]`` length in a plan's packs."""
    return [len(p) + kept[b] for p, rows in packs for b in rows]


def packed_work(
    prompt_ids: list[list[int]],
    L: int,
    lengths: Tensor | None = None,
    row_tokens: int | None = None,
    last_token: bool = True,
    sequences: bool = False,
) -> tuple[int, float]:
    """``(positions, attention pairs)`` a forward over :func:`pack_groups`' layout computes,
    counted from its plan without building it: the ragged layout (``lengths``) attends
    densely within each packed row, or (``sequences``, where :func:`attends_by_sequence`
    takes it) by sequence with its groups whole (:func:`ragged_pairs`), the uniform one
    through the shared-prompt op (the prompt causally, each response over the prompt and
    itself)."""
    B = len(prompt_ids)
    if lengths is None:
        plan, by_seq = _plan(prompt_ids, B, L, lengths, row_tokens, last_token), False
    else:
        plan, by_seq = _ragged_plan(prompt_ids, B, L, lengths, row_tokens, last_token, sequences)
    packs, _, kept, bins, T, drop = plan
    positions = sum(len(p) + sum(kept[b] for b in rows) for p, rows in packs)
    if lengths is not None:
        dense, seq_pairs = ragged_pairs(len(bins), T, _seq_lens(packs, kept))
        return positions, seq_pairs if by_seq else dense
    R = L - drop
    pairs = sum(len(p) * (len(p) + 1) / 2 + len(rows) * R * (len(p) + R) for p, rows in packs)
    return positions, pairs


def pack_groups(
    prompt_ids: list[list[int]],
    completion_ids: Tensor,
    pad_id: int,
    lengths: Tensor | None = None,
    row_tokens: int | None = None,
    last_token: bool = True,
    sequences: bool = False,
) -> PackedGroups:
    """Pack rows that share a prompt (equal ``prompt_ids``) into one sequence each, in
    order of first appearance; padding rows attend only to themselves.

    ``lengths`` (``[B]`` real tokens per completion): the *ragged* layout. Each response
    takes only its own tokens (no right padding inside a group), several groups may share
    a packed row (first-fit decreasing into rows as long as the longest group, so that
    rows need little padding), and ``layout`` is ``None``: ``allow`` is the mask (a token
    attends within its own group only); with ``row_tokens``, a group longer than
    ``max(row_tokens, 2 x its longest [prompt; response])`` is split, its prompt repeated
    (smaller rows, smaller dense masks). Without ``lengths`` every response is padded to
    ``L``, one group per row, and ``layout`` holds each row's ``(P, N, L)`` for the
    shared-prompt attention op. A completion position past a ragged response's length
    gathers that response's last predicting position (finite; the caller masks it out).

    ``last_token=False`` leaves each response's last token out of the packed input: its
    output predicts nothing and no later token attends to it, so every gathered output is
    unchanged while each response costs one position less (a uniform layout of ``L = 1``
    keeps its one token).

    ``sequences``: the caller can attend by sequence (each response's ``[prompt;
    response]`` its own causal sequence, ``seqs``); where :func:`attends_by_sequence`
    takes that, no group is split and no dense mask is built (``allow`` is ``None``)."""
    B, L = completion_ids.shape
    plan, by_seq = _ragged_plan(prompt_ids, B, L, lengths, row_tokens, last_token, sequences)
    packs, lens_all, kept, bins, T, drop = plan
    comp = completion_ids.tolist()
    ids, pos, grp, seg = [], [], [], []  # per packed row; grp / seg -1 on padding
    gather = [[0] * L for _ in range(B)]
    tokens, seqs = [], [[] for _ in range(B)]
    for r, members in enumerate(bins):
        i_r, p_r, g_r, s_r = [], [], [], []
        for g in members:
            prompt, rows = packs[g]
            P = len(prompt)
            prompt_slots = list(range(r * T + len(i_r), r * T + len(i_r) + P))
            i_r += prompt
            p_r += range(P)
            g_r += [g] * P
            s_r += [0] * P
            prev = r * T + len(i_r) - 1  # token 0 is predicted by the prompt's last
            for j, b in enumerate(rows):
                n, k = lens_all[b], kept[b]
                start = r * T + len(i_r)
                i_r += comp[b][:k]
                p_r += range(P, P + k)
                g_r += [g] * k
                s_r += [j + 1] * k
                pred = [prev, *range(start, start + n - 1)]  # token t: from position t - 1
                gather[b] = pred + [pred[-1]] * (L - n)
                seqs[b] = prompt_slots + list(range(start, start + k))
        tokens.append(len(i_r))
        pad = T - len(i_r)
        ids.append(i_r + [pad_id] * pad)
        pos.append(p_r + [0] * pad)
        grp.append(g_r + [-1] * pad)
        seg.append(s_r + [-1] * pad)
    segments = None if by_seq else (long_rows(grp), long_rows(seg))
    layout = None if lengths is not None else [(len(p), len(r), L - drop) for p, r in packs]
    return PackedGroups(
        long_rows(ids), long_rows(pos), segments, long_rows(gather), tokens, layout,
        seqs if lengths is not None else None, by_seq,
    )  # fmt: skip


def long_tensor(values: Iterable[int]) -> Tensor:
    """``[n]`` int64 of Python ints, through a typed buffer: ``torch.tensor`` of a long list
    costs tens of nanoseconds an element (a packed batch holds hundreds of thousands)."""
    return concat_rows((values,))


def concat_rows(rows: Iterable[Iterable[float]], dtype: torch.dtype = torch.long) -> Tensor:
    """``[total]`` int64 (or float64) of every row's Python numbers end to end, through one
    typed buffer: a list row is copied at C speed (``array.fromlist``, 5x an iterator),
    any other row element by element."""
    buf = array({torch.long: "q", torch.float64: "d"}[dtype])
    for r in rows:
        if type(r) is list:
            buf.fromlist(r)
        else:
            buf.extend(r)
    return torch.frombuffer(buf, dtype=dtype) if buf else torch.zeros(0, dtype=dtype)


def pad_rows(
    rows: list, fill: float = 0, dtype: torch.dtype = torch.long, *, left: bool = False,
    width: int | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``(values [B, W], real [B, W] bool)``: rows of Python numbers padded with ``fill`` to
    ``width`` (default the longest), on the right or on the ``left``, through one typed
    buffer (:func:`concat_rows`)."""
    lens = torch.tensor([len(r) for r in rows], dtype=torch.long)
    W = width if width is not None else int(lens.max()) if len(rows) else 0
    cols = torch.arange(W)
    real = cols >= (W - lens)[:, None] if left else cols < lens[:, None]
    out = torch.full((len(rows), W), fill, dtype=dtype)
    out[real] = concat_rows(rows, dtype)
    return out, real


def long_rows(rows: list[list[int]]) -> Tensor:
    """``[len(rows), n]`` int64 of equally long rows of Python ints (:func:`concat_rows`)."""
    return concat_rows(rows).view(len(rows), -1)


def _allow(grp: Tensor, seg: Tensor, T: int) -> Tensor:
    """``[G, T, T]`` bool: a token attends to its group's prompt and its own response,
    causally (``grp`` / ``seg`` ``[G, T]``: group and segment of each slot, -1 on padding,
    segment 0 the prompt); a padding slot to itself."""
    idx = torch.arange(T)
    gq, gk, sq, sk = grp[:, :, None], grp[:, None, :], seg[:, :, None], seg[:, None, :]
    allow = (gq == gk) & (gq >= 0) & ((sk == 0) | (sk == sq)) & (idx[None, :] <= idx[:, None])
    return allow | torch.eye(T, dtype=torch.bool)


def packing_ratio(n: int, prompt_len: int, response_len: int) -> float:
    """Theoretical per-token work ratio ``N (P + R) / (P + N R)`` of packing a group."""
    return n * (prompt_len + response_len) / (prompt_len + n * response_len)
