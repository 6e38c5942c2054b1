"""Run the command-line transcripts the docs show, and keep what they printed.

A page that shows a command and its output (``$ uv run rlpost-robot residual ...`` and the
table it prints) cites the log this tool wrote for it, ``docs/results/transcripts/<name>.log``;
``tests/test_docs.py`` checks that the log's commands are the page's and that every number
of the page's printed output is in the log.

    uv run --frozen python tools/transcripts.py --list
    uv run --frozen python tools/transcripts.py robot_residual diffusion_methods
    uv run --frozen python tools/transcripts.py --all          # every one, in turn (~25 min)

Each transcript runs in a fresh temporary directory (so ``runs/...`` starts empty, as for a
new user; caches such as the tiny bases are shared), through this checkout's environment
(``uv run X`` runs ``.venv/bin/X``), its commands in turn in one shell. A command ending
in ``&`` runs in the background until the rest have finished; what it printed by then is
logged under it. The log starts with a header line (date, commit, machine, threads), then
each ``$ command`` and its output (colour codes removed, a progress bar's last state kept),
and ends with the exit status and the wall time.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_model

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "results" / "transcripts"


@dataclass(frozen=True)
class Transcript:
    page: str  # the page that shows it
    commands: tuple[str, ...]  # exactly as the page shows them
    ready: str = ""  # a background command's line that says it is up
    timeout_s: int = 1200
    in_repo: bool = False  # run in the checkout (a tools/ script), not a fresh directory


TRANSCRIPTS = {
    "llm_demo": Transcript("docs/llm.md", ("uv run rlpost-llm demo",)),
    "llm_sync_whole": Transcript(
        "docs/llm.md",
        (
            "uv run rlpost-llm train --config grpo_arithmetic rollout.workers=2 train.steps=3 "
            "run.eval_every=0",
        ),
    ),
    "llm_sync_lora": Transcript(
        "docs/llm.md",
        (
            "uv run rlpost-llm train --config grpo_arithmetic rollout.workers=2 train.steps=3 "
            'run.eval_every=0 "model.lora={r: 4}"',
        ),
    ),
    "llm_reward_model": Transcript(
        "docs/algorithms/variance_rm.md", ("uv run rlpost-llm reward-model --out runs/rm",)
    ),
    "diffusion_methods": Transcript("docs/diffusion.md", ("uv run rlpost-diffusion methods",)),
    "diffusion_reward_server": Transcript(
        "docs/diffusion.md",
        (
            "OMP_NUM_THREADS=1 uv run rlpost-diffusion reward-server --reward geneval &",
            "uv run rlpost-diffusion train --config flow_grpo_digits "
            "reward.name=http://127.0.0.1:18085/ train.steps=3",
            "uv run rlpost-diffusion train --config flow_grpo_digits reward.name=geneval "
            "train.steps=3 run.dir=runs/in_process",
        ),
        ready="serving reward",
    ),
    "robot_tasks": Transcript("docs/robot.md", ("uv run rlpost-robot tasks --episodes 50",)),
    "robot_deploy": Transcript("docs/robot.md", ("uv run rlpost-robot deploy --config contour",)),
    "robot_residual": Transcript(
        "docs/robot.md", ("uv run rlpost-robot residual --config decoding",)
    ),
    "robot_fleet": Transcript(
        "docs/robot.md", ("uv run rlpost-robot fleet --robots 2 --minutes 1",)
    ),
    "robot_fleet_otql": Transcript(
        "docs/robot.md",
        ("uv run rlpost-robot fleet --config otql_multimodal_reach --robots 2 --minutes 1",),
    ),
}

TRANSCRIPTS.update(
    robot_demo=Transcript("docs/robot.md", ("uv run rlpost-robot demo",)),
    llm_dpo=Transcript("docs/llm.md", ("uv run rlpost-llm dpo --config dpo_arithmetic",)),
    llm_dpo_beta_01=Transcript(
        "docs/llm.md",
        (
            "uv run rlpost-llm dpo --config dpo_arithmetic loss.per_loss.dpo.beta=0.1 "
            "optim.lr=5e-5 train.steps=400",
        ),
    ),
)
# numbers quoted in prose, from one run each: the rewrite agent's 40 steps (docs/agents.md),
# OPSD's self-teacher without privileged knowledge, RAC's two pair variants at their first
# step, OTQL's first-tried settings on Reacher
_FIRST_ROW = (
    "import json, sys; rows = [json.loads(s) for s in open(sys.argv[1])]; "
    "keys = sys.argv[2].split(','); "
    "[print(r['step'], *(f'{k}={r[k]:.3f}' for k in keys if k in r)) for r in rows "
    "if any(k in r for k in keys)]"
)
TRANSCRIPTS.update(
    agents_kg=Transcript(
        "docs/agents.md", ("uv run rlpost-llm train --config grpo_kg train.steps=60",)
    ),
    agents_rewrite=Transcript(
        "docs/agents.md", ("uv run rlpost-llm train --config grpo_rewrite train.steps=40",)
    ),
    opsd_correct_rows=Transcript(
        "docs/algorithms/opsd.md",
        (
            "uv run rlpost-llm train --config opsd_arithmetic train.steps=2 "
            "algo.distill_rows=correct",
        ),
    ),
    rac_pair_sides=Transcript(
        "docs/algorithms/rac.md",
        (
            "uv run rlpost-llm train --config rac_arithmetic train.steps=1 "
            "algo.rac.pair_sample=false run.dir=runs/rescored",
            "uv run rlpost-llm train --config rac_arithmetic train.steps=1 run.dir=runs/sampled",
            f'uv run python -c "{_FIRST_ROW}" runs/rescored/metrics.jsonl '
            "rac/pair_loss,rac/confidence_drop",
            f'uv run python -c "{_FIRST_ROW}" runs/sampled/metrics.jsonl '
            "rac/pair_loss,rac/confidence_drop",
        ),
    ),
    otql_first_try=Transcript(
        "docs/algorithms/otql.md",
        (
            "uv run rlpost-robot train --config otql_reacher algo.params.ot_coef=1.0 "
            "algo.params.beta=2.0",
            f'uv run python -c "{_FIRST_ROW}" runs/otql_reacher/metrics.jsonl '
            "success,adv_samples,adv_data,target_from_data",
        ),
    ),
)
# outputs shown without their command line in the block: the reward-hacking monitor, a
# run's traces, the MuJoCo control command, the batch-invariance measurement
TRANSCRIPTS.update(
    hacking_monitor=Transcript(
        "docs/algorithms/hacking.md",
        (
            'uv run rlpost-llm monitor --config grpo_arithmetic --context "training=0:{prompt}" '
            "--samples 8",
        ),
    ),
    llm_traces=Transcript(
        "docs/llm.md",
        (
            "uv run rlpost-llm train --config grpo_arithmetic run.traces=true train.steps=3 "
            "run.eval_every=0 run.dir=tr2",
            "uv run rlpost-llm traces tr2 --groups 1 --step 3",
        ),
    ),
    diffusion_demo=Transcript("docs/diffusion.md", ("uv run rlpost-diffusion demo",)),
    robot_control=Transcript(
        "docs/robot.md",
        (
            "uv run rlpost-robot control --config pair_grpo_half_cheetah iterations=20 "
            "run.dir=runs/ctl",
        ),
    ),
    batch_invariance=Transcript(
        "docs/llm.md", ("uv run python tools/measure_batch_invariance.py",), in_repo=True
    ),
)
# the DPO recipe's per-loss choices, on its tuning seed (docs/llm.md, "Parameters the recipe uses")
for _name, _loss, _set in (
    ("ipo_tau_0.1", "ipo", ""),
    ("ipo_tau_0.5", "ipo", " loss.per_loss.ipo.tau=0.5"),
    ("simpo_gamma_1.0", "simpo", ""),
    ("simpo_gamma_0.5", "simpo", " loss.per_loss.simpo.gamma=0.5"),
    ("ed_dpo_alpha_0.02", "ed_dpo", ""),
    ("ed_dpo_alpha_1.0", "ed_dpo", " loss.per_loss.ed_dpo.alpha=1.0"),
):
    TRANSCRIPTS[f"dpo_tuning_{_name}"] = Transcript(
        "docs/llm.md",
        (
            f"uv run rlpost-llm dpo --config dpo_arithmetic loss.name={_loss} data.seed=7 "
            f"train.steps=200{_set}",
        ),
    )
for _base in ("frozen", "replay"):
    TRANSCRIPTS[f"lwd_one_robot_{_base}"] = Transcript(
        "docs/algorithms/lwd.md",
        (
            "uv run rlpost-robot train --config lwd_multimodal_reach algo.params.episodes=480 "
            f"algo.params.base={_base} run.eval_steps=[10]",
        ),
    )
# LWD's inverse temperature around its default 50 (docs/algorithms/lwd.md, "QAM")
for _inv_temp in (10, 200):
    TRANSCRIPTS[f"lwd_inv_temp_{_inv_temp}"] = Transcript(
        "docs/algorithms/lwd.md",
        (
            "uv run rlpost-robot train --config lwd_multimodal_reach algo.params.episodes=480 "
            f"algo.params.base=frozen algo.params.inv_temp={_inv_temp} run.eval_steps=[10]",
        ),
        timeout_s=3600,  # (7 minutes alone; 19 beside two other jobs)
    )
for _tasks in (1, 2):
    TRANSCRIPTS[f"hacking_chained_{_tasks}"] = Transcript(
        "docs/algorithms/hacking.md",
        (
            'uv run rlpost-llm exploits --config grpo_search "data.env.params.shortcuts=[metadata]" '
            f"data.env.params.tasks={_tasks}",
        ),
        timeout_s=1800,
    )

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][A-Z0-9]")


def clean(text: str) -> str:
    """Colour and cursor codes removed; of a line redrawn with ``\\r`` its last state."""
    lines = []
    for line in ANSI.sub("", text).split("\n"):
        parts = [p for p in line.split("\r") if p.strip()]
        lines.append(parts[-1].rstrip() if parts else "")
    return "\n".join(lines).strip("\n")


def runnable(command: str) -> str:
    """The command as this checkout runs it: ``uv run X`` is the environment's ``X``."""
    return re.sub(r"\buv run (--frozen )?", "", command).rstrip(" &")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(PYTHONUNBUFFERED="1", TERM="dumb", COLUMNS="120")
    return env


