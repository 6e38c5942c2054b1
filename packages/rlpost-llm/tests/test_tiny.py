"""The embedded tiny default: tokenizer, config, SFT, greedy evaluation, atomic cached builds.

Everything here is CPU-only and fast; the full-size base is never built.
"""

import json
import random

import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM

from rlpost.llm.data.tasks import CHARSET, ArithmeticTask, Example
from rlpost.llm.model import tiny

TINY_BUILD = {
    "task_name": "arithmetic",
    "digits": 1,
    "size": "micro",
    "max_steps": 12,
    "round_steps": 6,
    "heldout": 16,
    "batch_size": 8,
    "progress": False,
}


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _micro_model(tok, seed=0):
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny.tiny_config(tok, "micro"))


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_is_character_level_and_round_trips(tok):
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token, tok.eos_token, tok.unk_token) == ("<pad>", "<eos>", "<unk>")
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert len(tok) == len(CHARSET) + 3
    for text in ["12+3= 4", CHARSET, " 3 5 7>22: (3*5)+7 ", "", "  "]:
        ids = tok.encode(text)
        assert len(ids) == len(text)  # one token per character, no BOS/EOS added
        assert tok.decode(ids) == text
    assert tok.convert_ids_to_tokens(tok.encode("9")) == ["9"]
    assert tok.decode([*tok.encode("42"), tok.eos_token_id, 0], skip_special_tokens=True) == "42"


def test_tokenizer_reloads_identically_next_to_a_qwen2_config(tok, tmp_path):
    # AutoTokenizer picks the tokenizer class from config.json's model_type; the
    # reloaded tokenizer must still match the fresh one id for id.
    tok.save_pretrained(tmp_path)
    tiny.tiny_config(tok).save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert (again.pad_token_id, again.eos_token_id) == (0, 1)
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice(CHARSET) for _ in range(rng.randint(0, 24)))
        assert again.encode(text) == tok.encode(text)
        assert again.decode(again.encode(text)) == text


# ----------------------------------------------------------------------------- config


def test_tiny_config_default_size(tok):
    config = tiny.tiny_config(tok)
    assert config.model_type == "qwen2"
    assert config.vocab_size == len(tok)
    assert (config.pad_token_id, config.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert config.tie_word_embeddings and config.max_position_embeddings == 64
    n = tiny._count_parameters(Qwen2ForCausalLM(config))
    assert 0.8e6 <= n <= 3e6
    with pytest.raises(ValueError, match="unknown size"):
        tiny.tiny_config(tok, "huge")


# ----------------------------------------------------------------------------- SFT


def test_sft_batch_masks_the_prompt(tok):
    batch = tiny._sft_batch(tok, [Example("1+2=", "3", {}), Example("10+20=", "30", {})])
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 9)
    assert tok.decode(batch["input_ids"][1]) == "10+20=30<eos>"
    assert batch["labels"][0].tolist() == [-100] * 4 + [tok.encode("3")[0], 1] + [-100] * 3
    assert batch["attention_mask"][0].tolist() == [1] * 6 + [0] * 3
    assert (batch["labels"][1, :6] == -100).all()
    assert tok.decode(batch["labels"][1, 6:]) == "30<eos>"


def test_sft_train_reduces_loss(tok):
    model = _micro_model(tok)
    losses = tiny.sft_train(
        model,
        tok,
        ArithmeticTask(digits=1),
        steps=30,
        batch_size=16,
        lr=3e-3,
        rng_seed=0,
        progress=False,
    )
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert not model.training


# ----------------------------------------------------------------------------- greedy accuracy


class _OracleLM(torch.nn.Module):
    """Stands in for a causal LM: 'generates' the known answer of each prompt.

    ``wrong`` prompts get a wrong answer; every call checks the batch is left-padded.
    """

    def __init__(self, tok, answers: dict[str, str], wrong=()):
        super().__init__()
        self.tok, self.answers, self.wrong = tok, answers, set(wrong)
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.calls = []

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, eos_token_id, **kw):
        assert kw.get("do_sample") is False
        assert (attention_mask[:, -1] == 1).all()  # left padding: prompts end at the right edge
        assert ((input_ids == pad_token_id) == (attention_mask == 0)).all()
        self.calls.append(input_ids.shape[0])
        rows = []
        for ids, mask in zip(input_ids, attention_mask, strict=True):
            prompt = self.tok.decode(ids[mask.bool()])
            answer = self.answers[prompt] + ("1" if prompt in self.wrong else "")
            new = [*self.tok.encode(answer), eos_token_id][:max_new_tokens]
            rows.append(ids.tolist() + new + [pad_token_id] * (max_new_tokens - len(new)))
        return torch.tensor(rows)


