"""Built-in synthetic tasks with cheap, exact verifiers.

A :class:`Task` draws :class:`Example` s (a text prompt, one reference answer and
whatever the verifier needs in ``meta``) and scores a model's completion against
an example with a pure function returning a reward in ``[0, 1]``.

Two tasks ship with the library:

* :class:`ArithmeticTask` -- ``"123+456="`` -> ``"579"``;
* :class:`CountdownTask` -- ``"3 5 7>22:"`` -> any expression over the given
  numbers that evaluates to the target, e.g. ``"3*5+7"``.

Every character a prompt or reference answer can contain is in :data:`CHARSET`,
which the embedded character-level tokenizer (:mod:`rlpost.llm.model.tiny`) is built
from.  Scoring is picklable (tasks are frozen dataclasses defined at module
level) so rewards can be computed in worker processes.
"""

from __future__ import annotations

import abc
import ast
import logging
import random
import re
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

__all__ = [
    "CHARSET",
    "TASKS",
    "ArithmeticTask",
    "CountdownTask",
    "Example",
    "KnapsackTask",
    "PDETask",
    "Task",
    "extract_answer",
    "format_reward",
    "is_conversational",
    "make_task",
    "math_verify_reward",
    "safe_eval",
]

#: Every character that any prompt or reference answer of the built-in tasks can contain.
CHARSET = "0123456789+-*()=:> "

#: Longest completion (after :func:`extract_answer`) the countdown verifier will parse.
MAX_EXPRESSION_CHARS = 64

#: Strings that mark the end of a completion when they appear literally in decoded text.
_STOP_MARKERS = ("\n", "<eos>", "</s>", "<|endoftext|>", "<|im_end|>")


def is_conversational(prompt: Any) -> bool:
    """A list of ``{"role", "content"}`` messages (TRL's conversational format)."""
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )


@dataclass(frozen=True)
class Example:
    """One task instance.

    Attributes:
        prompt: the text the model is conditioned on (e.g. ``"123+456="``), or a list of
            chat messages (``[{"role": "user", "content": "123+456="}]``) rendered with the
            tokenizer's chat template (:func:`rlpost.llm.data.prompts.encode_prompt`).
        answer: one correct completion (e.g. ``"579"``); for tasks with several
            correct answers it is one of them, and :meth:`Task.score` decides.
        meta: JSON-serialisable data the verifier needs (operands, target ...).
    """

    prompt: str | list[dict[str, Any]]
    answer: str
    meta: dict = field(default_factory=dict)


def extract_answer(completion: str) -> str:
    """The answer part of a raw completion.

    Completions are the generated text after the prompt; generation may run on
    past the answer.  The answer ends at the first newline or literal
    end-of-sequence marker; surrounding whitespace is stripped.
    """
    cut = len(completion)
    for marker in _STOP_MARKERS:
        i = completion.find(marker)
        if i != -1:
            cut = min(cut, i)
    return completion[:cut].strip()


