"""RewardPool: out-of-process rewards with real time limits, and math_verify_reward.

The reward functions below are module-level so worker processes can load them
(workers load this file by path: pytest's importlib mode names it unimportably).
"""

import math
import multiprocessing
import os
import sys
import time

import pytest

from rlpost.llm.data.tasks import Example
from rlpost.llm.rollout.rewards import RewardPool, RewardResult, math_verify_reward

TIMEOUT = 1.0
#: Generous bound for one score() call with hung / dying verifiers (includes worker restarts).
MAX_CALL_S = 10 * TIMEOUT


def reward_exact(completion, example):
    return float(completion.strip() == example.answer)


def reward_length(completion, example):
    return float(len(completion))


def reward_hang(completion, example):
    time.sleep(3600)
    return 1.0


def reward_raise(completion, example):
    raise ValueError("verifier bug")


def reward_exit(completion, example):
    os._exit(1)


def reward_nan(completion, example):
    return math.nan


def reward_torch_threads(completion, example):
    """Torch threads in the worker (1.0 if the worker has not loaded torch at all)."""
    torch = sys.modules.get("torch")
    return 1.0 if torch is None else float(torch.get_num_threads())


def _failing_warmup():
    raise RuntimeError("verifier model missing")


def reward_with_failing_warmup(completion, example):
    return 1.0


reward_with_failing_warmup.warmup = _failing_warmup


def reward_by_marker(completion, example):
    """Misbehave as the completion says (``hang``, ``raise``, ``exit``, ``nan``, ``str``), else exact match."""
    behaviours = {
        "hang": reward_hang,
        "raise": reward_raise,
        "exit": reward_exit,
        "nan": reward_nan,
        "str": lambda c, e: "1.0",
    }
    return behaviours.get(completion, reward_exact)(completion, example)


def _examples(n, answer="4"):
    return [Example(prompt="2+2=", answer=answer, meta={"i": i}) for i in range(n)]


