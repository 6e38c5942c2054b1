"""PUST (catalog 004-04): a proxy's relative improvement transferred to a primary model.

Per seed, from the tiny 2-digit addition base: the proxy is a short GRPO run
(``--proxy-steps`` of the demo recipe), the primary a stronger model of the same
architecture, a longer GRPO run from the same base with another seed (``--steps``).
The proxy's update (its checkpoint minus the base) is added to the primary at each
strength ``--alphas``, and to the base itself (``alpha = 1`` there reproduces the proxy).
Reported, mean and spread over seeds: held-out greedy accuracy of each. The seed paper
reports update signals from substantially weaker proxies robustly and adjustably
enhancing stronger primary models (Qwen3 family, math and code).

    uv run --frozen python tools/bench_pust.py --steps 100 --proxy-steps 30 --seeds 0 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import mean_std, print_table, write_result
from llm_demo_runs import train_demo

from rlpost.llm.config import load_config
from rlpost.llm.model.tiny import build_base
from rlpost.llm.tools.evaluate import evaluate_config
from rlpost.llm.tools.pust import pust
from rlpost.llm.tools.weights import checkpoint_of


def one_seed(a: argparse.Namespace, seed: int, root: Path) -> dict[str, float]:
    base = build_base("arithmetic", progress=False, digits=2, ops="+")
    proxy, primary = root / f"proxy-{seed}", root / f"primary-{seed}"
    short = argparse.Namespace(**{**vars(a), "steps": a.proxy_steps, "eval_every": a.proxy_steps})
    train_demo(proxy, seed, short, [f"model.path={base}", f"run.save_every={a.proxy_steps}"])
    train_demo(primary, seed + 100, a, [f"model.path={base}", f"run.save_every={a.steps}"])
    cfg = load_config(str(primary / "config.yaml"), ["reward.workers=0"])

    def acc(folder: Path | None) -> float:
        return evaluate_config(cfg, None if folder is None else str(folder))["greedy_accuracy"]

    out = {"base": acc(None), "proxy": acc(checkpoint_of(proxy)[1]),
           "primary": acc(checkpoint_of(primary)[1])}  # fmt: skip
    for alpha in a.alphas:
        out[f"primary + {alpha} x proxy update"] = acc(
            Path(pust(proxy, primary, root / f"p-{seed}-{alpha}", alpha)["written"])
        )
    out["base + 2.0 x proxy update"] = acc(
        Path(pust(proxy, base, root / f"b-{seed}", 2.0)["written"])
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--proxy-steps", type=int, default=30)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench_results/pust.json")
    a = ap.parse_args()
    a.eval_every = a.steps
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_seed(a, s, Path(tmp)) for s in a.seeds]
    rows = []
    for k in runs[0]:
        m, s = mean_std(r[k] for r in runs)
        rows.append({"model": k, "heldout_acc": m, "heldout_acc_std": s})
    print_table(rows, ["model", "heldout_acc", "heldout_acc_std"])
    by = {r["model"]: r["heldout_acc"] for r in rows}
    best = max((k for k in by if k.startswith("primary +")), key=by.get)
    write_result(
        a.out,
        name="pust",
        catalog_ids=["004-04"],
        config=vars(a),
        seeds=a.seeds,
        rows=rows,
        headline={
            "metric": f"held-out accuracy of the primary with the proxy's update ({best}) vs the "
            "primary alone",
            "value": by[best],
            "baseline": by["primary"],
            "ratio": by[best] / max(by["primary"], 1e-9),
            "paper": "update signals from weaker proxies robustly and adjustably enhance stronger "
            "primary models",
        },
    )
    print(f"wrote {a.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
