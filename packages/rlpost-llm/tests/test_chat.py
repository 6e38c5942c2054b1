"""Chat-format episodes: the append-only check, tool calls, token-in / token-out."""

from __future__ import annotations

import json
import warnings

from rlpost.llm.data.envs import make_env
from rlpost.llm.rollout.agents import env_rollout
from rlpost.llm.rollout.chat import ChatFormat, append_only_violations, parse_tool_call, render
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.rollout.engines.fake import ActionScriptEngine

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen3-style: earlier assistant turns lose their reasoning (not append-only)
STRIPS_THINKING = (
    "{% for m in messages %}{% set c = m['content'] %}"
    "{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}"
    "{% endif %}{{ '<|im_start|>' + m['role'] + '\n' + c + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_tokenizer(template: str):
    """Every byte one token, plus ChatML's specials; ``<|im_end|>`` ends a turn."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlpost.llm.model.tiny import _bytes_to_unicode

    pieces = list(_bytes_to_unicode().values())
    specials = ["<pad>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate([*specials, *pieces])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )  # fmt: skip
    tok.chat_template = template
    return tok


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_the_append_only_check():
    assert append_only_violations(byte_tokenizer(CHATML)) == []
    bad = append_only_violations(byte_tokenizer(STRIPS_THINKING))
    assert bad and "re-renders the conversation" in bad[0] and "<think>" in bad[0]


def test_tool_calls_in_the_hermes_format():
    assert parse_tool_call("ok " + call("search", query="17*")) == ("search", {"query": "17*"})
    s = '<tool_call>{"name": "answer", "arguments": "{\\"answer\\": \\"42\\"}"}</tool_call>'
    assert parse_tool_call(s) == ("answer", {"answer": "42"})  # arguments as a JSON string
    for bad in ("search 17", "<tool_call>{nope}</tool_call>", '<tool_call>{"x": 1}</tool_call>'):
        assert parse_tool_call(bad) is None


def test_chat_episodes_are_token_in_token_out_with_tool_calls():
    tok = byte_tokenizer(CHATML)
    env = make_env("search", min_hops=1, max_hops=1)
    env.reset(6)
    script = [call("search", query=f"{env.start}{env.rels[0]}"), "hmm",
              call("answer", answer=str(env.chain[-1]))]  # fmt: skip
    make = lambda: make_env("search", min_hops=1, max_hops=1)  # noqa: E731
    eng = ActionScriptEngine(tok, [script])
    ro = env_rollout(eng, tok, make, [6], 1, SamplingParams(64, 1.0), 4,
                     chat=lambda: ChatFormat(tok, "be brief", env.tools))  # fmt: skip
    assert ro.solved.tolist() == [True]  # the tool calls reached the environment as actions
    assert ro.actions[0] == [f":{env.start}{env.rels[0]}", "hmm", f"={env.chain[-1]}"]
    b = ro.batch
    ids = b.prompt_ids[0] + b.completion_ids[0, : b.lengths[0]].tolist()
    # the whole sequence is the template's rendering of the conversation, and the actions
    # are their sampled ids
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}]
    first = env.reset(6)
    messages[1]["content"] = first
    env.step(env.tool_action("search", {"query": f"{env.start}{env.rels[0]}"}))
    obs1 = " ".join(env.retriever.search(f"{env.start}{env.rels[0]}", env.k)) + ">"
    messages += [
        {"role": "assistant", "content": script[0]}, {"role": "tool", "content": obs1},
        {"role": "assistant", "content": script[1]}, {"role": "user", "content": "()>"},
    ]  # fmt: skip
    want = render(tok, messages, env.tools, True) + script[2] + "<|im_end|>"
    assert tok.decode(ids) == want
    m, tid = b.mask[0, : b.lengths[0]], ro.turn_ids[0, : b.lengths[0]]
    for u, text in enumerate(script):
        sampled = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        got = b.completion_ids[0, : b.lengths[0]][tid == u].tolist()
        assert got == sampled and (m[tid == u] == 1).all()
    assert (m[tid == -1] == 0).all() and (tid == -1).sum() > 0  # template + observations


def test_a_template_that_rewrites_history_warns_once():
    tok = byte_tokenizer(STRIPS_THINKING)
    env = make_env("search")
    env.reset(1)
    eng = ActionScriptEngine(tok, [["<think>a</think>x", "<think>b</think>y", "z"]])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        env_rollout(eng, tok, lambda: make_env("search"), [1], 1, SamplingParams(32, 1.0), 3,
                    chat=lambda: ChatFormat(tok))  # fmt: skip
    assert sum("not append-only" in str(w.message) for w in seen) == 1


def test_chat_without_a_template_is_a_one_line_error(fast_overrides, tmp_path, capsys):
    from rlpost.apps.llm.cli import main as cli

    over = [*fast_overrides, "data.env={name: search, chat: true}", f"run.dir={tmp_path}"]
    assert cli(["train", "--config", "grpo_arithmetic", *over]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no chat template" in err[0] and "Traceback" not in err[0]
