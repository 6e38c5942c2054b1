import pytest

from rlpost.robot.config import RECIPES_DIR, ConfigError, load_config, recipe_path


@pytest.mark.parametrize("name", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_shipped_recipe_validates(name):
    cfg = load_config(recipe_path(name))
    assert cfg.task in name and name.startswith(cfg.algo)


def test_algo_needs_its_policy_kind():
    with pytest.raises(ConfigError, match=r"policy\.kind='act'"):
        load_config(None, ["algo=pac_act"])
    cfg = load_config(None, ["algo=pac_act", "policy.kind=act", "task=contour"])
    assert cfg.pac_act.prior_coef > 0


def test_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"otql\.beta"):
        load_config(None, ["otql.beta=-1"])
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(None, ["otql.lr=1"])
    with pytest.raises(FileNotFoundError, match="otql_reacher"):
        recipe_path("nope")


def test_craft_proxy_is_checked_at_load():
    with pytest.raises(ConfigError, match="counterfactual model"):
        load_config(recipe_path("craft_multimodal_reach"), ["craft.proxy=oracle"])
    with pytest.raises(ConfigError, match="counterfactual model"):
        load_config(recipe_path("craft_multimodal_reach"), ["task=contour"])
    cfg = load_config(recipe_path("craft_multimodal_reach"), ["task=contour", "craft.mode=real"])
    assert cfg.craft.mode == "real"
