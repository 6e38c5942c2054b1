"""Faults a realistic user hits: diverging updates, overflowing rewards, damaged
checkpoints, a group size that trains nothing, a reward that cannot be imported."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlpost.core.guard import RunStopped
from rlpost.core.io.config import ConfigError
from rlpost.llm.trainer import Trainer


def parity(completion, example):
    """A reward that varies within groups of a random model's completions."""
    return float(len(completion) % 2)


def overflowing(completion, example):
    return 1e39 if len(completion) % 2 else 1.0


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_diverging_learning_rate_is_rolled_back_and_then_stops_the_run(fast_cfg, capsys):
    # the growth check (next test) would reject the step itself; without it, the logits at
    # the next generation are the line of defence tested here
    cfg = fast_cfg(
        "optim.lr=1e30",
        "train.steps=20",
        "optim.grad_clip=null",
        "train.guard.max_consecutive=2",
        "train.guard.max_growth=null",
    )
    t = Trainer(cfg, reward_fn=parity)
    with pytest.raises(RunStopped, match=r"2 steps in a row skipped.*logits are not finite"):
        t.train()
    err = capsys.readouterr().err
    assert "the last update was rolled back" in err
    # the weights the run stopped with are the last finite ones, not the diverged ones
    assert all(torch.isfinite(p).all() and p.abs().max() < 1e6 for p in t.model.parameters())
    assert t.guard.rollbacks == 2 and t.skipped == 2


def test_exploded_weights_never_reach_a_checkpoint(fast_cfg, capsys):
    """lr=1e30 leaves finite weights around 1e29: before, the checkpoints of the bad steps
    kept them; now each such step is rolled back at once, and the run stops (exit 3)."""
    cfg = fast_cfg("optim.lr=1e30", "train.steps=6", "optim.grad_clip=null", "run.save_every=1")
    t = Trainer(cfg, reward_fn=parity)
    with pytest.raises(RunStopped, match=r"3 steps in a row skipped.*multiplied the weights' norm"):
        t.train()
    assert "rolled back" in capsys.readouterr().err
    for ckpt in Path(cfg.run.dir, "checkpoints").glob("step-*"):
        assert all(v.abs().max() < 1e3 for v in load_file(ckpt / "model.safetensors").values())
    assert all(p.abs().max() < 1e3 for p in t.model.parameters())


