"""Typed run configs: defaults <- YAML recipe <- ``a.b=c`` overrides, validated at load.

Every domain describes its run with a pydantic model and loads it with
:func:`load_validated`; the merge uses OmegaConf dot-lists and the validation error names
the dotted field (and the allowed values of a choice). pydantic, OmegaConf and PyYAML are
imported when a config is loaded (the ``rlpost-core[config]`` extra; every domain
package depends on them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field."""


def format_validation_error(err: Any) -> str:
    """A pydantic ``ValidationError`` as one line per field: ``  a.b: what is wrong``."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "literal_error":
            msg = f"must be one of {e.get('ctx', {}).get('expected', '')}, got {e.get('input')!r}"
        lines.append(f"  {loc}: {msg}")
    return "invalid config:\n" + "\n".join(lines)


def load_validated[T](
    model: type[T], path: str | Path | None = None, overrides: list[str] | None = None
) -> T:
    """``model``'s defaults <- the YAML file at ``path`` <- ``key.sub=value`` overrides.

    Raises :class:`ConfigError` for a missing file, a malformed override or any field that
    fails validation.
    """
    import yaml
    from omegaconf import OmegaConf
    from pydantic import ValidationError

    cfg = OmegaConf.create(model().model_dump(mode="json"))  # type: ignore[attr-defined]
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        cfg = OmegaConf.merge(cfg, OmegaConf.create(yaml.safe_load(p.read_text()) or {}))
    if overrides:
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ConfigError(f"overrides must look like key.sub=value, got {bad}")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    data = OmegaConf.to_container(cfg, resolve=True)
    try:
        return model.model_validate(data)  # type: ignore[attr-defined]
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None
