"""tools/profile_llm_grpo.py attributes a step's time to its parts: every part the step
runs is found in the profile (a moved function would silently read 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow) a benchmark tool's own check
def test_every_part_of_a_step_is_attributed(tmp_path):
    """In a process of its own, as a user runs it (a profiler is process-wide state).
    Generation is the trainer's call into its engine: twice, in the full suite, the
    engines' own ``generate`` was missing from the profile (cause not found)."""
    out = tmp_path / "profile.json"
    args = ["--prompts", "2", "--group-size", "4", "--max-new-tokens", "4", "--steps", "2",
            "--warmup", "1", "--threads", "1", "--size", "micro", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "profile_llm_grpo.py"), *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    parts = res["profiled"]["parts_ms"]
    for part in ("generation", "reward", "training forward + loss", "backward"):
        assert parts[part] > 0, (part, parts, res["engine"])
    assert parts["optimizer step + clip"] > 0
    assert res["profiled"]["generation_ms_per_token"] > 0
    # the rollout's time is generation's, not the remainder's (which held it when the
    # engines' generate moved to another file)
    assert parts["rest of collect"] < parts["generation"]
    assert "generation" in proc.stdout
