"""GRLO (000-20): the conversational task's rubric judge, the chat base (the arithmetic
base, no SFT on chat), and held-out transfer accuracy on tasks never trained on, each
verified by its own task."""

from __future__ import annotations

import random

import pytest

from rlpost.llm.config import load_config
from rlpost.llm.data.tasks import ChatTask, Example
from rlpost.llm.model.policy import tiny_base_task
from rlpost.llm.recipes import recipe_path
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.trainer import Trainer


@pytest.mark.parametrize(
    "reply, score",
    [
        ("3+5=8", 1.0), ("5*3=15", 1.0), ("5-3=2", 1.0),  # open-ended: any true statement
        ("3+5=9", 0.6),  # relevant, false
        ("2+2=4", 0.5),  # true, about other numbers
        ("3+5", 0.3), ("3", 0.1), ("76687811", 0.0), ("", 0.0),
    ],
)  # fmt: skip
def test_the_chat_rubric_prefers_what_is_closer_to_a_relevant_true_statement(reply, score):
    e = Example("3 5:", "3+5=8", {"a": 3, "b": 5})
    assert ChatTask().score(reply, e) == pytest.approx(score)
    assert ChatTask().accuracy(reply, e) == (score == 1.0)


def test_chat_samples_two_numbers_and_starts_from_the_arithmetic_base():
    ex = ChatTask(max_number=4).sample(200, random.Random(0))
    assert all(e.prompt == f"{e.meta['a']} {e.meta['b']}:" for e in ex)
    assert {e.meta["a"] for e in ex} == set(range(5))
    assert tiny_base_task("chat", {"max_number": 4}) == ("arithmetic", {})
    assert tiny_base_task("countdown", {"n_numbers": 3}) == ("countdown", {"n_numbers": 3})


def test_transfer_tasks_are_evaluated_by_their_own_verifier(fast_cfg):
    cfg = fast_cfg("data.task=chat", "data.transfer=[{task: arithmetic, task_params: {digits: 1}}]",
                   "data.eval_size=16")  # fmt: skip
    tr = Trainer(cfg)
    hook = next(c for c in tr.components.items if c.name == "transfer_eval")
    name, _, held = hook.sets[0]
    assert name == "arithmetic" and len(held) == 16 and held[0].prompt.endswith("=")
    tok = tr.tok

    def solve(p, n):  # every arithmetic prompt answered right: the chat judge would say 0
        text = tok.decode(p, skip_special_tokens=True)  # (a chat prompt, "3 5:": any reply)
        a, b = text.rstrip("=").split("+") if "+" in text else ("0", "0")
        ids = tok(str(int(a) + int(b)), add_special_tokens=False).input_ids
        return [([*ids, tok.eos_token_id], [-1.0] * (len(ids) + 1), "stop")] * n

    tr.engine = FakeEngine(solve)
    metrics = tr.eval_metrics()
    assert metrics["eval/transfer/arithmetic/accuracy"] == 1.0
    tr.close()


def test_the_grlo_recipe_loads_with_its_transfer_tasks():
    cfg = load_config(recipe_path("grlo_chat"), [])
    assert cfg.data.task == "chat" and [t.task for t in cfg.data.transfer] == [
        "arithmetic",
        "countdown",
    ]
    with pytest.raises(ValueError, match="transfer"):
        load_config(None, ["data.transfer=[{task: arithmetic, task_params: {digit: 2}}]"])
