"""YAML recipes shipped with rlpost-llm; ``rlpost-llm train --config grpo_arithmetic`` finds them."""

from pathlib import Path

RECIPES_DIR = Path(__file__).parent


def recipe_path(name_or_path: str) -> Path:
    """A YAML path as given, or the shipped recipe of that name (``.yaml`` optional)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    shipped = RECIPES_DIR / (
        name_or_path if name_or_path.endswith(".yaml") else f"{name_or_path}.yaml"
    )
    if shipped.is_file():
        return shipped
    names = sorted(q.stem for q in RECIPES_DIR.glob("*.yaml"))
    raise FileNotFoundError(
        f"no config file {name_or_path!r} and no shipped recipe of that name; recipes: {names}"
    )
