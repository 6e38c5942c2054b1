"""Numeric guards: skip, roll back, count and stop."""

import math

import pytest
import torch

from rlpost.core.guard import RunStopped, UpdateGuard, all_finite, finite_or_nan


def _setup():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    m(torch.randn(8, 4)).square().sum().backward()
    opt.step()  # a non-empty optimiser state
    return m, opt


def test_a_step_that_makes_parameters_non_finite_is_rolled_back_exactly():
    m, opt = _setup()
    guard = UpdateGuard(list(m.parameters()), [opt])
    before = [p.detach().clone() for p in m.parameters()]
    state = {k: v.clone() for k, v in opt.state[m.weight].items()}
    m(torch.randn(8, 4)).square().sum().backward()
    m.weight.grad[0, 0] = math.inf  # Adam turns this into a NaN parameter
    assert not guard.grads_finite()
    assert guard.step(opt.step) is False
    for p, b in zip(m.parameters(), before, strict=True):
        assert torch.equal(p, b)
    for k, v in opt.state[m.weight].items():
        assert torch.equal(v, state[k]), k
    assert guard.rollbacks == 1


def test_a_later_rollback_undoes_a_finite_but_diverged_step():
    m, opt = _setup()
    # the growth check would catch this one at the step; without it, the later rollback
    # (when the weights' use shows the damage) is the line of defence tested here
    guard = UpdateGuard(list(m.parameters()), [opt], max_growth=None)
    before = [p.detach().clone() for p in m.parameters()]
    for g in opt.param_groups:
        g["lr"] = 1e30
    m(torch.randn(8, 4)).square().sum().backward()
    assert guard.step(opt.step) is True  # huge, finite weights: only their use shows it
    assert m.weight.abs().max() > 1e20
    assert guard.rollback() is True
    assert all(torch.equal(p, b) for p, b in zip(m.parameters(), before, strict=True))
    assert guard.rollback() is False  # one snapshot, used once


def test_consecutive_bad_steps_stop_the_run_and_a_good_one_resets_the_count():
    guard = UpdateGuard([], [], max_consecutive=3)
    guard.record(False, "x")
    guard.record(False, "x")
    guard.record(True)
    guard.record(False, "x")
    guard.record(False, "x")
    with pytest.raises(RunStopped, match="3 steps in a row skipped, the last because nan loss"):
        guard.record(False, "nan loss")
    assert guard.total == 5


def test_without_rollback_a_non_finite_parameter_stops_the_run():
    m, opt = _setup()
    guard = UpdateGuard(list(m.parameters()), [opt], rollback=False)
    m(torch.randn(8, 4)).square().sum().backward()
    m.weight.grad[0, 0] = math.nan
    with pytest.raises(RunStopped, match="rollback is off"):
        guard.step(opt.step)


def test_values_are_checked_in_the_dtype_they_are_used_in():
    v = torch.tensor([1.0, 1e39, -1e39, math.nan, 3e38], dtype=torch.float64)
    out, bad = finite_or_nan(v)
    assert out.dtype == torch.float32 and bad == 3
    assert torch.isnan(out[1:4]).all() and out[0] == 1.0 and math.isfinite(out[4])
    assert all_finite([torch.ones(2), None]) and not all_finite([torch.tensor([math.inf])])


def test_all_finite_is_exact_where_its_fused_norm_overflows():
    """The fused 2-norm overflows on huge finite entries (and on long float16 tensors
    summed in their own dtype): those are still finite; any inf or NaN is not."""
    assert all_finite([torch.full((4,), 3e38), torch.ones(3)])  # squares overflow
    assert all_finite([torch.full((100_000,), 1000.0, dtype=torch.float16)])
    for bad in (math.inf, -math.inf, math.nan):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            ts = [torch.ones(5, dtype=dtype), torch.tensor([1.0, bad], dtype=dtype)]
            assert not all_finite(ts), (bad, dtype)
    assert not all_finite([torch.tensor([math.inf, -math.inf])])  # (their sum is NaN)


def test_a_step_that_explodes_the_weights_is_rolled_back_though_finite():
    """An lr of 1e30 leaves finite weights around 1e29: no checkpoint may keep them."""
    from rlpost.core.guard import UpdateGuard

    def run(lr, **kw):
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 3)
        opt = torch.optim.Adam(lin.parameters(), lr=lr)
        guard = UpdateGuard(list(lin.parameters()), [opt], **kw)
        before = [p.detach().clone() for p in lin.parameters()]
        lin(torch.randn(8, 4)).pow(2).sum().backward()
        return guard.step(opt.step), guard, lin, before

    ok, guard, lin, before = run(1e30)
    assert not ok and "multiplied the weights' norm by" in guard.why and "rolled back" in guard.why
    assert all(torch.equal(p, b) for p, b in zip(lin.parameters(), before, strict=True))
    assert run(1e-2)[0]  # control: an ordinary step passes
    ok, _, lin, _ = run(1e30, max_growth=None)  # without the check it goes through
    assert ok and max(p.abs().max().item() for p in lin.parameters()) > 1e28
    with pytest.raises(ValueError, match="max_growth"):
        run(1e-2, max_growth=0.5)


def test_the_training_loop_marks_bugs_but_not_input_errors():
    from rlpost.core.guard import training_loop
    from rlpost.core.io.config import ConfigError

    with pytest.raises(ValueError) as err, training_loop():
        raise ValueError("a bug")
    assert err.value.during_training
    with pytest.raises(ConfigError) as err, training_loop():
        raise ConfigError("data.path: x.jsonl:3: not JSON")
    assert not getattr(err.value, "during_training", False)
    with pytest.raises(RunStopped) as err, training_loop():  # not a ValueError: untouched
        raise RunStopped("3 steps in a row skipped")
    assert not getattr(err.value, "during_training", False)


def test_failing_rewards_stops_only_on_a_function_failing_everywhere_in_a_row(capsys):
    from rlpost.core.guard import FailingRewards, RewardFunctionFailing

    f = FailingRewards(["a", "b"], limit=2, setting="reward.stop_after_failing")
    every_a = torch.tensor([[True, False], [True, False]])
    why = [(0, "a", "error", "KeyError: 'x'\nmore"), (1, "a", "error", "KeyError: 'x'")]
    f.record(every_a, why)
    assert (
        "reward function 'a' failed on all 2 completions (KeyError: 'x')" in capsys.readouterr().err
    )
    f.record(torch.tensor([[True, True], [False, True]]), [])  # a passed once: streak reset
    f.record(every_a, why)  # b failed everywhere only once in a row
    with pytest.raises(RewardFunctionFailing, match=r"'a' .*2 scoring rounds in a row; fix") as e:
        f.record(every_a, why)
    assert e.value.exit_code == 2 and e.value.one_line
    timeouts = FailingRewards(["slow"], limit=1, setting="s")
    with pytest.raises(RewardFunctionFailing, match=r"exceeded .*raise reward.timeout_s"):
        timeouts.record(torch.ones(3, 1, dtype=torch.bool), [(0, "slow", "timeout", "exceeded 5s")])
    never = FailingRewards(["a"], limit=None, setting="s")
    for _ in range(5):
        never.record(torch.ones(2, 1, dtype=torch.bool), [])
    never.record(torch.zeros(0, 1, dtype=torch.bool), [])  # no completions: nothing to judge
