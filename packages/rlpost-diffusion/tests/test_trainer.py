import json
import math

import pytest
import torch

from rlpost.diffusion.config import Config, ConfigError, load_config
from rlpost.diffusion.methods import METHODS as REGISTRY
from rlpost.diffusion.models.digits import DigitsPolicy
from rlpost.diffusion.recipes import recipe_names, recipe_path
from rlpost.diffusion.trainer import Trainer

METHODS = REGISTRY.names()  # (every registered method: each needs a <name>_digits recipe)


def brightness(images, prompts):
    """A cheap reward for tests: mean intensity, higher for odd prompts' bottom half."""
    return images.mean((1, 2, 3)) + torch.tensor([int(p) % 2 for p in prompts]) * images[
        :, :, 4:
    ].mean((1, 2, 3))


def _cfg(tmp_path, method, *extra):
    return load_config(
        recipe_path(f"{method}_digits"),
        [
            "model.name=digits-random",
            "prompts.per_step=2",
            "prompts.group_size=3",
            "sampler.steps=3",
            "sampler.eval_steps=3",
            "train.steps=2",
            "run.eval_every=1",
            "run.eval_per_prompt=1",
            "run.save_every=1",
            "run.progress=false",
            "run.tensorboard=false",
            f"run.dir={tmp_path / method}",
            "algo.renoise_k=2",
            *extra,
        ],
    )


def _trainer(cfg, seed=0):
    torch.manual_seed(seed)
    policy = DigitsPolicy.random(seed=seed)
    # make the random net non-trivial (its output layer starts at zero)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
        policy.reference.load_state_dict(policy.net.state_dict())
    return Trainer(cfg, policy=policy, reward=brightness, metrics={})


@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_logs_and_checkpoints(tmp_path, method):
    rows = _trainer(_cfg(tmp_path, method)).train(resume=False)
    run = tmp_path / method
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(math.isfinite(r["loss"]) for r in rows[1:])
    assert "eval/vnorm_ratio" in rows[-1]
    for f in ("config.yaml", "metrics.jsonl", "curves.png", "summary.txt"):
        assert (run / f).is_file(), f
    assert (run / "samples_before.png").is_file() and (run / "samples_after.png").is_file()
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 2
    summary = json.loads((run / "summary.json").read_text())  # the shape every domain writes
    assert summary["domain"] == "diffusion" and summary["steps"] == 2
    assert summary["before"]["eval/reward"] == rows[0]["eval/reward"]
    assert summary["after"]["eval/reward"] == rows[-1]["eval/reward"]


def _params(trainer):
    return torch.cat([p.detach().flatten() for p in trainer.policy.trainable_parameters()])


@pytest.mark.parametrize("method", ["flow_grpo", "ram", "awm"])
def test_micro_batching_equals_full_batch(tmp_path, method):
    results = []
    for mb in (64, 1):
        t = _trainer(_cfg(tmp_path, method, f"optim.micro_batch_size={mb}", "optim.grad_clip=null"))
        t.opt = torch.optim.SGD(t.params, lr=1.0)  # parameter change = gradient (Adam's sign-
        torch.manual_seed(5)  # like first step would amplify float noise on ~0 gradients)
        b = t.collect()
        torch.manual_seed(6)
        t.update(b)
        results.append(_params(t))
    assert torch.allclose(results[0], results[1], atol=1e-6)
    assert not torch.equal(results[0], _params(_trainer(_cfg(tmp_path, method))))


@pytest.mark.parametrize("method", ["flow_grpo", "dance_grpo"])
def test_equal_rewards_give_zero_policy_gradient_and_no_nan(tmp_path, method):
    t = _trainer(_cfg(tmp_path, method, "algo.kl_coef=0.0"))
    t.reward = lambda images, prompts: torch.ones(len(prompts))
    b = t.collect()
    assert torch.equal(b.advantages, torch.zeros_like(b.advantages))
    before = _params(t)
    m = t.update(b)
    assert math.isfinite(m["loss"])
    assert torch.equal(_params(t), before)  # Adam with zero gradients leaves params put


def test_ram_with_zero_advantage_regresses_to_the_reference(tmp_path):
    t = _trainer(_cfg(tmp_path, "ram", "optim.lr=0.001"))
    with torch.no_grad():  # move the policy away from its reference
        for p in t.policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    t.reward = lambda images, prompts: torch.ones(len(prompts))
    b = t.collect()  # measure where RAM trains: re-noised endpoints of the model's samples
    s = torch.rand(len(b.prompts))
    x = (1 - s[:, None, None, None]) * b.traj.x0 + s[:, None, None, None] * torch.randn_like(
        b.traj.x0
    )
    c = b.cond

    def gap():
        with torch.no_grad():
            return (t.policy.velocity(x, s, c) - t.policy.reference_velocity(x, s, c)).norm()

    g0 = gap()
    for _ in range(20):
        t.update(t.collect())
    assert gap() < 0.7 * g0


@pytest.mark.parametrize("method", METHODS)
def test_resume_is_exact(tmp_path, method):
    # (the SIGKILL-and-resume form runs in a subprocess: test_reliability.py)
    full = _trainer(_cfg(tmp_path / "a", method, "train.steps=3", "run.eval_every=0"))
    full.train(resume=False)
    half = _trainer(_cfg(tmp_path / "b", method, "train.steps=1", "run.eval_every=0"))
    half.train(resume=False)
    resumed = _trainer(_cfg(tmp_path / "b", method, "train.steps=3", "run.eval_every=0"), seed=0)
    resumed.train(resume=True)
    assert torch.equal(_params(full), _params(resumed))

    def rows(run):
        return [
            {k: v for k, v in json.loads(x).items() if not k.startswith("time/")}
            for x in (run / method / "metrics.jsonl").read_text().splitlines()
        ]

    assert [r["step"] for r in rows(tmp_path / "b")] == [0, 1, 2, 3]
    assert rows(tmp_path / "a")[1:] == rows(tmp_path / "b")[1:]


