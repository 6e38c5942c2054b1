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


def _close_field(model: Any, loc: tuple) -> str | None:
    """The field of ``model`` at ``loc[:-1]`` whose name is closest to ``loc[-1]``."""
    import difflib

    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type):
            return None
        model = field.annotation
    names = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return close[0] if close else None


def format_validation_error(err: Any, model: Any = None) -> str:
    """A pydantic ``ValidationError`` as one line per field: ``  a.b: what is wrong`` (an
    unknown field of ``model`` with the closest known one: ``did you mean ...?``)."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
            close = _close_field(model, tuple(e["loc"])) if model is not None else None
            if close is not None:
                path = ".".join([*(str(x) for x in e["loc"][:-1]), close])
                msg += f"; did you mean {path}?"
        elif e["type"] == "literal_error":
            msg = f"must be one of {e.get('ctx', {}).get('expected', '')}, got {e.get('input')!r}"
        msg = msg.removeprefix("Value error, ")
        if loc == "<root>" or any(msg.startswith(loc + c) for c in ".:=["):
            lines.append(f"  {msg}")  # a cross-field check names its fields itself
        else:
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
    from omegaconf.errors import OmegaConfBaseException
    from pydantic import ValidationError

    cfg = OmegaConf.create(model().model_dump(mode="json"))  # type: ignore[attr-defined]
    where = "the overrides"
    try:
        if path is not None:
            where = str(path)
            try:
                cfg = OmegaConf.merge(cfg, OmegaConf.create(read_yaml_mapping(path)))
            except ConfigError:
                raise  # (it names the file already)
            except (TypeError, ValueError) as err:  # a list where a mapping goes, ...
                raise ConfigError(f"{path}: {_first_line(err)}") from None
        if overrides:
            where = "the overrides"
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ConfigError(f"overrides must look like key.sub=value, got {bad}")
            for o in overrides:
                try:
                    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o]))
                except yaml.YAMLError as err:
                    problem = getattr(err, "problem", None) or _first_line(err)
                    raise ConfigError(f"override {o!r}: malformed value: {problem}") from None
                except (TypeError, ValueError) as err:  # e.g. a list where a mapping goes
                    key = o.split("=", 1)[0]
                    raise ConfigError(f"override {o!r}: {key}: {_first_line(err)}") from None
        where = " with ".join(
            x for x in (str(path) if path else "", "the overrides" if overrides else "") if x
        )
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{where}: {_first_line(err)}") from None
    try:
        return model.model_validate(data)  # type: ignore[attr-defined]
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, model)) from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping at the top of the YAML file ``path`` (empty file: ``{}``).

    Raises :class:`ConfigError` naming the file, and the line and column of a syntax
    error, for a missing file, malformed YAML or a top level that is not a mapping."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.load(p.read_text(), Loader=_unique_keys_loader())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or _first_line(err)
        context = getattr(err, "context", None)
        raise ConfigError(
            f"{p}{at}: malformed YAML: {problem}" + (f" ({context})" if context else "")
        ) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{p}: not a text file ({err.reason})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{p}: the top level must be a mapping of fields (key: value), "
            f"got a {type(data).__name__}"
        )
    return data


def _unique_keys_loader() -> Any:
    """PyYAML's safe loader, refusing a mapping that repeats a key (plain YAML keeps the
    last value silently: a recipe's ``lr`` written twice would drop the first)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (also at line {seen[key]})",
                        key_node.start_mark,
                    )  # fmt: skip
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def _import_file(path: str, at: str) -> Any:
    import importlib.util
    import sys

    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(f"{at}no file {path!r}")
    name = file.stem
    module = sys.modules.get(name)
    if module is not None and Path(getattr(module, "__file__", "") or "").resolve() == file:
        return module
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # picklable by name; reward workers load it from its file
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)  # a fixed file is imported afresh next time
        raise
    return module


def import_object(spec: str, field: str | None = None) -> Any:
    """``"package.module:attribute"`` or ``"path/to/file.py:attribute"`` (dots allowed in
    the attribute) -> the callable it names, imported now so that a bad name fails when the config loads; the
    :class:`ConfigError` names ``field`` when given."""
    import importlib

    at = f"{field}: " if field else ""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{at}{spec!r} is not of the form 'package.module:function'")
    try:
        if module_name.endswith(".py"):  # a file: imported under its stem, once
            obj: Any = _import_file(module_name, at)
        else:
            obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except ImportError as exc:
        raise ConfigError(f"{at}cannot import {module_name!r} ({exc})") from None
    except AttributeError:
        raise ConfigError(f"{at}module {module_name!r} has no {attr!r}") from None
    except SyntaxError as exc:  # the user's file: where, not a traceback through importlib
        where = f"{exc.filename}:{exc.lineno}" if exc.lineno else str(exc.filename)
        raise ConfigError(f"{at}{where}: {exc.msg} (importing {module_name!r})") from None
    except Exception as exc:  # raised by the module's own top-level code
        import traceback

        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise ConfigError(
            f"{at}importing {module_name!r} raised {type(exc).__name__}: {exc} "
            f"({frame.filename}:{frame.lineno})"
        ) from None
    if not callable(obj):
        raise ConfigError(f"{at}{spec!r} is not callable")
    return obj
