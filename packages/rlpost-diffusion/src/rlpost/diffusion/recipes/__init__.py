"""YAML recipes shipped with rlpost-diffusion; ``rlpost-diffusion train --config ram_digits``."""

from pathlib import Path

from rlpost.core.io import recipes

RECIPES_DIR = Path(__file__).parent


def recipe_names() -> list[str]:
    return recipes.recipe_names(RECIPES_DIR)


def recipe_path(name_or_path: str) -> Path:
    """A YAML file path as given, else the shipped recipe of that name (``.yaml`` optional)."""
    return recipes.find_recipe(name_or_path, RECIPES_DIR)
