"""Multi-turn episodes in a chat model's own format (issue 20): observations as user / tool
messages, actions as assistant turns, tool calls as the model writes them, token-in /
token-out throughout.

A chat template renders a whole conversation. The multi-turn bug class is re-rendering it
each turn and re-tokenising the text: earlier turns then come out as other ids than the
ones sampled (or, with templates that rewrite history, other *text*). Here the sampled
ids are kept, and only the text the template adds *after* them is encoded:

* the prompt is the template's rendering of the first observation with the generation
  prompt;
* after an action (its sampled ids, ended by the end-of-turn token), the observation's
  ids are the template's rendering of the conversation with that observation appended,
  minus the rendering of everything up to and including the action;
* that difference exists only when the template is *append-only* (each rendering starts
  with the previous one). :func:`append_only_violations` checks a template once, on a
  probe conversation; a template that rewrites earlier turns (e.g. one that strips
  reasoning from past assistant messages) is reported, and :class:`ChatFormat` warns and
  continues from the longest common prefix.

Tool calls use the Hermes / Qwen convention, ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` (:func:`parse_tool_call`); an environment with ``tools`` (OpenAI
function schemas, passed to the template) maps a call to its own action with
``tool_action(name, arguments)``.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)

PROBE = [
    {"role": "user", "content": "find 17"},
    {"role": "assistant", "content": "<think>look it up</think>search 17"},
    {"role": "tool", "content": "17 is 42"},
    {"role": "assistant", "content": "<think>done</think>the answer is 42"},
    {"role": "user", "content": "thanks"},
]


def render(tokenizer, messages: list[dict], tools=None, generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
    )


def append_only_violations(tokenizer, tools=None, probe: list[dict] | None = None) -> list[str]:
    """Where the template is not append-only on ``probe`` (default :data:`PROBE`, whose
    assistant turns carry reasoning): for each prefix of the conversation, the rendering of
    the prefix (with the generation prompt before an assistant turn) must start the
    rendering of the longer conversation. Returns one line per violation (empty: fine)."""
    msgs = probe or PROBE
    out = []
    for k in range(1, len(msgs)):
        before = render(tokenizer, msgs[:k], tools, msgs[k]["role"] == "assistant")
        after = render(tokenizer, msgs[: k + 1], tools)
        if not after.startswith(before):
            at = _common_prefix(before, after)
            out.append(
                f"after message {k} ({msgs[k - 1]['role']}), adding a {msgs[k]['role']} "
                f"message re-renders the conversation from character {at}: "
                f"{before[at : at + 40]!r} became {after[at : at + 40]!r}"
            )
    return out


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """The first ``<tool_call>{"name", "arguments"}</tool_call>`` of ``text``, or None."""
    m = _TOOL_CALL.search(text)
    if m is None:
        return None
    try:
        call = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return (call["name"], args) if isinstance(args, dict) else None


class ChatFormat:
    """One episode's conversation in the tokenizer's chat template (see the module
    docstring). ``system``: an optional system message; ``tools``: the environment's tool
    schemas; ``role``: the role observations after the first take (``tool`` where the
    action was a tool call, else ``user``)."""

    def __init__(self, tokenizer, system: str | None = None, tools=None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "data.env.chat: the tokenizer has no chat template (use a chat model, or "
                "leave chat off for plain-text episodes)"
            )
        self.tok, self.tools = tokenizer, tools
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.text = ""  # everything rendered or sampled so far, as text
        self.warned = False

    def prompt_ids(self, observation: str) -> list[int]:
        self.messages.append({"role": "user", "content": observation})
        self.text = render(self.tok, self.messages, self.tools, True)
        return list(self.tok(self.text, add_special_tokens=False).input_ids)

    def observation_ids(self, action_ids: list[int], observation: str, tool: bool) -> list[int]:
        """The ids the template puts after the sampled action ``action_ids`` (its EOS
        included) and before the next generation: the rest of the assistant turn, the
        observation as a ``tool`` (or ``user``) message, the generation prompt."""
        said = self.tok.decode(action_ids, skip_special_tokens=False)
        content = self.tok.decode(action_ids, skip_special_tokens=True)
        self.text += said
        self.messages.append({"role": "assistant", "content": content})
        self.messages.append({"role": "tool" if tool else "user", "content": observation})
        full = render(self.tok, self.messages, self.tools, True)
        start = len(self.text)
        if not full.startswith(self.text):
            start = _common_prefix(self.text, full)
            if not self.warned:
                warnings.warn(
                    "the chat template is not append-only (it re-renders earlier turns): "
                    "observation tokens are taken from where the renderings first differ; "
                    "see rlpost.llm.rollout.chat.append_only_violations",
                    stacklevel=2,
                )
                self.warned = True
        delta = full[start:]
        self.text = full if start == len(self.text) else self.text + delta
        return list(self.tok(delta, add_special_tokens=False).input_ids)


__all__ = ["PROBE", "ChatFormat", "append_only_violations", "parse_tool_call", "render"]
