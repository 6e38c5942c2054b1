"""Recipe lookup shared by every domain's CLI: ``--config <name or path>``."""

from __future__ import annotations

from pathlib import Path


def recipe_names(folder: Path) -> list[str]:
    """The shipped recipes of ``folder`` (file stems of its ``*.yaml``), sorted."""
    return sorted(p.stem for p in Path(folder).glob("*.yaml"))


def find_recipe(name_or_path: str, folder: Path, what: str = "recipe") -> Path:
    """``name_or_path`` if it is a file, else the recipe of that name in ``folder``
    (``.yaml`` optional); the error lists the shipped ones."""
    given = Path(name_or_path)
    if given.is_file():
        return given
    shipped = Path(folder) / f"{name_or_path.removesuffix('.yaml')}.yaml"
    if shipped.is_file():
        return shipped
    raise FileNotFoundError(
        f"no file {name_or_path!r} and no shipped {what} of that name; {recipe_names(folder)}"
    )
