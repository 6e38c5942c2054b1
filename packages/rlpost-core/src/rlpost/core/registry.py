"""Named registries: one per independent choice a recipe makes.

Every registry fixes one frozen input dataclass and one output type, so all of its
entries share a signature::

    fn(inp: InputType, params: ParamsType) -> OutputType

``params`` is the entry's own frozen dataclass of hyper-parameters. ``Registry.build``
validates keyword arguments against it (unknown names and wrong types fail at build
time, naming the field) and returns a :class:`Bound` callable ``inp -> output``.
Registering a name twice raises; an unknown name raises and lists the valid ones.

Each entry also declares its side of the method/trainer contract
(:mod:`rlpost.core.contract`): the inputs it ``needs`` and ``reads`` beyond the base ones
and its ``coupling``. A registry names the inputs its entries may declare (``inputs``:
each :class:`~rlpost.core.contract.Input` and the input-dataclass fields holding it) and
which of them are *gated*: a :class:`Bound` entry is called with every gated input it did
not declare set to ``None``, and raises :class:`~rlpost.core.contract.ContractError`
naming the input when one it ``needs`` is missing.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlpost.core.contract import ContractError, Coupling, Input


@dataclass(frozen=True)
class NoParams:
    """Parameters of an entry that has no hyper-parameters."""


class RegistryError(KeyError, ValueError):
    """An unknown or duplicate registry name, or bad entry parameters."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def _check_type(value: Any, annotation: Any) -> bool:
    """Shallow runtime check of ``value`` against a (possibly string) annotation."""
    if annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_check_type(value, a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:  # YAML / JSON give lists
        return isinstance(value, (tuple, list))
    if origin is not None:
        return isinstance(value, origin)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def make_params(params_cls: type, where: str, kwargs: Mapping[str, Any]) -> Any:
    """Instantiate ``params_cls(**kwargs)`` with errors that name the bad field."""
    fields = {f.name: f for f in dataclasses.fields(params_cls)}
    hints = typing.get_type_hints(params_cls)
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        raise RegistryError(
            f"{where}: unknown parameter(s) {unknown}; valid parameters: {sorted(fields) or 'none'}"
        )
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise RegistryError(f"{where}: missing required parameter(s) {missing}")
    for name, value in kwargs.items():
        if not _check_type(value, hints[name]):
            raise RegistryError(f"{where}: parameter {name!r} must be {hints[name]}, got {value!r}")
    try:
        return params_cls(**kwargs)
    except (TypeError, ValueError) as exc:  # __post_init__ validation
        raise RegistryError(f"{where}: {exc}") from exc


Declared = Iterable[Input] | Callable[[Any], Iterable[Input]]


@dataclass(frozen=True)
class Entry[In, Out]:
    name: str
    fn: Callable[[In, Any], Out]
    params_cls: type
    doc: str
    needs: Declared = ()
    reads: Declared = ()
    coupling: Coupling | Callable[[Any], Coupling] = Coupling.ROW

    def declared(self, params: Any) -> tuple[frozenset[Input], frozenset[Input], Coupling]:
        """``(needs, reads, coupling)`` for these params; ``reads`` includes ``needs``."""

        def resolve(d: Any) -> Any:
            return d(params) if callable(d) and not isinstance(d, Coupling) else d

        needs = frozenset(resolve(self.needs))
        return needs, needs | frozenset(resolve(self.reads)), Coupling(resolve(self.coupling))


@dataclass(frozen=True)
class Bound[In, Out]:
    """A registry entry with validated parameters: call it with the registry's input."""

    registry: Registry[In, Out] = field(repr=False)
    name: str
    params: Any
    needs: frozenset[Input] = field(default=frozenset(), compare=False)
    reads: frozenset[Input] = field(default=frozenset(), compare=False)
    coupling: Coupling = field(default=Coupling.ROW, compare=False)

    def __str__(self) -> str:
        return f"{self.registry.kind} {self.name!r}"

    def visible(self, inp: In) -> In:
        """``inp`` with every gated input this entry did not declare set to ``None``."""
        reg = self.registry
        hide = {
            f: None
            for i in reg.gated - self.reads
            for f in reg.inputs[i]
            if getattr(inp, f) is not None
        }
        return dataclasses.replace(inp, **hide) if hide else inp  # type: ignore[type-var]

    def missing(self, inp: In) -> list[Input]:
        """The inputs this entry needs that ``inp`` does not hold."""
        return [i for i in sorted(self.needs) if not self.registry.present(i, inp)]

    def __call__(self, inp: In) -> Out:
        reg = self.registry
        if not isinstance(inp, reg.input_type):
            raise TypeError(
                f"{reg.kind} {self.name!r} expects {reg.input_type.__name__}, "
                f"got {type(inp).__name__}"
            )
        lacking = self.missing(inp)
        if lacking:
            what = "; ".join(f"{i} ({reg.describe(i)})" for i in lacking)
            raise ContractError(f"{self} needs {what}, which the caller did not pass")
        return reg.get(self.name).fn(self.visible(inp), self.params)


class Registry[In, Out]:
    """A name -> entry table for one kind of choice (advantages, objectives, ...)."""

    def __init__(
        self,
        kind: str,
        input_type: type[In],
        output_type: type[Out],
        *,
        inputs: Mapping[Input, tuple[str, ...]] | None = None,
        gated: Iterable[Input] = (),
        present: Mapping[Input, Callable[[In], bool]] | None = None,
        describe: Mapping[Input, str] | None = None,
    ):
        """``inputs``: the declarable inputs and the ``input_type`` fields holding each;
        ``gated``: those hidden from entries that do not declare them; ``present``: a
        presence test per input where "its fields are not None" is not the right one;
        ``describe``: how to pass an input, for error messages (default: its fields)."""
        self.kind = kind
        self.input_type = input_type
        self.output_type = output_type
        self.inputs: dict[Input, tuple[str, ...]] = dict(inputs or {})
        self.gated = frozenset(gated)
        self._present = dict(present or {})
        self._describe = dict(describe or {})
        names = {f.name for f in dataclasses.fields(input_type)}  # type: ignore[arg-type]
        for i, fs in self.inputs.items():
            if not set(fs) <= names:
                raise TypeError(f"{kind}: input {i} names fields {fs} not on {input_type}")
        if not self.gated <= set(self.inputs):
            raise TypeError(f"{kind}: gated inputs must be declarable inputs")
        self._entries: dict[str, Entry[In, Out]] = {}

    def describe(self, i: Input) -> str:
        """Where input ``i`` goes, e.g. ``AdvantageInput.values``."""
        fields = ", ".join(f"{self.input_type.__name__}.{f}" for f in self.inputs[i])
        return self._describe.get(i, fields)

    def present(self, i: Input, inp: In) -> bool:
        """Whether ``inp`` holds input ``i``."""
        if i in self._present:
            return self._present[i](inp)
        return all(getattr(inp, f) is not None for f in self.inputs[i])

    def register(
        self,
        name: str,
        params: type = NoParams,
        *,
        needs: Declared = (),
        reads: Declared = (),
        coupling: Coupling | Callable[[Any], Coupling] = Coupling.ROW,
    ) -> Callable[[Callable[[In, Any], Out]], Callable[[In, Any], Out]]:
        """Register ``fn(inp, params) -> out`` under ``name`` with its contract declaration
        (see :mod:`rlpost.core.contract`); static declarations are checked here."""
        if not dataclasses.is_dataclass(params) or not params.__dataclass_params__.frozen:
            raise TypeError(f"{self.kind} {name!r}: params must be a frozen dataclass")
        for d in (needs, reads):
            if not callable(d):
                self._check_declared(name, frozenset(d))

        def deco(fn: Callable[[In, Any], Out]) -> Callable[[In, Any], Out]:
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = Entry(
                name, fn, params, (fn.__doc__ or "").strip(), needs, reads, coupling
            )
            return fn

        return deco

    def _check_declared(self, name: str, declared: frozenset) -> None:
        unknown = sorted(str(i) for i in declared if i not in self.inputs)
        if unknown:
            raise TypeError(
                f"{self.kind} {name!r} declares {unknown}, which {self.input_type.__name__} "
                f"does not carry; declarable: {sorted(str(i) for i in self.inputs) or 'none'}"
            )

    def get(self, name: str) -> Entry[In, Out]:
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            ) from None

    def build(self, name: str, **params: Any) -> Bound[In, Out]:
        entry = self.get(name)
        p = make_params(entry.params_cls, f"{self.kind} {name!r}", params)
        needs, reads, coupling = entry.declared(p)
        self._check_declared(name, reads)
        return Bound(self, name, p, needs, reads, coupling)

    def __call__(self, name: str, inp: In, **params: Any) -> Out:
        return self.build(name, **params)(inp)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


class NamedRegistry[T]:
    """``name -> object`` for the domains' registries of larger things (a diffusion
    method, a robot algorithm): each object has a ``name``; registering a name twice
    raises, an unknown name lists the valid ones. Subclasses add their validation."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, item: T) -> T:
        name = item.name  # type: ignore[attr-defined]
        if name in self._items:
            raise RegistryError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self):
        return iter(self.names())


class ParamsRegistry[T](NamedRegistry[T]):
    """A :class:`NamedRegistry` whose entries carry their parameters' frozen dataclass as
    ``params`` (checked at registration); :meth:`params` validates values against it, an
    error naming the field (:func:`make_params`)."""

    def register(self, item: T) -> T:
        params = item.params  # type: ignore[attr-defined]
        if not dataclasses.is_dataclass(params):
            name = item.name  # type: ignore[attr-defined]
            raise TypeError(f"{self.kind} {name!r}: params must be a frozen dataclass")
        return super().register(item)

    def params(self, name: str, values: Mapping[str, Any]) -> Any:
        """``name``'s validated parameters."""
        return make_params(self.get(name).params, f"{self.kind} {name!r}", dict(values))  # type: ignore[attr-defined]
