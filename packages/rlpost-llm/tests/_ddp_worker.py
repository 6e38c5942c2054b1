"""Launched by test_distributed.py under torch.distributed.run: one trainer per rank
(``--resume``: continue the run in ``run.dir``), ending its process the way the CLI ends a
torchrun rank's (``end_rank``). Exit 3 when the model outlives its finished trainer (FSDP2's
layer states reference the model: a cache that held them strongly kept it alive)."""

import gc
import sys
import weakref

import torch

from rlpost.llm.config import load_config
from rlpost.llm.train.parallel import end_rank
from rlpost.llm.trainer import Trainer


def parity_reward(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    args = [a for a in sys.argv[1:] if a != "--resume"]
    resume = "--resume" in sys.argv[1:]
    trainer = Trainer(load_config(None, args), reward_fn=parity_reward, resume=resume)
    trainer.train()
    model = weakref.ref(trainer.model)
    del trainer
    gc.collect()
    if model() is not None:
        print("the model outlived its finished trainer", file=sys.stderr, flush=True)
    end_rank(0 if model() is None else 3)
