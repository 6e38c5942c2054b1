"""End-to-end GRPO step throughput and peak memory on CPU: rlpost.llm vs TRL's GRPOTrainer.

Command (defaults; writes bench_results/llm_grpo.json)::

    uv run --frozen python tools/bench_llm_grpo.py --prompts 16 --group-size 8 \\
        --max-new-tokens 8 --steps 20 --warmup 2 --threads 1 --lr 1e-4 --seeds 0 1 2 \\
        --out bench_results/llm_grpo.json

The headline grid of issue 45 (natural and full length x 8 / 32 / 128 / 512 new tokens x
G = 8 / 16, P = 8, 3 seeds; about an hour on one core; the headline is the smallest ratio of
tokens per CPU-second and names ``min_full_length_ratio``)::

    uv run --frozen python tools/bench_llm_grpo.py --grid --prompts 8 --seeds 0 1 2 \\
        --out docs/results/llm_grpo_grid_<date>.json

Quick run::

    uv run --frozen python tools/bench_llm_grpo.py --prompts 4 --group-size 4 --steps 3 \\
        --warmup 1 --seeds 0 --out bench_results/llm_grpo_quick.json

TRL is *not* a dependency of the project. The first run creates a separate virtual
environment for it, ``bench_results/.venv-trl`` (``--trl-venv``; git-ignored), with
``uv venv --python 3.12`` and ``uv pip install trl==<--trl-version>`` constrained to the
exact torch / transformers / accelerate / datasets (and tokenizers, safetensors,
huggingface-hub, numpy) versions of the main environment (read with ``uv pip freeze``),
so uv reuses its cached wheels. Later runs reuse it when those versions still match.
trl 1.16.0 (the newest release when this was written) works with transformers 5.24.

What is measured, per side and seed, each side in its own fresh subprocess, the two
sides one after the other (never concurrently; which side goes first alternates from
seed to seed, against drifts of the machine's background load):

* step time (ms): the wall-clock period of one whole training-loop iteration (prompt fetch,
  generation, reward, loss forward/backward, optimizer step, per-step logging), i.e. the
  time between the ends of consecutive steps, over ``--steps`` steps after ``--warmup``
  warm-up steps. rlpost: timestamps of ``Trainer.logger.log`` (called once per step after
  the update); TRL: a ``TrainerCallback`` (``on_step_end``; ``on_step_begin`` ->
  ``on_step_end`` is recorded too as ``inner_ms``, rlpost's ``time/rollout + time/update``
  as its ``inner_ms``).
* generated tokens per step (sum of completion lengths, EOS included) and trained tokens
  per step (completion tokens in the loss). rlpost: ``tokens/generated`` and
  ``tokens/trained`` of its ``metrics.jsonl``; TRL: counted from the ``completion_ids``
  that its reward function receives (cross-checked against the logged
  ``completions/mean_length``).
* tokens/s = (generated + trained tokens) / step time, summed over the timed steps.
* CPU ms/step and tokens per CPU second: the same with the process CPU time
  (``time.process_time``, all threads) over the same intervals. CPU time leaves out the
  time spent waiting for a core, but not the slowdown from other jobs sharing caches,
  memory bandwidth or SMT siblings; on a 2-core VM shared with other jobs it tracked wall
  time within ~2 %, and the side-to-side ratio moved by +-20 % between whole runs, so
  compare several runs there (the headline is wall-clock).
* peak RSS: ``VmHWM`` of the process at the end of the last timed step (imports, model,
  optimizer, trainer included); "RSS growth" is that peak minus the RSS right before
  ``train()`` (i.e. what the training loop itself adds).

``--full-length``: every response runs to ``--max-new-tokens`` on both sides, EOS
suppressed until then (rlpost: ``rollout.min_new_tokens``; TRL: ``generate``'s
``min_new_tokens`` through ``GRPOConfig.generation_kwargs``). The untrained tiny model
ends a response after about 22 tokens on its own, which flatters row compaction and the
padding-free update; reasoning-style RL has many responses at the cap.

Threads: ``--threads 1`` by default. On a small machine shared with other jobs, two torch
threads on two cores stall whenever another process holds a core (OpenMP barriers wait
for the descheduled thread): a 200 ms step then takes seconds, on both sides. Use
``--threads N`` on an otherwise idle machine with more than N cores.

Deliberately identical on both sides: the model weights and tokenizer (one seeded,
untrained tiny Qwen2 from ``rlpost.llm.model.tiny`` saved with ``save_pretrained``, loaded in
float32), the prompts (the first ``(warmup + steps) * prompts`` ArithmeticTask examples of
``random.Random(seed)``, in the same order; rlpost draws them from its own task stream,
TRL reads them from a dataset with ``shuffle_dataset=False``; both are checked), group
size, max_new_tokens, temperature 1.0 (top-p 1, no top-k), the reward (``--reward exact``,
the default, rlpost: ``ArithmeticTask.score``; TRL: a copy of its semantics reading the
``answer`` column; an untrained model is never right, so every group scores alike, its
advantages are all 0 and rlpost leaves its rows out of the update (``skipped_rows``;
``optim.skip_inert_rows``) where TRL trains on them; ``--reward digits``: the share of
digit characters, the same function on both sides, dense, so no group is skipped),
GRPO loss (group-std-scaled advantages, PPO clip 0.2, per-sequence token mean; TRL
``loss_type="grpo"``), beta = 0 (no KL, no reference model), one optimizer update per
batch and the whole batch in one micro-batch (TRL: ``per_device_train_batch_size = P*G``,
``gradient_accumulation_steps = steps_per_generation = num_iterations = 1``, so one
optimizer step consumes exactly the P*G completions generated for it), AdamW with the same
lr / betas (0.9, 0.99) / no weight decay / constant schedule, gradient clipping at 1.0,
truncated completions kept in the loss (``--mask-truncated`` drops them on both sides),
fp32 (no bf16 / fp16, no gradient checkpointing: TRL's default of True is turned off),
CPU only, the torch thread count (``torch.set_num_threads`` and ``OMP_NUM_THREADS``),
rewards computed in process (rlpost ``reward.workers=0``).

Not identical, by design (each library's own code path is what is compared): generation
(both call HF ``generate`` with left padding and a KV cache on all P*G rows at once, except
that rlpost's HF engine splits calls above 256 completions; rlpost also requests the
processed scores to keep the sampling log-probs, TRL does not); the training forward (rlpost: ``logits_to_keep`` + its chunked log-softmax/entropy at the
sampling temperature; TRL: ``fused_lm_head`` log-probs and entropy of transformers);
the bookkeeping around them (rlpost's rollout batch, mismatch metrics and JSONL logging;
TRL's Trainer / accelerate loop, dataset collation and metric gathering); the random
streams, so the sampled completions (and hence their lengths) differ between the sides;
the imported libraries (which count in the peak RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import proc_status_mib as _proc_status_mib

REPO = Path(__file__).resolve().parent.parent
CONSTRAINED = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "numpy",
)
DEFAULT_TRL_VERSION = "1.16.0"


# ------------------------------------------------------------------- stdlib helpers


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")
    if not uv:
        raise SystemExit("uv not found on PATH (needed to create the TRL environment)")
    return uv


def _freeze(python: str) -> dict[str, str]:
    """``{normalised name: version}`` of an environment, via ``uv pip freeze``."""
    out = subprocess.run(
        [_uv(), "pip", "freeze", "--python", python],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pins = {}
    for line in out.splitlines():
        if "==" in line:
            name, ver = line.split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name.strip().lower())] = ver.strip()
    return pins


# ------------------------------------------------------------------- the TRL environment


def ensure_trl_venv(venv: Path, trl_version: str) -> tuple[str, dict[str, str]]:
    """Create (or reuse) ``venv`` with trl, pinned to the main environment's stack.

    Returns the venv's python and its ``{package: version}`` for the constrained packages
    and trl.
    """
    main = _freeze(sys.executable)
    pins = {name: main[name] for name in CONSTRAINED if name in main}
    missing = [n for n in ("torch", "transformers", "accelerate", "datasets") if n not in pins]
    if missing:
        raise SystemExit(f"the main environment lacks {missing}")
    python = venv / "bin" / "python"
    want = dict(pins)
    if trl_version:
        want["trl"] = trl_version
    if python.exists():
        have = _freeze(str(python))
        if "trl" in have and all(have.get(k) == v for k, v in want.items()):
            print(f"reusing {venv} (trl {have['trl']})", flush=True)
            return str(python), {k: have[k] for k in [*pins, "trl"]}
        print(f"{venv} does not match the main environment; rebuilding it", flush=True)
        shutil.rmtree(venv)
    t0 = time.perf_counter()
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([_uv(), "venv", "--python", "3.12", str(venv)], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(f"{k}=={v}\n" for k, v in pins.items()))
        constraints = f.name
    try:
        spec = f"trl=={trl_version}" if trl_version else "trl"
        subprocess.run(
            [_uv(), "pip", "install", "--python", str(python), "-c", constraints, spec],
            check=True,
        )
    finally:
        os.unlink(constraints)
    have = _freeze(str(python))
    bad = {k: (v, have.get(k)) for k, v in pins.items() if have.get(k) != v}
    if bad:
        raise SystemExit(f"TRL venv versions differ from the main env: {bad}")
    print(f"created {venv} in {time.perf_counter() - t0:.1f} s (trl {have['trl']})", flush=True)
    return str(python), {k: have[k] for k in [*pins, "trl"]}


# ------------------------------------------------------------------- the shared inputs


def save_model(path: Path, size: str, seed: int) -> int:
    """Save a seeded, untrained tiny Qwen2 + character tokenizer; returns its parameter count."""
    import torch
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(tiny.tiny_config(tok, size))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def make_prompts(n: int, seed: int) -> list[dict[str, str]]:
    """The first ``n`` examples of the stream rlpost's task-backed prompt source draws
    with ``data.seed = seed`` (default ArithmeticTask, one ``random.Random(seed)``)."""
    import random

    from rlpost.llm.data.tasks import make_task

    return [
        {"prompt": e.prompt, "answer": e.answer}
        for e in make_task("arithmetic").sample(n, random.Random(seed))
    ]


# ------------------------------------------------------------------- rlpost child


def rlpost_config(spec: dict, run_dir: Path):
    """The rlpost run config of the benchmark's workload (also tools/profile_llm_grpo.py's)."""
    from rlpost.llm.config import load_config

    P, G = spec["prompts"], spec["group_size"]
    total = spec["warmup"] + spec["steps"]
    return load_config(
        None,
        [
            f"model.path={spec['model']}",
            "model.dtype=float32",
            "data.task=arithmetic",
            f"data.seed={spec['seed']}",
            "data.eval_size=1",
            f"rollout.group_size={G}",
            f"rollout.prompts_per_step={P}",
            f"rollout.max_new_tokens={spec['max_new_tokens']}",
            # full length: EOS suppressed until max_new_tokens (TRL: generate's min_new_tokens)
            f"rollout.min_new_tokens={spec['max_new_tokens'] if spec.get('full_length') else 0}",
            f"rollout.temperature={spec['temperature']}",
            "rollout.top_p=1.0",
            "rollout.top_k=0",
            "algo.preset=grpo",
            "algo.kl_coef=0.0",
            f"optim.lr={spec['lr']}",
            "optim.weight_decay=0.0",
            "optim.betas=[0.9,0.99]",
            "optim.schedule=constant",
            "optim.grad_clip=1.0",
            f"optim.micro_batch_size={P * G}",
            "optim.updates_per_batch=1",
            f"train.steps={total}",
            f"train.overlong_mask={str(spec['mask_truncated']).lower()}",
            f"run.dir={run_dir}",
            f"run.seed={spec['seed']}",
            f"run.threads={spec['threads']}",
            "run.eval_every=0",
            "run.save_every=0",
            "run.progress=false",
            "run.tensorboard=false",
            "reward.workers=0",
            *spec.get("rlpost_set", []),
        ],
    )


def rlpost_child(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    from rlpost.llm.data.tasks import make_task
    from rlpost.llm.tools.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    total = spec["warmup"] + spec["steps"]
    run_dir = Path(spec["work"]) / "rlpost-run"
    cfg = rlpost_config(spec, run_dir)
    task = make_task("arithmetic")

    def digits(completion, example):
        return digit_share(completion)

    trainer = Trainer(cfg, reward_fn=task.score if spec["reward"] == "exact" else digits)

    seen: list[str] = []
    next_batch = trainer.prompts.next_batch

    def recording_next_batch(n):
        out = next_batch(n)
        seen.extend(e.prompt for e in out)
        return out

    trainer.prompts.next_batch = recording_next_batch
    stamps: list[float] = []
    cpu_stamps: list[float] = []
    at_end: dict = {}
    log = trainer.logger.log

    def timed_log(step, metrics):
        stamps.append(time.perf_counter())
        cpu_stamps.append(time.process_time())
        if step == total:
            at_end["peak_rss_mib"] = _proc_status_mib("VmHWM")
            at_end["threads"] = torch.get_num_threads()
        log(step, metrics)

    trainer.logger.log = timed_log
    rss_before = _proc_status_mib("VmRSS")
    hwm_before = _proc_status_mib("VmHWM")
    trainer.train()
    rows = {r["step"]: r for r in read_metrics(run_dir)}
    steps = []
    for k in range(spec["warmup"] + 1, total + 1):
        r = rows[k]
        steps.append(
            {
                "step": k,
                "period_s": stamps[k - 1] - stamps[k - 2],
                "cpu_s": cpu_stamps[k - 1] - cpu_stamps[k - 2],
                "inner_s": r["time/rollout"] + r["time/update"],
                "rollout_s": r["time/rollout"],
                "update_s": r["time/update"],
                "generated": r["tokens/generated"],
                "trained": r["tokens/trained"],
                "reward": r["reward/mean"],
                # rows left out of the update (all-zero advantages, rlpost.llm.train.inert)
                "skipped_rows": r.get("update/skipped_rows", 0.0),
            }
        )
    return {
        "side": "rlpost",
        "steps": steps,
        "prompts_seen": seen,
        "rss_before_train_mib": rss_before,
        "hwm_before_train_mib": hwm_before,
        "peak_rss_mib": at_end.get("peak_rss_mib"),
        "peak_rss_exit_mib": _proc_status_mib("VmHWM"),
        "threads": at_end.get("threads"),
        "rlpost_imported": True,
    }


# ------------------------------------------------------------------- TRL child (TRL venv)

# ArithmeticTask.score, re-implemented here so that the TRL side does not import rlpost
_STOP_MARKERS = ("\n", "<eos>", "</s>", "<|endoftext|>", "<|im_end|>")
_LEADING_INT = re.compile(r"[+-]?\d+")


def digit_share(completion: str) -> float:
    """``--reward digits``: the share of the completion's characters that are digits (0 for
    an empty one). Dense: the responses of a group almost never all score alike."""
    return sum(c.isdigit() for c in completion) / len(completion) if completion else 0.0


def score(completion: str, answer: str, reward: str) -> float:
    """The benchmark's reward on both sides (``--reward``)."""
    return arithmetic_score(completion, answer) if reward == "exact" else digit_share(completion)


