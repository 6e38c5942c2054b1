"""Multi-turn agents on CPU (issue 20): GRPO vs StepOPSD (000-03) vs A²TGPO (001-15) on the
household text world and the search environment, from each one's tiny base.

The base (:func:`rlpost.llm.data.envs.pretrain.build_env_base`, cached) is SFT-trained on
scripted demonstrations that search the house in a random order; half of them start with a
hindsight hint (the episode's own solution), so the policy can also follow a hint. The
world hides a regularity: each object usually lies at its home place. Under a tight turn
budget, looking at an object's home first is what RL can find. From the same base:

* ``grpo``: the trajectory's outcome advantage on every action token;
* ``step_opsd``: the same advantage redistributed over the steps by the policy's own
  log-prob gap under a hindsight context (the group's shortest solved episode as a hint),
  never changing its sign;
* ``sd_search`` (search only): GRPO plus the token-level JSD to the same hindsight
  self-teacher at the search-query tokens only (000-16);
* ``rubricem`` (search only): RubricEM's Stage-Structured GRPO (000-30), each turn scored
  by the environment's rubric judge for its stage (research: a valid query that found a
  new chain fact; answer: right and grounded), each stage normalised in its group;
* ``rubricem_episodes`` / ``rubricem_frozen`` (``search_reflect`` only): RubricEM whole
  on multi-turn episodes, Stage-Structured GRPO plus the reflection meta-policy: the
  policy reflects on each task's first failed episode as the judge scored it, half of the
  group's episodes read a reflection each, and the reflections are trained on the
  outcomes of the episodes they guided (frozen: ``meta: false``, never trained);
* ``a2tgpo``: a turn-group-normalised per-turn signal accumulated with variance
  rescaling, plus the outcome advantage, with adaptive turn-level clip ranges. On the
  search environment the signal is the abstract's information gain (the change in the
  policy's probability of the right answer across the turn); the household world has no
  answer to predict, so there it is the world's progress (sub-goals completed by the turn).

The search environment's episodes have ``slack: 0``: one precise query per hop and the
answer fit, the base's vague queries (half of its demonstrations) do not.

Prints held-out greedy success before and after per method (mean of seeds), writes the
common JSON shape and a PNG of the curves.

    uv run --frozen python tools/bench_agents.py                # household, about 9 min
    uv run --frozen python tools/bench_agents.py --env search   # search
    uv run --frozen python tools/bench_agents.py --env search3  # three hops, its own base
    uv run --frozen python tools/bench_agents.py --env search_plan  # a plan first (RubricEM)
    uv run --frozen python tools/bench_agents.py --env search_reflect  # RubricEM's reflection
    uv run --frozen python tools/bench_agents.py --quick        # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    curve_row,
    mean_std,
    method_overrides,
    plot_mean_curves,
    print_table,
    run_pool,
    write_result,
)

DEFAULTS = {  # each world's episode parameters: a budget tight enough to leave room
    "household": {"params": "{budget: 8}", "max_turns": 8, "max_new_tokens": 3, "steps": 100},
    # the search base's vague queries are unlearned fast: compare how fast
    "search": {"params": "{slack: 0}", "max_turns": 7, "max_new_tokens": 5, "steps": 24},
    # the harder search benchmark: three hops every time, on its own base
    "search3": {
        "world": "search",
        "params": "{min_hops: 3, max_hops: 3, slack: 0}",
        "base": {"min_hops": 3, "max_hops": 3},
        "max_turns": 4,
        "max_new_tokens": 5,
        "steps": 40,
    },
    # RubricEM's self-generated rubric: a plan first (how to open each hop), on its own base
    "search_plan": {
        "world": "search",
        "params": "{plan: true, slack: 0}",
        "base": {"plan": True},
        "max_turns": 7,
        "max_new_tokens": 5,
        "steps": 24,
    },
    # RubricEM's reflection on judged episodes: a base that also reflects and follows
    # guidance; the sampled success is where the methods can differ (greedy saturates)
    "search_reflect": {
        "world": "search",
        "params": "{plan: true, reflect: true, slack: 0}",
        "base": {"plan": True, "reflect": True},
        "max_turns": 7,
        "max_new_tokens": 5,
        "steps": 40,
    },
}
METHODS = {
    "grpo": ["algo.preset=grpo"],
    "step_opsd": [
        "algo.preset=step_opsd",
        "distill.teachers=[{path: self, template: '{hindsight}{prompt}'}]",
    ],
    "a2tgpo": ["algo.preset=a2tgpo"],
    "sd_search": [  # the search environment only
        "algo.preset=sd_search",
        "distill.teachers=[{path: self, template: '{hindsight}{prompt}'}]",
    ],
    "rubricem": ["algo.preset=rubricem"],  # the search environment's rubric judge
    "rubricem_episodes": ["algo.preset=rubricem_episodes"],  # search_reflect only
    "rubricem_frozen": ["algo.preset=rubricem_episodes", "algo.episode_reflection={meta: false}"],
}
SEARCH_ONLY = ("sd_search", "rubricem")
REFLECT = ("grpo", "rubricem", "rubricem_episodes", "rubricem_frozen")


def world(env: str) -> str:
    """The environment a benchmark setting runs in (``search3`` is the search world)."""
    return DEFAULTS[env].get("world", env)


def methods(env: str) -> list[str]:
    if env == "search_reflect":
        return list(REFLECT)
    return [m for m in METHODS if m not in REFLECT[2:]
            and (m not in SEARCH_ONLY or world(env) == "search")]  # fmt: skip


def first_last(rows: list[dict], key: str) -> tuple[float, float]:
    """A logged series' first value and the mean of its last five (NaN: never logged)."""
    xs = [r[key] for r in rows if key in r]
    return (xs[0], sum(xs[-5:]) / len(xs[-5:])) if xs else (float("nan"), float("nan"))


