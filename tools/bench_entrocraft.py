"""Entrocraft (catalog 001-28) on a softmax bandit: does the entropy follow the schedule?

Command (defaults; writes bench_results/entrocraft.json and docs/img/entrocraft_bandit.png)::

    uv run --frozen python tools/bench_entrocraft.py --seeds 0 1 2 --steps 400 \\
        --out bench_results/entrocraft.json --plot docs/img/entrocraft_bandit.png

Setup: ``--prompts`` independent bandits ("prompts") of ``--arms`` arms each; arm k of
prompt j pays a Bernoulli reward with probability q_jk ~ U(0, 1) (drawn per seed). The
policy is a table of logits ``theta [P, K]`` initialised to 0 (uniform, H0 = log K). Each
step samples ``--group`` arms per prompt (one GRPO group per prompt), computes advantages
with the registry entry under test, and takes the exact softmax policy-gradient step

    theta_j += lr / G * sum_i A_i (e_{a_i} - pi_j)        (grad of sum_i A_i log pi(a_i))

Methods: ``grpo`` (plain GRPO advantages) and ``entrocraft`` (the same GRPO advantages
after rejection, with a linear schedule H* = (start + (end - start) * progress) * H0).
Entrocraft is fed ``logprobs`` of the sampled arms and ``TrainingDynamics(progress,
entropy, initial_entropy)`` with the exact mean policy entropy over prompts. Reported per
checkpoint (mean over seeds): the target, the entropy of both methods, the expected
reward sum_k pi_k q_k, and Entrocraft's rejected fraction; the tracking error
|H - H*| (nats and relative to H0) over all steps. Runs in seconds on one core.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import mean_std, print_table, write_result

from rlpost.core import ADVANTAGES, AdvantageInput, TrainingDynamics


def entropy(theta: torch.Tensor) -> torch.Tensor:
    """Exact entropy of each row's softmax, ``[P]``."""
    lp = theta.log_softmax(-1)
    return -(lp.exp() * lp).sum(-1)


def run(gain: float | None, seed: int, args: argparse.Namespace) -> dict[str, list[float]]:
    """One training run: plain GRPO when ``gain`` is None, else Entrocraft with that gain."""
    P, K, G = args.prompts, args.arms, args.group
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(P, K, generator=g, dtype=torch.float64)  # same bandits for every method
    theta = torch.zeros(P, K, dtype=torch.float64)
    group_ids = torch.arange(P).repeat_interleave(G)  # [P*G]
    if gain is None:
        est = ADVANTAGES.build("grpo")
    else:
        est = ADVANTAGES.build(
            "entrocraft", start=args.start, end=args.end, gain=gain, p_max=args.p_max, seed=seed
        )
    sampler = torch.Generator().manual_seed(10_000 + seed)  # same draws for every method
    h0 = entropy(theta).mean().item()
    hist: dict[str, list[float]] = {"entropy": [], "reward": [], "target": [], "rejected": []}
    for t in range(args.steps):
        progress = t / max(args.steps - 1, 1)
        pi = theta.softmax(-1)  # [P, K]
        arms = torch.multinomial(pi, G, replacement=True, generator=sampler)  # [P, G]
        r = torch.bernoulli(q.gather(1, arms), generator=sampler).flatten()  # [P*G]
        logp = pi.log().gather(1, arms).reshape(P * G, 1)  # behaviour log-probs, T = 1
        h = entropy(theta).mean().item()
        inp = AdvantageInput(
            r.float(),
            group_ids,
            logprobs=logp.float(),
            dynamics=TrainingDynamics(progress, entropy=h, initial_entropy=h0),
        )
        out = est(inp)
        adv = out.advantages.double().reshape(P, G)
        grad = torch.zeros_like(theta).scatter_add_(1, arms, adv) - pi * adv.sum(1, keepdim=True)
        theta += args.lr / G * grad
        hist["entropy"].append(h)
        hist["reward"].append((pi * q).sum(-1).mean().item())
        hist["target"].append((args.start + (args.end - args.start) * progress) * h0)
        hist["rejected"].append(out.metrics.get("entrocraft_rejected_frac", 0.0))
    return hist


def label(gain: float | None) -> str:
    return "grpo" if gain is None else f"entrocraft g={gain:g}"