class Task(abc.ABC):
    """A verifiable task: draws examples and scores completions.

    Subclasses set ``name`` and implement :meth:`sample` and :meth:`score`.
    ``score`` must be pure, cheap, and picklable with the task (module-level
    classes only): it may run in worker processes.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """Draw ``n`` independent examples using ``rng`` (deterministic given its state)."""

    @abc.abstractmethod
    def score(self, completion: str, example: Example) -> float:
        """Reward in ``[0, 1]`` for ``completion`` (text after the prompt) on ``example``."""

    def accuracy(self, completion: str, example: Example) -> float:
        """Whether ``completion`` solves ``example``, in ``[0, 1]``: the score, for tasks
        whose score is right / wrong (a score-based task says what solving means)."""
        return self.score(completion, example)

    def feedback(self, completion: str, example: Example) -> str:
        """The environment's diagnosis of a wrong ``completion`` (``""``: nothing to say,
        e.g. a right one): the raw failure feedback RESD and PMD reflect on. Written in the
        task's own characters (:data:`CHARSET`), so the tiny tokenizer can read it."""
        return ""

    def lesson(self, feedback: str) -> str:
        """The reusable part of a diagnosis, with what is specific to the problem removed
        (a playbook entry); default: the diagnosis with its digits masked."""
        return re.sub(r"\d+", "0", feedback)

    def wrong_attempt(self, example: Example, rng: random.Random) -> str | None:
        """A plausible wrong completion of ``example`` that :meth:`feedback` can diagnose
        (``None``: the task has none): what a feedback-aware base is shown in
        pre-training, a failed attempt with its diagnosis before the problem."""
        return None

    def params(self) -> dict[str, Any]:
        """The constructor parameters, JSON-serialisable (used for cache keys and logs)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- arithmetic

_LEADING_INT = re.compile(r"[+-]?\d+")


def _apply(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unsupported operator {op!r}")


@dataclass(frozen=True)
class ArithmeticTask(Task):
    """Integer arithmetic on two operands: prompt ``"123+456="``, answer ``"579"``.

    Args:
        digits: operands are drawn uniformly from ``0 .. 10**digits - 1`` (so they
            have 1 to ``digits`` digits, written without leading zeros).
        ops: the operators to draw from, uniformly, any of ``"+-*"``.  For ``"-"``
            the operands are ordered so the result is non-negative.

    Score: 1.0 iff the integer at the start of the extracted answer equals the
    reference result (trailing junk after that integer is ignored), else 0.0.
    """

    digits: int = 3
    ops: str = "+"
    name: ClassVar[str] = "arithmetic"

    def __post_init__(self) -> None:
        if not isinstance(self.digits, int) or self.digits < 1:
            raise ValueError(f"digits must be a positive int, got {self.digits!r}")
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"ops must be a non-empty string over '+-*', got {self.ops!r}")

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        hi = 10**self.digits - 1
        out = []
        for _ in range(n):
            op = rng.choice(self.ops)
            a, b = rng.randint(0, hi), rng.randint(0, hi)
            if op == "-" and a < b:
                a, b = b, a
            result = _apply(op, a, b)
            out.append(Example(f"{a}{op}{b}=", str(result), {"a": a, "b": b, "op": op}))
        return out

    def score(self, completion: str, example: Example) -> float:
        m = _LEADING_INT.match(extract_answer(completion))
        if m is None:
            return 0.0
        return 1.0 if int(m.group()) == int(example.answer) else 0.0

    def feedback(self, completion: str, example: Example) -> str:
        """``"57+10"``: the answer 57 is short by tens (``-``: over by; the magnitude is the
        place of the error's leading digit, as a carry error is off by 10); ``""`` when
        right or not a number."""
        m = _LEADING_INT.match(extract_answer(completion))
        if m is None:
            return ""
        d = int(example.answer) - int(m.group())
        if d == 0:
            return ""
        return f"{int(m.group())}{'+' if d > 0 else '-'}{10 ** (len(str(abs(d))) - 1)}"

    def lesson(self, feedback: str) -> str:
        """The error's direction and place (``"+10"``), without the attempt."""
        m = re.fullmatch(r"-?\d+([+-]\d+)", feedback)
        return m.group(1) if m else ""

    def wrong_attempt(self, example: Example, rng: random.Random) -> str | None:
        """The answer off by ``d * 10**k`` (``d`` in 1..9, ``k`` below the answer's
        length), kept non-negative: the slips of carries and single digits."""
        ans = int(example.answer)
        while True:
            delta = rng.randint(1, 9) * 10 ** rng.randrange(len(str(ans)))
            wrong = ans + rng.choice((-1, 1)) * delta
            if wrong >= 0:
                return str(wrong)


# ----------------------------------------------------------------------------- countdown

_EXPR_CHARS = re.compile(r"[0-9+\-*() ]+")
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}