def test_a_lower_learning_rate_given_with_resume_is_the_one_used(fast_cfg, tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(fast_cfg("train.steps=2", "run.save_every=2", "optim.lr=1e-3", f"run.dir={run}"),
            reward_fn=parity).train()  # fmt: skip
    cfg = fast_cfg("train.steps=3", "run.save_every=2", "optim.lr=2e-4", f"run.dir={run}")
    t = Trainer(cfg, reward_fn=parity, resume=True)
    t.train()
    assert t.scheduler.base_lrs == [2e-4] and {
        g["initial_lr"] for g in t.optimizer.param_groups
    } == {2e-4}
    assert (
        "from step 3 the configured learning rate replaces the checkpoint's: 0.001 -> 0.0002"
        in (capsys.readouterr().err)
    )


def test_a_reward_beyond_float32_is_counted_and_the_run_goes_on(fast_cfg):
    cfg = fast_cfg("train.steps=2")
    Trainer(cfg, reward_fn=overflowing).train()
    rows = _rows(Path(cfg.run.dir))
    assert all(math.isfinite(r["reward/mean"]) for r in rows)
    assert sum(r["reward/errors"] for r in rows) > 0


def test_resume_skips_a_damaged_newest_checkpoint_and_still_matches(fast_cfg, tmp_path, capsys):

    ref = fast_cfg("train.steps=6", "run.save_every=2", f"run.dir={tmp_path / 'ref'}")
    Trainer(ref, reward_fn=parity).train()
    part = fast_cfg("train.steps=4", "run.save_every=2", f"run.dir={tmp_path / 'cut'}")
    Trainer(part, reward_fn=parity).train()
    run = Path(part.run.dir)
    (run / "checkpoints" / "step-000004" / "model.safetensors").write_bytes(b"\0" * 10)
    full = fast_cfg("train.steps=6", "run.save_every=2", f"run.dir={run}")
    Trainer(full, reward_fn=parity, resume=True).train()
    err = capsys.readouterr().err
    assert "skipped step-000004: model.safetensors is" in err
    assert "resuming from step-000002" in err
    a = load_file(tmp_path / "ref" / "checkpoints" / "step-000006" / "model.safetensors")
    b = load_file(run / "checkpoints" / "step-000006" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda rows: [{k: v for k, v in r.items() if "time" not in k} for r in rows]  # noqa: E731
    assert strip(_rows(tmp_path / "ref")) == strip(_rows(run))


def test_group_size_one_is_refused_for_a_group_relative_estimator(fast_cfg):
    with pytest.raises(ConfigError, match=r"rollout.group_size=1: the advantage estimator 'grpo'"):
        fast_cfg("rollout.group_size=1")
    fast_cfg("rollout.group_size=1", "algo.preset=ppo")  # a critic's baseline: fine


def test_an_unimportable_reward_fails_at_load(fast_cfg):
    with pytest.raises(ConfigError, match=r"reward.funcs: cannot import 'no_such_pkg.mod'"):
        fast_cfg("reward.funcs=[{name: 'no_such_pkg.mod:fn'}]")
    with pytest.raises(ConfigError, match=r"module 'math' has no 'nope'"):
        fast_cfg("reward.funcs=[{name: 'math:nope'}]")


def test_a_reward_function_with_the_wrong_signature_is_refused_before_the_first_rollout(
    fast_cfg,
):
    """Before: it raised on every call, every completion scored 0, and the run ended rc 0."""
    with pytest.raises(ConfigError, match=r"operator:truth: cannot be called as fn\(completion"):
        fast_cfg("reward.funcs=[{name: 'operator:truth'}]")  # truth(a): one argument

    def lengthy(completion):
        return len(completion)

    def trl_style(completions):  # TRL passes prompts= too: needs **kwargs or a parameter
        return [1.0] * len(completions)

    for fn, form in [(lengthy, "fn(completion, example)"), (trl_style, "fn(prompts=")]:
        with pytest.raises(ValueError, match=rf"reward_funcs: {fn.__name__}: .*{re.escape(form)}"):
            Trainer(fast_cfg(), reward_funcs=[fn])
    with pytest.raises(ValueError, match=r"reward_fn: cannot be called as fn\(completion"):
        Trainer(fast_cfg(), reward_fn=lengthy)


def test_a_reward_function_failing_on_every_completion_stops_the_run_in_one_line(
    fast_overrides, tmp_path, capsys
):
    """Before: a reward raising on every call (here operator.getitem(completion, example):
    a TypeError) left every reward 0 and the run ended with exit code 0."""
    from rlpost.apps.llm.cli import main as cli

    args = ["train", *fast_overrides, "reward.funcs=[{name: 'operator:getitem'}]",
            "train.steps=6", "run.eval_every=0"]  # fmt: skip
    assert cli([*args, f"run.dir={tmp_path / 'a'}", "reward.stop_after_failing=2"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert "Traceback" not in "\n".join(err)
    assert "reward function 'operator:getitem' failed on all" in err[-1]
    assert "(TypeError: string indices must be integers" in err[-1]
    assert "2 scoring rounds in a row; fix the function" in err[-1]
    assert any("the run stops if it keeps failing" in x for x in err[:-1])  # said at once
    assert len(_rows(tmp_path / "a")) == 1  # stopped in the second step
    # null: never stop (failed evaluations score 0 and are counted, as before)
    assert cli([*args, f"run.dir={tmp_path / 'b'}", "reward.stop_after_failing=null"]) == 0
    assert all(r["reward/errors"] > 0 for r in _rows(tmp_path / "b"))


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    good = '{"prompt": "1+1=", "answer": "2"}\n'
    files = {
        "empty.jsonl": b"",
        "blank.jsonl": b'{"prompt": "", "answer": "1"}\n' * 2,
        "latin.jsonl": good.encode() + b'{"prompt": "\xff\xfe", "answer": "2"}\n',
        "notjson.jsonl": good.encode() + b"not json\n",
        "big.jsonl": good.encode() + b'{"prompt": "' + b"x" * (3 << 20) + b'"}\n',
    }
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    (tmp / "afile").write_text("a file")
    (tmp / "pickled").mkdir()
    (tmp / "pickled" / "config.json").write_text('{"model_type": "llama"}')
    (tmp / "pickled" / "pytorch_model.bin").write_bytes(b"never unpickled")
    return {
        "empty": ([f"data.path={tmp / 'empty.jsonl'}"], "empty.jsonl holds no rows"),
        "blank": ([f"data.path={tmp / 'blank.jsonl'}"], "row 1: the 'prompt' is empty"),
        "latin": ([f"data.path={tmp / 'latin.jsonl'}"], "latin.jsonl:2: not UTF-8"),
        "notjson": ([f"data.path={tmp / 'notjson.jsonl'}"], "notjson.jsonl:2: not JSON"),
        "big": ([f"data.path={tmp / 'big.jsonl'}", "data.max_row_mb=1"],
                "big.jsonl:2: a row of over 1 MiB"),
        "ops": (["data.task_params.ops=-"], "data.task_params: task 'arithmetic': ops must be"),
        "pickle": ([f"model.path={tmp / 'pickled'}"], "holds its weights only as pickles"),
        "run-dir-under-a-file": ([f"run.dir={tmp / 'afile' / 'run'}"], "afile is a file"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case", ["empty", "blank", "latin", "notjson", "big", "ops", "pickle", "run-dir-under-a-file"]
)
def test_bad_input_is_one_line_rc_2_before_the_run_directory_exists(
    case, fast_overrides, tmp_path, capsys
):
    from rlpost.apps.llm.cli import main as cli

    over, message = _bad_inputs(tmp_path)[case]
    run = tmp_path / "run"
    assert cli(["train", *fast_overrides, f"run.dir={run}", *over]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err, err
    assert len([x for x in err.splitlines() if x.strip()]) <= 2, err  # "invalid config:" + field
    assert not run.exists()


def test_a_value_error_from_a_bug_mid_training_keeps_its_traceback(
    fast_overrides, tmp_path, monkeypatch
):
    """Before: the command line printed any ValueError as a one-line input error, also one
    raised by a bug in the middle of training (where the traceback is what one needs)."""
    from rlpost.apps.llm.cli import main as cli

    def buggy(self, stop, max_stale):
        raise ValueError("a bug in a step")

    monkeypatch.setattr(Trainer, "_train_step", buggy)
    with pytest.raises(ValueError, match="a bug in a step") as err:
        cli(["train", *fast_overrides, f"run.dir={tmp_path / 'run'}"])
    assert err.value.during_training
    # an input error stays one line, rc 2
    assert cli(["train", *fast_overrides, f"run.dir={tmp_path / 'r2'}", "data.path=/no/such"]) == 2
