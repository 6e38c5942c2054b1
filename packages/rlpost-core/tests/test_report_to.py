"""run.report_to: metrics.jsonl always, TensorBoard and W&B (offline) on request."""

import pytest

from rlpost.core.io.config import ConfigError, load_validated
from rlpost.core.io.metrics import MetricsLogger, read_metrics
from rlpost.core.io.schema import CheckpointedRunConfig


def test_wandb_offline_files_are_written_and_a_resume_continues_the_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = CheckpointedRunConfig(report_to=["jsonl", "wandb"])
    log = MetricsLogger.for_run(tmp_path, run)
    assert log.tb is None and log.wb is not None
    for step in (1, 2):
        log.log(step, {"reward": step / 2, "note": "text is not logged"})
    log.close()
    run_id = (tmp_path / "wandb-run-id").read_text()
    files = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert files and files[0].stat().st_size > 0
    log = MetricsLogger.for_run(tmp_path, run, resume_step=2)  # the same W&B run again
    log.log(3, {"reward": 1.5})
    log.close()
    assert (tmp_path / "wandb-run-id").read_text() == run_id
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_tensorboard_by_default_and_off_by_either_switch(tmp_path):
    pytest.importorskip("tensorboard")  # (core alone does not install it)
    for d in "abc":
        (tmp_path / d).mkdir()
    assert MetricsLogger.for_run(tmp_path / "a", CheckpointedRunConfig()).tb is not None
    off = CheckpointedRunConfig(tensorboard=False)
    assert MetricsLogger.for_run(tmp_path / "b", off).tb is None
    only_jsonl = CheckpointedRunConfig(report_to=["jsonl"])
    assert MetricsLogger.for_run(tmp_path / "c", only_jsonl).tb is None


def test_an_unknown_destination_names_the_choices():
    with pytest.raises(ConfigError, match=r"report_to.0: must be one of 'jsonl', 'tensorboard'"):
        load_validated(CheckpointedRunConfig, None, ["report_to=[mlflow]"])