def safe_eval(expression: str) -> tuple[int, list[int]] | None:
    """Evaluate an integer expression over ``+ - * ( )`` without ``eval``.

    Returns ``(value, literals)`` -- the value and every integer literal in
    the expression, in order -- or ``None`` when the text is longer than
    :data:`MAX_EXPRESSION_CHARS`, contains any other character, does not parse,
    or uses any syntax but binary ``+ - *``, unary minus and int literals.
    """
    if not expression or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    if not _EXPR_CHARS.fullmatch(expression):
        return None
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError):
        return None
    literals: list[int] = []

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _apply(_BINOPS[type(node.op)], ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and not isinstance(node.value, bool)
        ):
            literals.append(node.value)
            return node.value
        raise ValueError(f"disallowed syntax {type(node).__name__}")

    try:
        value = ev(tree.body)
    except (ValueError, RecursionError):
        return None
    return value, literals


def _render(tree: Any, parent_op: str = "", right: bool = False) -> str:
    """Render a nested ``(op, left, right)`` / int tree with minimal parentheses."""
    if isinstance(tree, int):
        return str(tree)
    op, left, right_child = tree
    text = _render(left, op) + op + _render(right_child, op, right=True)
    # '+'/'-' under '*' need parentheses, and so does a '+'/'-' right operand of '-'.
    needs = op != "*" and (parent_op == "*" or (right and parent_op == "-"))
    return f"({text})" if needs else text


@dataclass(frozen=True)
class CountdownTask(Task):
    """Reach a target by combining given numbers: prompt ``"3 5 7>22:"``, answer ``"3*5+7"``.

    Args:
        n_numbers: how many numbers are given (>= 2).
        max_number: numbers are drawn uniformly from ``1 .. max_number``.

    The target is built from a random expression (random operand order, random
    binary tree, random ``+ - *``) that uses every number exactly once and has a
    positive value; that expression is the reference answer.

    Score: 1.0 iff the extracted answer is an expression over ``+ - * ( )`` and
    integer literals, at most :data:`MAX_EXPRESSION_CHARS` characters, whose
    literals form a sub-multiset of the given numbers (each used at most once,
    no other numbers) and whose value is exactly the target; else 0.0.
    It is evaluated with :func:`safe_eval` (``ast``, never ``eval``).
    """

    n_numbers: int = 3
    max_number: int = 9
    name: ClassVar[str] = "countdown"

    def __post_init__(self) -> None:
        if not isinstance(self.n_numbers, int) or not 2 <= self.n_numbers <= 6:
            raise ValueError(f"n_numbers must be an int in 2..6, got {self.n_numbers!r}")
        if not isinstance(self.max_number, int) or self.max_number < 1:
            raise ValueError(f"max_number must be a positive int, got {self.max_number!r}")

    def _random_tree(self, numbers: list[int], rng: random.Random) -> Any:
        if len(numbers) == 1:
            return numbers[0]
        k = rng.randint(1, len(numbers) - 1)
        return (
            rng.choice("+-*"),
            self._random_tree(numbers[:k], rng),
            self._random_tree(numbers[k:], rng),
        )

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        out = []
        while len(out) < n:
            numbers = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            order = numbers[:]
            rng.shuffle(order)
            expression = _render(self._random_tree(order, rng))
            result = safe_eval(expression)
            if result is None or result[0] <= 0:
                continue  # resample: the target must be a positive int
            target = result[0]
            prompt = " ".join(map(str, numbers)) + f">{target}:"
            out.append(Example(prompt, expression, {"numbers": numbers, "target": target}))
        return out

    def score(self, completion: str, example: Example) -> float:
        result = safe_eval(extract_answer(completion))
        if result is None:
            return 0.0
        value, literals = result
        if Counter(literals) - Counter(example.meta["numbers"]):
            return 0.0  # a number used more often than given, or a foreign number
        return 1.0 if value == example.meta["target"] else 0.0

    def feedback(self, completion: str, example: Example) -> str:
        """``"7=12+"``: the expression evaluates to 7 and must grow to reach 12 (``-``:
        shrink); ``"()"`` when it does not parse or uses numbers not given; ``""`` when
        right."""
        result = safe_eval(extract_answer(completion))
        if result is None or Counter(result[1]) - Counter(example.meta["numbers"]):
            return "()"
        value, target = result[0], example.meta["target"]
        if value == target:
            return ""
        return f"{value}={target}{'+' if target > value else '-'}"

    def lesson(self, feedback: str) -> str:
        """The kind of miss: ``"()"`` (not a valid use of the numbers), ``"+"`` / ``"-"``."""
        return feedback if feedback == "()" else feedback[-1:]

    def wrong_attempt(self, example: Example, rng: random.Random) -> str | None:
        """Another expression over the given numbers that misses the target (``None``
        when 20 draws all hit it)."""
        numbers = list(example.meta["numbers"])
        for _ in range(20):
            rng.shuffle(numbers)
            expression = _render(self._random_tree(numbers, rng))
            result = safe_eval(expression)
            if result is not None and result[0] != example.meta["target"]:
                return expression
        return None