def job(spec: dict) -> dict[str, Any]:
    import torch

    from rlpost.llm.config import load_config
    from rlpost.llm.tools.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    torch.set_num_threads(1)
    run_dir = Path(spec["root"]) / f"{spec['name']}-{spec['seed']}"
    signal = "ig" if spec["name"] == "a2tgpo" and world(spec["env"]) == "search" else "env"
    if spec["name"].startswith("rubricem"):
        signal = "rubric"
    cfg = load_config(
        None,
        [
            "model.path=tiny",
            f"data.env={{name: {world(spec['env'])}, params: {spec['params']}, "
            f"max_turns: {spec['max_turns']}, turn_signal: {signal}}}",
            f"data.eval_size={spec['eval_size']}", f"rollout.prompts_per_step={spec['prompts']}",
            f"rollout.group_size={spec['group_size']}", f"rollout.max_new_tokens={spec['max_new_tokens']}",
            "rollout.temperature=1.0", f"optim.lr={spec['lr']}",
            f"optim.micro_batch_size={spec['group_size'] * spec['prompts']}",
            "algo.kl_coef=0.0", f"train.steps={spec['steps']}",
            f"run.eval_every={spec['eval_every']}", "run.save_every=0",
            f"run.seed={spec['seed']}", "run.threads=1", "run.progress=false",
            "run.tensorboard=false", "reward.workers=0", f"run.dir={run_dir}",
            *METHODS[spec["name"]],
            *spec.get("extra", {}).get(spec["name"], []),
        ],
    )  # fmt: skip
    t0 = time.perf_counter()
    tr = Trainer(cfg)
    retry = {}
    held = [10**9 + i for i in range(spec["eval_size"])]  # the held-out seeds
    if spec["env"] == "search_reflect":  # attempt, reflect on the judged attempt, retry
        from rlpost.llm.rollout.sources.reflect import reflective_success

        retry = {f"retry_base_{k}": v for k, v in reflective_success(tr, held).items()}
    tr.train()
    if retry:
        retry |= {f"retry_{k}": v for k, v in reflective_success(tr, held).items()}
    tr.close()
    rows = read_metrics(run_dir)
    curve = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    out = {"name": spec["name"], "seed": spec["seed"], "curve": curve}
    for key, series in (("turns", "env/turns"), ("plan", "env/plan_precise"),
                        ("solved", "env/solved"), ("exact", "reflect/exact"),
                        ("guided", "reflect/guided_solved")):  # fmt: skip
        out[f"{key}_first"], out[f"{key}_last"] = first_last(rows, series)
    return out | retry | {"seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="household", choices=sorted(DEFAULTS))
    ap.add_argument("--steps", type=int, default=None, help="default: the world's")
    ap.add_argument("--eval-every", type=int, default=None, help="default: steps / 6")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--eval-size", type=int, default=256)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--methods", nargs="+", default=None, help="default: the world's all")
    ap.add_argument("--set", nargs="+", default=[], metavar="METHOD=OVERRIDE",
                    help="an override for one method, e.g. \"step_opsd=algo.advantage={name: "
                    "step_opsd, params: {alpha_clip: 0.5}}\"")  # fmt: skip
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args()
    extra = method_overrides(ap, a.set, METHODS)
    a.steps = a.steps or DEFAULTS[a.env]["steps"]
    a.out = a.out or f"bench_results/llm_agents_{a.env}.json"
    a.plot = a.plot or f"docs/img/agents_{a.env}.png"
    if a.quick:
        a.steps, a.prompts, a.group_size, a.eval_size, a.seeds = 2, 2, 4, 16, [0]
        a.out, a.plot = f"bench_results/llm_agents_{a.env}_quick.json", "/tmp/agents_quick.png"
    a.eval_every = a.eval_every or max(1, a.steps // 6)
    chosen = [m for m in methods(a.env) if a.methods is None or m in a.methods]
    from rlpost.llm.data.envs.pretrain import build_env_base

    t0 = time.perf_counter()
    # cached; built once (minutes) before the jobs
    base = build_env_base(world(a.env), DEFAULTS[a.env].get("base"))
    with tempfile.TemporaryDirectory(prefix="bench_agents_") as tmp:
        spec = {
            "root": tmp, "env": a.env, **DEFAULTS[a.env], "eval_size": a.eval_size,
            "prompts": a.prompts, "group_size": a.group_size, "lr": a.lr, "steps": a.steps,
            "eval_every": a.eval_every, "extra": extra,
        }  # fmt: skip
        jobs = [{**spec, "name": n, "seed": s} for n in chosen for s in a.seeds]
        done = run_pool(
            job, jobs, 2, lambda r: f"{r['name']} seed {r['seed']}: {r['curve'][-1][1]:.3f}"
        )
    rows, curves = [], {}
    for name in chosen:
        runs = sorted((r for r in done if r["name"] == name), key=lambda r: r["seed"])
        row = curve_row(name, runs)
        curves[name] = row["curves"]
        for k in runs[0]:
            if k.endswith(("_first", "_last")) or k.startswith("retry_") or k == "seconds":
                row[k], _ = mean_std(r[k] for r in runs)
        rows.append(row)
    plan = ["plan_first", "plan_last"] if "plan" in DEFAULTS[a.env]["params"] else []
    if a.env == "search_reflect":  # the sampled success, and the reflections'
        plan += [
            "solved_first",
            "solved_last",
            "exact_first",
            "exact_last",
            "guided_last",
            "retry_base_first",
            "retry_base_two_attempts",
            "retry_base_exact",
            "retry_first",
            "retry_two_attempts",
        ]
    print_table(
        rows, ["method", "before", "after", "after_std", "best", "auc", "turns_first",
               "turns_last", *plan, "seconds"],
    )  # fmt: skip
    plot_mean_curves(
        curves,
        a.plot,
        x=0,
        y=1,
        xlabel="step",
        ylabel=f"held-out greedy success ({DEFAULTS[a.env]['params']})",
        title=f"multi-turn agents, tiny model, {a.env} world",
    )
    by = {r["method"]: r for r in rows}
    for m in ("grpo", "step_opsd"):  # (the headline's two, whatever --methods chose)
        by.setdefault(m, {"after": float("nan")})
    headline = {
        "metric": f"held-out greedy success on the {a.env} world after {a.steps} steps, "
        "StepOPSD vs GRPO",
        "value": by["step_opsd"]["after"],
        "baseline": by["grpo"]["after"],
        "ratio": by["step_opsd"]["after"] / by["grpo"]["after"]
        if by["grpo"]["after"] == by["grpo"]["after"] and by["grpo"]["after"]
        else None,
        "paper": "StepOPSD is best or second-best on ALFWorld Heat / PickTwo (000-03); "
        "A²TGPO's turn-level credit beats outcome-only GRPO (001-15)",
    }
    if a.env == "search_reflect":
        headline = reflect_headline(by, a.steps)
    write_result(
        a.out,
        name=f"llm_agents_{a.env}",
        catalog_ids=["000-03", "001-15", "000-16", "000-30"],
        config={**vars(a), "base": str(base)},
        seeds=a.seeds,
        rows=rows,
        headline=headline,
    )
    print(f"wrote {a.out} and {a.plot} in {time.perf_counter() - t0:.0f} s")


def reflect_headline(by: dict[str, dict], steps: int) -> dict[str, Any]:
    """RubricEM's reflection, trained against frozen: the sampled success of the plain
    episodes over the last five steps."""
    nan = {"solved_last": float("nan")}
    value = by.get("rubricem_episodes", nan)["solved_last"]
    base = by.get("rubricem_frozen", nan)["solved_last"]
    return {
        "metric": f"sampled success of plain episodes, last 5 of {steps} steps, reflections "
        "trained (rubricem_episodes) vs frozen (meta: false)",
        "value": value,
        "baseline": base,
        "ratio": value / base if base == base and base else None,
        "paper": "RubricEM's reflection meta-policy distills judged trajectories into "
        "reusable guidance for future attempts (000-30)",
    }


if __name__ == "__main__":
    main()
