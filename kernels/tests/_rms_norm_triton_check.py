"""Run by test_rms_norm.py with TRITON_INTERPRET=1: the Triton kernels against the torch
reference, forward and backward (the largest absolute differences, per case)."""

import json
import sys

import torch

from rlpost.kernels.ops.rms_norm import rms_norm

out = {}
for rows, n, dtype in ((37, 96, torch.float32), (16, 128, torch.float32), (5, 100, torch.float32),
                       (20, 64, torch.bfloat16)):  # fmt: skip
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, n, generator=g) * 3).to(dtype)
    w = (1 + torch.randn(n, generator=g) / 4).to(dtype)
    dy = torch.randn(rows, n, generator=g).to(dtype)
    res = {}
    for backend in ("triton", "reference"):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = rms_norm(xi.view(rows, 1, n), wi, 1e-6, backend=backend)
        y.backward(dy.view(rows, 1, n))
        res[backend] = (y.detach().float(), xi.grad.float(), wi.grad.float())
    diffs = [float((a - b).abs().max()) for a, b in zip(*res.values(), strict=True)]
    out[f"{rows}x{n} {dtype}"] = dict(zip(("y", "dx", "dw"), diffs, strict=True))
json.dump(out, sys.stdout)