# ----------------------------------------------------------------------------- knapsack


@dataclass(frozen=True)
class KnapsackTask(Task):
    """A score-based optimisation task without ground truth (RiVER's setting, catalog
    004-29): pick items under a weight capacity; the reward is the picked value, a raw
    continuous score, never a match with a reference.

    Prompt ``"3*40 5*60 2*10 4*30(7)>"``: items ``weight*value`` (numbered from 0 in
    order) and the capacity in parentheses. A completion lists item numbers, e.g.
    ``"02"``: items 0 and 2. Its score is their total value when their total weight fits
    (each item at most once), else 0. Each instance's values are multiplied by its own
    ``scale`` (1, 10 or 100), so raw scores differ in range across instances: the *scale
    dominance* RiVER's instance-wise ranking removes. ``example.answer`` is the best
    subset (brute force), for logging only: the score never reads it.
    """

    name: ClassVar[str] = "knapsack"
    items: int = 4
    scales: tuple[int, ...] = (1, 10, 100)

    def __post_init__(self) -> None:
        if not 2 <= self.items <= 8:
            raise ValueError(f"knapsack: items must be in 2..8, got {self.items}")

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        out = []
        for _ in range(n):
            scale = rng.choice(self.scales)
            ws = [rng.randint(1, 5) for _ in range(self.items)]
            vs = [rng.randint(1, 9) * scale for _ in range(self.items)]
            cap = rng.randint(max(ws), sum(ws) - 1) if sum(ws) > max(ws) else max(ws)
            best = max(
                (c for c in range(1 << self.items) if _weight(c, ws) <= cap),
                key=lambda c: _value(c, vs),
            )
            prompt = " ".join(f"{w}*{v}" for w, v in zip(ws, vs, strict=True)) + f"({cap})>"
            answer = "".join(str(i) for i in range(self.items) if best >> i & 1)
            out.append(Example(prompt, answer, {"w": ws, "v": vs, "cap": cap, "scale": scale}))
        return out

    def score(self, completion: str, example: Example) -> float:
        picked = extract_answer(completion)
        m = example.meta
        if not picked.isdigit() or len(set(picked)) != len(picked):
            return 0.0
        idx = [int(c) for c in picked]
        if any(i >= len(m["w"]) for i in idx) or sum(m["w"][i] for i in idx) > m["cap"]:
            return 0.0
        return float(sum(m["v"][i] for i in idx))

    def accuracy(self, completion: str, example: Example) -> float:
        """1 when the pick is optimal (the brute-force best value), else 0."""
        m = example.meta
        best = max(
            _value(c, m["v"]) for c in range(1 << len(m["w"])) if _weight(c, m["w"]) <= m["cap"]
        )
        return float(self.score(completion, example) == best)


def _weight(mask: int, ws: list[int]) -> int:
    return sum(w for i, w in enumerate(ws) if mask >> i & 1)


