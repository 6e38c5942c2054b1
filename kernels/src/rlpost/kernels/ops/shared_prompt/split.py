"""The responses' half of shared-prompt attention on CPU as two attentions merged by
their log-sum-exp, with the prompt's keys and values never copied.

Torch's fused SDPA takes one key sequence per query row, so
:func:`rlpost.kernels.ops.shared_prompt.shared_prompt_attention_sdpa` copies the prompt's
keys and values once per response (``[N, H, P + R, d]``) and sums their gradients back.
Here each response's queries attend

* to the prompt's keys, all ``N R`` of them as one query sequence per head (the prompt's
  keys and values read once, no mask), and
* causally to their own response's keys,

with torch's CPU flash kernel, which returns each part's log-sum-exp ``l_1``, ``l_2``; the
output is ``o_1 exp(l_1 - l) + o_2 exp(l_2 - l)`` with ``l = logaddexp(l_1, l_2)``. The
backward hands each part the merged output and log-sum-exp: the flash backward then
recomputes each part's probabilities as ``exp(s - l)``, the merged softmax's, and its
``rowsum(dO * O)`` is the merged one, so each part's gradients are exactly its share of
the whole attention's.

The CPU flash kernel does not skip the masked blocks of a short causal sequence, so the
split saves only the copies (``N P d`` per head, kept for the backward too) and pays for
the merge: ``auto`` takes it on CPU where the prompt is long, :func:`preferred`
(``tools/bench_shared_prompt_cpu.py``, one thread: 1.02-1.23x the two-call SDPA there,
0.78-0.95x at shorter prompts or tiny calls); the two-call SDPA otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

_ops = torch.ops.aten


def available() -> bool:
    """Torch's CPU flash attention with its log-sum-exp and backward (``aten`` ops)."""
    return hasattr(_ops, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
        _ops, "_scaled_dot_product_flash_attention_for_cpu_backward"
    )


MIN_PROMPT = 128  # the split pays where the prompt is at least this long ...
MIN_RATIO = 2  # ... and at least this many times a response's length


def preferred(prompt_len: int, response_len: int) -> bool:
    """Whether ``auto`` takes the split on CPU for a prompt and responses of these lengths."""
    return prompt_len >= max(MIN_PROMPT, MIN_RATIO * response_len)


def _flat(x: Tensor) -> Tensor:
    """``[N, H, R, ...]`` -> ``[1, H, N R, ...]``: every response's rows as one sequence."""
    N, H, R = x.shape[:3]
    return x.transpose(0, 1).reshape(1, H, N * R, *x.shape[3:])


class _Responses(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_r, k_p, v_p, k_r, v_r, scale):
        N, H, R, d = q_r.shape
        flash = _ops._scaled_dot_product_flash_attention_for_cpu
        o_1, l_1 = flash(_flat(q_r), k_p[None], v_p[None], scale=scale)
        o_2, l_2 = flash(q_r, k_r, v_r, is_causal=True, scale=scale)
        o_1 = o_1.view(H, N, R, d).transpose(0, 1)
        l_1 = l_1.view(H, N, R).transpose(0, 1)
        lse = torch.logaddexp(l_1, l_2)
        w_1, w_2 = (l_1 - lse).exp_()[..., None], (l_2 - lse).exp_()[..., None]
        out = (o_1 * w_1 + o_2 * w_2).to(q_r.dtype)  # (the log-sum-exps are float32)
        ctx.save_for_backward(q_r, k_p, v_p, k_r, v_r, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q_r, k_p, v_p, k_r, v_r, out, lse = ctx.saved_tensors
        N, H, R, d = q_r.shape
        d_out = d_out.contiguous()
        grad = _ops._scaled_dot_product_flash_attention_for_cpu_backward
        dq_1, dk_p, dv_p = grad(
            _flat(d_out), _flat(q_r), k_p[None], v_p[None], _flat(out), _flat(lse),
            0.0, False, scale=ctx.scale,
        )  # fmt: skip
        dq_2, dk_r, dv_r = grad(d_out, q_r, k_r, v_r, out, lse, 0.0, True, scale=ctx.scale)
        dq = dq_1.view(H, N, R, d).transpose(0, 1) + dq_2
        return dq, dk_p[0], dv_p[0], dk_r, dv_r, None


def shared_prompt_attention_split(
    q_p: Tensor, k_p: Tensor, v_p: Tensor, q_r: Tensor, k_r: Tensor, v_r: Tensor,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``(out_prompt [H, P, d], out_responses [N, H, R, d])`` on CPU: the prompt causally
    through SDPA, the responses as two flash attentions merged (see the module). Keys and
    values may have fewer heads than the queries: the CPU flash kernel reads them grouped,
    with no copy per query head."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    grouped = k_p.shape[0] < q_p.shape[0]
    out_p = sdpa(q_p[None], k_p[None], v_p[None], is_causal=True, scale=scale,
                 enable_gqa=grouped)[0]  # fmt: skip
    if scale is None:
        scale = q_r.shape[-1] ** -0.5
    return out_p, _Responses.apply(q_r, k_p.contiguous(), v_p.contiguous(), k_r, v_r, scale)
