"""tools/profile_llm_grpo.py attributes a step's time to its parts: every part the step
runs is found in the profile (a moved function would silently read 0)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_part_of_a_step_is_attributed(tmp_path):
    sys.path.insert(0, str(REPO / "tools"))
    import profile_llm_grpo

    spec = {
        "prompts": 2, "group_size": 4, "max_new_tokens": 4, "steps": 2, "warmup": 1,
        "threads": 1, "seed": 0, "size": "micro", "work": str(tmp_path), "temperature": 1.0,
        "lr": 1e-4, "mask_truncated": False,
    }  # fmt: skip
    res = profile_llm_grpo.run(spec)
    parts = res["profiled"]["parts_ms"]
    for part in ("generation", "reward", "training forward + loss", "backward"):
        assert parts[part] > 0, part
    assert parts["optimizer step + clip"] > 0
    assert res["profiled"]["generation_ms_per_token"] > 0
    # the rollout's time is generation's, not the remainder's (which held it when the
    # engines' generate moved to another file)
    assert parts["rest of collect"] < parts["generation"]
    assert "generation" in profile_llm_grpo.format_table(res)
