"""The preference trainer (``rlpost-llm dpo``) on a tiny untrained Qwen2 (CPU, 1 thread)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlpost.core.io.rundir import locked_here
from rlpost.core.preference import PREFERENCE_LOSSES
from rlpost.llm.config import ConfigError
from rlpost.llm.preference import PreferenceTrainer, load_preference_config
from rlpost.llm.rollout.engines.fake import FakeEngine

PFAST = [
    "model.path=tiny-random",
    "data.task_params.digits=2",
    "data.train_size=16",
    "data.eval_size=8",
    "data.eval_max_new_tokens=4",
    "train.steps=2",
    "train.batch_size=8",
    "optim.micro_batch_size=4",
    "optim.lr=1e-3",
    "online.pairs_per_step=4",
    "online.samples_per_prompt=3",
    "online.max_new_tokens=4",
    "run.eval_every=0",
    "run.save_every=0",
    "reward.workers=0",
    "run.progress=false",
    "run.tensorboard=false",
    "run.threads=1",
]


def cfg_of(run_dir: Path, *overrides: str):
    return load_preference_config(None, [*PFAST, f"run.dir={run_dir}", *overrides])


def params_of(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def strip_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.parametrize("loss", PREFERENCE_LOSSES.names())
def test_every_loss_trains_two_offline_steps(loss, tmp_path):
    tr = PreferenceTrainer(cfg_of(tmp_path, f"loss.name={loss}", "run.eval_every=2"))
    before = params_of(tr.model)
    result = tr.train()
    assert not locked_here(tmp_path)  # the run has ended: its directory is released
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])
        assert {"reward_acc", "margin", "logp/chosen", "logp/rejected"} <= set(r)
    assert any(not torch.equal(v, before[k]) for k, v in params_of(tr.model).items())
    assert result["steps"] == 2 and "pref_acc_after" in result and "eval_after" in result
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def _count_forwards(module: torch.nn.Module) -> list[int]:
    """Counts forwards through the input embedding (every forward path uses it)."""
    calls = [0]
    module.get_input_embeddings().register_forward_hook(
        lambda *_: calls.__setitem__(0, calls[0] + 1)
    )
    return calls


def test_reference_logprobs_are_computed_once_and_only_when_read(tmp_path):
    tr = PreferenceTrainer(cfg_of(tmp_path / "dpo", "train.steps=3", "run.eval_every=1"))
    calls = _count_forwards(tr.reference.model)
    tr.train()
    # 16 training + 8 held-out pairs in micro-batches of 4, once; none in the 3 steps or 4 evals
    assert calls[0] == 16 // 4 + 8 // 4
    assert tr.ref_train[0].shape == (16,)
    rows = [json.loads(ln) for ln in (tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()]
    # before the first update the policy is the reference: DPO's implicit rewards are 0
    assert abs(rows[0]["eval/margin"]) < 1e-4 and abs(rows[1]["margin"]) < 1e-4
    for loss in ("simpo", "xi_dpo"):  # reference-free: no reference model, no reference pass
        free = PreferenceTrainer(cfg_of(tmp_path / loss, f"loss.name={loss}"))
        assert free.reference is None
        free.train()
        assert free.ref_train is None and free.ref_eval is None


def test_microbatching_equals_the_full_batch(tmp_path):
    """Micro-batches of 1 pair with the loss divided by the step's pair count: the same
    accumulated gradient and, after the step, the same parameters as one 8-pair batch."""
    out = {}
    for mbs in (1, 8):
        cfg = cfg_of(
            tmp_path / str(mbs),
            f"optim.micro_batch_size={mbs}",
            "loss.name=ed_dpo",
            "optim.lr=1e-4",
        )
        tr = PreferenceTrainer(cfg)
        tr._prepare()
        grads: dict[str, torch.Tensor] = {}
        tr.optimizer.register_step_pre_hook(  # the accumulated, clipped gradient
            lambda *_, tr=tr, grads=grads: grads.update(
                {n: q.grad.clone() for n, q in tr.model.named_parameters()}
            )
        )
        m = tr.train_step()
        out[mbs] = (grads, params_of(tr.model), m)
        tr.close()
    (g1, p1, m1), (g8, p8, m8) = out[1], out[8]
    for k in g1:
        torch.testing.assert_close(g1[k], g8[k], atol=1e-6, rtol=1e-4)
    # Adam moves each weight by about lr = 1e-4; a weight whose gradient is near Adam's eps
    # moves by a rounding-sensitive fraction of that (the packed rows of 1 and of 8 pairs sum
    # in another order): 3e-6 is 3 % of a step
    for k in p1:
        torch.testing.assert_close(p1[k], p8[k], atol=3e-6, rtol=1e-5)
    for key in ("loss", "margin", "reward_acc", "explore", "logp/chosen", "grad_norm"):
        assert m1[key] == pytest.approx(m8[key], rel=1e-5, abs=1e-6)


def test_resume_continues_exactly(tmp_path):
    full = cfg_of(tmp_path / "full", "train.steps=4", "run.save_every=2", "run.eval_every=2")
    PreferenceTrainer(full).train()
    first = cfg_of(tmp_path / "split", "train.steps=2", "run.save_every=2", "run.eval_every=2")
    PreferenceTrainer(first).train()
    rest = cfg_of(tmp_path / "split", "train.steps=4", "run.save_every=2", "run.eval_every=2")
    resumed = PreferenceTrainer(rest, resume=True)
    assert resumed.step == 2
    resumed.train()
    final = "checkpoints/step-000004/model.safetensors"
    a, b = load_file(tmp_path / "full" / final), load_file(tmp_path / "split" / final)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = {
        d: strip_times(
            [json.loads(ln) for ln in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
        )
        for d in ("full", "split")
    }
    assert rows["full"] == rows["split"]


def arithmetic_script(tok):
    """A scripted engine for 2-digit addition: prompts whose sum is divisible by 3 get only
    correct samples (no pair: skipped); the others get one correct sample, then wrong ones."""

    def script(prompt_ids, n):
        a, b = tok.decode(prompt_ids).rstrip("=").split("+")
        s = int(a) + int(b)
        right = [*tok(str(s), add_special_tokens=False).input_ids, tok.eos_token_id]
        wrong = [*tok(str(s + 1), add_special_tokens=False).input_ids, tok.eos_token_id]
        rows = [right] * n if s % 3 == 0 else [right] + [wrong] * (n - 1)
        return [(r, [0.0] * len(r), "stop") for r in rows]

    return script


def online_trainer(run_dir: Path, *overrides: str) -> PreferenceTrainer:
    from rlpost.llm.model.policy import load_policy

    cfg = cfg_of(run_dir, "mode=online", *overrides)
    model, tok = load_policy(cfg, progress=False)
    engine = FakeEngine(arithmetic_script(tok), pad_id=tok.pad_token_id)
    return PreferenceTrainer(cfg, model, tok, engine=engine)


def test_online_mode_builds_pairs_from_verified_samples_and_trains(tmp_path):
    tr = online_trainer(tmp_path, "online.max_refill=0")
    pairs, m = tr.collect()
    prompts = [tr.tok.decode(p) for p in pairs.prompt_ids]
    assert m["online/prompts"] == 4 and m["online/pairs"] + m["online/skipped_prompts"] == 4
    assert len(pairs) == m["online/pairs"] > 0
    for p, c, r in zip(prompts, pairs.chosen_ids, pairs.rejected_ids, strict=True):
        total = sum(int(x) for x in p.rstrip("=").split("+"))
        assert total % 3 != 0  # all-correct prompts were skipped
        assert tr.tok.decode(c, skip_special_tokens=True) == str(total)
        assert tr.tok.decode(r, skip_special_tokens=True) == str(total + 1)
    before = params_of(tr.model)
    tr.train()
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
    assert any(not torch.equal(v, before[k]) for k, v in params_of(tr.model).items())


def test_refresh_reference_resets_the_reference_to_the_policy(tmp_path):
    one = online_trainer(tmp_path / "one", "train.steps=1")
    init = params_of(one.reference.model)
    one.train()
    after_one = params_of(one.model)
    two = online_trainer(
        tmp_path / "two", "train.steps=2", "online.refresh_reference=true", "online.round_steps=1"
    )
    two.train()
    ref = params_of(two.reference.model)  # refreshed at the start of step 2
    for k in ref:
        assert torch.equal(ref[k], after_one[k]), k
    assert any(not torch.equal(ref[k], init[k]) for k in ref)
    fixed = online_trainer(tmp_path / "fixed", "train.steps=2")
    fixed.train()
    for k, v in params_of(fixed.reference.model).items():  # no refresh: still the initial weights
        assert torch.equal(v, init[k]), k


def test_online_iterative_resume_restores_the_round_reference(tmp_path):
    it = ("online.refresh_reference=true", "online.round_steps=2", "run.save_every=3")
    full = online_trainer(tmp_path / "full", "train.steps=5", *it)
    full.train()
    online_trainer(tmp_path / "split", "train.steps=3", *it).train()
    cfg = cfg_of(tmp_path / "split", "mode=online", "train.steps=5", *it)
    from rlpost.llm.model.policy import load_policy

    model, tok = load_policy(cfg, progress=False)
    resumed = PreferenceTrainer(
        cfg, model, tok, resume=True, engine=FakeEngine(arithmetic_script(tok), tok.pad_token_id)
    )
    assert resumed.step == 3
    resumed.train()
    for a, b in ((full.model, resumed.model), (full.reference.model, resumed.reference.model)):
        pb = params_of(b)
        for k, v in params_of(a).items():
            assert torch.equal(v, pb[k]), k


def test_bad_loss_name_fails_at_load_naming_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown preference loss 'dpoo'; valid names: dpo, "):
        load_preference_config(None, ["loss.name=dpoo"])
    with pytest.raises(ConfigError, match=r"'simpo': unknown parameter\(s\) \['tau'\]"):
        load_preference_config(None, ["loss.name=simpo", "loss.params.tau=1"])
    with pytest.raises(ConfigError, match=r"refresh_reference: needs mode=online"):
        load_preference_config(None, ["online.refresh_reference=true"])


def _per_token_loglik(model, prompt: list[int], completion: list[int]) -> float:
    """Mean log pi of ``completion``'s tokens after ``prompt``: one unpadded forward."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
    picked = logp[len(prompt) - 1 :].gather(1, ids[0, len(prompt) :, None])
    return float(picked.mean())


