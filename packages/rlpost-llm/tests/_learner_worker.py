"""Launched by test_distributed.py under torch.distributed.run: one rank of a
:class:`~rlpost.llm.train.parallel.Learner` over a small model, its gradients written by rank 0.

Rows are split unevenly (``argv[2]``: rank 0's shares, comma-separated, each a fresh model
and learner in the one process group), so the ranks take different numbers of
micro-batches, and a rank may have none at all."""

import sys

import torch
import torch.distributed as dist

from rlpost.llm.train.parallel import Learner, end_rank


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, n: int) -> torch.Tensor:
    return ((model(x) - y) ** 2).sum() / n  # normalised by the global row count


def gradients(share: int, mbs: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(dist.get_rank())  # different initial weights: DDP must broadcast rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 4, generator=g), torch.randn(10, 1, generator=g)
    learner = Learner(model)
    rows = torch.arange(share) if dist.get_rank() == 0 else torch.arange(share, len(x))
    chunks = learner.micro_batches(rows, mbs, torch.arange(len(x)))
    for j, (idx, weight) in enumerate(chunks):
        learner.sync(last=j == len(chunks) - 1)
        loss = learner(loss_of, x[idx], y[idx], len(x))
        (loss * (weight * learner.scale)).backward()
    return {n: p.grad for n, p in model.named_parameters()}


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out, shares, mbs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    grads = {int(s): gradients(int(s), mbs) for s in shares.split(",")}
    if dist.get_rank() == 0:
        torch.save(grads, out)
    dist.destroy_process_group()
    end_rank(0)  # (as the CLI ends a rank: no interpreter teardown with torch's threads up)
