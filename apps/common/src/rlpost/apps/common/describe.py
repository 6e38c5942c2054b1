"""``rlpost-<domain> config``: a run config's keys, defaults and docs, as text."""

from __future__ import annotations

from typing import Any


def describe(model: Any, values: Any = None, section: str | None = None) -> str:
    """Every key of the config ``model`` (a pydantic model class) as ``key = value`` and
    the field's description under it, in field order; ``values``: a loaded config whose
    values to show instead of the defaults; ``section``: only the keys under it
    (``optim``, ``rollout.sampling``). What ``rlpost-<domain> config`` prints."""
    import json
    import textwrap

    values = values if values is not None else model()
    lines: list[str] = []

    def walk(cls: Any, obj: Any, prefix: str) -> None:
        for name, field in cls.model_fields.items():
            key, value = f"{prefix}{name}", getattr(obj, name)
            sub = field.annotation if isinstance(field.annotation, type) else None
            if sub is not None and hasattr(sub, "model_fields") and value is not None:
                walk(sub, value, f"{key}.")
                continue
            if section and not (key == section or key.startswith(section + ".")):
                continue
            shown = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
            if isinstance(shown, list) and shown and hasattr(shown[0], "model_dump"):
                shown = [v.model_dump(mode="json") for v in shown]
            lines.append(f"{key} = {json.dumps(shown, default=str)}")  # (YAML reads it)
            doc = " ".join((field.description or "").split())
            if doc:
                lines.extend(
                    textwrap.wrap(doc, 88, initial_indent="    ", subsequent_indent="    ")
                )

    walk(model, values, "")
    if section and not lines:
        tops = sorted({k.split(" = ")[0].split(".")[0] for k in describe(model).splitlines()
                       if not k.startswith(" ")})  # fmt: skip
        raise ValueError(f"no config section {section!r}; sections: {tops}")
    return "\n".join(lines)