def _value(mask: int, vs: list[int]) -> int:
    return sum(v for i, v in enumerate(vs) if mask >> i & 1)


# ----------------------------------------------------------------------------- pde


@dataclass(frozen=True)
class PDETask(Task):
    """RLVP's multi-PDE solver generation (catalog 004-07; :mod:`rlpost.llm.data.pde`): a prompt
    asks for a Python ``solve()``, scored by the hybrid physics verifier (sandboxed
    validity, accuracy, residual). ``families``: those drawn; ``w_acc``: the accuracy's
    weight against the residual's. Prompts are English, for a code model (the tiny
    character model cannot write Python)."""

    name: ClassVar[str] = "pde"
    families: tuple[str, ...] = ("elliptic", "parabolic", "hyperbolic")
    w_acc: float = 0.5

    def __post_init__(self) -> None:
        from rlpost.llm.data.pde import FAMILIES

        bad = [f for f in self.families if f not in FAMILIES]
        if not self.families or bad:
            raise ValueError(f"pde: families must be among {', '.join(FAMILIES)}, got {bad}")
        from rlpost.llm.data.sandbox import SandboxError, check_sandbox

        try:
            check_sandbox()  # at the start, once: not at the first reward, hours in
        except SandboxError as exc:
            raise ValueError(f"pde: the code sandbox cannot run here: {exc}") from None

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        from rlpost.llm.data.pde import describe, problem

        out = []
        for _ in range(n):
            p = problem(rng.choice(self.families), rng)
            out.append(Example(describe(p) + "\n", "", {"pde": p}))
        return out

    def score(self, completion: str, example: Example) -> float:
        from rlpost.llm.data.pde import extract_code, verify

        return verify(extract_code(completion), example.meta["pde"], self.w_acc).reward


# ----------------------------------------------------------------------------- chat

_STATEMENT = re.compile(r"(\d+)([+\-*])(\d+)=(-?\d+)")


@dataclass(frozen=True)
class ChatTask(Task):
    """Open-ended number talk, judged by a rubric (GRLO's conversational setting, 000-20).

    The user says two numbers, ``"3 5:"``, and the assistant answers with a statement
    about them; no single answer is right: ``"3+5=8"``, ``"5*3=15"`` and ``"5-3=2"`` are
    all as good. The judge scores any reply on graded rubric items, so that a reply that is
    partly there is preferred to one that is not (a judge's preference, not a verifier's
    verdict):

    * **attentive**: 0.1 for each of the user's two numbers the reply mentions;
    * **a statement**: 0.1 for an operator and 0.1 for an ``=``; 0.1 more when the whole
      reply is one statement ``x op y = z``;
    * **relevant**: 0.1 when that statement is about the user's two numbers (either order);
    * **true**: 0.4 when ``x op y`` equals ``z`` (0.2 for a true statement about other
      numbers).

    A relevant true statement scores 1; accuracy (a satisfying reply) is a score of 1.

    ``base_task``: the tiny default model for this task is the ``arithmetic`` base: the
    conversation is learned by RL from that pre-trained base, never by supervised
    fine-tuning on chat.

    Args:
        max_number: the user's numbers are drawn from ``0 .. max_number``.
    """

    max_number: int = 9
    name: ClassVar[str] = "chat"
    base_task: ClassVar[str] = "arithmetic"

    def __post_init__(self) -> None:
        if not isinstance(self.max_number, int) or self.max_number < 1:
            raise ValueError(f"max_number must be a positive int, got {self.max_number!r}")

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        out = []
        for _ in range(n):
            a, b = rng.randint(0, self.max_number), rng.randint(0, self.max_number)
            out.append(Example(f"{a} {b}:", f"{a}+{b}={a + b}", {"a": a, "b": b}))
        return out

    def score(self, completion: str, example: Example) -> float:
        reply = extract_answer(completion)
        said = re.findall(r"\d+", reply)
        user = (example.meta["a"], example.meta["b"])
        mentioned = [str(user[0]) in said, str(user[1]) in said and (
            user[0] != user[1] or said.count(str(user[1])) > 1)]  # fmt: skip
        score = 0.1 * sum(mentioned) + 0.1 * bool(re.search(r"[+\-*]", reply))
        score += 0.1 * ("=" in reply)
        m = _STATEMENT.fullmatch(reply)
        if m is None:
            return round(score, 6)
        x, op, y, z = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        relevant = sorted((x, y)) == sorted(user)
        true = _apply(op, x, y) == z
        return round(score + 0.1 + 0.1 * relevant + (0.4 if relevant else 0.2) * true, 6)

    def accuracy(self, completion: str, example: Example) -> float:
        return 1.0 if self.score(completion, example) >= 1.0 - 1e-9 else 0.0


