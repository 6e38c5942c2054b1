"""A user's own data: conversational prompts through the chat template, prompt-only files
with a user reward, small files, a datasets.Dataset from Python."""

import json

import pytest
import torch

from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.model.policy import load_policy
from rlpost.llm.trainer import Trainer

# characters of the tiny tokenizer's vocabulary, so that every rendered one is a token
TEMPLATE = (
    "{% for m in messages %}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}:{% endif %}"
)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _chat_rows(n):
    return [
        {"prompt": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i)}
        for i in range(n)
    ]


def test_conversational_prompts_go_through_the_chat_template(fast_cfg, tmp_path):
    data = _jsonl(tmp_path / "chat.jsonl", _chat_rows(12))
    cfg = fast_cfg(f"data.path={data}", "data.eval_size=4", "train.steps=1")
    model, tok = load_policy(cfg, progress=False)
    tok.chat_template = TEMPLATE
    messages = [{"role": "user", "content": "87+65="}]
    assert encode_prompt(tok, messages) == tok(">87+65=:", add_special_tokens=False).input_ids
    assert encode_prompt(tok, "87+65=") == tok("87+65=", add_special_tokens=False).input_ids
    t = Trainer(cfg, model=model, tokenizer=tok)
    col = t.collect()
    text = tok.decode(col.batch.prompt_ids[0])  # what the model was conditioned on
    assert text.startswith(">") and text.endswith("=:") and "role" not in text, text
    t.update(col)


def test_conversational_prompts_need_a_tokenizer_with_a_template(fast_cfg, tmp_path):
    data = _jsonl(tmp_path / "chat.jsonl", _chat_rows(12))
    cfg = fast_cfg(f"data.path={data}", "data.eval_size=4")
    model, tok = load_policy(cfg, progress=False)
    tok.chat_template = None
    with pytest.raises(ValueError, match=r"conversational prompts .* no chat template"):
        Trainer(cfg, model=model, tokenizer=tok).collect()


def test_a_prompt_only_file_trains_with_a_user_reward(fast_cfg, tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def length(completion, example):\n    return float(len(completion) % 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = _jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"{i}+1="} for i in range(20)])
    with pytest.raises(ValueError, match="no 'answer' column, which the 'correct' reward needs"):
        Trainer(fast_cfg(f"data.path={data}")).train()
    cfg = fast_cfg(
        f"data.path={data}", "reward.funcs=[{name: 'my_rewards:length'}]", "train.steps=1",
        f"run.dir={tmp_path / 'run2'}",
    )  # fmt: skip
    assert Trainer(cfg).train()["steps"] == 1


def test_a_small_file_holds_out_a_tenth_and_says_so(fast_cfg, tmp_path, capsys):
    data = _jsonl(tmp_path / "small.jsonl", _chat_rows(10))
    cfg = fast_cfg(f"data.path={data}", "data.eval_size=256")
    model, tok = load_policy(cfg, progress=False)
    tok.chat_template = TEMPLATE
    t = Trainer(cfg, model=model, tokenizer=tok)
    assert len(t.prompts.examples) == 9 and len(t.prompts.eval_examples) == 1
    assert "10 rows <= data.eval_size=256; holding out 1" in capsys.readouterr().err


def test_a_datasets_dataset_from_python(fast_cfg):
    import datasets

    ds = datasets.Dataset.from_list(
        [{"prompt": f"{i}+2=", "answer": str(i + 2)} for i in range(30)]
    )
    t = Trainer(fast_cfg("data.eval_size=5", "train.steps=1"), train_dataset=ds)
    assert len(t.prompts.examples) == 25 and t.prompts.eval_examples[-1].prompt == "29+2="
    t.train()


SCRIPT = """
from rlpost.llm.config import load_config
from rlpost.llm.trainer import Trainer


def reward(completion, example):
    return float(len(completion) % 2)


{guard}cfg = load_config(None, {overrides!r})
{guard}Trainer(cfg, reward_fn=reward).train()
{guard}print("TRAINED")
"""


