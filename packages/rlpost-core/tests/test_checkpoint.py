import json

import pytest
import torch
from safetensors.torch import load_file

from rlpost.core.io.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint


def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[1].weight = torch.nn.Parameter(model[1].weight)  # plain
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def _step(model, opt, sched):
    model(torch.randn(5, 3)).square().sum().backward()
    opt.step()
    opt.zero_grad()
    if sched is not None:
        sched.step()


def test_roundtrip_restores_model_optimizer_scheduler_rng(tmp_path):
    m, o, s = _setup()
    for _ in range(3):
        _step(m, o, s)
    save_checkpoint(tmp_path, 3, m, o, s, {"data": {"pos": 7}})
    m2, o2, s2 = _setup(seed=99)
    state = load_checkpoint(latest_checkpoint(tmp_path), m2, o2, s2)
    assert state["step"] == 3 and state["data"] == {"pos": 7}
    for a, b in zip(m.parameters(), m2.parameters(), strict=True):
        assert torch.equal(a, b)
    assert s2.get_last_lr() == s.get_last_lr()
    # continuing both gives identical parameters (optimizer moments restored)
    torch.manual_seed(5)
    _step(m, o, s)
    torch.manual_seed(5)
    _step(m2, o2, s2)
    for a, b in zip(m.parameters(), m2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_rng_state_is_restored(tmp_path):
    m, o, s = _setup()
    torch.manual_seed(42)
    save_checkpoint(tmp_path, 1, m, o, s, {})
    after_save = torch.rand(4)
    torch.manual_seed(0)
    load_checkpoint(latest_checkpoint(tmp_path), m, o, s)
    assert torch.equal(torch.rand(4), after_save)


def test_latest_pointer_and_retention_and_torn_writes(tmp_path):
    m, o, s = _setup()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, m, o, s, {}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000002", "step-000003"]
    # a crash mid-write leaves only a .tmp directory, which is never picked up
    (tmp_path / "step-000004.tmp-999").mkdir()
    assert latest_checkpoint(tmp_path).name == "step-000003"
    assert json.loads((tmp_path / "latest.json").read_text())["step"] == 3


def test_files_are_safetensors_and_json_only(tmp_path):
    m, o, s = _setup()
    _step(m, o, s)
    path = save_checkpoint(tmp_path, 1, m, o, s, {})
    assert {p.suffix for p in path.iterdir()} == {".safetensors", ".json"}
    assert set(load_file(path / "optimizer.safetensors")) == {
        f"{i}.{k}" for i in range(4) for k in ("step", "exp_avg", "exp_avg_sq")
    }


def test_trainable_only_checkpoint_holds_just_the_adapters(tmp_path):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    base[0].requires_grad_(False)  # a frozen "base" layer and a trainable "adapter"
    frozen = {k: v.clone() for k, v in base[0].state_dict().items()}
    opt = torch.optim.AdamW([p for p in base.parameters() if p.requires_grad], lr=0.1)
    _step(base, opt, None)
    save_checkpoint(tmp_path, 1, base, opt, None, {}, trainable_only=True)
    stored = load_file(str(tmp_path / "step-000001" / "model.safetensors"))
    assert set(stored) == {"1.weight", "1.bias"}
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    fresh[0].load_state_dict(frozen)
    fresh[0].requires_grad_(False)
    opt2 = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=0.1)
    load_checkpoint(tmp_path / "step-000001", fresh, opt2, None)
    for a, b in zip(base.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    wrong = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))  # all trainable
    with pytest.raises(RuntimeError, match="trainable parameters"):
        load_checkpoint(tmp_path / "step-000001", wrong, opt2, None)


def test_the_configured_learning_rate_wins_on_resume(tmp_path, capsys):
    """The divergence stop says "lower optim.lr, then --resume": before, the checkpoint's
    rate came back and the new one was ignored (while config.yaml recorded it)."""
    m, o, s = _setup()
    for _ in range(3):
        _step(m, o, s)
    save_checkpoint(tmp_path, 3, m, o, s, {})
    # same configuration: every rate is the checkpoint's, bit for bit, and nothing is said
    m2, o2, s2 = _setup(seed=99)
    load_checkpoint(latest_checkpoint(tmp_path), m2, o2, s2)
    assert s2.get_last_lr() == s.get_last_lr() and o2.param_groups[0]["lr"] == 0.1 / 4
    assert capsys.readouterr().err == ""
    # a lower configured rate: the schedule continues from the new base (factor 1/4 at 3)
    m3, o3, s3 = _setup(seed=99)
    for g in o3.param_groups:
        g["lr"] = g["initial_lr"] = 0.01
    s3.base_lrs = [0.01]
    load_checkpoint(latest_checkpoint(tmp_path), m3, o3, s3)
    assert o3.param_groups[0]["lr"] == pytest.approx(0.01 / 4) and s3.base_lrs == [0.01]
    _step(m3, o3, s3)
    assert o3.param_groups[0]["lr"] == pytest.approx(0.01 / 5)
    assert "from step 4 the configured learning rate replaces the checkpoint's: 0.1 -> 0.01" in (
        capsys.readouterr().err
    )
    # no scheduler (diffusion, robot): the configured rate, for the extras' optimisers too
    critic = torch.nn.Linear(2, 1)
    c_opt = torch.optim.SGD(critic.parameters(), lr=0.5)
    save_checkpoint(tmp_path / "b", 1, m, o, None, {}, extras={"critic": (critic, c_opt)})
    m4 = _setup()[0]
    o4 = torch.optim.AdamW(m4.parameters(), lr=0.003)
    c_opt4 = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.05)
    load_checkpoint(
        latest_checkpoint(tmp_path / "b"), m4, o4, None,
        extras={"critic": (torch.nn.Linear(2, 1), c_opt4)},
    )  # fmt: skip
    assert o4.param_groups[0]["lr"] == 0.003 and c_opt4.param_groups[0]["lr"] == 0.05


def test_a_full_disk_is_one_line_and_the_kept_checkpoints_stay(tmp_path, monkeypatch):
    """Before: three chained tracebacks (safetensors' I/O error) and a half-written folder."""
    import errno

    from rlpost.core.io import checkpoint as ck

    m, o, s = _setup()
    _step(m, o, s)
    save_checkpoint(tmp_path, 1, m, o, s, {})
    real = ck.save_model

    def full(*a, **k):
        raise RuntimeError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(ck, "save_model", full)
    with pytest.raises(ck.CheckpointWriteError) as err:
        save_checkpoint(tmp_path, 2, m, o, s, {})
    msg = str(err.value)
    assert "step-000002 not written: no space left" in msg and "(step-000001) are intact" in msg
    assert err.value.one_line and err.value.exit_code == 3 and "\n" not in msg
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [
        "step-000001"
    ]  # nothing half-written
    assert ck.validate_checkpoint(tmp_path / "step-000001") is None

    def quota(*a, **k):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(ck, "save_model", real)
    monkeypatch.setattr(ck, "save_file", quota)
    with pytest.raises(ck.CheckpointWriteError):
        save_checkpoint(tmp_path, 2, m, o, s, {})

    def bug(*a, **k):
        raise ValueError("a bug, not the disk")

    monkeypatch.setattr(ck, "save_file", bug)
    with pytest.raises(ValueError, match="a bug"):  # anything else keeps its traceback
        save_checkpoint(tmp_path, 2, m, o, s, {})
