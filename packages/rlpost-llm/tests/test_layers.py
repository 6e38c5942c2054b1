"""Layer contribution (004-23): one decoder layer trained alone (every other weight frozen),
its share of the same-budget full run's gain, and the ``rlpost-llm layers`` table."""

from __future__ import annotations

import json

import pytest
import torch

from rlpost.llm.config import load_config
from rlpost.llm.tools.layers import contribution
from rlpost.llm.trainer import Trainer


def test_a_layers_share_of_the_full_gain_by_hand():
    assert contribution(0.4, 0.6, 0.5) == pytest.approx(0.5)
    assert contribution(0.4, 0.6, 0.6) == pytest.approx(1.0)
    assert contribution(0.4, 0.6, 0.3) == pytest.approx(-0.5)  # the layer alone lost accuracy
    assert contribution(0.4, 0.4, 0.5) is None  # full RL gained nothing: no share


def _odd_length(completion: str, example) -> float:
    return float(len(completion) % 2)


def test_only_the_chosen_layer_trains(fast_cfg):
    tr = Trainer(fast_cfg("model.train_layers=[1]", "optim.lr=1e-2"), reward_fn=_odd_length)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    trainable = {n for n, p in tr.model.named_parameters() if p.requires_grad}
    assert trainable and all(".layers.1." in n for n in trainable)
    tr.update(tr.rollouts.collect())
    moved = {n for n, p in tr.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and moved <= trainable  # something in layer 1 moved, nothing else
    tr.close()


def test_a_bad_layer_or_lora_with_layers_is_refused_in_one_line(fast_cfg, fast_overrides):
    with pytest.raises(ValueError, match=r"decoder layers are 0\.\.3"):
        Trainer(fast_cfg("model.train_layers=[9]"))
    with pytest.raises(ValueError, match="exclusive"):
        load_config(None, [*fast_overrides, "model.train_layers=[0]", "model.lora={r: 4}"])


@pytest.mark.slow
def test_the_layers_command_writes_the_table_against_the_same_budget_full_run(
    fast_overrides, tmp_path, capsys
):
    from rlpost.apps.llm.cli import main

    out = tmp_path / "layers"
    assert main(["layers", "--out", str(out), *fast_overrides, "data.eval_size=8"]) == 0
    rows = json.loads((out / "layers.json").read_text())
    assert [r["run"] for r in rows] == ["full", "layer 0", "layer 1", "layer 2", "layer 3"]
    assert len({r["heldout_before"] for r in rows}) == 1  # one base, one held-out set
    for r in rows:
        s = r["share_of_full_gain"]
        assert s is None or -10 < s < 10
    assert (out / "layers.png").is_file() and "share of full RL's gain" in capsys.readouterr().out