def arithmetic_score(completion: str, answer: str) -> float:
    cut = len(completion)
    for marker in _STOP_MARKERS:
        i = completion.find(marker)
        if i != -1:
            cut = min(cut, i)
    m = _LEADING_INT.match(completion[:cut].strip())
    if m is None:
        return 0.0
    return 1.0 if int(m.group()) == int(answer) else 0.0


def trl_child(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    P, G = spec["prompts"], spec["group_size"]
    total = spec["warmup"] + spec["steps"]
    tok = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    dataset = Dataset.from_list(spec["data"])
    eos_and_pad = {tok.eos_token_id, tok.pad_token_id}
    count = {"generated": 0, "trained": 0, "reward": 0.0, "n": 0}
    seen: list[str] = []

    def arithmetic_reward(prompts, completions, completion_ids, answer, **kwargs):
        for ids in completion_ids:
            count["generated"] += len(ids)
            truncated = not ids or ids[-1] not in eos_and_pad  # TRL's own test
            if not (spec["mask_truncated"] and truncated):
                count["trained"] += len(ids)
        for i in range(0, len(prompts), G):
            seen.append(prompts[i])
        pairs = zip(completions, answer, strict=True)
        scores = [score(c, a, spec["reward"]) for c, a in pairs]
        count["reward"] += sum(scores)
        count["n"] += len(scores)
        return scores

    steps: list[dict] = []
    logged: dict[int, dict] = {}
    at_end: dict = {}

    class Timer(TrainerCallback):
        def __init__(self):
            self.begin = self.last_end = self.last_cpu = None

        def on_step_begin(self, args, state, control, **kw):
            self.begin = time.perf_counter()
            if self.last_cpu is None:
                self.last_cpu = time.process_time()

        def on_step_end(self, args, state, control, **kw):
            t, cpu = time.perf_counter(), time.process_time()
            steps.append(
                {
                    "step": state.global_step,
                    "period_s": t - (self.last_end if self.last_end is not None else self.begin),
                    "inner_s": t - self.begin,
                    "cpu_s": cpu - self.last_cpu,
                    "generated": float(count["generated"]),
                    "trained": float(count["trained"]),
                    "completions": count["n"],
                    "reward": count["reward"] / max(count["n"], 1),
                    "rollout_s": phase["rollout"],
                    "update_s": t - self.begin - phase["rollout"],
                }
            )
            count.update(generated=0, trained=0, reward=0.0, n=0)
            phase["rollout"] = 0.0
            self.last_end, self.last_cpu = t, cpu
            if state.global_step == total:
                at_end["peak_rss_mib"] = _proc_status_mib("VmHWM")
                at_end["threads"] = torch.get_num_threads()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                nums = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
                logged.setdefault(state.global_step, {}).update(nums)

    config = GRPOConfig(
        output_dir=str(Path(spec["work"]) / "trl-out"),
        num_generations=G,
        per_device_train_batch_size=P * G,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        mask_truncated_completions=spec["mask_truncated"],
        use_vllm=False,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        optim="adamw_torch",
        max_grad_norm=1.0,
        max_steps=total,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        seed=spec["seed"],
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
        # full length: EOS suppressed until max_new_tokens, as rlpost's rollout.min_new_tokens
        generation_kwargs={"min_new_tokens": spec["max_new_tokens"]}
        if spec.get("full_length")
        else None,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=arithmetic_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Timer()],
    )
    # the rollout half of a step: generation, rewards, advantages (and any no-grad forward)
    phase = {"rollout": 0.0}
    make_batch = trainer._generate_and_score_completions

    def timed_make_batch(*a, **kw):
        t = time.perf_counter()
        try:
            return make_batch(*a, **kw)
        finally:
            phase["rollout"] += time.perf_counter() - t

    trainer._generate_and_score_completions = timed_make_batch
    rss_before = _proc_status_mib("VmRSS")
    hwm_before = _proc_status_mib("VmHWM")
    trainer.train()
    timed = [s for s in steps if s["step"] > spec["warmup"]]
    for s in timed:
        lg = logged.get(s["step"], {})
        if "completions/mean_length" in lg:
            s["logged_mean_length"] = lg["completions/mean_length"]
    import trl

    return {
        "side": "trl",
        "steps": timed,
        "prompts_seen": seen,
        "rss_before_train_mib": rss_before,
        "hwm_before_train_mib": hwm_before,
        "peak_rss_mib": at_end.get("peak_rss_mib"),
        "peak_rss_exit_mib": _proc_status_mib("VmHWM"),
        "threads": at_end.get("threads"),
        "trl_version": trl.__version__,
        "rlpost_imported": any(m == "rlpost" or m.startswith("rlpost.") for m in sys.modules),
        "logged_keys": sorted(logged.get(total, {})),
    }


