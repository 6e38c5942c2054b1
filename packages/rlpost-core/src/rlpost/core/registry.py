"""Named registries: one per independent choice a recipe makes.

Every registry fixes one frozen input dataclass and one output type, so all of its
entries share a signature::

    fn(inp: InputType, params: ParamsType) -> OutputType

``params`` is the entry's own frozen dataclass of hyper-parameters. ``Registry.build``
validates keyword arguments against it (unknown names and wrong types fail at build
time, naming the field) and returns a :class:`Bound` callable ``inp -> output``.
Registering a name twice raises; an unknown name raises and lists the valid ones.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


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


@dataclass(frozen=True)
class Entry[In, Out]:
    name: str
    fn: Callable[[In, Any], Out]
    params_cls: type
    doc: str


@dataclass(frozen=True)
class Bound[In, Out]:
    """A registry entry with validated parameters: call it with the registry's input."""

    registry: Registry[In, Out] = field(repr=False)
    name: str
    params: Any

    def __call__(self, inp: In) -> Out:
        reg = self.registry
        if not isinstance(inp, reg.input_type):
            raise TypeError(
                f"{reg.kind} {self.name!r} expects {reg.input_type.__name__}, "
                f"got {type(inp).__name__}"
            )
        return reg.get(self.name).fn(inp, self.params)


class Registry[In, Out]:
    """A name -> entry table for one kind of choice (advantages, objectives, ...)."""

    def __init__(self, kind: str, input_type: type[In], output_type: type[Out]):
        self.kind = kind
        self.input_type = input_type
        self.output_type = output_type
        self._entries: dict[str, Entry[In, Out]] = {}

    def register(
        self, name: str, params: type = NoParams
    ) -> Callable[[Callable[[In, Any], Out]], Callable[[In, Any], Out]]:
        if not dataclasses.is_dataclass(params) or not params.__dataclass_params__.frozen:
            raise TypeError(f"{self.kind} {name!r}: params must be a frozen dataclass")

        def deco(fn: Callable[[In, Any], Out]) -> Callable[[In, Any], Out]:
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = Entry(name, fn, params, (fn.__doc__ or "").strip())
            return fn

        return deco

    def get(self, name: str) -> Entry[In, Out]:
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            ) from None

    def build(self, name: str, **params: Any) -> Bound[In, Out]:
        entry = self.get(name)
        return Bound(self, name, make_params(entry.params_cls, f"{self.kind} {name!r}", params))

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
