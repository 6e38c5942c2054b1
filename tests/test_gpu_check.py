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
        "shared_prompt_attention",
        "mxfp4",
    }
    assert res["trainer_step"]["tokens_per_s"] > 0
    assert res["tiles"]["ok"] and len(res["tiles"]["rows"]) == 2
    assert res["vllm_engine"]["ok"]  # ran, or says why not (no vLLM on CPU)
    assert res["vllm_teacher"]["ok"]
    assert res["demo"]["ran"] and 0 <= res["demo"]["eval_after"] <= 1
    assert res["parity"]["greedy_differ"] == 0  # the CPU against itself
    assert res["parity"]["max_logit_diff"] == 0.0
    assert {r["engine"] for r in res["engines"]["rows"]} == {"lean", "hf generate"}
    assert all(r["tokens"] > 0 for r in res["engines"]["rows"])


def test_gpu_check_shell_wrapper_parses():
    assert subprocess.run(["bash", "-n", str(REPO / "tools" / "gpu_check.sh")]).returncode == 0
