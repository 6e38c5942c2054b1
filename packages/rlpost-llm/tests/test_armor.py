"""ARMOR (004-06): anchor rollouts sampled from the reference policy join every group,
carry the reference's log-probs as their behaviour policy and so get off-policy ratios."""

from __future__ import annotations

import copy

import pytest
import torch

from rlpost.core.peers import OWN, TRAIN
from rlpost.llm.config import load_config
from rlpost.llm.train.inputs import Role
from rlpost.llm.trainer import Trainer


def _one_first(completion: str, example) -> float:
    return float(completion.startswith("1"))


def test_anchor_rows_carry_the_references_logprobs_and_get_off_policy_ratios(fast_cfg):
    cfg = fast_cfg("algo.armor={anchors: 3}", "optim.lr=1e-2")
    tr = Trainer(cfg, reward_fn=_one_first)
    initial = copy.deepcopy(tr.model)
    for _ in range(2):  # the policy moves away from the reference
        tr.update(tr.rollouts.collect())
        tr.sync_engine()
    col = tr.rollouts.collect()
    G, k, n = 4, 3, 4
    assert len(col.batch) == n * (G + k) and col.metrics["armor/anchors"] == n * k
    assert torch.equal(torch.bincount(col.batch.group), torch.full((n,), G + k))
    anchor = col.roles == TRAIN
    assert anchor.sum() == n * k and (col.roles[~anchor] == OWN).all()
    for j in range(n):  # a group: one prompt, its own rows then its anchors
        rows = torch.nonzero(col.batch.group == j).flatten()
        assert len({tuple(col.batch.prompt_ids[r]) for r in rows}) == 1
        assert anchor[rows].tolist() == [False] * G + [True] * k
    mask = col.batch.mask
    ref = tr.forwards.nograd(initial, col.batch).logp
    now = tr.forwards.nograd(tr.model, col.batch).logp
    assert torch.allclose(col.old_logp[anchor], ref[anchor], atol=1e-5)
    assert torch.allclose(col.old_logp[~anchor], now[~anchor], atol=1e-5)
    ratio = ((now - col.old_logp) * mask).abs().sum(1)
    assert (ratio[~anchor] < 1e-4).all() and (ratio[anchor] > 1e-3).all()  # off-policy
    step = tr.step_inputs(col)  # the loss's pi_old: each row's own behaviour policy
    assert torch.equal(step[Role.OLD_LOGP], col.old_logp)
    assert bool(step[Role.TRAINED].all())  # anchors are trained on, not baseline-only
    assert col.own().sum() == n * G  # the policy's accuracy leaves the anchors out
    tr.close()


def test_armor_loads_from_the_cli_and_declares_its_uneven_groups(fast_overrides):
    cfg = load_config(None, [*fast_overrides, "algo.armor={}"])
    assert any(c.name == "armor" for c in cfg.preset().rollout)
    with pytest.raises(ValueError, match="anchors must be >= 1"):
        load_config(None, [*fast_overrides, "algo.armor={anchors: 0}"])
    with pytest.raises(ValueError, match="ARMOR"):
        load_config(None, [*fast_overrides, "algo.armor={}", "algo.dynamic_sampling=true"])
