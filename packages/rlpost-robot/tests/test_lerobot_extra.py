import importlib.util


def test_default_dev_environment_has_the_lerobot_extra():
    # The default `uv sync` installs rlpost-robot[lerobot] so its integration is tested here.
    assert importlib.util.find_spec("lerobot") is not None
