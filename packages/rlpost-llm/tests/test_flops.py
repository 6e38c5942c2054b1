"""RACE FLOP accounting of a run (004-01): generation counted token by token, the update
as forward + backward, an engine outside the process from its batch, totals resumed."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM

from rlpost.core.flops import FlopCounter, flop_params, forward_flops
from rlpost.llm.model import tiny
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.trainer import Trainer


def parity(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _hook(tr):
    return next(c for c in tr.components.items if c.name == "flops")


def test_generate_with_a_kv_cache_costs_2n_per_token_it_feeds():
    tok = tiny.build_tokenizer()
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(tiny.tiny_config(tok)).eval()
    n, _ = flop_params(m)
    c = FlopCounter(m)
    ids = torch.randint(5, 20, (3, 4))
    m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, min_new_tokens=5,
               do_sample=False, pad_token_id=tok.pad_token_id)  # fmt: skip
    # the prompt once (3 x 4), then one token per row for each of the 4 later decode steps
    assert c.counts == {"inference": 2 * n * (3 * 4 + 3 * 4)}


def test_a_run_logs_its_split_and_counts_an_outside_engine_from_its_batch(fast_cfg):
    cfg = fast_cfg("train.steps=2", "optim.skip_inert_rows=false")  # every row forwarded
    tr = Trainer(cfg, reward_fn=parity)
    n, _ = flop_params(tr.model)
    seen: list[list[int]] = []
    fake = FakeEngine(lambda p, k: [([7, 8, 9], [-1.0] * 3, "length") for _ in range(k)])
    generate = fake.generate
    fake.generate = lambda prompts, k, sp: (
        seen.append([len(p) for p in prompts]) or generate(prompts, k, sp)
    )
    tr.engine = fake  # no model in this process: the batch is the count
    tr.train()
    steps = [r for r in _rows(cfg.run.dir) if "accuracy" in r]
    g = tr.preset.group_size
    for row, lengths in zip(steps, seen, strict=True):
        assert row["flops/rollout"] == 2 * n * sum(g * (p + 3) for p in lengths)
        trained = 6 * n * sum(g * 3 for _ in lengths)  # at least the completions, trained
        assert row["flops/update"] >= trained and row["flops/update"] % (2 * n) == 0
        assert row["flops/feedback"] == 0  # a rule-based reward costs no model FLOPs
    last = steps[-1]
    assert last["flops/total/rollout"] == sum(r["flops/rollout"] for r in steps)
    assert last["flops/total"] == sum(r["flops/rollout"] + r["flops/update"] for r in steps)


def test_in_process_rollouts_and_evaluations_are_counted_and_totals_resume(fast_cfg):
    cfg = fast_cfg("run.eval_every=1", "run.save_every=1", "optim.skip_inert_rows=false")
    tr = Trainer(cfg, reward_fn=parity)
    tr.train()
    rows = _rows(cfg.run.dir)
    steps = [r for r in rows if "accuracy" in r]
    assert all(r["flops/rollout"] > 0 and r["flops/update"] > r["flops/rollout"] for r in steps)
    assert rows[0]["flops/eval"] > 0 and all(r["flops/eval"] > 0 for r in steps)
    resumed = Trainer(cfg, reward_fn=parity, resume=True)
    totals = {k.removeprefix("flops/total/"): v for k, v in rows[-1].items()
              if k.startswith("flops/total/")}  # fmt: skip
    assert _hook(resumed).totals == totals
    resumed.close()


def test_the_flops_command_splits_finished_runs_and_names_the_best_allocation(
    fast_cfg, tmp_path, capsys
):
    from rlpost.apps.llm.cli import main
    from rlpost.llm.tools.flops import run_split

    dirs = []
    for g in (2, 4):  # a two-point pilot grid over the group size
        cfg = fast_cfg(
            "run.eval_every=2", f"rollout.group_size={g}", f"run.dir={tmp_path / f'g{g}'}"
        )
        Trainer(cfg, reward_fn=parity).train()
        dirs.append(cfg.run.dir)
    a, b = (run_split(d) for d in dirs)
    assert a["total"] < b["total"]  # half the samples per prompt, less compute
    for s in (a, b):
        assert abs(s["rollout_share"] + s["update_share"] + s["feedback_share"] - 1) < 1e-9
    assert main(["flops", *dirs]) == 0
    out = capsys.readouterr().out
    assert "rollout" in out and "most accuracy per FLOP:" in out
    assert main(["flops", str(tmp_path / "nothing")]) == 2
    assert "no metrics.jsonl rows" in capsys.readouterr().err


def test_an_engine_copy_is_counted_as_rollouts_and_its_evaluations_as_eval(fast_cfg):
    """One step off: the engine holds its own copy and generates the next batch on a
    thread while the update runs; the evaluations it runs are eval, not rollouts."""
    cfg = fast_cfg("train.pipeline=one_step_off", "run.eval_every=1", "train.steps=3")
    tr = Trainer(cfg, reward_fn=parity)
    assert tr.engine.model is not tr.model
    tr.train()
    rows = _rows(cfg.run.dir)
    steps = [r for r in rows if "accuracy" in r]
    assert all(r["flops/rollout"] > 0 and r["flops/eval"] > 0 for r in steps)
    n, _ = flop_params(tr.model)
    assert all(r["flops/update"] % (2 * n) == 0 for r in steps)


def test_a_generator_threads_flops_go_to_the_step_that_trains_on_them_whenever_they_run(fast_cfg):
    """One step off: the next batch's generation may finish before or after the update's
    end; either way its FLOPs are the next step's rollouts, and a checkpoint holds them."""
    import threading

    tr = Trainer(fast_cfg(), reward_fn=parity)
    hook = _hook(tr)
    hook._drain()

    def generate():  # the generator thread's forward of 5 tokens
        with torch.no_grad():
            tr.model(torch.ones(1, 5, dtype=torch.long))

    worker = threading.Thread(target=generate)
    worker.start()
    worker.join()  # it ran during step t's update (before its end)...
    want = forward_flops(hook.counters[0].n_params, 5)
    metrics: dict[str, float] = {}
    hook.end_update(None, metrics)
    assert metrics["flops/rollout"] == 0  # ...and is not step t's
    state, _ = hook.state_dict()
    assert state["ahead"] == want and "ahead" not in hook.totals
    hook.ahead = 0
    hook.load_state_dict(state, {})  # (a resumed run gets it back from the checkpoint)
    hook.collected(type("Col", (), {"batch": []})())
    hook.end_update(None, metrics)
    assert metrics["flops/rollout"] == want  # step t+1's, which trains on that batch
    tr.close()


def test_the_engine_copy_is_counted_from_the_first_batch_its_thread_generates(fast_cfg):
    """One step off: step 2's batch is generated on the engine's copy in a thread that
    starts before step 1's update begins. Its forwards are counted however far the thread
    got before the update began; before, the copy was hooked at the update's start, so a
    thread that got ahead went uncounted (and a resumed run's next step differed from the
    uninterrupted one's, in ``flops/rollout`` only, whenever its thread got ahead)."""
    from rlpost.llm.rollout.sources.sync import OneStepOffSource

    tr = Trainer(fast_cfg("train.pipeline=one_step_off", "train.steps=2"), reward_fn=parity)
    hook, src = _hook(tr), tr.rollouts
    while not isinstance(src, OneStepOffSource):
        src = src.inner
    held: list[int] = []
    begin, collected = hook.begin_update, hook.collected

    def late_begin(col):  # the thread finishes the next batch before the update begins
        if src._pending is not None:
            src._pending.result()
        begin(col)

    def counting(col):
        held.append(hook.ahead)
        return collected(col)

    hook.begin_update, hook.collected = late_begin, counting
    tr.train()
    tr.close()
    assert held[0] == 0 and held[1] > 0, held  # step 2's batch: its thread's forwards