@pytest.mark.parametrize("method", METHODS)
def test_every_methods_config_round_trips(method):
    cfg = load_config(recipe_path(f"{method}_digits"))
    again = Config.model_validate(cfg.model_dump())
    assert again == cfg and again.sampler_params() == cfg.sampler_params()
    assert again.algo.family_params() == cfg.algo.family_params()
    assert again.algo.regularizers() == cfg.algo.regularizers()


def test_an_old_config_with_flat_sampler_knobs_loads_as_it_behaved():
    # before samplers took typed params: sampler.a / sampler.eta applied to their sampler
    old = load_config(recipe_path("dance_grpo_digits"), ["sampler.eta=0.2", "sampler.a=0.9"])
    assert old.sampler.params == {"eta": 0.2} and old.sampler_params().eta == 0.2
    flow = load_config(recipe_path("flow_grpo_digits"), ["sampler.a=0.5"])
    assert flow.sampler_params().a == 0.5
    with pytest.raises(ConfigError, match=r"sampler\.params"):
        load_config(recipe_path("dance_grpo_digits"), ["sampler.params={a: 0.5}"])
    # and the flat family knobs: read into algo.family where the family has them
    ram = load_config(recipe_path("ram_digits"), ["algo.renoise_k=2", "algo.sigma_loc=0.5"])
    assert ram.algo.family_params().renoise_k == 2 and ram.algo.family_params().sigma_loc == 0.5
    dance = load_config(recipe_path("dance_grpo_digits"), ["algo.renoise_k=2"])
    assert dance.algo.family == {"timestep_fraction": 0.6}  # (never applied to an SDE replay)
    with pytest.raises(ConfigError, match=r"algo\.family"):
        load_config(recipe_path("dance_grpo_digits"), ["algo.family.renoise_k=2"])


def test_normguard_alone_pulls_inflated_norms_back_to_the_reference(tmp_path):
    # AWM with equal rewards has zero advantage and no KL: NormGuard is the only loss
    t = _trainer(
        _cfg(tmp_path, "awm", "algo.kl_coef=0.0", "algo.normguard.coef=1.0", "optim.lr=0.003")
    )
    t.reward = lambda images, prompts: torch.ones(len(prompts))
    with torch.no_grad():
        t.policy.net.out.weight.mul_(3.0)
        t.policy.net.out.bias.mul_(3.0)
    first = t.update(t.collect())
    assert first["vnorm_ratio"] > 1.5 and first["normguard"] > 0
    for _ in range(30):
        last = t.update(t.collect())
    assert last["vnorm_ratio"] < 0.5 * (1 + first["vnorm_ratio"])
    assert last["normguard"] < first["normguard"]


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"algo\.method"):
        load_config(None, ["algo.method=ppo"])
    with pytest.raises(ConfigError, match=r"model\.path"):
        load_config(None, ["model.name=sd3"])
    with pytest.raises(ConfigError, match=r"prompts\.prompts"):
        load_config(None, ["prompts.prompts=[cat]"])
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(None, ["algo.clip=0.2"])


def test_prompt_files_replace_the_prompt_list(tmp_path):
    (tmp_path / "p.txt").write_text("# my digits\n3\n\n7\n")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a red cube"}\n{"prompt": "a cat"}\n')
    (tmp_path / "p.json").write_text('["one", "two"]')
    assert load_config(None, [f"prompts.path={tmp_path / 'p.txt'}"]).prompts.prompts == ["3", "7"]
    sd3 = ["model.name=sd3", "model.path=x"]
    for name, want in (("p.jsonl", ["a red cube", "a cat"]), ("p.json", ["one", "two"])):
        cfg = load_config(None, [*sd3, f"prompts.path={tmp_path / name}"])
        assert cfg.prompts.prompts == want
    with pytest.raises(ConfigError, match=r"prompts: path: no prompt file"):
        load_config(None, [f"prompts.path={tmp_path / 'nope.txt'}"])
    with pytest.raises(ConfigError, match=r"prompts\.prompts: the digits model takes classes"):
        load_config(None, [f"prompts.path={tmp_path / 'p.json'}"])


@pytest.mark.parametrize("name", recipe_names())
def test_every_shipped_recipe_validates(name):
    if "sd3" in name:  # its reward is a placeholder for the user's own: refused as it is
        with pytest.raises(ConfigError, match=r"reward.name: cannot import 'my_pkg.rewards'"):
            load_config(recipe_path(name))
        cfg = load_config(recipe_path(name), ["reward.name=hackable"])
    else:
        cfg = load_config(recipe_path(name))
    assert cfg.algo.method in name


def test_unknown_recipe_lists_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match="ram_digits"):
        recipe_path("nope")


def test_the_progress_bar_says_when_the_run_is_evaluating(tmp_path, capsys):
    """Before: the evaluation before the first step ran before the bar existed."""
    _trainer(_cfg(tmp_path, "flow_grpo", "run.progress=true")).train(resume=False)
    err = capsys.readouterr().err.replace("\r", "\n").splitlines()
    said = [ln for ln in err if "flow_grpo (evaluating)" in ln]
    assert any(" 0/2 " in ln for ln in said), err
    assert "(evaluating)" not in err[-1]
