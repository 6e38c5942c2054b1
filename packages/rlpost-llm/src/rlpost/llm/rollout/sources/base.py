"""Rollout sources: where a step's rollouts come from and when they are generated.

Every source answers the same two questions, so the trainer asks one object and never a
pipeline's name::

    collect(want, given) -> Collected    generate ``want`` groups now (and score them)
    step(stop) -> Rollouts               the rollouts this training step uses

Sources stack by ``layer``: a *generator* makes groups (plain prompts, multi-turn
episodes, FBOS-RL's guided rounds), a *filter* reshapes what its inner source generates
(dynamic sampling's refill rounds), a *schedule* decides when generation runs beside
training (synchronous, one step off, DORA's stream, BubbleSpec's drafts, RolloutPipe's
chunks, Mu-GRPO's stages). A run's stack is: the generator its data picks (or the one
its preset names), the preset's sources (``Preset.rollout``), and ``train.pipeline``.
Each source declares what it requires of a step and what it breaks
(:class:`~rlpost.core.contract.Declares`), checked at config load against everything
else the config switches on.

A new source is one module: a subclass registered with :func:`register_source`, whose
name ``train.pipeline`` (a schedule) or ``Preset.rollout`` (any layer) can then name.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from rlpost.core.contract import Declares, Party
from rlpost.core.registry import NoParams, RegistryError, make_params
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.data.tasks import Example, Task
from rlpost.llm.rollout.engines.base import SamplingParams

GENERATE, FILTER, SCHEDULE = 0, 1, 2


def back_reference(trainer: Any) -> Any:
    """A part's reference to the trainer that owns it, weak: the trainer holds its parts,
    so a strong one would make a cycle, and a trainer in a cycle is freed only by the
    garbage collector, at worst during interpreter shutdown, where a data-parallel run's
    process group (held by its learner) then aborts the process."""
    return trainer if isinstance(trainer, weakref.ProxyType) else weakref.proxy(trainer)


def greedy_accuracy(trainer: Any, examples: list[Example], task: Task | None = None) -> float:
    """The engine's greedy answers to ``examples``, verified (a score-based task says
    what solving means itself, e.g. an optimal knapsack pick); ``task``: verified by that
    task instead of the run's (a transfer task's held-out set)."""
    t = trainer
    prompts = [encode_prompt(t.tok, e.prompt) for e in examples]
    greedy = SamplingParams(t.sampling.max_new_tokens, 0.0, stop=t.sampling.stop)
    batch = t.engine.generate(prompts, 1, greedy)
    given = task is not None
    task = task if given else getattr(t.prompts, "task", None)
    if given or (task is not None and type(task).accuracy is not Task.accuracy):
        texts = batch.texts(t.tok)
        hits = sum(task.accuracy(x, e) for x, e in zip(texts, examples, strict=True))
        return hits / max(len(examples), 1)
    return float(t.scorer.accuracy(t.scorer.score(batch, examples, train=False).components).mean())


@dataclass
class Rollouts:
    """What a schedule hands one training step: the rollouts, and, for a source that
    trains as it generates (RolloutPipe), the update's metrics (``{}``: nothing
    trainable) and the seconds the trainer waited for rollouts."""

    col: Any  # Collected
    waited: float
    update: dict[str, float] | None = None


class RolloutSource:
    """Base of every rollout source (see the module docstring)."""

    name: ClassVar[str]
    layer: ClassVar[int] = SCHEDULE
    params: ClassVar[type] = NoParams
    declares: ClassVar[Declares] = Declares()
    label: ClassVar[str] = ""  # how errors name it (default: "rollout source <name>")
    option: ClassVar[str | None] = None  # the ``algo.<option>`` key that switches it
    trains: ClassVar[bool] = False  # it back-propagates as it generates (RolloutPipe)
    example: ClassVar[tuple[str, ...]] = ()  # config overrides that switch it on (tests)

    def __init__(self, trainer: Any, inner: RolloutSource | None, params: Any):
        self.trainer = back_reference(trainer)
        self.inner = inner
        self.params = params

    # ----------------------------------------------------------- declarations
    @classmethod
    def party(cls, preset: Any, params: Any) -> Party:
        return Party(cls.label.format(preset=preset) or f"rollout source {cls.name}", cls.declares)

    @classmethod
    def check(cls, cfg: Any, preset: Any, params: Any) -> None:
        """Refuse, at config load, a config this source cannot serve (one line)."""

    @classmethod
    def check_preset(cls, preset: Any, params: Any) -> None:
        """Refuse a preset this source cannot serve (e.g. its group size)."""

    @classmethod
    def selected(cls, cfg: Any) -> bool:
        """A generator the data picks (multi-turn episodes for ``data.env``)."""
        return False

    @classmethod
    def from_option(cls, value: Any, current: Any) -> Any:
        """The ``Choice`` (or ``None``: off) that ``algo.<option>: value`` makes of the
        preset's ``current`` choice of this source (``None`` when it has none). A source
        that sets ``option`` defines it."""
        raise NotImplementedError(f"rollout source {cls.name!r} has no algo option to read")

    @classmethod
    def rows_per_group(cls, params: Any, group_size: int) -> int:
        """Rows a group contributes at most (FBOS-RL's guided copies add some)."""
        return group_size

    # ----------------------------------------------------------- generation
    def collect(self, want: int | None = None, given: Any = None) -> Any:
        """Generate and score ``want`` groups now (default: a step's)."""
        return self.inner.collect(want, given)

    def evaluate(self, examples: list | None = None) -> float:
        """Greedy accuracy on ``examples`` (default: the held-out set; an environment's
        generator: its success rate on held-out episodes)."""
        if self.inner is not None:
            return self.inner.evaluate(examples)
        return greedy_accuracy(self.trainer, examples or self.trainer.prompts.eval_examples)

    # ----------------------------------------------------------- the step's schedule
    def next(self) -> Any:
        """This step's rollouts (on the main rank): a schedule asks the source inside it, the
        outermost generator or filter collects (a filter's ``collect`` wraps its inner
        generator's, so passing ``next`` through it would skip the filter)."""
        if self.layer == SCHEDULE and self.inner is not None:
            return self.inner.next()
        return self.collect()

    def step(self, stop: int) -> Rollouts:
        """The step's rollouts on every rank (rank 0 generates, the others receive them)."""
        t0 = time.perf_counter()
        t = self.trainer
        col = t.dist.broadcast(self.next() if t.dist.main else None)
        return Rollouts(col, time.perf_counter() - t0)

    def start_next(self, stop: int) -> None:
        """After the step's rollouts are in hand, before its update."""
        if self.inner is not None:
            self.inner.start_next(stop)

    def finish(self) -> float:
        """Before the weights change: wait for generation that reads them (seconds)."""
        return self.inner.finish() if self.inner is not None else 0.0

    def paused(self) -> contextlib.AbstractContextManager:
        """No rollout is being generated inside this block (the engine's weights load)."""
        return self.inner.paused() if self.inner is not None else contextlib.nullcontext()

    def syncing(self) -> contextlib.AbstractContextManager:
        """The block in which each step's new weights go to the engine: :meth:`paused`,
        unless generators take new weights on their own between their chunks (DORA on
        several Ray workers). A source that overrides :meth:`paused` overrides this too."""
        return self.inner.syncing() if self.inner is not None else self.paused()

    def busy_spans(self) -> list[tuple[float, float]]:
        """The generator's busy wall-clock spans (for the idle-time metrics)."""
        return self.inner.busy_spans() if self.inner is not None else []

    def forget_spans(self, before: float) -> None:
        """Drop the busy spans that ended before ``before`` (already counted)."""
        if self.inner is not None:
            self.inner.forget_spans(before)

    def make_engine(self) -> Any:
        """The rollout engine this source generates with (None: the configured one)."""
        return self.inner.make_engine() if self.inner is not None else None

    def max_staleness(self, bound: int) -> int:
        return self.inner.max_staleness(bound) if self.inner is not None else bound

    def reset(self) -> None:
        """Drop rollouts generated ahead (the last update was rolled back)."""
        if self.inner is not None:
            self.inner.reset()

    # ----------------------------------------------------------- state
    state_key: ClassVar[str | None] = None

    def state_dict(self) -> tuple[Any, dict]:
        return None, {}

    def load_state_dict(self, state: Any, tensors: dict) -> None: ...

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

    def chain(self) -> list[RolloutSource]:
        """This source and those inside it, outermost first."""
        return [self, *(self.inner.chain() if self.inner is not None else [])]


def settings_option(cls: type, value: Any, current: Any) -> Any:
    """``from_option`` of a source whose ``algo.<option>`` is a mapping of its params:
    ``False`` switches it off; a mapping (``{}``: the defaults) is merged over the preset's
    current choice of it. Use as ``from_option = classmethod(settings_option)``."""
    from rlpost.core.presets import Choice

    if value is False:
        return None
    base = dict(current.params) if current is not None else {}
    return Choice(cls.name, {**base, **(value if isinstance(value, dict) else {})})


def with_options(values: Any, chosen: tuple, classes: Iterable[type]) -> tuple:
    """A preset's ``chosen`` components (``Choice`` s) after the config keys the
    ``classes`` answer to: each class with an ``option`` reads ``values.<option>`` and, when
    it is set, makes its choice (``from_option``: the preset's current one merged, or
    ``None``: off)."""
    current = {c.name: c for c in chosen}
    for cls in classes:
        value = getattr(values, cls.option, None) if cls.option else None
        if value is None:
            continue
        made = cls.from_option(value, current.get(cls.name))
        if made is None:
            current.pop(cls.name, None)
        else:
            current[cls.name] = made
    return tuple(current.values())


ROLLOUT_SOURCES: dict[str, type[RolloutSource]] = {}


def register_source(cls: type[RolloutSource]) -> type[RolloutSource]:
    if cls.name in ROLLOUT_SOURCES:
        raise RegistryError(f"rollout source {cls.name!r} is already registered")
    ROLLOUT_SOURCES[cls.name] = cls
    return cls


def get_source(name: str) -> type[RolloutSource]:
    try:
        return ROLLOUT_SOURCES[name]
    except KeyError:
        raise RegistryError(
            f"unknown rollout source {name!r}; valid names: {', '.join(sorted(ROLLOUT_SOURCES))}"
        ) from None


def source_params(cls: type[RolloutSource], params: Any) -> Any:
    """``params`` (a mapping) validated against the source's params dataclass."""
    return make_params(cls.params, f"rollout source {cls.name!r}", dict(params or {}))