def _pid_dead(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_weighted_sum_components_and_metrics():
    completions = ["4", "5", " 4", "44"] * 10
    with RewardPool(
        {"exact": reward_exact, "length": reward_length},
        weights={"exact": 1.0, "length": 0.5},
        workers=2,
        timeout_s=5.0,
    ) as pool:
        res = pool.score(completions, _examples(len(completions)))
        pids = pool.pids
        again = pool.score(["4"], _examples(1))
        assert pool.pids == pids  # persistent workers

    assert isinstance(res, RewardResult)
    assert res.names == ["exact", "length"]
    assert tuple(res.components.shape) == (40, 2)
    assert tuple(res.rewards.shape) == (40,)
    assert str(res.rewards.dtype) == "torch.float32"
    assert res.components[:4].tolist() == [[1.0, 1.0], [0.0, 1.0], [1.0, 2.0], [0.0, 2.0]]
    assert res.rewards[:4].tolist() == [1.5, 0.5, 2.0, 1.0]
    assert res.metrics["reward/timeouts"] == 0
    assert res.metrics["reward/errors"] == 0
    assert res.metrics["reward/exact/mean"] == pytest.approx(0.5)
    assert res.metrics["reward/length/mean"] == pytest.approx(1.5)
    assert res.metrics["reward/mean"] == pytest.approx(1.25)
    assert not res.failed.any()
    assert again.rewards.tolist() == [1.5]


def test_each_failing_verifier_scores_zero_and_is_counted():
    fns = {
        "exact": reward_exact,
        "hang": reward_hang,
        "raise": reward_raise,
        "exit": reward_exit,
        "nan": reward_nan,
    }
    with RewardPool(fns, workers=2, timeout_s=TIMEOUT) as pool:
        pool.wait_ready(timeout=60)
        old_pids = set(pool.pids)
        t0 = time.monotonic()
        res = pool.score(["4"], _examples(1))
        elapsed = time.monotonic() - t0
        assert not set(pool.pids) & old_pids  # the hung and the dead worker were replaced
        failures = pool.last_failures

    assert elapsed < MAX_CALL_S
    assert res.components.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    assert res.rewards.tolist() == [1.0]
    assert res.metrics["reward/timeouts"] == 1
    assert res.metrics["reward/errors"] == 3
    assert res.metrics["reward/hang/timeouts"] == 1
    for name in ("raise", "exit", "nan"):
        assert res.metrics[f"reward/{name}/errors"] == 1
    assert res.metrics["reward/exact/errors"] == res.metrics["reward/exact/timeouts"] == 0
    assert res.metrics["reward/worker_restarts"] == 2
    assert res.failed.tolist() == [[False, True, True, True, True]]
    reasons = {name: reason for _, name, _, reason in failures}
    assert "ValueError: verifier bug" in reasons["raise"]
    assert "died" in reasons["exit"]
    assert "non-finite" in reasons["nan"]
    assert "timeout" in reasons["hang"]


def test_failures_are_isolated_within_a_batch_and_the_pool_recovers():
    completions = ["4", "hang", "raise", "exit", "nan", "str", "5", "4"]
    with RewardPool(reward_by_marker, workers=2, timeout_s=TIMEOUT) as pool:
        pool.wait_ready(timeout=60)
        t0 = time.monotonic()
        res = pool.score(completions, _examples(len(completions)))
        elapsed = time.monotonic() - t0
        assert res.rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        assert res.metrics["reward/timeouts"] == 1
        assert res.metrics["reward/errors"] == 4  # raise, exit, nan, str
        assert res.failed[:, 0].tolist() == [False, True, True, True, True, True, False, False]
        assert elapsed < MAX_CALL_S

        nxt = pool.score(["4", "5", "4"], _examples(3))
        assert nxt.rewards.tolist() == [1.0, 0.0, 1.0]
        assert nxt.metrics["reward/errors"] == nxt.metrics["reward/timeouts"] == 0


def test_math_verify_reward_in_a_worker():
    completions = ["0.5", "$\\frac{1}{2}$", "1/3", "The answer is \\boxed{\\frac12}", "no idea"]
    examples = [Example(prompt="1/2 = ?", answer="\\frac{1}{2}", meta={}) for _ in completions]
    with RewardPool(math_verify_reward, workers=1, timeout_s=30.0) as pool:
        pool.wait_ready(timeout=180)  # importing sympy can take seconds
        res = pool.score(completions, examples)
    assert res.names == ["math_verify_reward"]
    assert res.rewards.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert res.metrics["reward/errors"] == 0
    assert res.metrics["reward/timeouts"] == 0


def test_workers_limit_torch_threads_and_close_terminates_them():
    pool = RewardPool(reward_torch_threads, workers=2, timeout_s=5.0)
    res = pool.score(["x", "y"], _examples(2))
    assert res.rewards.tolist() == [1.0, 1.0]
    pids = pool.pids
    assert len(pids) == 2 and not any(_pid_dead(p) for p in pids)
    pool.close()
    pool.close()  # idempotent
    assert all(_pid_dead(p) for p in pids)
    assert not {p.pid for p in multiprocessing.active_children()} & set(pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.score(["4"], _examples(1))


def test_a_verifier_that_cannot_start_fails_loudly():
    with (
        RewardPool(reward_with_failing_warmup, workers=1, timeout_s=5.0) as pool,
        pytest.raises(RuntimeError, match="verifier model missing"),
    ):
        pool.score(["4"], _examples(1))


def test_in_process_mode():
    pool = RewardPool(
        {"exact": reward_exact, "bad": reward_raise, "nan": reward_nan},
        weights={"exact": 2.0, "bad": 1.0, "nan": 1.0},
        workers=0,
    )
    res = pool.score(["4", "5"], _examples(2))
    assert pool.pids == []
    assert res.rewards.tolist() == [2.0, 0.0]
    assert res.metrics["reward/errors"] == 4
    assert res.metrics["reward/timeouts"] == 0
    empty = pool.score([], [])
    assert tuple(empty.components.shape) == (0, 3)
    pool.close()


def test_argument_validation():
    with pytest.raises(TypeError, match="picklable"):
        RewardPool(lambda c, e: 1.0, workers=1)
    with pytest.raises(ValueError, match="weights"):
        RewardPool({"a": reward_exact}, weights={"b": 1.0}, workers=0)
    with pytest.raises(ValueError, match="start_method"):
        RewardPool(reward_exact, workers=1, start_method="fork")
    pool = RewardPool(reward_exact, workers=0)
    with pytest.raises(ValueError, match="examples"):
        pool.score(["4"], [])


def test_a_trl_reward_returning_more_values_than_completions_is_refused():
    """A TRL-style reward is called with one completion at a time; returning more values
    than completions used to be silently cut to the first one."""
    from rlpost.llm.data.tasks import Example
    from rlpost.llm.rollout.rewards import as_verifier

    def lengthy(prompts, completions, **kwargs):
        return [1.0, 0.0]  # two values for one completion

    def fine(prompts, completions, **kwargs):
        return [float(len(c)) for c in completions]

    ex = Example("1+1=", "2", {})
    assert as_verifier(fine)("abc", ex) == 3.0
    with pytest.raises(ValueError, match=r"lengthy returned 2 values for 1 completion"):
        as_verifier(lengthy)("abc", ex)


_STUCK = """
import re, subprocess, sys, time

MARKER = sys.argv[1]


def stuck(completion, example):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(90)", MARKER],
                     start_new_session=True)  # a grandchild in its own session
    re.match(r"(a+)+$", "a" * 64 + "b")  # hours of backtracking in C, holding the GIL
    return 0.0


if __name__ == "__main__":
    from rlpost.llm.rollout.rewards import RewardPool

    pool = RewardPool({"stuck": stuck}, workers=1, timeout_s=600)
    pool.wait_ready(120)
    print(*pool.pids, flush=True)
    pool.score(["x"], [None])
"""


def _pids_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="a PID namespace per reward worker needs Linux and CAP_SYS_ADMIN (without it the "
    "worker is only the subreaper of its children, which a SIGKILLed trainer does not reach)",
)
def test_killing_the_trainer_takes_stuck_workers_and_their_setsid_children_along(tmp_path):
    import signal
    import subprocess
    import uuid

    marker = "rlpost-grandchild-" + uuid.uuid4().hex
    script = tmp_path / "trainer.py"
    script.write_text(_STUCK)
    trainer = subprocess.Popen(
        [sys.executable, str(script), marker], stdout=subprocess.PIPE, text=True
    )
    workers = [int(p) for p in trainer.stdout.readline().split()]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _pids_with(marker):
        time.sleep(0.2)
    assert workers and _pids_with(marker), "the reward function never ran"
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    deadline = time.monotonic() + 15
    alive = lambda: [p for p in workers if os.path.exists(f"/proc/{p}")] + _pids_with(marker)  # noqa: E731
    while time.monotonic() < deadline and alive():
        time.sleep(0.2)
    assert alive() == []
