"""A 2-process data-parallel run (gloo, CPU) equals a 1-process run with the same global batch."""

import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlpost.llm.config import load_config
from rlpost.llm.trainer import Trainer

WORKER = Path(__file__).with_name("_ddp_worker.py")


def parity_reward(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_equal_one(tmp_path, fast_overrides):
    common = [*fast_overrides, "train.steps=2", "run.save_every=2", "optim.micro_batch_size=5"]
    single = tmp_path / "single"
    tr = Trainer(load_config(None, [*common, f"run.dir={single}"]), reward_fn=parity_reward)
    initial = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    tr.train()
    ddp = tmp_path / "ddp"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--nnodes=1",
            f"--master_port={_free_port()}",
            str(WORKER),
            *common,
            f"run.dir={ddp}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = load_file(single / "checkpoints/step-000002/model.safetensors")
    b = load_file(ddp / "checkpoints/step-000002/model.safetensors")
    for k in a:  # (packed rows sum in another order per rank; Adam magnifies near-eps grads)
        torch.testing.assert_close(a[k], b[k], atol=5e-6, rtol=1e-5)
    assert any(not torch.allclose(a[k], initial[k]) for k in a), "training must move the weights"
