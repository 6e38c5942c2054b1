"""Federated post-training through the trainer (rlpost.llm.runtimes.federated, catalog 001-07)."""

from __future__ import annotations

import pytest
import torch

from rlpost.llm.runtimes.federated import Client, client_config, flat_weights, run_federated

# varied rewards on the untrained model (the format reward), every response trained on
LEARN = ("reward.funcs=[{name: correct}, {name: format}]", "train.overlong_mask=false")


def test_clients_get_their_own_streams_and_run_dirs(fast_cfg):
    cfg = fast_cfg("federated.clients=3", "federated.rounds=2", "federated.local_steps=2")
    cs = [client_config(cfg, i) for i in range(3)]
    assert [c.data.seed for c in cs] == [1, 2, 3]
    assert all(c.train.steps == 4 and c.federated is None for c in cs)
    assert len({c.run.dir for c in cs}) == 3


def test_a_client_update_is_its_trained_weights_minus_the_received_ones(fast_cfg):
    cfg = fast_cfg("federated.clients=1", *LEARN)
    c = Client(client_config(cfg, 0).model_dump_json(), "none", 1.0)
    theta = flat_weights(c.trainer.model)
    out = c.work(theta.clone(), 0, 1)
    torch.testing.assert_close(theta + out["update"], flat_weights(c.trainer.model))
    assert out["update"].abs().max() > 0 and out["step"] == 1
    c.close()


def test_a_synchronous_federated_run_trains_and_saves_a_loadable_server_model(fast_cfg, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = fast_cfg(
        "federated.clients=2", "federated.rounds=2", "federated.backend=local",
        "federated.compression=topk", "federated.ratio=0.1", f"run.dir={tmp_path / 'fed'}",
        "federated.eval_every=1", *LEARN,
    )  # fmt: skip
    s = run_federated(cfg, progress=False)
    assert s["updates"] == 4 and s["mean_staleness"] == 0
    # the learning curve: the server evaluated before and after each round of updates
    per = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    assert [(u, n) for u, n, _ in s["curve"]] == [(0, 0), (2, 2 * per), (4, 4 * per)]
    assert s["curve"][-1][2] == s["eval_after"]
    assert s["compression_ratio"] < 0.25  # top-10 % values + their indices
    model = AutoModelForCausalLM.from_pretrained(s["model"])
    trained = torch.nn.utils.parameters_to_vector(model.parameters())
    client = AutoModelForCausalLM.from_pretrained(s["model"])  # the same folder loads again
    assert torch.equal(trained, torch.nn.utils.parameters_to_vector(client.parameters()))
    assert s["eval_after"] >= 0 and s["bytes_sent"] > 0
    assert (tmp_path / "fed" / "federated.json").is_file()
    with pytest.raises(ValueError, match="holds a federated run: --overwrite"):
        run_federated(cfg, progress=False)  # one run per run directory


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow)
def test_asynchronous_updates_from_ray_actors_are_applied_as_they_arrive(fast_cfg, tmp_path):
    cfg = fast_cfg(
        "federated.clients=2", "federated.rounds=2", "federated.backend=ray",
        "federated.compression=int8", f"run.dir={tmp_path / 'fed'}", *LEARN,
    )  # fmt: skip
    s = run_federated(cfg, progress=False)
    assert s["updates"] == 4 and s["backend"] == "ray"
    assert 0 < s["mean_staleness"] <= 1  # each update lands while the other client trains
    assert s["compression_ratio"] < 0.3  # int8: a quarter of float32
