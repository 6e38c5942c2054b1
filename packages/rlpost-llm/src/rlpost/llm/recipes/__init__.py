"""YAML recipes shipped with rlpost-llm; ``rlpost-llm train --config grpo_arithmetic`` finds them."""

from pathlib import Path

from rlpost.core.io.recipes import find_recipe

RECIPES_DIR = Path(__file__).parent

__all__ = ["RECIPES_DIR", "recipe_path"]


def recipe_path(name_or_path: str) -> Path:
    """A YAML path as given, or the shipped recipe of that name (``.yaml`` optional)."""
    return find_recipe(name_or_path, RECIPES_DIR)
