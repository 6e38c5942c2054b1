"""The LLM trainer's side of the method/trainer contract: every preset trains from the CLI,
and each input the trainer provides (critic values, vector rewards, token distributions,
attention token weights, optimisers, regularisers, schedules) reaches its entry."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from rlpost.apps.llm.cli import main as cli
from rlpost.core import PRESETS, Input
from rlpost.llm.config import ConfigError
from rlpost.llm.trainer import Trainer

from .test_trainer import parity_reward

TWO_REWARDS = "reward.funcs=[{name: correct}, {name: format}]"


def spy_entry(monkeypatch, registry, name: str, seen: list) -> None:
    """Record every input the registry entry ``name`` is called with."""
    entry = registry.get(name)

    def spy(inp, p):
        seen.append(inp)
        return entry.fn(inp, p)

    monkeypatch.setitem(registry._entries, name, dataclasses.replace(entry, fn=spy))


def _rows(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_trains_two_steps_from_the_cli(name, fast_overrides, tmp_path):
    # two reward functions: varied rewards on the untrained model (so that dynamic
    # sampling keeps groups) and the vector that vpo / rdpo need
    overrides = [
        *fast_overrides,
        "run.eval_every=2",
        TWO_REWARDS,
        f"algo.preset={name}",
        f"run.dir={tmp_path}",
    ]
    needs = set(PRESETS[name].build().needs())
    teacher = {Input.TEACHER_LOGPROBS, Input.TEACHER_TOPK, Input.TEACHER_FULL}
    if teacher & needs:  # a distillation preset: its teacher
        overrides.append("distill.teachers=[{path: tiny-random}]")
    if Input.TURNS in needs:  # multi-turn episodes (the environment's reward alone)
        overrides.remove(TWO_REWARDS)
        from rlpost.llm.rollout.sources import get_source

        own = [x for c in PRESETS[name].rollout for x in get_source(c.name).example]
        env = [x for x in own if x.startswith("data.env=")]  # a source's own environment
        overrides += env or ["data.env={name: household, params: {budget: 3}, max_turns: 3}"]
    run = tmp_path
    if PRESETS[name].peers is not None:  # Mutual RL: a peer (in a thread, no Ray here)
        overrides += [
            "mutual.policies=[{name: a, path: tiny-random}, {name: b, path: tiny-random}]",
            "mutual.backend=local",
        ]
        run = tmp_path / "policies" / "a"
    assert cli(["train", "--config", "grpo_arithmetic", *overrides]) == 0
    rows = _rows(run)
    trained = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in trained] == [1, 2]
    assert all(math.isfinite(r["grad_norm"]) for r in trained)


def test_a_need_the_config_does_not_meet_is_refused_with_the_fix(fast_cfg):
    with pytest.raises(ConfigError, match=r"'vpo' needs vector_rewards \(set two or more"):
        fast_cfg("algo.preset=vpo")
    fast_cfg("algo.preset=vpo", TWO_REWARDS)
    with pytest.raises(ConfigError, match=r"'cpo' needs task_boundary: set data.curriculum"):
        fast_cfg("regularizer.name=cpo")


# --------------------------------------------------------------------------- critic


def test_ppo_builds_a_critic_whose_value_loss_falls_and_that_is_checkpointed(fast_cfg, tmp_path):
    cfg = fast_cfg(
        "algo.preset=ppo",
        "train.steps=6",
        "run.save_every=6",
        "critic.lr=3e-3",
        "algo.kl_coef=0.0",
    )
    tr = Trainer(cfg, reward_fn=parity_reward)
    critic = tr.components.get("critic").critic
    critic_before = {k: v.clone() for k, v in critic.module.state_dict().items()}
    col = tr.collect()
    losses = [tr.update(col)["value/loss"] for _ in range(5)]  # the same batch: V fits R
    assert losses[-1] < 0.5 * losses[0], losses
    assert any(not torch.equal(v, critic.module.state_dict()[k]) for k, v in critic_before.items())
    tr.close()
    res = Trainer(fast_cfg("algo.preset=ppo", "run.save_every=2"), reward_fn=parity_reward).train()
    ckpt = Path(cfg.run.dir) / "checkpoints" / "step-000002"
    assert {"critic.safetensors", "critic-optimizer.safetensors"} <= {
        p.name for p in ckpt.iterdir()
    }
    rows = _rows(Path(cfg.run.dir))
    assert "value/loss" in rows[-1] and "value/explained_variance" in rows[-1]
    assert res["steps"] == 2


def test_critic_free_presets_build_no_critic(fast_cfg):
    tr = Trainer(fast_cfg("algo.preset=grpo"), reward_fn=parity_reward)
    assert tr.components.get("critic") is None


def test_critic_warmup_leaves_the_policy_unchanged(fast_cfg):
    tr = Trainer(fast_cfg("algo.preset=ppo", "critic.warmup_steps=1"), reward_fn=parity_reward)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    m = tr.update(tr.collect())
    assert "value/loss" in m and "grad_norm" not in m
    assert all(torch.equal(v, tr.model.state_dict()[k]) for k, v in before.items())


# ----------------------------------------------------------------- vector rewards


def test_vector_rewards_reach_vector_estimators_and_each_is_logged(fast_cfg, monkeypatch):
    from rlpost.core import ADVANTAGES

    seen: list = []
    spy_entry(monkeypatch, ADVANTAGES, "vpo", seen)
    tr = Trainer(fast_cfg("algo.preset=vpo", TWO_REWARDS))
    col = tr.collect()
    assert col.components.shape == (len(col.batch), 2)
    tr.update(col)
    assert seen[0].rewards.shape == (len(col.batch), 2)
    assert torch.equal(seen[0].rewards, col.components)
    assert {"reward/correct/mean", "reward/format/mean"} <= set(col.metrics)


def test_scalar_estimators_get_the_weighted_sum(fast_cfg):
    tr = Trainer(
        fast_cfg("reward.funcs=[{name: correct, weight: 1.0}, {name: format, weight: 0.5}]")
    )
    col = tr.collect()
    assert torch.allclose(col.rewards, col.components @ torch.tensor([1.0, 0.5]))
    assert torch.equal(col.accuracy, (col.components[:, 0] >= 1).float())


def test_a_custom_reward_function_by_import_path(fast_cfg):
    cfg = fast_cfg("reward.funcs=[{name: 'rlpost.llm.data.tasks:format_reward'}]")
    col = Trainer(cfg).collect()
    assert "reward/rlpost.llm.data.tasks:format_reward/mean" in col.metrics
    with pytest.raises(ValueError, match="cannot import"):
        Trainer(fast_cfg("reward.funcs=[{name: 'nowhere.at_all:fn'}]"))


# -------------------------------------------------------------- token distributions


def test_token_distributions_are_both_policies_top_k_of_the_behaviour(fast_cfg, monkeypatch):
    from rlpost.core import CORRECTIONS

    calls: list = []
    spy_entry(monkeypatch, CORRECTIONS, "predictive_divergence_mask", calls)
    cfg = fast_cfg(  # (every row forwarded: the check below reads the whole batch)
        "algo.preset=predictive_divergence_mask", "algo.topk=5", "optim.updates_per_batch=2",
        "optim.skip_inert_rows=false",
    )  # fmt: skip
    tr = Trainer(cfg, reward_fn=parity_reward)
    col = tr.collect()
    model0 = {k: v.clone() for k, v in tr.model.state_dict().items()}
    m = tr.update(col)
    d0, d1 = calls[0].dists, calls[-1].dists
    assert d0.logp.shape[-1] == 5
    # epoch 1: the current policy is the behaviour one: identical distributions
    torch.testing.assert_close(d0.logp, d0.old_logp)
    # epoch 2: the behaviour distribution is still the pre-update policy's top-K
    torch.testing.assert_close(d1.old_logp, d0.old_logp)
    assert not torch.allclose(d1.logp, d1.old_logp)
    # independent check: the pre-update policy's full softmax, top-5, at the sampled tokens
    from rlpost.llm.model.policy import make_seq_batch

    tr.model.load_state_dict(model0)
    b = col.batch
    sb = make_seq_batch(b.prompt_ids, b.completion_ids, b.mask, b.pad_id)
    with torch.no_grad():
        logits = tr.model(
            input_ids=sb.input_ids, attention_mask=sb.attention_mask, position_ids=sb.position_ids
        ).logits[:, sb.P - 1 : -1]
    top = logits.float().log_softmax(-1).topk(5, -1)
    valid = b.mask.bool()
    torch.testing.assert_close(d0.old_logp[valid], top.values[valid], atol=1e-5, rtol=1e-5)
    hit = top.indices == b.completion_ids[..., None]
    expect = torch.where(hit.any(-1), hit.float().argmax(-1), torch.full_like(b.completion_ids, -1))
    assert torch.equal(d0.sampled_index[valid], expect[valid])
    assert "pdm_masked_frac" in m


# ------------------------------------------------------------ attention token weights


def test_attention_token_weights_reach_the_loss(fast_cfg, monkeypatch):
    from rlpost.llm.train import probes

    seen = {}
    real = probes.attention_token_entropy

    def spy(model, batch, mbs):
        seen["h"] = real(model, batch, mbs)
        return seen["h"]

    monkeypatch.setattr(probes, "attention_token_entropy", spy)
    cfg = fast_cfg("algo.token_weights.name=anchors", "algo.token_weights.params.quantile=0.3")
    tr = Trainer(cfg, reward_fn=parity_reward)
    col = tr.collect()
    m = tr.update(col)
    h = seen["h"]
    assert h.shape == col.batch.mask.shape and (h[col.batch.mask == 0] == 0).all()
    assert (h[col.batch.mask > 0] > 0).all()  # entropy of a causal attention row
    assert 0.2 < m["anchors_frac"] <= 0.35
    assert tr.model.config._attn_implementation != "eager"  # switched back after the maps


def test_token_weights_change_the_update(fast_cfg):
    torch.manual_seed(0)
    a = Trainer(fast_cfg(), reward_fn=parity_reward)
    col = a.collect()
    b = Trainer(fast_cfg("algo.token_weights.name=explorers"), reward_fn=parity_reward)
    b.model.load_state_dict(a.model.state_dict())
    a.update(col)
    b.update(col)
    assert any(
        not torch.allclose(p, q)
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True)
    )


# ------------------------------------------------------------------------ optimisers


@pytest.mark.parametrize("name", ["muon", "pion"])
def test_matrix_optimisers_train_and_differ_from_adamw(name, fast_cfg):
    torch.manual_seed(0)
    a = Trainer(fast_cfg(), reward_fn=parity_reward)
    col = a.collect()
    b = Trainer(
        fast_cfg(f"optim.name={name}", "optim.params.matrix_lr=0.01"), reward_fn=parity_reward
    )
    b.model.load_state_dict(a.model.state_dict())
    start = {k: v.clone() for k, v in b.model.state_dict().items()}
    ma, mb = a.update(col), b.update(col)
    assert math.isfinite(mb["grad_norm"])
    moved = [k for k, v in b.model.state_dict().items() if not torch.equal(v, start[k])]
    assert moved and any(
        not torch.allclose(p, q)
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True)
    )
    assert type(b.optimizer).__name__.lower() == name
    del ma


def test_a_bad_optimizer_parameter_fails_at_load(fast_cfg):
    with pytest.raises(ConfigError, match=r"'muon': unknown parameter\(s\) \['matrix_rl'\]"):
        fast_cfg("optim.name=muon", "optim.params.matrix_rl=0.01")


# ---------------------------------------------------------------------- regularisers


def test_dr_post_training_projects_the_gradient_with_general_data(fast_cfg):
    cfg = fast_cfg(
        "regularizer.name=dr_post_training",
        "regularizer.data.task=arithmetic",
        "regularizer.data.task_params.digits=1",
        "regularizer.batches=3",
        "regularizer.batch_size=4",
    )
    tr = Trainer(cfg, reward_fn=parity_reward)
    m = tr.update(tr.collect())
    assert "dr/changed" in m and "aux/loss" in m and m["aux/loss"] > 0
    assert 0 <= m["dr/conflicts"] <= 3


def test_gac_mixes_sft_and_rl_with_a_bounded_lambda(fast_cfg):
    cfg = fast_cfg(
        "regularizer.name=gac",
        "regularizer.data.task=arithmetic",
        "regularizer.batches=2",
        "regularizer.batch_size=4",
        "optim.micro_batch_size=8",  # 16 rows: two micro-batch gradient samples
        "train.steps=3",
    )
    tr = Trainer(cfg, reward_fn=parity_reward)
    lams = [tr.update(tr.collect())["gac/lambda"] for _ in range(3)]
    assert all(0.0 <= x <= 1.0 for x in lams)
    assert all(
        abs(b - a) <= 0.05 + 1e-9 for a, b in zip([0.5, *lams[:-1]], lams, strict=True)
    )  # max_step
    assert tr.components.get("regularizer").state["lam"] == lams[-1]
    with pytest.raises(ConfigError, match="gradient samples"):
        fast_cfg("regularizer.name=gac", "regularizer.data.task=arithmetic")


def test_cpo_over_a_curriculum_penalises_drift_after_the_first_task(fast_cfg):
    cfg = fast_cfg(
        "regularizer.name=cpo",
        "regularizer.params.coef=10.0",
        "data.curriculum=[{task: arithmetic, steps: 2, task_params: {digits: 1}},"
        " {task: countdown, steps: 2}]",
        "run.eval_every=2",
    )
    tr = Trainer(cfg, reward_fn=parity_reward)
    res = tr.train()
    rows = _rows(Path(cfg.run.dir))
    by_step = {r["step"]: r for r in rows}
    assert "cpo/penalty" not in by_step[2] and by_step[4]["cpo/penalty"] > 0
    assert {"eval/0-arithmetic/accuracy", "eval/1-countdown/accuracy"} <= set(by_step[4])
    assert res["steps"] == 4
    state = tr.components.get("regularizer").state
    assert state["fisher"] is not None and state["start"] is not None


# ------------------------------------------------------------------------- schedules


def test_mu_grpo_generates_each_stage_at_once_with_growing_staleness(fast_cfg):
    cfg = fast_cfg("algo.preset=mu_grpo", "algo.stages=2", "train.steps=4")
    tr = Trainer(cfg, reward_fn=parity_reward)
    calls = []
    gen = tr.engine.generate
    tr.engine.generate = lambda *a, **k: calls.append(tr.version) or gen(*a, **k)
    tr.train()
    assert calls == [0, 0, 2, 2]  # two stages of two steps, each generated at its start
    staleness = [r["staleness"] for r in _rows(Path(cfg.run.dir)) if r["step"] > 0]
    assert staleness == [0, 1, 0, 1]


def test_mu_grpo_resumes_exactly_mid_stage(fast_cfg):
    cfg = fast_cfg(
        "algo.preset=mu_grpo",
        "algo.stages=2",
        "train.steps=4",
        "run.save_every=1",
        "run.keep_checkpoints=10",
    )
    full = Trainer(cfg, reward_fn=parity_reward)
    full.train()
    final = {k: v.clone() for k, v in full.model.state_dict().items()}
    ckpts = Path(cfg.run.dir) / "checkpoints"  # resume from step 1: one stage batch left
    for later in ("step-000002", "step-000003", "step-000004"):
        shutil.rmtree(ckpts / later)
    b = Trainer(cfg, reward_fn=parity_reward, resume=True)
    (stages,) = [s for s in b.rollouts.chain() if s.name == "stages"]
    assert b.step == 1 and len(stages.buffer) == 1
    b.train()
    for k, v in final.items():
        torch.testing.assert_close(b.model.state_dict()[k], v, rtol=0, atol=0, msg=k)


def test_vapr_resets_policy_and_reference_to_the_best_validation_checkpoint(fast_cfg, monkeypatch):
    cfg = fast_cfg("algo.preset=reva_po", "run.eval_every=1", "train.steps=2", "algo.kl_coef=0.04")
    tr = Trainer(cfg, reward_fn=parity_reward)
    scores = iter([0.5, 0.2, 0.7])  # step 0 (anchor), step 1 (worse: reset), step 2 (better)
    monkeypatch.setattr(tr, "evaluate", lambda examples=None: next(scores))
    anchor = tr.components.get("validation_reset").anchor
    anchor_weights = {}
    real_update = anchor.update

    def record(model, acc):
        worse = real_update(model, acc)
        if not worse and not anchor_weights:
            anchor_weights.update({k: v.clone() for k, v in model.state_dict().items()})
        return worse

    anchor.update = record
    restored = []
    real_restore = anchor.restore

    def check_restore(*modules):
        real_restore(*modules)
        restored.append([{k: v.clone() for k, v in m.state_dict().items()} for m in modules])

    anchor.restore = check_restore
    tr.train()
    rows = {r["step"]: r for r in _rows(Path(cfg.run.dir))}
    assert rows[1].get("vapr/reset") == 1.0 and "vapr/reset" not in rows[2]
    assert len(restored) == 1 and len(restored[0]) == 2  # policy and reference
    for sd in restored[0]:
        for k, v in anchor_weights.items():
            assert torch.equal(sd[k], v)
    assert rows[2]["vapr/best"] == 0.7 and rows[2]["vapr/resets"] == 1.0


def test_conspo_margin_follows_the_training_progress(fast_cfg):
    cfg = fast_cfg("algo.preset=conspo", "train.steps=3")
    Trainer(cfg, reward_fn=parity_reward).train()
    margins = [r["margin"] for r in _rows(Path(cfg.run.dir)) if "margin" in r]
    assert margins == pytest.approx([0.0, 0.05, 0.1])


def test_critic_from_a_separate_model_and_with_lora(fast_cfg, tmp_path):
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    from transformers import Qwen2ForCausalLM

    Qwen2ForCausalLM(tiny.tiny_config(tok)).save_pretrained(tmp_path / "value-model")
    tr = Trainer(
        fast_cfg("algo.preset=ppo", f"critic.model={tmp_path / 'value-model'}"),
        reward_fn=parity_reward,
    )
    policy_ids = {id(p) for p in tr.model.parameters()}
    critic = tr.components.get("critic").critic
    assert not policy_ids & {id(p) for p in critic.module.parameters()}
    m = tr.update(tr.collect())
    assert math.isfinite(m["value/loss"])
    lora = Trainer(fast_cfg("algo.preset=ppo", "critic.lora.r=4"), reward_fn=parity_reward)
    critic = lora.components.get("critic").critic
    trainable = [n for n, p in critic.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or n.startswith("head.") for n in trainable)
    assert math.isfinite(lora.update(lora.collect())["value/loss"])
