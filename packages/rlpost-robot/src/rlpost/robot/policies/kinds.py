"""The policy-kind registry of the robot trainer: ``POLICY_KINDS``.

A :class:`PolicyKind` is a policy the trainer can behaviour-clone and fine-tune. As in
lerobot, each kind has a light configuration module (``configuration_<kind>.py``: a
pydantic model of its own fields, which a recipe gives as ``policy: {kind: ...,
params: {...}}``; importing it imports no torch) and a modeling module (``flow.py``,
``act.py``, ``gaussian.py``: the policy itself). The registration names the modeling side
as ``"module:attribute"`` strings, imported when a policy is built or loaded:

* ``build``: ``build(task, demos, settings, progress, force=False) -> folder``, the cached
  BC policy of the kind's settings (``folder/policy`` and ``bc_info.json``);
* ``load``: ``load(folder) -> policy``, a saved policy of this kind;
* ``multi_step``: whether the number of integration steps matters when it acts (a flow
  policy) or a chunk is decoded in one pass.

Adding a kind is a configuration module with its registration (imported by
``rlpost/robot/policies/__init__.py``, which fills the registry) and a modeling module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rlpost.core.registry import NamedRegistry


@dataclass(frozen=True)
class PolicyKind:
    name: str
    config: type  # the kind's pydantic settings (its configuration module)
    build: str  # "module:function" of its cached BC build
    load: str  # "module:attribute" of its loader (folder -> policy)
    multi_step: bool = False
    cache: str | None = None  # its BC policies' cache folder prefix (default: the name)

    @property
    def cache_name(self) -> str:
        return self.cache or self.name

    def builder(self) -> Any:
        return _resolve(self.build)

    def loader(self) -> Any:
        return _resolve(self.load)


def _resolve(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class PolicyKindRegistry(NamedRegistry[PolicyKind]):
    def __init__(self) -> None:
        super().__init__("policy kind")

    def __getitem__(self, name: str) -> PolicyKind:
        return self.get(name)

    def settings(self, name: str, values: dict[str, Any]) -> Any:
        """The kind's validated settings (pydantic: an error names the field)."""
        return self.get(name).config.model_validate(values)


POLICY_KINDS = PolicyKindRegistry()


def register_policy_kind(kind: PolicyKind) -> PolicyKind:
    return POLICY_KINDS.register(kind)


__all__ = ["POLICY_KINDS", "PolicyKind", "register_policy_kind"]
