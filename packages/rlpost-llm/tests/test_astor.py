"""ASTOR (001-18): the budget follows task utility (learning potential and cross-task
synergy), within a task the informative prompts are kept, each task's KL coefficient
moves with its state and scales its rows' KL term, and the state resumes."""

from __future__ import annotations

import pytest
import torch

from rlpost.core.multitask import allocate, kl_scales, learning_potential, synergy, utility
from rlpost.core.presets import PolicyBatch, get_preset
from rlpost.llm.config import load_config
from rlpost.llm.rollout.sources.astor import AstorSource
from rlpost.llm.train.inputs import Role
from rlpost.llm.trainer import Trainer

MIX = "data.mixture=[{task: arithmetic, task_params: {digits: 2}}, {task: countdown}]"


def test_learning_potential_and_synergy_by_hand():
    assert learning_potential(torch.tensor([0.5, 0.0, 1.0, 0.25])) == pytest.approx(
        (1 + 0 + 0 + 0.75) / 4
    )
    g = torch.tensor([[1.0, 0.0], [1.0, 1.0], [-1.0, 0.0]])
    c = 2**-0.5  # cos(g0, g1) = cos(g1, -g2); cos(g0, g2) = -1
    assert torch.allclose(synergy(g), torch.tensor([(c - 1) / 2, 0.0, (-c - 1) / 2]))
    assert synergy(torch.zeros(3, 4)).tolist() == [0, 0, 0]  # zero gradients: no synergy
    assert torch.allclose(utility(torch.tensor([0.5, 0.5]), torch.tensor([0.4, -0.4]), 1.0),
                          torch.tensor([0.7, 0.3]))  # fmt: skip


def test_the_budget_follows_utility_above_a_floor():
    u = torch.tensor([0.9, 0.3, 0.1])
    counts = allocate(u, 32, tau=0.5, floor=0.1)
    assert sum(counts) == 32 and counts[0] > counts[1] > counts[2] >= 3  # floor: 3.2 each
    assert allocate(torch.tensor([0.5, 0.5]), 9, 0.1, 0.0) == [5, 4]  # remainder: lower index
    assert allocate(u, 30, tau=1e3, floor=0.0) == [10, 10, 10]  # a hot softmax: uniform
    hi = allocate(torch.tensor([0.9, 0.1]), 100, 0.1, 0.0)
    lo = allocate(torch.tensor([0.6, 0.4]), 100, 0.1, 0.0)
    assert hi[0] > lo[0] > 50  # more utility gap, more budget to the leader
    with pytest.raises(ValueError, match="floor"):
        allocate(u, 10, 0.1, 0.5)


def test_each_tasks_kl_coefficient_moves_with_its_state():
    s = kl_scales(torch.tensor([0.8, 0.2]), 0.25, 4.0)
    assert torch.allclose(s, torch.tensor([0.625, 2.5]))  # mean 0.5 over each
    later = kl_scales(torch.tensor([0.2, 0.8]), 0.25, 4.0)  # the tasks swapped states
    assert torch.allclose(later, s.flip(0))
    assert kl_scales(torch.tensor([1.0, 0.0]), 0.25, 4.0).tolist() == [0.5, 4.0]  # clipped
    assert kl_scales(torch.zeros(2), 0.25, 4.0).tolist() == [1.0, 1.0]


def test_a_rows_kl_scale_multiplies_its_kl_term_in_the_loss():
    recipe = get_preset("grpo").replace(kl_coef=0.1).build()
    logp = torch.randn(2, 3, requires_grad=True)
    kw = dict(old_logp=logp.detach(), advantages=torch.zeros(2), mask=torch.ones(2, 3),
              ref_logp=torch.zeros(2, 3), global_tokens=6.0, global_sequences=2.0)  # fmt: skip
    g1 = torch.autograd.grad(recipe.policy_loss(PolicyBatch(logp, **kw)).loss, logp)[0]
    scale = torch.tensor([2.0, 0.5])
    g2 = torch.autograd.grad(
        recipe.policy_loss(PolicyBatch(logp, kl_scale=scale, **kw)).loss, logp
    )[0]
    assert g1.abs().sum() > 0 and torch.allclose(g2, g1 * scale[:, None])


def test_a_step_routes_by_utility_and_puts_each_tasks_kl_scale_on_its_rows(fast_cfg):
    tr = Trainer(fast_cfg("algo.astor={oversample: 2.0, floor: 0.1, tau: 0.1}",
                          "algo.kl_coef=0.01", MIX, "rollout.prompts_per_step=8"))  # fmt: skip
    src = next(s for s in tr.rollouts.chain() if isinstance(s, AstorSource))
    src.potential = torch.tensor([0.9, 0.1])  # arithmetic has potential, countdown not
    col = tr.rollouts.collect()
    domains = [col.examples[i].meta["domain"] for i in range(0, len(col.examples), 4)]
    assert domains.count("arithmetic") == 7 and domains.count("countdown") == 1
    assert col.metrics["astor/share/arithmetic"] == 7 / 8
    step = tr.step_inputs(col)
    want = torch.tensor([src.kl_scales()[0 if d == "arithmetic" else 1] for d in domains])
    assert torch.equal(step[Role.KL_SCALE], want.repeat_interleave(4))
    assert step[Role.KL_SCALE][0] < step[Role.KL_SCALE][-1]  # countdown: the tighter KL
    tr.close()


def test_the_task_state_resumes(fast_cfg, tmp_path):
    over = ("algo.astor={synergy_every: 1}", "algo.kl_coef=0.01", MIX, "run.save_every=2")
    a = Trainer(fast_cfg(*over, f"run.dir={tmp_path / 'a'}"))
    a.train()
    b = Trainer(fast_cfg(*over, f"run.dir={tmp_path / 'a'}"), resume=True)
    sa, sb = (next(s for s in t.rollouts.chain() if isinstance(s, AstorSource)) for t in (a, b))
    assert torch.equal(sa.potential, sb.potential) and torch.equal(sa.synergy, sb.synergy)
    assert not torch.equal(sa.potential, torch.ones(2))  # measured, not the initial state
    b.close()


def test_astor_refuses_one_task_and_a_missing_kl(fast_overrides):
    with pytest.raises(ValueError, match="at least two tasks"):
        load_config(None, [*fast_overrides, "algo.astor={adaptive_kl: false}"])
    with pytest.raises(ValueError, match=r"set algo\.kl_coef > 0"):
        load_config(None, [*fast_overrides, "algo.astor={}", MIX])
    load_config(None, [*fast_overrides, "algo.astor={}", "algo.kl_coef=0.01", MIX])