def test_xi_auto_is_the_initial_models_quantile_and_survives_resume(tmp_path, capsys):
    """``xi: auto`` = the 0.9 quantile of rho_0 = 1 - l_w / l_l over the training pairs under
    the *initial* model (per-token log-likelihoods computed here pair by pair, unpadded);
    a resumed run (whose model then holds trained weights) gets the same xi."""
    over = ("loss.name=xi_dpo", "loss.params.xi=auto", "run.save_every=2", "optim.lr=1e-2")
    tr = PreferenceTrainer(cfg_of(tmp_path / "run", *over))
    p = tr.train_pairs
    rho = []
    for i in range(len(p)):
        lw = _per_token_loglik(tr.model, p.prompt_ids[i], p.chosen_ids[i])
        ll = _per_token_loglik(tr.model, p.prompt_ids[i], p.rejected_ids[i])
        rho.append(1 - lw / min(ll, -1e-2))
    expected = min(max(float(torch.tensor(rho).double().quantile(0.9)), 0.05), 0.95)
    assert tr.auto["xi"] == pytest.approx(expected, abs=1e-5)
    assert tr.loss.params.xi == tr.auto["xi"]
    assert f"xi = {tr.auto['xi']:.4f} from the initial model" in capsys.readouterr().err
    assert tr.train()["xi"] == tr.auto["xi"]
    resumed = PreferenceTrainer(cfg_of(tmp_path / "run", *over, "train.steps=4"), resume=True)
    assert resumed.step == 2 and resumed.auto == tr.auto
    # a stand-in value would have been 0.5; an online run has no initial pairs to set it from
    assert tr.auto["xi"] != 0.5
    with pytest.raises(ConfigError, match=r"xi=auto is set from the initial model's training"):
        load_preference_config(None, ["loss.name=xi_dpo", "loss.params.xi=auto", "mode=online"])
    with pytest.raises(ConfigError, match=r"'ipo'"):
        load_preference_config(None, ["loss.name=ipo", "loss.params.tau=auto"])


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trl_format_jsonl_loads_and_a_missing_column_is_named(tmp_path, capsys):
    rows = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(12)]
    path = _write_jsonl(tmp_path / "pairs.jsonl", rows)
    tr = PreferenceTrainer(cfg_of(tmp_path / "run", f"data.path={path}", "data.eval_size=4"))
    assert (len(tr.train_pairs), len(tr.eval_pairs)) == (8, 4)
    assert tr.tok.decode(tr.eval_pairs.chosen_ids[0], skip_special_tokens=True) == "9"
    result = tr.train()
    assert result["steps"] == 2 and "eval_before" not in result  # no task: no greedy accuracy

    bad = _write_jsonl(
        tmp_path / "bad.jsonl", [{"prompt": r["prompt"], "chosen": r["chosen"]} for r in rows]
    )
    with pytest.raises(ConfigError, match=r"missing column\(s\) \['rejected'\]"):
        PreferenceTrainer(cfg_of(tmp_path / "bad", f"data.path={bad}"))
    from rlpost.apps.llm.cli import main

    assert main(["dpo", *PFAST, f"data.path={bad}", f"run.dir={tmp_path / 'cli'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlpost-llm: ") and "'rejected'" in err and "\n" not in err


def test_cli_dpo_runs_the_shipped_recipe_end_to_end(tmp_path, capsys):
    from rlpost.apps.llm.cli import main
    from rlpost.llm.recipes import recipe_path

    assert recipe_path("dpo_arithmetic").name == "dpo_arithmetic.yaml"
    run = tmp_path / "run"
    args = [*PFAST, "run.eval_every=2", "run.save_every=2", f"run.dir={run}"]
    assert main(["dpo", "--config", "dpo_arithmetic", *args]) == 0
    out = capsys.readouterr().out
    assert "held-out greedy accuracy:" in out and "preference margin:" in out
    assert (run / "checkpoints" / "step-000002" / "model.safetensors").is_file()
    assert load_preference_config(run / "config.yaml") == load_preference_config(
        recipe_path("dpo_arithmetic"), args
    )
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_a_small_file_trains_without_setting_eval_size(tmp_path, capsys):
    """Before: a 64-row file was refused (eval_size=256 by default) until set by hand."""
    rows = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(64)]
    path = _write_jsonl(tmp_path / "pairs.jsonl", rows)
    over = [o for o in PFAST if not o.startswith("data.eval_size")]
    tr = PreferenceTrainer(load_preference_config(None, [*over, f"data.path={path}",
                                                         f"run.dir={tmp_path / 'run'}"]))  # fmt: skip
    assert (len(tr.train_pairs), len(tr.eval_pairs)) == (58, 6)  # a tenth held out
    assert "64 rows <= data.eval_size=256; holding out 6" in capsys.readouterr().err


