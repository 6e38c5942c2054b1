"""Run by test_swiglu.py with TRITON_INTERPRET=1: the Triton kernels against the torch
reference, forward and backward (the largest absolute differences, per case)."""

import json
import sys

import torch

from rlpost.kernels.ops.swiglu import swiglu

out = {}
for shape, dtype in (((7, 300), torch.float32), ((2, 3, 1030), torch.float32),
                     ((5, 64), torch.bfloat16)):  # fmt: skip
    g = torch.Generator().manual_seed(len(shape))
    gate = (torch.randn(*shape, generator=g) * 4).to(dtype)
    up = torch.randn(*shape, generator=g).to(dtype)
    dh = torch.randn(*shape, generator=g).to(dtype)
    res = {}
    for backend in ("triton", "reference"):
        gi, ui = gate.clone().requires_grad_(), up.clone().requires_grad_()
        h = swiglu(gi, ui, backend=backend)
        h.backward(dh)
        res[backend] = (h.detach().float(), gi.grad.float(), ui.grad.float())
    diffs = [float((a - b).abs().max()) for a, b in zip(*res.values(), strict=True)]
    out[f"{shape} {dtype}"] = dict(zip(("h", "dgate", "dup"), diffs, strict=True))
json.dump(out, sys.stdout)
