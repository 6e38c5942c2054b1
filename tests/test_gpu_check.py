"""tools/gpu_check.py, the GPU check script, rehearsed at toy sizes on the CPU (``--smoke``)
so that it still runs when a GPU is lent; and its shell wrapper parses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_gpu_check_smoke_runs_every_part(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "tools"))
    import gpu_check

    monkeypatch.setattr(gpu_check, "cuda_tests", lambda smoke: {"ok": True, "skipped": True})
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--smoke", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert {r["op"].split()[0] for r in res["kernels"]["rows"]} == {
        "linear_logprob",
        "rms_norm",
        "swiglu",
        "shared_prompt_attention",
        "mxfp4",
    }
    assert res["trainer_step"]["tokens_per_s"] > 0
    assert set(res["trainer_step"]["layouts"]) == {
        "uniform", "ragged", "ragged-dense", "padded", "padded+fused-norm",
        "padded+fused-norm+mlp",
    }  # fmt: skip
    assert all("step_ms" in v for v in res["trainer_step"]["layouts"].values())
    assert res["trainer_step"]["mfu"] is None  # no peak to divide by on a CPU
    assert res["trainer_step"]["peak_gib"] is None  # device memory: CUDA only
    assert res["tiles"]["ok"] and len(res["tiles"]["rows"]) == 2
    assert res["vllm_engine"]["ok"]  # ran, or says why not (no vLLM on CPU)
    assert res["vllm_teacher"]["ok"]
    assert res["demo"]["ran"] and 0 <= res["demo"]["eval_after"] <= 1
    assert res["parity"]["greedy_differ"] == 0  # the CPU against itself
    assert res["parity"]["max_logit_diff"] == 0.0
    assert {r["engine"] for r in res["engines"]["rows"]} == {"lean", "hf generate"}
    assert all(r["tokens"] > 0 for r in res["engines"]["rows"])
    assert [r["rows"] for r in res["engines"]["decode_scaling"]] == [8, 4]


def test_gpu_check_shell_wrapper_parses():
    assert subprocess.run(["bash", "-n", str(REPO / "tools" / "gpu_check.sh")]).returncode == 0


def test_model_flops_count_the_head_once_and_not_the_lookup():
    """MFU's numerator: six FLOPs per weight per token, the LM head's product counted (once,
    when tied to the input embedding) and the input lookup not."""
    sys.path.insert(0, str(REPO / "tools"))
    import gpu_check
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def model(tied: bool):
        cfg = Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          tie_word_embeddings=tied)  # fmt: skip
        return Qwen2ForCausalLM(cfg)

    tied, untied = model(True), model(False)
    total = sum(p.numel() for p in tied.parameters())  # (parameters() lists a tied one once)
    assert gpu_check.model_flops(tied, 10) == 60 * total
    lookup = untied.get_input_embeddings().weight.numel()
    assert gpu_check.model_flops(untied, 10) == 60 * (
        sum(p.numel() for p in untied.parameters()) - lookup
    )
    assert gpu_check.peak_flops("cpu") is None