@pytest.mark.parametrize(
    # the guarded script running to the end is in the slow tier (uv run pytest -m slow)
    "guarded",
    [False, pytest.param(True, marks=pytest.mark.slow)],
)
def test_a_script_without_a_main_guard_fails_fast_naming_the_fix(tmp_path, guarded):
    import subprocess
    import sys

    from .conftest import FAST

    overrides = [*FAST, "reward.workers=1", "train.steps=1", f"run.dir={tmp_path / 'run'}"]
    guard = "    " if guarded else ""
    text = SCRIPT.format(guard=guard, overrides=overrides)
    if guarded:
        text = text.replace("\n    cfg", '\nif __name__ == "__main__":\n    cfg', 1)
    (tmp_path / "train.py").write_text(text)
    out = subprocess.run(  # (the timeout only guards against a hang)
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    if guarded:
        assert out.returncode == 0 and "TRAINED" in out.stdout, out.stderr[-2000:]
    else:  # "fast": before any step, measured by what ran rather than by the clock
        assert out.returncode != 0 and "TRAINED" not in out.stdout
        assert 'under  if __name__ == "__main__":' in out.stderr.splitlines()[-1]
        metrics = tmp_path / "run" / "metrics.jsonl"
        assert not metrics.exists() or not metrics.read_text().strip()


TRL_REWARDS = '''
def odd_length(prompts, completions, **kwargs):
    """TRL's convention: batches, the data set's other columns as keyword arguments."""
    assert set(kwargs) >= {"answer", "level"}, kwargs
    return [float(len(c[0]["content"]) % 2) for c in completions]


def level_bonus(prompts, completions, level, **kwargs):
    return [None if lv == 0 else 0.5 for lv in level]  # None: does not apply
'''


def test_trl_style_reward_files_from_the_config_each_logged(fast_cfg, tmp_path):
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    rows = [{**r, "level": i % 2} for i, r in enumerate(_chat_rows(24))]
    data = _jsonl(tmp_path / "chat.jsonl", rows)
    f = tmp_path / "trl_rewards.py"
    cfg = fast_cfg(
        f"data.path={data}", "data.eval_size=4", "train.steps=1", "reward.workers=1",
        f"reward.funcs=['{f}:odd_length', '{f}:level_bonus']", "reward.weights=[1.0, 2.0]",
    )  # fmt: skip
    model, tok = load_policy(cfg, progress=False)
    tok.chat_template = TEMPLATE
    t = Trainer(cfg, model=model, tokenizer=tok)
    try:
        col = t.collect()
    finally:
        t.close()
    m = col.metrics
    pool = t.scorer.pool
    assert m["reward/errors"] == 0, pool.last_failures if pool else None
    names = [n for n in t.scorer.names]
    assert [n.rsplit(":", 1)[1] for n in names] == ["odd_length", "level_bonus"]
    bonus = col.components[:, 1]
    levels = torch.tensor([e.meta["level"] for e in col.examples])
    assert torch.equal(bonus, torch.where(levels == 0, 0.0, 0.5))  # None scored 0
    assert torch.allclose(col.rewards, col.components[:, 0] + 2.0 * bonus)
    assert f"reward/{names[0]}/mean" in m and f"reward/{names[1]}/mean" in m


def test_reward_weights_must_match_the_functions(fast_cfg):
    from rlpost.llm.config import ConfigError

    with pytest.raises(ConfigError, match=r"reward.weights: 3 weights for 2 reward.funcs"):
        fast_cfg("reward.funcs=[correct, format]", "reward.weights=[1.0, 2.0, 3.0]")
    with pytest.raises(ValueError, match=r"reward.weights: 2 weights for 1 reward.funcs"):
        Trainer(fast_cfg("reward.weights=[1.0, 2.0]"))  # (no reward_funcs to weight)


def test_report_to_wandb_writes_offline_files(fast_cfg, monkeypatch):
    from pathlib import Path

    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = fast_cfg("run.report_to=[jsonl, wandb]", "train.steps=1")
    Trainer(cfg).train()
    run = Path(cfg.run.dir)
    run_id = (run / "wandb-run-id").read_text()
    assert list((run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))


def test_reward_funcs_given_from_python_are_named_weighted_and_scored(fast_cfg):
    def lengthy(prompts, completions, **kwargs):
        return [float(len(c)) for c in completions]

    cfg = fast_cfg("reward.weights=[1.0, 0.5]", "data.eval_size=4")
    t = Trainer(cfg, reward_funcs=[lengthy, lengthy])  # workers=0: a local function is fine
    assert t.scorer.names == ["lengthy", "lengthy_2"]
    col = t.collect()
    assert torch.allclose(col.rewards, 1.5 * col.components[:, 0])
    with pytest.raises(ValueError, match=r"reward.weights: 2 weights for 1 reward_funcs"):
        Trainer(cfg, reward_funcs=[lengthy], overwrite=True)
