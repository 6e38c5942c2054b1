"""SAR (004-19): a planted in-subspace update is kept and a planted orthogonal one removed;
the retained shares; experts' cores merged into a model that loads with
``from_pretrained``; a mismatched checkpoint refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlpost.core.spectral import merge, rewire, subspace
from rlpost.llm.config import load_config
from rlpost.llm.model.policy import load_policy
from rlpost.llm.tools.sar import sar
from rlpost.llm.tools.weights import checkpoint_steps
from rlpost.llm.trainer import Trainer


def _base(m=12, n=10, r=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q1, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    q2, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    s = torch.tensor([10.0, 8, 6] + [0.1] * (min(m, n) - r), dtype=torch.float64)
    return q1[:, : len(s)] @ torch.diag(s) @ q2[:, : len(s)].T, q1, q2, g


def test_an_in_subspace_update_is_kept_and_an_orthogonal_one_removed():
    w0, q1, q2, g = _base()
    inside = q1[:, :3] @ torch.randn(3, 3, generator=g, dtype=torch.float64) @ q2[:, :3].T
    ortho = q1[:, 3:8] @ torch.randn(5, 5, generator=g, dtype=torch.float64) @ q2[:, 3:8].T
    r = rewire(w0, inside + ortho, rank=3)
    assert torch.allclose(r.delta, inside, atol=1e-10)  # exactly the planted core
    assert r.rank == 3 and r.core_params == 9 and r.params == 120
    share = float((inside**2).sum() / ((inside + ortho) ** 2).sum())
    assert r.norm_share == pytest.approx(share)
    assert torch.allclose(rewire(w0, ortho, rank=3).delta, torch.zeros_like(ortho), atol=1e-10)


def test_the_rank_follows_an_energy_threshold_and_vectors_are_kept_or_dropped():
    w0, *_ = _base()
    assert subspace(w0, energy=0.45)[0].shape[1] == 1  # 100 of 200.07: the first holds 0.4999
    assert subspace(w0, energy=0.5)[0].shape[1] == 2
    assert subspace(w0, energy=0.9)[0].shape[1] == 3  # 100 + 64 + 36 = 200 of 200.07
    assert subspace(w0, rank=99)[0].shape[1] == 10  # capped at the matrix's rank
    with pytest.raises(ValueError, match="exactly one"):
        subspace(w0)
    v = torch.ones(4)
    assert torch.equal(rewire(v, v * 2).delta, v * 2)
    assert rewire(v, v * 2, keep_vectors=False).delta.abs().sum() == 0
    merged = merge(
        {"a": torch.zeros(2)}, [{"a": torch.ones(2)}, {"a": 2 * torch.ones(2)}], [1, 0.5]
    )
    assert merged["a"].tolist() == [2.0, 2.0]


def _odd_length(completion: str, example) -> float:
    return float(len(completion) % 2)


def test_experts_cores_merge_into_a_model_that_loads_and_a_mismatch_is_refused(fast_cfg, tmp_path):
    from transformers import AutoModelForCausalLM

    runs = []
    for i in range(2):
        cfg = fast_cfg("optim.lr=1e-2", "run.save_every=2", f"run.seed={i}",
                       f"run.dir={tmp_path / f'e{i}'}")  # fmt: skip
        Trainer(cfg, reward_fn=_odd_length).train()
        runs.append(Path(cfg.run.dir))
    out = tmp_path / "merged"
    rep = sar(runs, out, rank=4)
    assert len(rep["experts"]) == 2
    for e in rep["experts"]:
        assert 0 < e["param_share"] < 0.5 and 0 < e["norm_share"] < 1
    base, _ = load_policy(load_config(str(runs[0] / "config.yaml"), []), progress=False)
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    b = base.state_dict()
    for k, w in load_file(str(checkpoint_steps(runs[0])[-1][1] / "model.safetensors")).items():
        w1 = load_file(str(checkpoint_steps(runs[1])[-1][1] / "model.safetensors"))[k]
        want = b[k] + rewire(b[k], w - b[k], rank=4).delta + rewire(b[k], w1 - b[k], rank=4).delta
        assert torch.allclose(loaded[k], want, atol=1e-5), k
    assert json.loads((out / "sar.json").read_text())["written"] == str(out)
    bad = tmp_path / "bad" / "checkpoints" / "step-000001"
    bad.mkdir(parents=True)
    k = next(iter(b))
    save_file({k: torch.zeros(3, 3)}, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=f"tensor '{k}' is \\(3, 3\\)"):
        sar([runs[0], bad], tmp_path / "x", rank=4)
