"""YAML recipes shipped with rlpost-diffusion; ``rlpost-diffusion train --config ram_digits``."""

from pathlib import Path

RECIPES_DIR = Path(__file__).parent


def recipe_names() -> list[str]:
    return sorted(q.stem for q in RECIPES_DIR.glob("*.yaml"))


def recipe_path(name_or_path: str) -> Path:
    """A YAML file path as given, else the shipped recipe of that name (``.yaml`` optional)."""
    given = Path(name_or_path)
    if given.is_file():
        return given
    stem = name_or_path.removesuffix(".yaml")
    if (RECIPES_DIR / f"{stem}.yaml").is_file():
        return RECIPES_DIR / f"{stem}.yaml"
    raise FileNotFoundError(f"no file {name_or_path!r} and no shipped recipe; {recipe_names()}")