# ----------------------------------------------------------------------------- registry

#: Built-in task classes by name.
TASKS: dict[str, type[Task]] = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "knapsack": KnapsackTask,
    "pde": PDETask,
    "chat": ChatTask,
}


def make_task(name: str, **params: Any) -> Task:
    """Instantiate the built-in task ``name`` with constructor ``params``.

    Raises:
        ValueError: ``name`` is not in :data:`TASKS` (the message lists valid names).
    """
    check_task_params(name, params)
    try:
        return TASKS[name](**params)
    except (TypeError, ValueError) as exc:
        hint = ""
        if any(isinstance(v, list) and None in v for v in params.values()):
            hint = " (a bare '-' on the command line is YAML for a list holding null: quote it)"
        raise ValueError(f"data.task_params: task {name!r}: {exc}{hint}") from None


def check_task_params(name: str, params: dict[str, Any], where: str = "task_params") -> None:
    """Refuse an unknown task or a parameter its constructor does not take, in one line
    naming it (what a config validates at load: ``where`` is its key)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    known = sorted(f.name for f in fields(TASKS[name]) if f.init)
    bad = sorted(set(params) - set(known))
    if bad:
        raise ValueError(
            f"{where}: task {name!r} has no parameter {', '.join(map(repr, bad))} "
            f"(its parameters: {', '.join(known) or 'none'})"
        )


# ----------------------------------------------------------------------------- format

_WELL_FORMED = re.compile(r"[0-9+\-*() ]+")


def format_reward(completion: str, example: Example) -> float:
    """1.0 iff the answer part of ``completion`` (:func:`extract_answer`) is non-empty,
    uses only answer characters (digits, ``+ - * ( )`` and spaces) and is no longer than
    twice the reference answer, else 0.0: a well-formed, concise answer, right or wrong
    (``reward.funcs`` name ``format``; a second reward component for vector-reward
    estimators)."""
    ans = extract_answer(completion)
    ok = bool(ans) and _WELL_FORMED.fullmatch(ans) is not None
    return 1.0 if ok and len(ans) <= 2 * max(1, len(example.answer)) else 0.0


# -------------------------------------------------------------- files: math-verify


def math_verify_reward(completion: str, example: Example) -> float:
    """1.0 iff ``math_verify.verify(parse(example.answer), parse(completion))`` holds, else 0.0.

    math-verify's own ``signal.alarm`` time limits are disabled (they only work in
    a process's main thread and would raise in threaded callers); run this in a
    :class:`RewardPool` with ``workers > 0``, which enforces the time limit by
    killing the worker.  Unparseable completions score 0 (they are wrong
    answers, not errors).
    """
    from math_verify import parse, verify

    gold = parse(example.answer, parsing_timeout=None)  # type: ignore[arg-type]
    pred = parse(completion, parsing_timeout=None)  # type: ignore[arg-type]
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


def _math_verify_warmup() -> None:
    """Import math-verify (and sympy) once per worker and silence its 'timeout disabled' note."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import parse, verify

    verify(parse("1", parsing_timeout=None), parse("1", parsing_timeout=None), timeout_seconds=None)  # type: ignore[arg-type]


math_verify_reward.warmup = _math_verify_warmup  # type: ignore[attr-defined]
