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
from dataclasses import dataclass

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
    ``allow [G, T, T]`` (bool: query row may attend to key column), ``gather [B, L]``
    (flat index into ``G * T`` of the position whose output predicts each completion
    token), ``tokens`` (real tokens per packed sequence), ``layout`` (``(P, N, L)`` of each
    packed sequence: prompt length, responses, response length)."""

    input_ids: Tensor
    position_ids: Tensor
    allow: Tensor
    gather: Tensor
    tokens: list[int]
    layout: list[tuple[int, int, int]]

    def additive_mask(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """``[G, 1, T, T]``: 0 where allowed, the dtype's minimum elsewhere (HF 4D mask)."""
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


def pack_groups(prompt_ids: list[list[int]], completion_ids: Tensor, pad_id: int) -> PackedGroups:
    """Pack rows that share a prompt (equal ``prompt_ids``) into one sequence each, in
    order of first appearance; padding rows attend only to themselves."""
    B, L = completion_ids.shape
    order: dict[tuple[int, ...], list[int]] = {}
    for b, p in enumerate(prompt_ids):
        order.setdefault(tuple(p), []).append(b)
    packs = [(list(p), rows) for p, rows in order.items()]
    T = max(len(p) + len(rows) * L for p, rows in packs)
    G = len(packs)
    ids = torch.full((G, T), pad_id, dtype=torch.long)
    pos = torch.zeros(G, T, dtype=torch.long)
    allow = torch.eye(T, dtype=torch.bool).repeat(G, 1, 1)
    gather = torch.zeros(B, L, dtype=torch.long)
    tokens, layout = [], []
    for g, (prompt, rows) in enumerate(packs):
        i, p, a = pack_group(prompt, completion_ids[rows])
        n = len(i)
        ids[g, :n], pos[g, :n], allow[g, :n, :n] = i, p, a
        P = len(prompt)
        for j, b in enumerate(rows):
            s = P + j * L  # response j's first token; it is predicted by position P - 1
            gather[b] = g * T + torch.cat([torch.tensor([P - 1]), torch.arange(s, s + L - 1)])
        tokens.append(n)
        layout.append((P, len(rows), L))
    return PackedGroups(ids, pos, allow, gather, tokens, layout)


def packing_ratio(n: int, prompt_len: int, response_len: int) -> float:
    """Theoretical per-token work ratio ``N (P + R) / (P + N R)`` of packing a group."""
    return n * (prompt_len + response_len) / (prompt_len + n * response_len)
