"""A 2-process data-parallel run (DDP or FSDP2 over gloo, CPU) equals a 1-process run with
the same global batch: for GRPO, and for PPO, whose critic is data-parallel too; an FSDP2
run resumes from its checkpoint to the same weights and optimiser state."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlpost.llm.config import load_config
from rlpost.llm.trainer import Trainer

WORKER = Path(__file__).with_name("_ddp_worker.py")
LEARNER_WORKER = Path(__file__).with_name("_learner_worker.py")


def parity_reward(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


def _launch(*args) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            # the rendezvous store binds a port of its own choosing: a port picked here
            # and handed over could be taken in between (CI: EADDRINUSE)
            "--standalone",
            *map(str, args),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        # a rank killed by a signal (CI once saw SIGABRT, 'terminate called without an
        # active exception') dumps every thread's Python stack before it dies
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    # the ranks' own output, without the launcher's traceback that follows it
    ranks = proc.stderr.split('Traceback (most recent call last):\n  File "<frozen runpy>"')[0]
    assert proc.returncode == 0, ranks[-6000:]


@pytest.mark.parametrize(
    "preset, parallel",
    [
        ("grpo", "ddp"),
        # PPO's critic under DDP: the slow tier (uv run pytest -m slow); GRPO keeps DDP and
        # FSDP2 in the default suite
        pytest.param("ppo", "ddp", marks=pytest.mark.slow),
        ("grpo", "fsdp2"),
    ],
)
def test_two_ranks_equal_one(tmp_path, fast_overrides, preset, parallel):
    common = [
        *fast_overrides,
        f"algo.preset={preset}",
        f"train.parallel={parallel}",
        "train.steps=3",  # (the third step's rollback snapshot copies into kept buffers)
        "run.save_every=3",
        "optim.micro_batch_size=5",  # 8 rows a rank: two micro-batches, one all-reduce
        # unclipped AdamW with eps above the gradients: its step is about lr g / eps, linear
        # in g, so a wrong gradient scale shows in the weights (at eps 1e-8 the step is
        # lr sign(g), blind to scale, and amplifies rounding in near-zero gradients 1e4-fold)
        "optim.grad_clip=null",
        "optim.lr=1e-2",
        "optim.params={eps: 1e-2}",
    ]
    single = tmp_path / "single"
    tr = Trainer(load_config(None, [*common, f"run.dir={single}"]), reward_fn=parity_reward)
    initial = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    tr.train()
    ddp = tmp_path / "ddp"
    _launch(WORKER, *common, f"run.dir={ddp}")
    files = ["model.safetensors"] + (["critic.safetensors"] if preset == "ppo" else [])
    for f in files:
        a = load_file(single / "checkpoints/step-000003" / f)
        b = load_file(ddp / "checkpoints/step-000003" / f)
        for k in a:  # (packed rows sum in another order per rank; Adam magnifies tiny grads)
            torch.testing.assert_close(a[k], b[k], atol=5e-6, rtol=1e-5, msg=f"{f}: {k}")
    a = load_file(single / "checkpoints/step-000003/model.safetensors")
    assert any(not torch.allclose(a[k], initial[k]) for k in a), "training must move the weights"


def test_learner_gradient_equals_the_full_batch_gradient(tmp_path):
    """At the gradient level: the ranks' micro-batches (3 on rank 0, and on rank 1 either 1
    or none: a zero-weight pass; both splits in one launch), all-reduced once, give the
    one-process gradient of all 10 rows, from rank 0's weights although rank 1 started
    from others."""
    _launch(LEARNER_WORKER, tmp_path / "grads.pt", "7,10", 3)
    got = torch.load(tmp_path / "grads.pt")
    assert sorted(got) == [7, 10]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 4, generator=g), torch.randn(10, 1, generator=g)
    ((model(x) - y) ** 2).sum().div(10).backward()
    for share, grads in got.items():
        for n, p in model.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, atol=1e-6, rtol=1e-5, msg=f"{share}: {n}")


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow)
def test_fsdp2_resumes_to_the_uninterrupted_run(tmp_path, fast_overrides):
    """Two FSDP2 ranks train 2 steps and stop; relaunched with --resume they load the whole
    weights and Adam state into their shards and train step 3: the checkpoint equals a
    one-process run's of 3 steps (weights and optimiser state)."""
    common = [*fast_overrides, "run.save_every=1", "optim.micro_batch_size=5"]
    single = tmp_path / "single"
    Trainer(
        load_config(None, [*common, "train.steps=3", f"run.dir={single}"]),
        reward_fn=parity_reward,
    ).train()
    sharded = tmp_path / "fsdp2"
    args = [*common, "train.parallel=fsdp2", f"run.dir={sharded}"]
    _launch(WORKER, *args, "train.steps=2")
    _launch(WORKER, *args, "train.steps=3", "--resume")
    for f in ("model.safetensors", "optimizer.safetensors"):
        a = load_file(single / "checkpoints/step-000003" / f)
        b = load_file(sharded / "checkpoints/step-000003" / f)
        assert a.keys() == b.keys(), f
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=5e-6, rtol=1e-5, msg=f"{f}: {k}")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.lora.r=4"], "model.lora"),
        (["algo.preset=ppo"], "a critic"),
        (["train.pipeline=dora"], "train.pipeline dora"),
    ],
)
def test_fsdp2_refuses_what_needs_whole_weights_on_one_rank(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, ["train.parallel=fsdp2", *overrides])


def test_end_rank_flushes_what_it_can_and_exits_with_the_code():
    """Buffered output is written, a closed stream does not stop the exit, the code is kept,
    and no exit handler runs."""
    code = (
        "import atexit, sys\n"
        "from rlpost.llm.train.parallel import end_rank\n"
        "atexit.register(print, 'torn down')\n"
        "print('kept', end='')\n"
        "sys.stderr.close()\n"
        "end_rank(4)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (4, "kept")
