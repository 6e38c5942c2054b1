"""TEA / Prefix-TEA benchmark: how well m rollouts per prompt estimate the best-of-N gradient.

Command (defaults; writes bench_results/tea.json)::

    uv run --frozen python tools/bench_tea.py --prompts 32 --arms 20 --trials 400 \\
        --m 4 8 --n 16 64 --seeds 0 1 2 --out bench_results/tea.json

Each prompt is a softmax policy over ``arms`` responses with logits ~ N(0, 1) and a fixed
reward per response ~ N(0, 1). The best-of-N objective of a prompt,
J_N = E[max of N rewards] = sum_a r_a (F(r_a)^N - F(r_a^-)^N), is computed exactly from
the policy (no sampling), and its gradient over all prompts' logits by autograd: the
reference direction (the limit of the "many rollouts" estimate). Each trial samples m
responses per prompt and forms the score-function estimate
g = sum_prompts sum_i A_i grad log pi(a_i) with the advantages of

* ``grpo``: (r - mean) / std (the mean-reward direction the standard objective follows);
* ``dr_grpo``: r - mean;
* ``tea``: the Gaussian tail-extrapolated best-of-N advantage;
* ``prefix_tea``: its leave-one-out, predictive-scale debiased form;

and the table reports the cosine between g and the exact best-of-N gradient (mean over
trials and seeds; higher is better).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch
from benchlib import mean_std, print_table, write_result

from rlpost.core import ADVANTAGES, AdvantageInput

METHODS = {
    "grpo": ("grpo", {}),
    "dr_grpo": ("grpo", {"scale_by_std": False}),
    "tea": ("tea", {}),
    "prefix_tea": ("prefix_tea", {}),
}


def best_of_n_objective(logits: torch.Tensor, rewards: torch.Tensor, n: int) -> torch.Tensor:
    """sum over prompts of E[max of n draws], exact: ``logits``, ``rewards`` ``[P, A]``."""
    order = rewards.argsort(1)
    r = rewards.gather(1, order)
    pi = logits.softmax(1).gather(1, order)
    cdf = pi.cumsum(1)
    prev = torch.cat([torch.zeros_like(cdf[:, :1]), cdf[:, :-1]], 1)
    return (r * (cdf.clamp(max=1.0) ** n - prev**n)).sum()


def run(prompts: int, arms: int, m: int, n: int, trials: int, seed: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(prompts, arms, generator=gen, dtype=torch.float64)
    rewards = torch.randn(prompts, arms, generator=gen, dtype=torch.float64)
    lg = logits.clone().requires_grad_(True)
    best_of_n_objective(lg, rewards, n).backward()
    ref = lg.grad.flatten()
    pi = logits.softmax(1)
    groups = torch.arange(prompts).repeat_interleave(m)
    est = {
        k: ADVANTAGES.build(name, **({"n": n} if name in ("tea", "prefix_tea") else {}), **p)
        for k, (name, p) in METHODS.items()
    }
    cos: dict[str, list[float]] = {k: [] for k in METHODS}
    for _ in range(trials):
        a = torch.multinomial(pi, m, replacement=True, generator=gen)  # [P, m]
        r = rewards.gather(1, a).flatten()
        onehot = torch.nn.functional.one_hot(a, arms).double()  # [P, m, A]
        score = onehot - pi[:, None, :]  # grad of log pi(a) w.r.t. the prompt's logits
        for k, fn in est.items():
            adv = fn(AdvantageInput(r, groups)).advantages.double().view(prompts, m)
            g = (adv[:, :, None] * score).sum(1).flatten()
            c = (g @ ref) / (g.norm() * ref.norm()).clamp_min(1e-30)
            cos[k].append(float(c))
    return {k: sum(v) / len(v) for k, v in cos.items()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--arms", type=int, default=20)
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--m", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--n", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="bench_results/tea.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = []
    for n in args.n:
        for m in args.m:
            per_seed = [run(args.prompts, args.arms, m, n, args.trials, s) for s in args.seeds]
            row = {"N": n, "m": m}
            for k in METHODS:
                mu, sd = mean_std(r[k] for r in per_seed)
                row[k] = mu
                row[f"{k}_std"] = sd
            rows.append(row)
    print_table(rows, ["N", "m", *METHODS])
    best = max(rows, key=lambda r: r["N"] * 100 - r["m"])  # largest N, smallest m
    write_result(
        args.out,
        name="tea",
        catalog_ids=["001-02"],
        config=vars(args),
        seeds=args.seeds,
        rows=rows,
        headline={
            "metric": f"cosine to the exact best-of-{best['N']} gradient, m={best['m']}",
            "value": best["tea"],
            "baseline": best["grpo"],
            "ratio": best["tea"] / best["grpo"] if best["grpo"] else None,
            "paper": "TEA/Prefix-TEA improve best-of-N performance with m << N (no cosine reported)",
        },
    )
    print(f"wrote {args.out} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
