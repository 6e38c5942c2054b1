from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from rlpost.core.io.cache import default_cache_dir, publish_directory
from rlpost.core.io.config import ConfigError, load_validated


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(1e-3, gt=0)
    kind: Literal["a", "b"] = "a"


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inner: _Inner = _Inner()
    steps: int = 3


def test_load_validated_merges_defaults_yaml_and_overrides(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("inner: {lr: 0.5}\nsteps: 7\n")
    cfg = load_validated(_Cfg, f, ["steps=9"])
    assert cfg.inner.lr == 0.5 and cfg.inner.kind == "a" and cfg.steps == 9


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["inner.lr=-1"], "inner.lr"),
        (["inner.kind=c"], "must be one of 'a' or 'b', got 'c'"),
        (["inner.nope=1"], "inner.nope: unknown field\n"),  # nothing close: no guess
        (["inner.lrr=1"], "inner.lrr: unknown field; did you mean inner.lr?"),
        (["step=1"], "step: unknown field; did you mean steps?"),
        (["steps"], "key.sub=value"),
        (["inner=[1, 2]"], "override 'inner=[1, 2]': inner: Cannot merge"),
    ],
)
def test_bad_config_names_the_field(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_validated(_Cfg, None, overrides)
    assert message in str(err.value) + "\n"


def test_a_list_for_a_mapping_in_yaml_is_a_config_error(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("inner: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"r\.yaml: Cannot merge"):
        load_validated(_Cfg, f)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_validated(_Cfg, tmp_path / "nope.yaml")


def test_cache_dir_env_and_publish_is_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    target = tmp_path / "c" / "entry"

    def broken(tmp):
        (tmp / "half").write_text("x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        publish_directory(target, "done.json", broken)
    assert not target.exists() and list(target.parent.iterdir()) == []  # nothing left behind

    def good(tmp):
        (tmp / "done.json").write_text("{}")

    assert publish_directory(target, "done.json", good) == target
    assert (target / "done.json").is_file()

    def other(tmp):
        (tmp / "done.json").write_text('{"v": 2}')

    publish_directory(target, "done.json", other)  # a complete entry is kept ...
    assert (target / "done.json").read_text() == "{}"
    publish_directory(target, "done.json", other, force=True)  # ... unless forced
    assert (target / "done.json").read_text() == '{"v": 2}'


def test_named_registry_rejects_duplicates_and_names_the_valid_ones():
    from dataclasses import dataclass

    from rlpost.core.registry import NamedRegistry, RegistryError

    @dataclass(frozen=True)
    class Thing:
        name: str

    reg = NamedRegistry[Thing]("toy thing")
    a = reg.register(Thing("a"))
    reg.register(Thing("b"))
    assert reg.get("a") is a and list(reg) == ["a", "b"] and "b" in reg
    with pytest.raises(RegistryError, match="toy thing 'a' is already registered"):
        reg.register(Thing("a"))
    with pytest.raises(RegistryError, match="unknown toy thing 'c'; valid names: a, b"):
        reg.get("c")
    reg.unregister("a")
    assert reg.names() == ["b"]


def test_recipe_lookup_run_dir_and_summary(tmp_path):
    from rlpost.core.io.curves import plot_curves, summary_table
    from rlpost.core.io.metrics import MetricsLogger
    from rlpost.core.io.recipes import find_recipe, recipe_names
    from rlpost.core.io.rundir import open_run_dir
    from rlpost.core.io.schema import CheckpointedRunConfig

    (tmp_path / "a.yaml").write_text("x: 1\n")
    assert find_recipe("a", tmp_path) == find_recipe("a.yaml", tmp_path) == tmp_path / "a.yaml"
    with pytest.raises(FileNotFoundError, match=r"no shipped recipe of that name; \['a'\]"):
        find_recipe("b", tmp_path)
    assert recipe_names(tmp_path) == ["a"]
    run = open_run_dir(tmp_path / "run", CheckpointedRunConfig(seed=3))
    assert "seed: 3" in (run / "config.yaml").read_text()
    assert not list(run.glob("*.tmp"))
    log = MetricsLogger(run, tensorboard=False)
    for step, value in ((1, 0.5), (2, 0.75)):
        log.log(step, {"reward": value, "eval/reward": value / 2})
    log.close()
    rows = [{"reward": 0.5}, {"reward": 0.75}]
    assert summary_table(rows, ["reward", "absent"]).splitlines()[1].split() == [
        "reward",
        "0.5000",
        "0.7500",
    ]
    assert summary_table([], ["reward"]) == "(no steps)"
    assert plot_curves(run, [("reward", ("reward", "eval/reward"))]).is_file()


def test_cache_lock_serialises_builders_of_one_entry(tmp_path):
    import threading
    import time

    from rlpost.core.io.cache import cache_lock

    target = tmp_path / "llm" / "tiny-x"
    order: list[str] = []
    held = threading.Event()

    def first():
        with cache_lock(target):
            held.set()
            time.sleep(0.3)
            order.append("first done")

    t = threading.Thread(target=first)
    t.start()
    held.wait()
    with cache_lock(target):  # waits for the first builder
        order.append("second in")
    t.join()
    assert order == ["first done", "second in"]
    assert [p.name for p in (tmp_path / ".locks").iterdir()] == ["llm-tiny-x.lock"]
    assert not (tmp_path / "llm").exists()  # nothing inside the domain folder


def test_a_torn_last_metrics_line_is_dropped_on_resume_with_a_notice(tmp_path, capsys):
    """A write interrupted mid-line (a full disk, a kill) leaves a torn last line: resume
    drops it, says so, and the log continues; reading skips it."""
    from rlpost.core.io.metrics import MetricsLogger, read_metrics

    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        log.log(step, {"loss": float(step)})
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 4, "loss": 0.')  # torn
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    log = MetricsLogger(tmp_path, tensorboard=False, resume_step=3)
    log.log(4, {"loss": 4.0})
    log.close()
    assert "metrics.jsonl: dropped unreadable line(s) [4]" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]


def test_a_repeated_yaml_key_is_refused_naming_both_lines(tmp_path):
    """Plain YAML keeps the last of two equal keys silently (the first ``lr`` dropped)."""
    p = tmp_path / "dup.yaml"
    p.write_text("steps: 1\nsteps: 2\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml:2:1: malformed YAML: duplicate key 'steps'"):
        load_validated(_Cfg, p)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_non_finite_number_is_refused_at_load(value):
    from rlpost.core.io.schema import Strict

    class Run(Strict):
        lr: float = 1e-4

    with pytest.raises(ConfigError, match="lr: Input should be a finite number"):
        load_validated(Run, None, [f"lr={value}"])


def test_a_reward_file_that_does_not_import_is_one_line_naming_where(tmp_path):
    """Before: a 40-line traceback through importlib for a syntax error in the user's file."""
    from rlpost.core.io.config import import_object

    bad = tmp_path / "syntax_slip.py"
    bad.write_text("def f(completion, example):\n    return 1.0 +\n")
    with pytest.raises(ConfigError, match=rf"^reward.funcs: {bad}:2: invalid syntax"):
        import_object(f"{bad}:f", "reward.funcs")
    top = tmp_path / "top_level_slip.py"
    top.write_text("X = 1 / 0\n\ndef f(completion, example):\n    return 1.0\n")
    with pytest.raises(
        ConfigError, match=rf"raised ZeroDivisionError: division by zero \({top}:1\)"
    ):
        import_object(f"{top}:f", "reward.funcs")
    top.write_text("def f(completion, example):\n    return 1.0\n")  # fixed: imported afresh
    assert import_object(f"{top}:f", "reward.funcs")("x", None) == 1.0