def test_trls_conversational_preference_format_goes_through_the_chat_template(tmp_path):
    """Before: refused ('the conversational format is not supported')."""
    from rlpost.llm.model.policy import load_policy

    user = lambda i: [{"role": "user", "content": f"{i}+1="}]  # noqa: E731
    said = lambda x: [{"role": "assistant", "content": x}]  # noqa: E731
    rows = [{"prompt": user(i), "chosen": said(str(i + 1)), "rejected": said(str(i + 2))}
            for i in range(12)]  # fmt: skip
    path = _write_jsonl(tmp_path / "chat.jsonl", rows)
    cfg = cfg_of(tmp_path / "run", f"data.path={path}", "data.eval_size=4")
    model, tok = load_policy(cfg, progress=False)
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}>{{ m['content'] }}"
        "{% else %}:{{ m['content'] }})){% endif %}{% endfor %}"
        "{% if add_generation_prompt %}:{% endif %}"
    )
    tr = PreferenceTrainer(cfg, model=model, tokenizer=tok)
    # pair 8 (the first held out): prompt rendered with the generation prompt, completions
    # what the template appends after it, then EOS
    assert tok.decode(tr.eval_pairs.prompt_ids[0]) == ">8+1=:"
    assert tok.decode(tr.eval_pairs.chosen_ids[0], skip_special_tokens=True) == "9))"
    assert tok.decode(tr.eval_pairs.rejected_ids[0], skip_special_tokens=True) == "10))"
    assert tr.eval_pairs.chosen_ids[0][-1] == tok.eos_token_id
    assert tr.train()["steps"] == 2
    mixed = _write_jsonl(tmp_path / "mixed.jsonl", [{**rows[0], "chosen": "1"}] * 12)
    with pytest.raises(ConfigError, match=r"row 0: .* must all be plain strings or all lists"):
        PreferenceTrainer(cfg_of(tmp_path / "mixed", f"data.path={mixed}", "data.eval_size=4"))