def _header() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    return (
        f"# {date.today().isoformat()}, commit {commit}, {cpu_model()}, {os.cpu_count()} cores, "
        f"OMP_NUM_THREADS={threads}"
    )


def run(name: str, t: Transcript) -> tuple[int, str]:
    """Run one transcript; ``(exit status, log text)``."""
    out, status, t0 = [_header()], 0, time.perf_counter()
    background: list[tuple[str, subprocess.Popen, Path]] = []
    with tempfile.TemporaryDirectory(prefix=f"transcript-{name}-") as tmp:
        cwd = REPO if t.in_repo else tmp
        for i, command in enumerate(t.commands):
            if command.endswith("&"):
                log = Path(tmp) / f".bg{i}.log"
                proc = subprocess.Popen(
                    runnable(command), shell=True, cwd=cwd, env=_env(), start_new_session=True,
                    stdout=log.open("w"), stderr=subprocess.STDOUT,
                )  # fmt: skip
                _wait_ready(log, t.ready, proc)
                background.append((command, proc, log))
                out += [f"$ {command}", clean(log.read_bytes().decode(errors="replace"))]
                continue
            code, printed = _run_one(command, cwd, t.timeout_s)
            out += [f"$ {command}", printed]
            if code is None:  # past its time limit: the log says so, the tool goes on
                out.append(f"# timed out after {t.timeout_s} s")
                status = 124
                break
            if code != 0:
                status = code
                break
        for _, proc, _ in background:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
    out.append(f"# exit {status} in {time.perf_counter() - t0:.1f} s")
    return status, "\n".join(out) + "\n"