def plot(runs: dict[str, list[dict[str, list[float]]]], out: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    steps = np.arange(args.steps)
    for name, hs in runs.items():
        for key, ax in (("entropy", axes[0]), ("reward", axes[1])):
            ys = np.array([h[key] for h in hs])
            (line,) = ax.plot(steps, ys.mean(0), lw=1.3, label=name)
            ax.fill_between(steps, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.15)
    first = next(iter(runs.values()))[0]
    axes[0].plot(steps, first["target"], "k--", lw=1, label="target H*")
    axes[0].set_ylabel("policy entropy (nats)")
    axes[1].set_ylabel("expected reward")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"softmax bandit, {args.prompts} prompts x {args.arms} arms, G={args.group}, "
        f"lr {args.lr}; schedule {args.start} -> {args.end} x H0 (mean, min-max over "
        f"{len(args.seeds)} seeds)",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--arms", type=int, default=100)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--start", type=float, default=1.0)
    ap.add_argument("--end", type=float, default=0.7)
    ap.add_argument(
        "--gains", type=float, nargs="+", default=[1.0, 10.0, 50.0], help="last = headline"
    )
    ap.add_argument("--p-max", type=float, default=1.0)
    ap.add_argument("--checkpoints", type=int, default=8, help="table rows")
    ap.add_argument("--out", default="bench_results/entrocraft.json")
    ap.add_argument("--plot", default="docs/img/entrocraft_bandit.png", help="'' to skip")
    args = ap.parse_args()
    torch.set_num_threads(1)

    t0 = time.perf_counter()
    gains: list[float | None] = [None, *args.gains]
    runs = {label(gn): [run(gn, s, args) for s in args.seeds] for gn in gains}
    head = label(args.gains[-1])
    h0 = runs["grpo"][0]["entropy"][0]

    def avg(name: str, key: str, t: int) -> float:
        return mean_std([h[key][t] for h in runs[name]])[0]

    every = max(args.steps // args.checkpoints, 1)
    checkpoints: list[dict[str, Any]] = []
    for t in [*range(0, args.steps, every), args.steps - 1]:
        row: dict[str, Any] = {"kind": "checkpoint", "step": t, "target": avg(head, "target", t)}
        row.update({f"H {name}": avg(name, "entropy", t) for name in runs})
        row.update({f"reward {name}": avg(name, "reward", t) for name in ("grpo", head)})
        row[f"rejected {head}"] = avg(head, "rejected", t)
        checkpoints.append(row)
    summary: list[dict[str, Any]] = []
    for name, hs in runs.items():
        errs = [abs(h - tg) for r in hs for h, tg in zip(r["entropy"], r["target"], strict=True)]
        reward, reward_std = mean_std([r["reward"][-1] for r in hs])
        summary.append(
            {
                "kind": "tracking",
                "method": name,
                "max_abs_err": max(errs),
                "mean_abs_err": sum(errs) / len(errs),
                "max_rel_err": max(errs) / h0,
                "mean_rel_err": sum(errs) / len(errs) / h0,
                "final_H": mean_std([r["entropy"][-1] for r in hs])[0],
                "final_reward": reward,
                "final_reward_std": reward_std,
                "rejected_mean": sum(sum(r["rejected"]) for r in hs) / (len(hs) * args.steps),
            }
        )
    print(
        f"\nsoftmax bandit: {args.prompts} prompts x {args.arms} arms, G={args.group}, "
        f"lr {args.lr}, {args.steps} steps; H0 = log K = {h0:.3f} nats; schedule "
        f"{args.start} -> {args.end} x H0; p_max {args.p_max}; mean over seeds {args.seeds}"
    )
    cols = ["step", ("target", "target H*")]
    cols += [(f"H {n}", f"H {n}") for n in runs]
    cols += [(f"reward {n}", f"reward {n}") for n in ("grpo", head)]
    print_table(checkpoints, [*cols, (f"rejected {head}", "rejected")])
    print("\n|H - H*| over all steps and seeds; final entropy and expected reward:")
    print_table(
        summary,
        [
            "method",
            ("max_abs_err", "max nats"),
            ("mean_abs_err", "mean nats"),
            ("max_rel_err", "max / H0"),
            ("mean_rel_err", "mean / H0"),
            ("final_H", "final H"),
            ("final_reward", "final reward"),
            ("final_reward_std", "±"),
            ("rejected_mean", "rejected"),
        ],
    )
    by = {r["method"]: r for r in summary}
    out = write_result(
        args.out,
        name="entrocraft_bandit",
        catalog_ids=["001-28"],
        config=vars(args),
        seeds=args.seeds,
        rows=summary + checkpoints,
        headline={
            "metric": f"mean |H - H*| / H0 over all steps, {head} vs plain GRPO",
            "value": by[head]["mean_rel_err"],
            "baseline": by["grpo"]["mean_rel_err"],
            "ratio": by[head]["mean_rel_err"] / max(by["grpo"]["mean_rel_err"], 1e-12),
            "paper": None,
        },
    )
    if args.plot:
        plot(runs, Path(args.plot), args)
        print(f"wrote {args.plot}")
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
