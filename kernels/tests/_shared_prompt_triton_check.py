"""Run by test_shared_prompt.py with TRITON_INTERPRET=1: Triton kernels vs the reference,
outputs and all six gradients (float32). R=40 spans three 16-row blocks (the causal
block skipping)."""

import json
import sys

import torch

from rlpost.kernels.ops.shared_prompt import shared_prompt_attention

out = {}
for N, H, P, R, d in ((3, 2, 20, 13, 16), (2, 1, 16, 16, 32), (2, 2, 8, 40, 16)):
    g = torch.Generator().manual_seed(P + R)

    def t(*shape, g=g):
        return torch.randn(*shape, generator=g).requires_grad_()

    ins = (t(H, P, d), t(H, P, d), t(H, P, d), t(N, H, R, d), t(N, H, R, d), t(N, H, R, d))
    gp, gr = torch.randn(H, P, d, generator=g), torch.randn(N, H, R, d, generator=g)
    res = {}
    for backend in ("triton", "reference"):
        op, orr = shared_prompt_attention(*ins, backend=backend)
        grads = torch.autograd.grad((op * gp).sum() + (orr * gr).sum(), ins)
        res[backend] = (op, orr, *grads)
    errs = [
        float((a - b).detach().abs().max())
        for a, b in zip(res["triton"], res["reference"], strict=True)
    ]
    out[f"N{N}H{H}P{P}R{R}d{d}"] = errs
json.dump(out, sys.stdout)