def _run_one(command: str, cwd, timeout_s: int) -> tuple[int | None, str]:
    """``(exit status, what it printed)`` of one command; status ``None`` when it ran past
    ``timeout_s``, and then its whole process group is killed (a shell's children too)."""
    proc = subprocess.Popen(
        runnable(command), shell=True, cwd=cwd, env=_env(), start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        raw, _ = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raw, _ = proc.communicate()
        code = None
    # (bytes: text mode would turn a progress bar's \r into new lines)
    return code, clean(raw.decode(errors="replace"))


def _wait_ready(log: Path, ready: str, proc: subprocess.Popen, limit_s: float = 120) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if ready and ready in log.read_bytes().decode(errors="replace"):
            return
        if proc.poll() is not None:
            raise SystemExit(f"background command exited early:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)
    raise SystemExit(f"background command not ready within {limit_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="transcripts to run (see --list)")
    ap.add_argument("--all", action="store_true", help="run every transcript")
    ap.add_argument("--list", action="store_true", help="list them and their commands")
    ap.add_argument("--out", default=str(OUT), help="folder for the logs")
    args = ap.parse_args(argv)
    if args.list:
        for name, t in TRANSCRIPTS.items():
            print(f"{name:24s} {t.page:32s} {' ; '.join(t.commands)}")
        return 0
    unknown = [n for n in args.names if n not in TRANSCRIPTS]
    if unknown or not (args.names or args.all):
        ap.error(f"unknown transcript {unknown}" if unknown else "name transcripts, or --all")
    failed = []
    for name in TRANSCRIPTS if args.all else args.names:
        print(f"{name}: {' ; '.join(shlex.quote(c) for c in TRANSCRIPTS[name].commands)}")
        status, text = run(name, TRANSCRIPTS[name])
        path = Path(args.out) / f"{name}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(
            f"  exit {status}; wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"
        )
        if status:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
