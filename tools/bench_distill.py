"""On-policy distillation on CPU (issue 19): domain teachers by RL, then one student by
mixed-reward RL or by MOPD, and OPD against GRPO from the same base.

Everything is built by our own code from one seeded tiny Qwen2 (~1M parameters, the
character tokenizer):

1. **base**: supervised fine-tuning on a 50/50 mixture of 2-digit addition and countdown
   (3 numbers up to 9), a fixed number of steps;
2. **teachers**: GRPO from the base on one domain each (arithmetic, countdown);
3. **students**, from the base on the mixture, the same steps and rollouts per step:
   (a) mixed-reward RL (GRPO on both domains' verifiers), (b) MOPD (catalog 004-25: each
   prompt's rollouts scored by its domain's teacher, pure reverse KL), (c) CoPD (001-26:
   one expert per domain as Ray actors, GRPO on its domain plus OPD from the other on
   theirs, weights exchanged ten times; then MOPD from the co-evolved experts into a
   student, the same number of steps again);
4. **OPD vs GRPO** on arithmetic from the base: held-out accuracy per step, OPD taught by
   the arithmetic teacher.

Every model is evaluated greedily on both domains' held-out sets. Jobs of one phase run in
two spawned processes (one torch thread each). Prints the table, writes the common JSON
shape and a PNG of the OPD / GRPO curves.

    uv run --frozen python tools/bench_distill.py            # about 15 min on 2 cores
    uv run --frozen python tools/bench_distill.py --quick    # a smoke run of the pipeline
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import mean_std, print_table, run_pool, write_result

DOMAINS = {
    "arithmetic": {"digits": 2, "ops": "+"},
    "countdown": {"n_numbers": 3, "max_number": 9},
}


def _mixture() -> str:
    parts = [f"{{task: {t}, task_params: {_yaml(p)}}}" for t, p in DOMAINS.items()]
    return f"data.mixture=[{', '.join(parts)}]"


def _yaml(d: dict) -> str:
    return "{" + ", ".join(f"{k}: {v!r}".replace("'", '"') for k, v in d.items()) + "}"


def _common(spec: dict, run_dir: Path) -> list[str]:
    return [
        f"model.path={spec['base']}",
        f"rollout.group_size={spec['group_size']}",
        f"rollout.prompts_per_step={spec['prompts']}",
        f"rollout.max_new_tokens={spec['max_new_tokens']}",
        "rollout.temperature=1.0",
        f"optim.lr={spec['lr']}",
        f"optim.micro_batch_size={spec['prompts'] * spec['group_size']}",
        "algo.kl_coef=0.0",
        f"data.eval_size={spec['eval_size']}",
        f"run.dir={run_dir}",
        f"run.seed={spec['seed']}",
        "run.threads=1",
        "run.progress=false",
        "run.tensorboard=false",
        "reward.workers=0",
    ]


def _eval_both(spec: dict, model, tok, where: Path) -> dict[str, float]:
    """Greedy held-out accuracy of ``model`` on each domain (the mixture's held-out sets)."""
    from rlpost.llm.config import load_config
    from rlpost.llm.trainer import Trainer

    cfg = load_config(None, [*_common(spec, where), _mixture(), "train.steps=1"])
    tr = Trainer(cfg, model=model, tokenizer=tok)
    try:
        m = tr.eval_metrics()
    finally:
        tr.close()
    return {d: m[f"eval/{d}/accuracy"] for d in DOMAINS}


def job(spec: dict) -> dict[str, Any]:
    """One training run (a teacher, a student, or a curve run) and its evaluation."""
    import torch

    from rlpost.llm.config import load_config
    from rlpost.llm.tools.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    torch.set_num_threads(1)
    root = Path(spec["root"])
    run_dir = root / spec["name"]
    extra = list(spec["overrides"])
    cfg = load_config(None, [*_common(spec, run_dir), *extra])
    t0 = time.perf_counter()
    tr = Trainer(cfg)
    tr.train()
    seconds = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    curve = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    acc = _eval_both(spec, tr.model, tr.tok, root / f"{spec['name']}-eval")
    kl = [r["distill/kl"] for r in rows if "distill/kl" in r]
    tr.close()
    return {
        "name": spec["name"],
        "steps": cfg.train_steps(),
        "seconds": seconds,
        "accuracy": acc,
        "curve": curve,
        "distill_kl_first": kl[0] if kl else None,
        "distill_kl_last": kl[-1] if kl else None,
    }


def copd_job(spec: dict, a: argparse.Namespace, root: Path) -> dict[str, dict]:
    """CoPD from the base: one expert per domain (Ray actors, weights exchanged every tenth
    of training), then MOPD from the co-evolved experts into a student, the same steps."""
    import torch

    from rlpost.llm.config import load_config
    from rlpost.llm.runtimes.copd import run_copd

    torch.set_num_threads(1)
    rounds = 10 if a.student_steps % 10 == 0 else 1
    cfg = load_config(
        None,
        [
            *_common(spec, root / "copd"), _mixture(), "algo.preset=copd",
            f"train.steps={a.student_steps}", f"run.eval_every={a.student_steps}",
            f"copd.rounds={rounds}", f"copd.consolidate_steps={a.student_steps}",
        ],
    )  # fmt: skip
    t0 = time.perf_counter()
    s = run_copd(cfg, progress=False)
    seconds = time.perf_counter() - t0
    out = {}
    for d, e in s["experts"].items():
        acc = {k: e[f"eval/{k}/accuracy"] for k in DOMAINS}
        out[f"copd-expert-{d}"] = {"name": f"copd-expert-{d}", "steps": e["step"],
                                   "seconds": s["expert_seconds"], "accuracy": acc}  # fmt: skip
    st = s["student"]
    out["copd"] = {
        "name": "copd", "steps": a.student_steps + st["steps"], "seconds": seconds,
        "accuracy": {k: st[f"eval/{k}/accuracy"] for k in DOMAINS},
    }  # fmt: skip
    print(f"  done copd in {seconds:.0f} s: {out['copd']['accuracy']}", flush=True)
    return out


def build_base(spec: dict, out: Path) -> dict[str, Any]:
    """SFT a fresh tiny model on the two-domain mixture; save it with its tokenizer."""
    import torch
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.data.tasks import Example, Task, make_task
    from rlpost.llm.model import tiny

    @dataclass(frozen=True)
    class Mixed(Task):
        name: ClassVar[str] = "mixed"

        def sample(self, n: int, rng: random.Random) -> list[Example]:
            tasks = {d: make_task(d, **p) for d, p in DOMAINS.items()}
            out = []
            for _ in range(n):
                d = rng.choice(list(DOMAINS))
                e = tasks[d].sample(1, rng)[0]
                out.append(Example(e.prompt, e.answer, {**e.meta, "domain": d}))
            return out

        def score(self, completion: str, example: Example) -> float:
            d = example.meta["domain"]
            return make_task(d, **DOMAINS[d]).score(completion, example)

    torch.set_num_threads(1)
    tok = tiny.build_tokenizer()
    torch.manual_seed(spec["seed"])
    model = Qwen2ForCausalLM(tiny.tiny_config(tok))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    t0 = time.perf_counter()
    tiny.sft_train(model, tok, Mixed(), spec["base_steps"], 32, 1e-3, spec["seed"], progress=True)
    seconds = time.perf_counter() - t0
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    acc = _eval_both({**spec, "base": str(out)}, model, tok, out.parent / "base-eval")
    return {"name": "base", "steps": spec["base_steps"], "seconds": seconds, "accuracy": acc}


def plot(curves: dict[str, list[list]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, per_seed) in enumerate(curves.items()):
        for j, curve in enumerate(per_seed):
            s, v = zip(*curve, strict=True)
            ax.plot(s, v, marker="o", ms=3, color=f"C{i}", alpha=0.8,
                    label=name if j == 0 else None)  # fmt: skip
    ax.set(
        xlabel="step", ylabel="greedy held-out accuracy (2-digit addition)",
        title="OPD from a GRPO teacher vs GRPO, same base",
    )  # fmt: skip
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def one_seed(a: argparse.Namespace, seed: int) -> dict[str, dict]:
    """Base, teachers, students and curve runs of one seed: ``{run name: result}``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spec = {
            "root": str(root), "base": str(root / "base"), "seed": seed,
            "group_size": a.group_size, "prompts": a.prompts, "max_new_tokens": a.max_new_tokens,
            "lr": a.lr, "eval_size": a.eval_size, "base_steps": a.base_steps,
        }  # fmt: skip
        print(f"seed {seed}: base, SFT on the mixture, {a.base_steps} steps", flush=True)
        base = build_base(spec, root / "base")

        def make(name: str, steps: int, *ov: str, eval_every: int = 0) -> dict:
            o = [f"train.steps={steps}", f"run.eval_every={eval_every}", *ov]
            return {**spec, "name": name, "overrides": o}

        def describe(r: dict) -> str:
            accs = ", ".join(f"{d} {v:.3f}" for d, v in r["accuracy"].items())
            return f"{r['name']}: {accs} ({r['seconds']:.0f} s)"

        save = f"run.save_every={a.teacher_steps}"
        teachers = [
            make(
                f"teacher-{d}",
                a.teacher_steps,
                "algo.preset=grpo",
                f"data.task={d}",
                f"data.task_params={_yaml(p)}",
                save,
            )
            for d, p in DOMAINS.items()
        ]
        print(f"teachers: GRPO on each domain, {a.teacher_steps} steps", flush=True)
        done = {r["name"]: r for r in run_pool(job, teachers, 2, describe)}
        routed = ", ".join(f"{{path: {root / f'teacher-{d}'}, domains: [{d}]}}" for d in DOMAINS)
        students = [
            make("mixed-rl", a.student_steps, "algo.preset=grpo", _mixture()),
            make(
                "mopd",
                a.student_steps,
                "algo.preset=mopd",
                _mixture(),
                f"distill.teachers=[{routed}]",
            ),
        ]
        arith = ["data.task=arithmetic", f"data.task_params={_yaml(DOMAINS['arithmetic'])}"]
        every = max(1, a.curve_steps // 10)
        curves = [
            make("grpo-arithmetic", a.curve_steps, "algo.preset=grpo", *arith, eval_every=every),
            make(
                "opd-arithmetic",
                a.curve_steps,
                "algo.preset=opd",
                *arith,
                f"distill.teachers=[{{path: {root / 'teacher-arithmetic'}}}]",
                eval_every=every,
            ),
        ]
        print(f"students: mixed RL and MOPD, {a.student_steps} steps; curves", flush=True)
        done.update({r["name"]: r for r in run_pool(job, students + curves, 2, describe)})
        print(f"CoPD: two experts as Ray actors, {a.student_steps} steps, then MOPD", flush=True)
        done.update(copd_job(spec, a, root))
    done["base"] = base
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-steps", type=int, default=700)
    ap.add_argument("--teacher-steps", type=int, default=200)
    ap.add_argument("--student-steps", type=int, default=200)
    ap.add_argument("--curve-steps", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--eval-size", type=int, default=256)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--quick", action="store_true", help="a few steps of everything")
    ap.add_argument("--out", default="bench_results/llm_distill.json")
    ap.add_argument("--plot", default="docs/img/opd_vs_grpo.png")
    a = ap.parse_args()
    if a.quick:
        a.base_steps, a.teacher_steps, a.student_steps, a.curve_steps = 20, 2, 2, 2
        a.prompts, a.eval_size, a.seeds = 4, 8, [0]
        a.out, a.plot = "bench_results/llm_distill_quick.json", "/tmp/opd_vs_grpo_quick.png"
    t0 = time.perf_counter()
    per_seed = [one_seed(a, seed) for seed in a.seeds]
    order = ["base", "teacher-arithmetic", "teacher-countdown", "mixed-rl", "mopd",
             "copd-expert-arithmetic", "copd-expert-countdown", "copd",
             "grpo-arithmetic", "opd-arithmetic"]  # fmt: skip
    rows = []
    for name in order:
        runs = [done[name] for done in per_seed]
        row: dict[str, Any] = {"model": name, "steps": runs[0]["steps"]}
        for d in DOMAINS:
            row[d], row[f"{d}_std"] = mean_std(r["accuracy"][d] for r in runs)
        row["mean"], row["mean_std"] = mean_std(
            sum(r["accuracy"].values()) / len(DOMAINS) for r in runs
        )
        row["seconds"], _ = mean_std(r["seconds"] for r in runs)
        if name == "mopd":  # the student's cost with its teachers' training
            row["seconds_with_teachers"], _ = mean_std(
                r["seconds"]
                + d["teacher-arithmetic"]["seconds"]
                + d["teacher-countdown"]["seconds"]
                for r, d in zip(runs, per_seed, strict=True)
            )
        for k in ("distill_kl_first", "distill_kl_last"):
            if runs[0].get(k) is not None:
                row[k], _ = mean_std(r[k] for r in runs)
        row["per_seed_mean"] = [sum(r["accuracy"].values()) / len(DOMAINS) for r in runs]
        if runs[0].get("curve"):
            row["curves"] = [r["curve"] for r in runs]
        rows.append(row)
    print_table(
        rows,
        ["model", "arithmetic", "arithmetic_std", "countdown", "countdown_std", "mean",
         "steps", "seconds", "distill_kl_first", "distill_kl_last"],
    )  # fmt: skip
    curves = {n: rows[order.index(n)]["curves"] for n in ("grpo-arithmetic", "opd-arithmetic")}
    plot(curves, Path(a.plot))
    mopd, mixed = rows[order.index("mopd")], rows[order.index("mixed-rl")]
    write_result(
        a.out,
        name="llm_distill",
        catalog_ids=["base", "004-25", "004-11", "001-26"],
        config=vars(a),
        seeds=a.seeds,
        rows=rows,
        headline={
            "metric": "student's mean held-out accuracy over the two domains",
            "value": mopd["mean"],
            "baseline": mixed["mean"],
            "ratio": mopd["mean"] / mixed["mean"] if mixed["mean"] else None,
            "paper": "MOPD keeps nearly all of each teacher's capability, beats mixed RL (004-25)",
        },
    )
    print(f"wrote {a.out} and {a.plot} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
