"""Run by test_mxfp4.py with TRITON_INTERPRET=1: the Triton kernel vs the torch reference."""

import json
import sys

import torch

from rlpost.kernels.ops.mxfp4 import decompose_mxfp4

g = torch.Generator().manual_seed(0)
x = torch.randn(6, 256, generator=g) * torch.exp(2 * torch.randn(6, 256, generator=g))
x[0, :32] = 0.0  # an all-zero block
x[1, 5] = 0.75  # ties in the grid
out = {}
for kw in ({}, {"macro": 4}, {"outliers": 2}, {"macro": 8, "outliers": 1}):
    tri = decompose_mxfp4(x, backend="triton", **kw)
    ref = decompose_mxfp4(x, backend="reference", **kw)
    names = ("q", "scale_bias", "deadzone", "grid")
    out[json.dumps(kw)] = {n: float((getattr(tri, n) - getattr(ref, n)).abs().max()) for n in names}
json.dump(out, sys.stdout)
