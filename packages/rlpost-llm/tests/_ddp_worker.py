"""Launched by test_distributed.py under torch.distributed.run: one trainer per rank."""

import sys

import torch

from rlpost.llm.config import load_config
from rlpost.llm.trainer import Trainer


def parity_reward(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    Trainer(load_config(None, sys.argv[1:]), reward_fn=parity_reward).train()
