"""A run saved by an older revision resumes on this tree, and ends where the older code's
uninterrupted run ends.

For each config: the older revision (a ``git worktree`` of ``--old``, imported ahead of
this tree) trains ``steps`` steps uninterrupted, and again ``steps - 1`` with a checkpoint
every step; this tree resumes the second run from its last checkpoint and trains the last
step. The final weights must be bitwise equal to the uninterrupted run's: the checkpoint
still loads (every trainer state its components keep) and the step computes exactly what
the older code computed. Used for the trainer redesign (issue 38)::

    uv run --frozen python tools/resume_across_versions.py --old e76fa4e \\
        --out bench_results/resume_across_versions.json

Prints a table and writes JSON. Needs git (the worktree) and one CPU thread per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# name -> overrides; each switches on a component with trainer state
CONFIGS = {
    "grpo": [],
    "mu_grpo (stages, resumed mid-stage)": ["algo.preset=mu_grpo", "algo.stages=2", "train.steps=4"],
    "gac (regulariser state, auxiliary data)": [
        "regularizer.name=gac", "regularizer.data.task=arithmetic", "regularizer.batches=2",
        "regularizer.batch_size=4", "optim.micro_batch_size=8",
    ],
    "mipu (rejection count)": ["train.mipu={}"],
    "ppo (critic)": ["algo.preset=ppo"],
    "reva_po (validation anchor)": ["algo.preset=reva_po", "run.eval_every=1"],
    "fade (training dynamics)": ["algo.preset=fade"],
}  # fmt: skip
COMMON = [
    "model.path=tiny-random", "rollout.group_size=4", "rollout.prompts_per_step=4",
    "rollout.max_new_tokens=4", "optim.micro_batch_size=16", "run.progress=false",
    "run.save_every=1", "train.steps=3", "reward.workers=0",
]  # fmt: skip

RUN = """
import sys, torch
torch.set_num_threads(1)
from rlpost.llm.config import load_config
from rlpost.llm.trainer import Trainer
overrides, mode = sys.argv[1:-1], sys.argv[-1]
cfg = load_config(None, overrides)
reward = lambda completion, example: float(len(completion) % 2 == 0)
if mode == "full":
    Trainer(cfg, reward_fn=reward, overwrite=True).train()
elif mode == "cut":
    tr = Trainer(cfg, reward_fn=reward, overwrite=True)
    tr.train(until=cfg.train_steps() - 1)
    tr.close()
else:
    Trainer(cfg, reward_fn=reward, resume=True).train()
"""


def _python(overrides: list[str], mode: str, tree: Path | None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if tree is not None:  # the older revision's packages ahead of this tree's
        pkgs = tree / "packages"
        env["PYTHONPATH"] = f"{pkgs / 'rlpost-core' / 'src'}:{pkgs / 'rlpost-llm' / 'src'}"
    subprocess.run([sys.executable, "-c", RUN, *overrides, mode], check=True, env=env,
                   capture_output=True, text=True)  # fmt: skip


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    last = sorted((run / "checkpoints").glob("step-*"))[-1]
    return load_file(str(last / "model.safetensors"))


def check(old: str, names: list[str], work: Path) -> list[dict]:
    tree = work / "old"
    subprocess.run(
        ["git", "worktree", "add", "-q", "--detach", str(tree), old], cwd=REPO, check=True
    )
    rows = []
    try:
        for name in names:
            over = [*COMMON, *CONFIGS[name]]
            full, cut = work / f"{len(rows)}-full", work / f"{len(rows)}-cut"
            _python([*over, f"run.dir={full}"], "full", tree)
            _python([*over, f"run.dir={cut}"], "cut", tree)
            _python([*over, f"run.dir={cut}"], "resume", None)  # this tree
            a, b = _weights(full), _weights(cut)
            diff = max(float((a[k] - b[k]).abs().max()) for k in a)
            rows.append({"config": name, "overrides": CONFIGS[name], "bitwise_equal": diff == 0.0,
                         "max_abs_diff": diff})  # fmt: skip
            print(f"{name:<42} {'bitwise equal' if diff == 0.0 else f'differs by {diff:.3g}'}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="the older git revision that saves the runs")
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--out", default="bench_results/resume_across_versions.json")
    a = ap.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        rows = check(a.old, a.configs, Path(work))
    res = {"name": "resume_across_versions", "command": " ".join(sys.argv), "old": a.old,
           "new": f"{head} + working tree", "rows": rows,
           "headline": {"metric": "configs resumed bitwise", "value": sum(r["bitwise_equal"] for r in rows),
                        "of": len(rows)}}  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"{res['headline']['value']} of {len(rows)} bitwise; wrote {a.out}")
    return 0 if all(r["bitwise_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
