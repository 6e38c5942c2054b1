"""Run by test_linear_logprob.py in a subprocess with TRITON_INTERPRET=1 (the interpreter
must be selected before triton is imported): Triton kernels vs the naive op, float32."""

import json
import sys

import torch

from rlpost.kernels.ops.linear_logprob import linear_logprob_entropy, linear_logprob_entropy_naive

out = {}
for n, v, d, temp in ((37, 101, 24, 1.0), (16, 64, 16, 0.7)):
    g = torch.Generator().manual_seed(n)
    h = torch.randn(n, d, generator=g, requires_grad=True)
    w = (0.5 * torch.randn(v, d, generator=g)).requires_grad_()
    y = torch.randint(v, (n,), generator=g)
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    res = {}
    for name in ("triton", "naive"):
        if name == "triton":
            lp, ent = linear_logprob_entropy(h, w, y, temp, backend="triton")
        else:
            lp, ent = linear_logprob_entropy_naive(h, w, y, temp)
        dh, dw = torch.autograd.grad((a * lp).sum() + (b * ent).sum(), (h, w))
        res[name] = (lp, ent, dh, dw)
    pairs = zip(res["triton"], res["naive"], strict=True)
    errs = [float((x - y_).detach().abs().max()) for x, y_ in pairs]
    out[f"{n}x{v}x{d}@{temp}"] = errs
json.dump(out, sys.stdout)