# ------------------------------------------------------------------- parent


def _child_env(side: str, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    if side == "trl":  # let the benchmark's own venv cache its bytecode (faster start-up)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def run_child(python: str, side: str, spec: dict, work: Path, verbose: bool) -> dict:
    spec_path = work / f"{side}-spec.json"
    out_path = work / f"{side}-result.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [python, str(Path(__file__).resolve()), f"--_child={side}", str(spec_path), str(out_path)]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, env=_child_env(side, spec["threads"]), capture_output=not verbose, text=True, cwd=REPO
    )
    if proc.returncode != 0:
        if not verbose:
            sys.stderr.write(proc.stdout[-5000:] + proc.stderr[-20000:])
        raise SystemExit(f"{side} child failed with exit code {proc.returncode}")
    res = json.loads(out_path.read_text())
    res["process_s"] = time.perf_counter() - t0
    return res


def summarise(res: dict, spec: dict) -> dict:
    """One row per side and seed from a child's per-step records."""
    steps = res["steps"]
    period = sum(s["period_s"] for s in steps)
    cpu = sum(s["cpu_s"] for s in steps)
    gen = sum(s["generated"] for s in steps)
    trained = sum(s["trained"] for s in steps)
    n = len(steps)
    want = [d["prompt"] for d in spec["data"]]
    row = {
        "side": res["side"],
        "seed": spec["seed"],
        "step_ms": 1e3 * period / n,
        "inner_ms": 1e3 * sum(s["inner_s"] for s in steps) / n,
        "cpu_ms": 1e3 * cpu / n,
        "cpu_tok_s": (gen + trained) / cpu,
        "gen_tokens_per_step": gen / n,
        "trained_tokens_per_step": trained / n,
        "gen_tok_s": gen / period,
        "train_tok_s": trained / period,
        "total_tok_s": (gen + trained) / period,
        "peak_rss_mib": res["peak_rss_mib"],
        "rss_growth_mib": res["peak_rss_mib"] - res["rss_before_train_mib"],
        "peak_rss_exit_mib": res["peak_rss_exit_mib"],
        "rss_before_train_mib": res["rss_before_train_mib"],
        "reward_mean": sum(s["reward"] for s in steps) / n,
        "skipped_rows": sum(s.get("skipped_rows", 0.0) for s in steps) / n,
        "torch_threads_seen": res["threads"],
        "same_prompts_in_order": res["prompts_seen"][: len(want)] == want,
        "timed_steps": n,
        "process_s": res["process_s"],
        "step_ms_each": [1e3 * s["period_s"] for s in steps],
    }
    row["rollout_ms"] = 1e3 * sum(s["rollout_s"] for s in steps) / n
    row["update_ms"] = 1e3 * sum(s["update_s"] for s in steps) / n
    if res["side"] != "rlpost":
        row["rlpost_imported"] = res["rlpost_imported"]
        lens = [s.get("logged_mean_length") for s in steps]
        if all(v is not None for v in lens):  # logged mean length x completions per step
            row["logged_gen_tokens_per_step"] = sum(lens) / n * spec["prompts"] * spec["group_size"]
    return row


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step (P)")
    ap.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps (>= 1)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads on both sides (2+ only on an otherwise idle machine)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--size", default="default", help="rlpost.llm.model.tiny size preset")
    ap.add_argument("--model-seed", type=int, default=0, help="init seed of the shared model")
    ap.add_argument(
        "--mask-truncated",
        action="store_true",
        help="drop completions cut by max_new_tokens from the loss (both sides)",
    )
    ap.add_argument(
        "--full-length",
        action="store_true",
        help="every response runs to --max-new-tokens: EOS suppressed on both sides",
    )
    ap.add_argument(
        "--reward", choices=["exact", "digits"], default="exact",
        help="exact: 1 for the right answer (an untrained model is never right, so every "
        "group scores alike and its advantages are 0); digits: the share of digit characters "
        "(dense: groups almost never score alike)",
    )  # fmt: skip
    ap.add_argument(
        "--grid",
        action="store_true",
        help=f"every workload of the headline: natural and full length x {GRID_LENGTHS} new tokens "
        f"x G {GRID_GROUPS} (P = --prompts, timed steps {GRID_STEPS}); the headline names "
        "min_full_length_ratio (tokens per CPU-second)",
    )
    ap.add_argument(
        "--modes", nargs="+", choices=["natural", "full"], default=["natural", "full"],
        help="--grid: which length regimes",
    )  # fmt: skip
    ap.add_argument(
        "--lengths", type=int, nargs="+", default=list(GRID_LENGTHS),
        help=f"--grid: new-token caps (each of {sorted(GRID_STEPS)})",
    )  # fmt: skip
    ap.add_argument(
        "--rlpost-set", nargs="+", default=[], metavar="KEY=VALUE",
        help="config overrides for the rlpost side only (e.g. run.malloc_mmap_kb=128)",
    )  # fmt: skip
    ap.add_argument("--trl-venv", default=str(REPO / "bench_results" / ".venv-trl"))
    ap.add_argument(
        "--trl-version", default=DEFAULT_TRL_VERSION, help="trl release ('' for the newest)"
    )
    ap.add_argument("--out", default="bench_results/llm_grpo.json")
    ap.add_argument("--verbose", action="store_true", help="show the children's output")
    ap.add_argument("--_child", dest="child", choices=["rlpost", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("child_args", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is None:
        if args.child_args:
            ap.error(f"unexpected arguments {args.child_args}")
        if min(args.prompts, args.max_new_tokens, args.steps, args.warmup, args.threads) < 1:
            ap.error("--prompts, --max-new-tokens, --steps, --warmup, --threads must be >= 1")
        if args.group_size < 2:
            ap.error("--group-size must be >= 2 (TRL's minimum)")
        if args.grid and set(args.lengths) - set(GRID_STEPS):
            ap.error(f"--lengths: each of {sorted(GRID_STEPS)}")
        if args.grid and args.full_length:
            ap.error("--grid runs both natural and full length; drop --full-length")
        if (args.full_length or args.grid) and args.mask_truncated:
            ap.error("--full-length with --mask-truncated trains on nothing: every response is cut")
    return args


KEYS = (
    "step_ms",
    "rollout_ms",
    "update_ms",
    "gen_tok_s",
    "train_tok_s",
    "total_tok_s",
    "cpu_ms",
    "cpu_tok_s",
    "peak_rss_mib",
    "rss_growth_mib",
)
TABLE = [
    "side",
    ("step_ms", "step ms"),
    ("step_ms_std", "+-"),
    ("rollout_ms", "rollout ms"),
    ("update_ms", "update ms"),
    ("gen_tok_s", "gen tok/s"),
    ("train_tok_s", "train tok/s"),
    ("total_tok_s", "total tok/s"),
    ("total_tok_s_std", "+-"),
    ("peak_rss_mib", "peak RSS MiB"),
    ("peak_rss_mib_std", "+-"),
    ("rss_growth_mib", "RSS growth MiB"),
    ("cpu_ms", "CPU ms/step"),
    ("cpu_tok_s", "tok/CPU-s"),
]
# --grid: the headline workloads (issue 45). Timed steps per length keep every cell at a few
# hundred thousand tokens; a natural-length cell is cheap (the model stops after ~22 tokens).
GRID_LENGTHS = (8, 32, 128, 512)
GRID_GROUPS = (8, 16)
GRID_STEPS = {8: 10, 32: 6, 128: 3, 512: 3}


def run_cell(args, cell: dict, model_dir: Path, trl_python: str, tmp: Path) -> dict:
    """Both sides of one workload over ``args.seeds``: per-seed rows, means and their ratio."""
    P, G, L = cell["prompts"], cell["group_size"], cell["max_new_tokens"]
    steps, warmup = cell["steps"], cell["warmup"]
    rows, ratios, cpu_ratios = [], [], []
    for i, seed in enumerate(args.seeds):
        spec = {
            "model": str(model_dir),
            "data": make_prompts(P * (warmup + steps), seed),
            "seed": seed,
            "prompts": P,
            "group_size": G,
            "max_new_tokens": L,
            "temperature": args.temperature,
            "lr": args.lr,
            "steps": steps,
            "warmup": warmup,
            "threads": args.threads,
            "mask_truncated": args.mask_truncated,
            "reward": args.reward,
            "full_length": cell["full_length"],
            "rlpost_set": args.rlpost_set,
        }
        pair = {}
        sides = [("rlpost", sys.executable), ("trl", trl_python)]
        for order, (side, python) in enumerate(sides if i % 2 == 0 else sides[::-1]):
            work = tmp / f"{cell['name']}-{side}-{seed}"
            work.mkdir()
            spec["work"] = str(work)
            res = run_child(python, side, spec, work, args.verbose)
            pair[side] = row = summarise(res, spec)
            row.update(run_order=order, cell=cell["name"])
            rows.append(row)
            print(
                f"{cell['name']} seed {seed} {side:6s}: {row['step_ms']:.1f} ms/step, "
                f"{row['total_tok_s']:,.0f} tok/s, {row['cpu_tok_s']:,.0f} tok/CPU-s, peak RSS "
                f"{row['peak_rss_mib']:.0f} MiB (process {row['process_s']:.1f} s)",
                flush=True,
            )
        ratios.append(pair["rlpost"]["total_tok_s"] / pair["trl"]["total_tok_s"])
        cpu_ratios.append(pair["rlpost"]["cpu_tok_s"] / pair["trl"]["cpu_tok_s"])
    return _cell_summary(cell, rows, ratios, cpu_ratios)


def _cell_summary(cell: dict, rows: list, ratios: list, cpu_ratios: list) -> dict:
    import benchlib

    summary = {}
    for side in ("rlpost", "trl"):
        s = {"side": side, "seed": "mean", "cell": cell["name"]}
        for k in (*KEYS, "inner_ms", "gen_tokens_per_step", "trained_tokens_per_step"):
            s[k], s[k + "_std"] = benchlib.mean_std(r[k] for r in rows if r["side"] == side)
        summary[side] = s
    ratio_row = {"side": "rlpost/TRL", "seed": "mean", "cell": cell["name"]}
    for k in KEYS:
        ratio_row[k] = summary["rlpost"][k] / summary["trl"][k]
    ratio_row["total_tok_s_std"] = benchlib.mean_std(ratios)[1]  # spread of per-seed ratios
    ratio_row["cpu_tok_s_std"] = benchlib.mean_std(cpu_ratios)[1]
    ratio_row["per_seed_cpu_tok_s"] = cpu_ratios
    ratio_row.update({k: cell[k] for k in ("prompts", "group_size", "max_new_tokens")})
    ratio_row["full_length"] = cell["full_length"]
    return {"rows": rows, "summary": summary, "ratio": ratio_row, "ratios": ratios}


def grid_cells(args) -> list[dict]:
    """The --grid workloads, or the one workload of the command line."""
    if not args.grid:
        return [
            {
                "name": f"{'full' if args.full_length else 'natural'}{args.max_new_tokens}"
                f"_g{args.group_size}",
                "prompts": args.prompts,
                "group_size": args.group_size,
                "max_new_tokens": args.max_new_tokens,
                "full_length": args.full_length,
                "steps": args.steps,
                "warmup": args.warmup,
            }
        ]
    return [
        {
            "name": f"{'full' if full else 'natural'}{L}_g{G}",
            "prompts": args.prompts,
            "group_size": G,
            "max_new_tokens": L,
            "full_length": full,
            "steps": GRID_STEPS[L],
            "warmup": 1,
        }
        for full in (False, True)
        if ("full" if full else "natural") in args.modes
        for L in args.lengths
        for G in GRID_GROUPS
    ]


def grid_headline(cells: list[dict]) -> dict:
    """Tokens per CPU-second, rlpost over TRL: the smallest cell, split by length regime."""
    ratio = {c["ratio"]["cell"]: c["ratio"] for c in cells}

    def smallest(full: bool) -> float | None:
        vals = [r["cpu_tok_s"] for r in ratio.values() if r["full_length"] == full]
        return min(vals) if vals else None

    worst = min(ratio.values(), key=lambda r: r["cpu_tok_s"])
    return {
        "metric": "GRPO tokens per CPU-second (generated+trained), rlpost / TRL, smallest cell",
        "value": worst["cpu_tok_s"],
        "baseline": 1.0,
        "ratio": worst["cpu_tok_s"],
        "paper": None,
        "worst_cell": worst["cell"],
        "min_full_length_ratio": smallest(True),
        "min_natural_ratio": smallest(False),
        "max_peak_rss_ratio": max(r["peak_rss_mib"] for r in ratio.values()),
        "cells": {name: r["cpu_tok_s"] for name, r in ratio.items()},
    }


def _print_cell(cell: dict, res: dict, args, n_params: int, trl_versions: dict) -> None:
    import benchlib

    print(
        f"\nGRPO on CPU, tiny Qwen2 ({n_params:,} params), {cell['name']}: P={cell['prompts']} "
        f"prompts x G={cell['group_size']}, max_new_tokens={cell['max_new_tokens']}"
        f"{' (full length)' if cell['full_length'] else ''}, {cell['steps']} timed steps after "
        f"{cell['warmup']} warm-up, {args.threads} torch threads, seeds {args.seeds}, "
        f"trl {trl_versions['trl']} (mean +- std over seeds)"
    )
    s = res["summary"]
    benchlib.print_table([s["rlpost"], {**s["trl"], "side": "TRL"}, res["ratio"]], TABLE)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        spec_path, out_path = args.child_args
        spec = json.loads(Path(spec_path).read_text())
        res = (rlpost_child if args.child == "rlpost" else trl_child)(spec)
        Path(out_path).write_text(json.dumps(res))
        return

    import benchlib

    t_start = time.perf_counter()
    trl_python, trl_versions = ensure_trl_venv(Path(args.trl_venv), args.trl_version)
    t_bench = time.perf_counter()
    cells = grid_cells(args)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_llm_grpo-") as tmp:
        model_dir = Path(tmp) / "model"
        n_params = save_model(model_dir, args.size, args.model_seed)
        print(f"tiny model ({n_params:,} params, size {args.size!r}) saved to {model_dir}")
        for cell in cells:
            res = run_cell(args, cell, model_dir, trl_python, Path(tmp))
            _print_cell(cell, res, args, n_params, trl_versions)
            results.append(res)  # the file holds every finished cell (a late failure loses none)
            out, headline = _write(args, cells, results, n_params, trl_versions, benchlib)
    if args.grid:
        benchlib.print_table(
            [res["ratio"] for res in results],
            [
                "cell",
                ("cpu_tok_s", "tok/CPU-s ratio"),
                ("cpu_tok_s_std", "+-"),
                ("total_tok_s", "tok/s ratio"),
                ("update_ms", "update time ratio"),
                ("peak_rss_mib", "peak RSS ratio"),
            ],
        )
    print(f"\nheadline: {json.dumps(headline)}")
    now = time.perf_counter()
    print(
        f"wrote {out}; benchmark {now - t_bench:.1f} s "
        f"(+ {t_bench - t_start:.1f} s TRL environment check/creation)"
    )


def _write(args, cells, results, n_params, trl_versions, benchlib):
    """The result file of the cells finished so far: ``(path, headline)``."""
    rows = [r for res in results for r in res["rows"]]
    checks = {
        "same_prompts_in_order": all(r["same_prompts_in_order"] for r in rows),
        "trl_side_imported_rlpost": any(r.get("rlpost_imported") for r in rows),
        "torch_threads_seen": sorted({r["torch_threads_seen"] for r in rows}),
    }
    if args.grid:
        headline = grid_headline(results)
    else:
        only = results[0]
        headline = {
            "metric": "GRPO tokens/s (generated+trained), tiny model, CPU",
            "value": only["summary"]["rlpost"]["total_tok_s"],
            "baseline": only["summary"]["trl"]["total_tok_s"],
            "ratio": only["ratio"]["total_tok_s"],
            "paper": None,
        }
    config = {
        "cells": cells,
        "cells_done": len(results),
        "temperature": args.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "lr": args.lr,
        "adam_betas": [0.9, 0.99],
        "grad_clip": 1.0,
        "loss": "GRPO: group-std advantages, PPO clip 0.2, per-sequence token mean, beta=0",
        "updates_per_batch": 1,
        "micro_batch": "P * G (the whole batch)",
        "mask_truncated": args.mask_truncated,
        "reward": args.reward,
        "torch_threads": args.threads,
        "rlpost_set": args.rlpost_set,
        "model": {"size": args.size, "params": n_params, "init_seed": args.model_seed},
        "task": "arithmetic (digits=3, ops='+'), prompts = first (warmup+steps)*P examples "
        "of random.Random(seed)",
        "device": "cpu",
        "dtype": "float32",
        "step_time": "period between ends of consecutive training steps (whole loop)",
        "peak_rss": "VmHWM at the end of the last timed step, fresh process per side and seed",
        "trl_versions": trl_versions,
        "trl_venv": str(args.trl_venv),
        "checks": checks,
        "per_seed_ratio_total_tok_s": {res["ratio"]["cell"]: res["ratios"] for res in results},
    }
    out = benchlib.write_result(
        args.out,
        name="llm_grpo",
        catalog_ids=["base"],
        config=config,
        seeds=args.seeds,
        rows=[r for res in results for r in (*res["rows"], *res["summary"].values(), res["ratio"])],
        headline=headline,
    )
    return out, headline


if __name__ == "__main__":
    main()