def test_greedy_accuracy_scores_perfect_and_partly_wrong_generations(tok):
    task = ArithmeticTask(digits=3)
    examples = task.sample(10, random.Random(0))
    answers = {e.prompt: e.answer for e in examples}
    tok.padding_side = "right"
    assert tiny.greedy_accuracy(_OracleLM(tok, answers), tok, task, examples) == 1.0
    assert tok.padding_side == "right"  # restored
    model = _OracleLM(tok, answers, wrong=[e.prompt for e in examples[:4]])
    assert tiny.greedy_accuracy(model, tok, task, examples, batch_size=3) == pytest.approx(0.6)
    assert model.calls == [3, 3, 3, 1]
    assert tiny.greedy_accuracy(model, tok, task, []) == 0.0


def test_greedy_accuracy_runs_a_real_model(tok):
    model = _micro_model(tok)
    task = ArithmeticTask(digits=1)
    acc = tiny.greedy_accuracy(model, tok, task, task.sample(20, random.Random(0)), batch_size=8)
    assert 0.0 <= acc <= 1.0


# ----------------------------------------------------------------------------- cached builds


def test_base_path_keys_on_params_and_honours_rlpost_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path))
    p = tiny.base_path("arithmetic")
    assert p.parent == tmp_path / "llm" and p.name.startswith("tiny-arithmetic-")
    assert tiny.base_path("arithmetic") == p
    assert tiny.base_path("arithmetic", digits=3) != p
    assert tiny.base_path("arithmetic", train={"max_steps": 10}) != p
    assert tiny.base_path("countdown").name.startswith("tiny-countdown-")
    with pytest.raises(ValueError, match="unknown task"):
        tiny.build_base("sudoku", cache_dir=tmp_path)


def test_build_base_is_atomic_cached_and_loadable(tmp_path, monkeypatch):
    path = tiny.build_base(cache_dir=tmp_path, **TINY_BUILD)
    assert path.parent == tmp_path / "llm" and path.is_dir()
    assert list(path.parent.iterdir()) == [path]  # no temp dirs left behind
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "base_info.json"} <= files
    info = json.loads((path / "base_info.json").read_text())
    assert info["task"] == "arithmetic" and info["params"] == {"digits": 1, "ops": "+"}
    assert info["steps"] in (6, 12) and 0.0 <= info["heldout_accuracy"] <= 1.0
    assert info["train"]["max_steps"] == 12 and info["parameters"] > 0
    assert info["seconds"] > 0 and len(info["history"]) >= 1

    model, tok = tiny.load_base(path)
    assert isinstance(model, Qwen2ForCausalLM) and not model.training
    assert tok.decode(tok.encode("12+3= 4")) == "12+3= 4"

    # A second call finds the finished build and does not train again.
    def boom(*args, **kwargs):
        raise AssertionError("retrained")

    monkeypatch.setattr(tiny._SFTRun, "train", boom)
    assert tiny.build_base(cache_dir=tmp_path, **TINY_BUILD) == path


def test_interrupted_build_leaves_no_cache_entry(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    # Interrupted while writing: the model is already in the temp dir, the tokenizer fails.
    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", fail)
    with pytest.raises(KeyboardInterrupt):
        tiny.build_base(cache_dir=tmp_path, **TINY_BUILD)
    assert list((tmp_path / "llm").iterdir()) == []
    monkeypatch.undo()

    # force=True replaces a finished build with a fresh one.
    path = tiny.build_base(cache_dir=tmp_path, **TINY_BUILD)
    (path / "marker").write_text("old")
    assert tiny.build_base(cache_dir=tmp_path, force=True, **TINY_BUILD) == path
    assert not (path / "marker").exists() and (path / "base_info.json").is_file()
    assert list(path.parent.iterdir()) == [path]


def test_training_batches_avoid_heldout_prompts_unless_impossible(tok):
    task = ArithmeticTask(digits=1)  # only 100 distinct prompts
    some = frozenset(e.prompt for e in task.sample(30, random.Random(1)))
    run = tiny._SFTRun(_micro_model(tok), tok, task, 1, 64, 1e-3, 0, exclude_prompts=some)
    batch = run._examples()
    assert len(batch) == 64 and not {e.prompt for e in batch} & some
    everything = frozenset(f"{a}+{b}=" for a in range(10) for b in range(10))
    run = tiny._SFTRun(_micro_model(tok), tok, task, 1, 64, 1e-3, 0, exclude_prompts=everything)
    assert len(run._examples()) == 64  # does not spin forever
