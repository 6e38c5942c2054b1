import pytest
import torch
from torch.testing import assert_close

from rlpost.core import (
    PRESETS,
    AdvantageInput,
    Choice,
    Coupling,
    Input,
    PolicyBatch,
    Preset,
    RegistryError,
    TeacherDistributions,
    TrainingDynamics,
    get_preset,
    kl_reward_penalty,
    register_preset,
)
from rlpost.core.objectives import OBJECTIVES, ObjectiveInput

B, T = 8, 6


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 2, 5, 1, 6, 3, 4, 6])
    mask = (torch.arange(T) < lengths[:, None]).float()
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_(True)
    old = logp.detach() + 0.05 * torch.randn(B, T, generator=g)
    ref = logp.detach() + 0.2 * torch.randn(B, T, generator=g)
    rollout = old + 0.02 * torch.randn(B, T, generator=g)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    groups = torch.arange(B) // 4
    values = torch.randn(B, T, generator=g)
    return mask, logp, old, ref, rollout, rewards, groups, values


DYN = TrainingDynamics(progress=0.5, entropy=1.0, initial_entropy=1.2)


def step_inputs(preset: Preset, seed=0):
    mask, logp, old, ref, rollout, rewards, groups, values = batch(seed)
    recipe = preset.build()
    tr = (
        kl_reward_penalty(old, ref, mask, preset.kl_coef, preset.kl.name)
        if preset.kl_in_reward
        else None
    )
    if Input.VECTOR_REWARDS in recipe.advantage.needs:  # a second reward component
        rewards = torch.stack([rewards, torch.linspace(0, 1, B)], 1)
    adv = recipe.advantages(
        AdvantageInput(
            rewards,
            groups,
            mask,
            values=values,
            token_rewards=tr,
            # the optional inputs some seed estimators read
            logprobs=old * mask,
            teacher_logprobs=ref * mask,
            turn_ids=torch.where(mask > 0, torch.arange(T) // 3, -1),
            turn_rewards=torch.randn(B, T, generator=torch.Generator().manual_seed(5)),
            prompt_features=torch.randn(B, 4, generator=torch.Generator().manual_seed(seed)),
            completion_features=torch.randn(B, 4, generator=torch.Generator().manual_seed(7)),
            dynamics=DYN,
        )
    ).advantages
    return recipe, mask, logp, old, ref, rollout, adv


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_and_cites_its_paper(name):
    p = get_preset(name)
    # base methods cite their arXiv paper; seed methods their catalog ID (CATALOG.md)
    assert p.catalog_id and (
        "arXiv" in p.paper if p.catalog_id == "base" else p.catalog_id in p.paper
    )
    p.build()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_microbatching_equals_full_batch(name):
    preset = get_preset(name).replace(correction=Choice("tis"), entropy_coef=0.01)
    coupling = preset.build().coupling()
    grouped = coupling == Coupling.GROUP
    if grouped:  # batch() has groups of 4
        preset = preset.replace(group_size=4)
    recipe, mask, logp, old, ref, rollout, adv = step_inputs(preset)
    ent = torch.rand(B, T)
    groups = torch.arange(B) // 4
    kw = {"rollout_logp": rollout, "ref_logp": ref, "entropy": ent, "dynamics": DYN}
    kw["generation_budget"] = float(T)  # Dr. GRPO's constant
    kw["group_ids"] = groups  # entries that do not declare them never see them
    g = torch.Generator().manual_seed(3)  # a teacher's top-2 (distillation presets)
    topk = TeacherDistributions(
        -torch.rand(B, T, 2, generator=g) * 3,
        -torch.rand(B, T, 2, generator=g) * 3,
        torch.randint(-1, 2, (B, T), generator=g),
    )
    teacher = {"teacher_logp": ref, "teacher_topk": topk}
    kw.update(teacher)
    full = recipe.policy_loss(PolicyBatch(logp, old, adv, mask, **kw)).loss
    (g_full,) = torch.autograd.grad(full, logp)
    g_acc, tot = torch.zeros_like(logp), 0.0
    n_tok, n_seq = mask.sum().item(), B
    splits = ([0, 1, 2, 3], [4, 5, 6, 7]) if grouped else ([0, 1, 2], [3, 4], [5, 6, 7])
    if coupling == Coupling.BATCH:  # a statistic of the whole step batch: one call
        splits = (list(range(B)),)
    for idx in splits:
        x = logp.detach()[idx].clone().requires_grad_(True)
        gkw = {"group_ids": groups[idx], "dynamics": DYN, "generation_budget": float(T)}
        gkw["teacher_logp"] = ref[idx]
        gkw["teacher_topk"] = TeacherDistributions(
            topk.student[idx], topk.teacher[idx], topk.sampled_index[idx]
        )
        li = recipe.policy_loss(
            PolicyBatch(
                x,
                old[idx],
                adv[idx],
                mask[idx],
                rollout_logp=rollout[idx],
                ref_logp=ref[idx],
                entropy=ent[idx],
                global_tokens=n_tok,
                global_sequences=n_seq,
                **gkw,
            )
        ).loss
        (g,) = torch.autograd.grad(li, x)
        g_acc[idx] += g
        tot += li.item()
    assert tot == pytest.approx(full.item(), rel=1e-5, abs=1e-7)
    assert_close(g_acc, g_full)
    assert (g_full[mask == 0] == 0).all()


def test_grpo_kl_in_loss_requires_reference():
    recipe, mask, logp, old, _, _, adv = step_inputs(get_preset("grpo"))
    with pytest.raises(ValueError, match=r"needs ref_logprobs: pass PolicyBatch\.ref_logp"):
        recipe.policy_loss(PolicyBatch(logp, old, adv, mask))


def test_gspo_preset_is_sequence_level_objective():
    # GSPO: loss_i = -min(s_i A_i, clip(s_i) A_i), averaged over sequences
    recipe, mask, logp, old, _, _, adv = step_inputs(get_preset("gspo"))
    loss = recipe.policy_loss(PolicyBatch(logp, old, adv, mask)).loss
    s = (((logp - old) * mask).sum(1) / mask.sum(1)).exp()
    A = adv[:, 0]
    expected = -torch.minimum(s * A, s.clamp(1 - 3e-4, 1 + 4e-4) * A).mean()
    assert_close(loss, expected)


def test_register_duplicate_and_unknown_preset():
    with pytest.raises(RegistryError, match="already registered"):
        register_preset(get_preset("grpo"))
    with pytest.raises(RegistryError, match=r"valid names: .*dapo, dr_grpo"):
        get_preset("gpro")


def test_bad_preset_fails_at_registration_naming_field():
    bad = get_preset("dapo").replace(name="bad", objective=Choice("ppo_clip", {"clip_hgih": 0.3}))
    with pytest.raises(RegistryError, match=r"'ppo_clip': unknown parameter\(s\) \['clip_hgih'\]"):
        register_preset(bad)
    assert "bad" not in PRESETS


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_group_coupling_is_declared_by_exactly_the_entries_whose_loss_reads_groups(name):
    # the declared coupling gates the whole-group check of Recipe.policy_loss and the
    # trainers' micro-batching: an entry declaring GROUP must depend on the labels (here:
    # relabelling the groups changes its loss); one not declaring it never sees them
    mask, logp, old, *_ = batch()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, -0.3])
    f = OBJECTIVES.build(name)
    dyn = {"dynamics": DYN}
    two = f(ObjectiveInput(logp, old, adv, mask, group_ids=torch.arange(B) // 4, **dyn)).loss
    four = f(ObjectiveInput(logp, old, adv, mask, group_ids=torch.arange(B) // 2, **dyn)).loss
    assert (f.coupling == Coupling.GROUP) == (not torch.equal(two, four))
    assert (Input.GROUP_IDS in f.reads) == (f.coupling == Coupling.GROUP)


def test_whole_group_check_only_for_group_objectives():
    odd = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])  # group sizes 3, 2, 3 != group_size
    recipe, mask, logp, old, ref, _, adv = step_inputs(get_preset("dapo"))
    plain = recipe.policy_loss(PolicyBatch(logp, old, adv, mask, ref_logp=ref)).loss
    assert (
        recipe.policy_loss(PolicyBatch(logp, old, adv, mask, ref_logp=ref, group_ids=odd)).loss
        == plain
    )
    recipe, mask, logp, old, _, _, adv = step_inputs(get_preset("conspo"))
    with pytest.raises(ValueError, match="whole groups"):
        recipe.policy_loss(PolicyBatch(logp, old, adv, mask, group_ids=odd, dynamics=DYN))


def test_policy_loss_forwards_ref_entropy_to_the_kl():
    # reva_rer weights the KL of each response by the reference entropy: KLInput.ref_entropy
    # when given, else the sampled-token estimate -log pi_ref; policy_loss must forward it
    recipe, mask, logp, old, ref, _, adv = step_inputs(get_preset("reva_po"))
    base = recipe.policy_loss(PolicyBatch(logp, old, adv, mask, ref_logp=ref)).loss
    same = recipe.policy_loss(
        PolicyBatch(logp, old, adv, mask, ref_logp=ref, ref_entropy=-ref)
    ).loss
    h = torch.linspace(0.1, 3.0, B * T).reshape(B, T)
    other = recipe.policy_loss(PolicyBatch(logp, old, adv, mask, ref_logp=ref, ref_entropy=h)).loss
    assert_close(same, base)
    assert not torch.allclose(other, base)
