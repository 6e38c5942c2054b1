"""The project's GPU checks, in a few minutes on one CUDA GPU (issue 18).

Command (on the GPU machine, through ``tools/gpu_check.sh``; writes ``--out``)::

    python3 tools/gpu_check.py --out gpu_check.json

and, on any machine, the same code at toy sizes on the CPU (how CI keeps it working)::

    uv run --frozen python tools/gpu_check.py --smoke --out /tmp/gpu_check_smoke.json

1. the CUDA-only tests: the kernel test files and the trainer's (``-k cuda``);
2. Triton vs the torch reference for the three kernel ops (fused linear log-prob /
   entropy forward + backward, shared-prompt attention, MXFP4 decomposition): ms per call
   and the speed-up, one table; then the fused log-prob kernels under other tile and
   launch choices (``tiles``);
3. the vLLM rollout engine end to end on the tiny model: a few GRPO steps through
   ``rlpost.llm.trainer.Trainer`` with ``rollout.engine=vllm``, generated tokens per second
   (a line saying why when vLLM is not installed there);
   and a vLLM distillation teacher: two OPD steps with the tiny base as its own teacher
   on vLLM (``distill.teachers[].engine=vllm``), whose first reverse KL must be ~0 (the
   student equals the teacher; bfloat16 noise only);
4. ``rlpost-llm demo`` with its policy on the GPU (held-out accuracy before / after, wall
   time); ``parity``: the demo's base on the GPU against the CPU (greedy completions that
   differ, the largest logit difference, the float32 matmul settings); ``engines``: the
   lean engine against Hugging Face ``generate`` on the Qwen3-0.6B-sized model, tokens/s;
5. a trainer step of a randomly initialised Qwen3-0.6B-sized model (no weights can be
   downloaded) in bfloat16: the packed forward with fused log-probs, a GRPO loss, backward
   and AdamW, trained tokens per second, beside prime-rl's published trainer throughput of
   about 11.9k tokens/s on one H100.

Each part prints its result and lands in the JSON (rewritten after every part); a part
that fails is reported and the others still run (exit code 1 if any failed). ``--only``
runs the parts named.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

PRIME_RL_TOKENS_PER_S = 11_900  # prime-rl trainer, Qwen3-0.6B, one H100 (published)
# dense bfloat16 peak, FLOP/s, of the SXM parts (NVIDIA's data sheets; half the sparse figure)
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
QWEN3_06B = dict(  # Qwen/Qwen3-0.6B's config.json
    vocab_size=151_936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40_960,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
)


def _sync(dev: str) -> None:
    import torch

    if dev == "cuda":
        torch.cuda.synchronize()


def _time(fn, dev: str, reps: int) -> float:
    """Median ms of ``fn()`` over ``reps`` calls after one warm-up."""
    fn()
    _sync(dev)
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        _sync(dev)
        out.append(1e3 * (time.perf_counter() - t))
    return sorted(out)[len(out) // 2]


def cuda_tests(smoke: bool) -> dict:
    files = [
        "kernels/tests/test_linear_logprob.py",
        "kernels/tests/test_shared_prompt.py",
        "kernels/tests/test_mxfp4.py",
        "kernels/tests/test_rms_norm.py",
        "kernels/tests/test_swiglu.py",
        "kernels/tests/test_dispatch.py",
        "packages/rlpost-llm/tests/test_cuda.py",
    ]
    cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider"]
    cmd += ["-k", "cuda", "-rfE"]  # the CUDA cases (the rest run in CI); failures listed
    proc = subprocess.run([*cmd, *files], cwd=REPO, capture_output=True, text=True)
    tail = proc.stdout.strip().splitlines()[-1:] or [proc.stderr[-300:]]
    if proc.returncode not in (0, 5):  # what failed, for the log
        print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n")
    print(f"CUDA tests: {tail[0]}")
    return {"returncode": proc.returncode, "summary": tail[0], "ok": proc.returncode in (0, 5)}


def kernel_table(dev: str, smoke: bool) -> dict:
    import torch

    from rlpost.kernels.ops.linear_logprob import linear_logprob_entropy
    from rlpost.kernels.ops.mxfp4 import decompose_mxfp4
    from rlpost.kernels.ops.rms_norm import rms_norm
    from rlpost.kernels.ops.shared_prompt import shared_prompt_attention
    from rlpost.kernels.ops.swiglu import swiglu

    g = torch.Generator(device=dev).manual_seed(0)
    backends = ["triton", "reference"] if dev == "cuda" else ["reference"]
    reps = 3 if smoke else 10
    n, v, d = (256, 1000, 64) if smoke else (8192, 151_936, 1024)
    h = torch.randn(n, d, device=dev, generator=g, dtype=torch.bfloat16, requires_grad=True)
    w = (0.02 * torch.randn(v, d, device=dev, generator=g, dtype=torch.bfloat16)).requires_grad_()
    tok = torch.randint(0, v, (n,), device=dev, generator=g)

    def logprob(backend):
        def run():
            lp, ent = linear_logprob_entropy(h, w, tok, 1.0, backend=backend)
            (lp.sum() + 0.1 * ent.sum()).backward()
            h.grad = w.grad = None

        return run

    H, P, N, R, hd = (2, 16, 4, 8, 32) if smoke else (16, 1024, 16, 1024, 128)

    def rnd(*shape):
        return torch.randn(*shape, device=dev, generator=g, dtype=torch.bfloat16)

    qkv_p = [rnd(H, P, hd).requires_grad_() for _ in range(3)]
    qkv_r = [rnd(N, H, R, hd).requires_grad_() for _ in range(3)]

    def attention(backend):  # forward and backward (the trainer's use)
        def run():
            out_p, out_r = shared_prompt_attention(*qkv_p, *qkv_r, backend=backend)
            (out_p.float().sum() + out_r.float().sum()).backward()
            for t in (*qkv_p, *qkv_r):
                t.grad = None

        return run

    x = torch.randn(512 if smoke else 16_384, 1024, device=dev, generator=g)

    def mxfp4(backend):
        return lambda: decompose_mxfp4(x, macro=8, outliers=1, backend=backend)

    xn = rnd(4 * n, d).requires_grad_()  # the trainer's norm: [tokens, hidden], bf16
    wn = (1 + 0.1 * rnd(d)).requires_grad_()

    def norm(backend):
        def run():
            rms_norm(xn, wn, 1e-6, backend=backend).float().sum().backward()
            xn.grad = wn.grad = None

        return run

    gu = [rnd(4 * n, 3 * d).requires_grad_() for _ in range(2)]  # the MLP's gate and up

    def act(backend):
        def run():
            swiglu(*gu, backend=backend).float().sum().backward()
            for t in gu:
                t.grad = None

        return run

    cases = {
        f"linear_logprob fwd+bwd N={n} V={v} D={d} bf16": logprob,
        f"rms_norm fwd+bwd {tuple(xn.shape)} bf16": norm,
        f"swiglu fwd+bwd {tuple(gu[0].shape)} bf16": act,
        f"shared_prompt_attention fwd+bwd H={H} P={P} N={N} R={R} d={hd} bf16": attention,
        f"mxfp4 decompose {tuple(x.shape)} fp32": mxfp4,
    }
    rows = []
    for name, make in cases.items():
        ms = {b: _time(make(b), dev, reps) for b in backends}
        row = {"op": name, **{f"{b}_ms": round(t, 3) for b, t in ms.items()}}
        if "triton" in ms:
            row["speedup"] = round(ms["reference"] / ms["triton"], 2)
        rows.append(row)
        print("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    return {"rows": rows, "ok": True}


#: (BLOCK_N, BLOCK_V, BLOCK_D, num_warps, num_stages) tried by ``tiles``; the first is the
#: kernels' default (BLOCKS / LAUNCH in linear_logprob/triton_impl.py)
TILES = [
    (64, 128, 64, None, None),
    (64, 128, 64, 8, 3),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (64, 256, 64, 8, 3),
    (128, 128, 32, 4, 4),
    (64, 128, 128, 8, 2),
    (128, 64, 64, 4, 3),
]


def tiles(dev: str, smoke: bool) -> dict:
    """The fused log-prob kernels (forward + backward, bf16, the Qwen3 vocabulary) under
    each tile / launch choice of :data:`TILES`: ms per call, and the largest difference
    from the default's outputs relative to their largest entry (tiles change only the
    summation order). A choice the chip cannot run (shared memory) is reported as such."""
    import torch

    from rlpost.kernels.ops.linear_logprob import linear_logprob_entropy

    backend = "triton" if dev == "cuda" else "reference"  # (on CPU: the harness only)
    g = torch.Generator(device=dev).manual_seed(0)
    n, v, d = (64, 512, 32) if smoke else (8192, 151_936, 1024)
    h = torch.randn(n, d, device=dev, generator=g, dtype=torch.bfloat16, requires_grad=True)
    w = (0.02 * torch.randn(v, d, device=dev, generator=g, dtype=torch.bfloat16)).requires_grad_()
    tok = torch.randint(0, v, (n,), device=dev, generator=g)

    def run():
        lp, ent = linear_logprob_entropy(h, w, tok, 1.0, backend=backend)
        dh, dw = torch.autograd.grad(lp.sum() + 0.1 * ent.sum(), (h, w))
        return [x.float() for x in (lp, ent, dh, dw)]

    if dev == "cuda":
        from rlpost.kernels.ops.linear_logprob import triton_impl as impl

        saved = (impl.BLOCKS["cuda"], dict(impl.LAUNCH["cuda"]))
    rows, base = [], None
    try:
        for bn, bv, bd, warps, stages in TILES[:2] if smoke else TILES:
            name = f"{bn}x{bv}x{bd} warps={warps or '-'} stages={stages or '-'}"
            if dev == "cuda":
                impl.BLOCKS["cuda"] = (bn, bv, bd)
                impl.LAUNCH["cuda"] = {
                    k: x for k, x in (("num_warps", warps), ("num_stages", stages)) if x
                }
            try:
                out = run()
                ms = _time(run, dev, 2 if smoke else 3)
            except Exception as exc:  # e.g. triton's OutOfResources: too much shared memory
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
                rows.append({"tiles": name, "error": why})
                print(f"  {name}: {why}")
                continue
            base = base or out
            err = max(
                float((a - b).abs().max() / b.abs().max()) for a, b in zip(out, base, strict=True)
            )
            rows.append({"tiles": name, "ms": round(ms, 2), "rel_diff": err})
            print(f"  {name}: {ms:.2f} ms, outputs within {err:.1e} of the default's")
    finally:
        if dev == "cuda":
            impl.BLOCKS["cuda"], impl.LAUNCH["cuda"] = saved
    timed = [r for r in rows if "ms" in r]
    best = min(timed, key=lambda r: r["ms"]) if timed else None
    if best:
        print(f"tiles: fastest {best['tiles']} at {best['ms']} ms ({backend}, N={n} V={v} D={d})")
    return {"ok": bool(timed) and all(r["rel_diff"] < 2e-2 for r in timed), "rows": rows,
            "backend": backend, "fastest": best}  # fmt: skip


def vllm_engine(smoke: bool) -> dict:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        print(f"vLLM engine: not run: vllm is not installed here ({exc})")
        return {"ok": True, "ran": False, "why": f"vllm not installed: {exc}"}
    import tempfile

    from rlpost.llm.config import load_config
    from rlpost.llm.trainer import Trainer

    steps = 2 if smoke else 5
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            None,
            [
                "rollout.engine=vllm",
                f"train.steps={steps}",
                "rollout.prompts_per_step=32",
                "rollout.group_size=8",
                "rollout.max_new_tokens=32",
                "run.eval_every=0",
                "run.save_every=0",
                "run.progress=false",
                f"run.dir={tmp}/run",
            ],
        )
        tr = Trainer(cfg)
        t = time.perf_counter()
        tr.train()
        wall = time.perf_counter() - t
        from rlpost.llm.tools.runlog import read_metrics

        rows = read_metrics(Path(tmp) / "run")
    gen = sum(r.get("tokens/generated", 0.0) for r in rows)
    roll = sum(r.get("time/rollout", 0.0) for r in rows)
    out = {
        "ok": True,
        "ran": True,
        "steps": steps,
        "wall_s": round(wall, 2),
        "generated_tokens": gen,
        "rollout_tokens_per_s": round(gen / max(roll, 1e-9)),
    }
    print(
        f"vLLM engine: {steps} GRPO steps in {wall:.1f} s, {out['rollout_tokens_per_s']} "
        "generated tokens/s during rollouts"
    )
    return out


def vllm_teacher(smoke: bool) -> dict:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        print(f"vLLM teacher: not run: vllm is not installed here ({exc})")
        return {"ok": True, "ran": False, "why": f"vllm not installed: {exc}"}
    import tempfile

    from rlpost.llm.config import load_config
    from rlpost.llm.model import tiny
    from rlpost.llm.tools.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    base = tiny.build_base("arithmetic", progress=False, digits=2)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            None,
            [
                "data.task_params={digits: 2}", "algo.preset=opd", "train.steps=2",
                "rollout.prompts_per_step=16", "rollout.group_size=4", "rollout.temperature=1.0",
                f"distill.teachers=[{{path: {base}, engine: vllm, dtype: float32}}]",
                "run.eval_every=0", "run.save_every=0", "run.progress=false",
                f"run.dir={tmp}/run",
            ],
        )  # fmt: skip
        t = time.perf_counter()
        Trainer(cfg).train()
        wall = time.perf_counter() - t
        rows = [r for r in read_metrics(Path(tmp) / "run") if "distill/kl" in r]
    kl = [r["distill/kl"] for r in rows]
    out = {"ok": bool(kl) and abs(kl[0]) < 1e-2, "ran": True, "wall_s": round(wall, 2),
           "distill_kl": kl}  # fmt: skip
    print(f"vLLM teacher: 2 OPD steps in {wall:.1f} s, reverse KL {kl} (first must be ~0)")
    return out


def _no_base(smoke: bool) -> str | None:
    """Why the demo's tiny base cannot be used (``None`` when it can: in the cache, or the
    untrained model at ``--smoke``)."""
    from rlpost.llm.model import tiny

    if smoke or tiny._is_complete(tiny.base_path("arithmetic", digits=2)):
        return None
    return "the tiny base is not in the cache (RLPOST_CACHE): building it takes minutes"


def demo(dev: str, smoke: bool) -> dict:
    """``rlpost-llm demo`` (GRPO on 2-digit addition, the tiny default) with its policy on
    ``dev``: held-out accuracy before and after, and the wall time."""
    import tempfile

    from rlpost.llm.config import load_config
    from rlpost.llm.recipes import recipe_path
    from rlpost.llm.trainer import Trainer

    why = _no_base(smoke)
    if why:
        print(f"demo: not run: {why}")
        return {"ok": True, "ran": False, "why": why}
    steps = 4 if smoke else 200
    with tempfile.TemporaryDirectory() as tmp:
        over = [f"run.dir={tmp}/demo", f"run.device={dev}", "run.progress=false"]
        over += [f"train.steps={steps}", "run.save_every=0", "run.tensorboard=false"]
        if smoke:  # (the untrained model: no base to build)
            over += ["run.eval_every=2", "data.eval_size=16", "rollout.prompts_per_step=4"]
            over += ["model.path=tiny-random"]
        t = time.perf_counter()
        res = Trainer(load_config(recipe_path("grpo_arithmetic"), over), overwrite=True).train()
        wall = time.perf_counter() - t
    out = {
        "ok": res["eval_after"] >= res["eval_before"] or smoke,
        "ran": True,
        "device": dev,
        "steps": steps,
        "wall_s": round(wall, 1),
        "ms_per_step": round(1e3 * wall / steps, 1),
        "eval_before": res["eval_before"],
        "eval_after": res["eval_after"],
    }
    print(
        f"demo on {dev}: {steps} GRPO steps in {wall:.1f} s ({out['ms_per_step']} ms/step), "
        f"held-out accuracy {res['eval_before']:.3f} -> {res['eval_after']:.3f}"
    )
    return out


def parity(dev: str, smoke: bool) -> dict:
    """The demo's tiny base on ``dev`` against the same weights on the CPU: greedy
    completions of the held-out prompts that differ, and the largest difference of the
    prompts' next-token logits (float32 on both: only reduction order should differ);
    with the float32 matmul settings, which decide whether TF32 is in play."""
    import copy
    import tempfile

    import torch

    from rlpost.llm.config import load_config
    from rlpost.llm.data.prompts import encode_prompt
    from rlpost.llm.recipes import recipe_path
    from rlpost.llm.rollout.engines.base import SamplingParams
    from rlpost.llm.rollout.engines.lean import LeanEngine
    from rlpost.llm.trainer import Trainer

    settings = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "tf32_env": {k: v for k, v in os.environ.items() if "TF32" in k},
    }
    print(f"parity: {settings}")
    why = _no_base(smoke)
    if why:
        print(f"parity: not run: {why}")
        return {"ok": True, "ran": False, "why": why, **settings}
    with tempfile.TemporaryDirectory() as tmp:
        over = [f"run.dir={tmp}/p", f"run.device={dev}", "run.progress=false"]
        over += ["run.tensorboard=false", "reward.workers=0"]
        if smoke:
            over += ["data.eval_size=16", "model.path=tiny-random"]
        tr = Trainer(load_config(recipe_path("grpo_arithmetic"), over))
        prompts = [encode_prompt(tr.tok, e.prompt) for e in tr.prompts.eval_examples]
        greedy = SamplingParams(tr.sampling.max_new_tokens, 0.0, stop=tr.sampling.stop)
        P = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), P), tr.tok.pad_token_id, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding, as the engines do
            ids[i, P - len(p) :], att[i, P - len(p) :] = torch.tensor(p), 1
        texts, logits = {}, {}
        for where, model in (("dev", tr.model), ("cpu", copy.deepcopy(tr.model).cpu())):
            texts[where] = LeanEngine(model, tr.tok).generate(prompts, 1, greedy).texts(tr.tok)
            d = next(model.parameters()).device
            with torch.no_grad():
                out = model(input_ids=ids.to(d), attention_mask=att.to(d), use_cache=False)
            logits[where] = out.logits[:, -1].float().cpu()
        tr.close()
    differ = sum(a != b for a, b in zip(texts["dev"], texts["cpu"], strict=True))
    gap = float((logits["dev"] - logits["cpu"]).abs().max())
    flips = int((logits["dev"].argmax(-1) != logits["cpu"].argmax(-1)).sum())
    print(
        f"parity: {differ} of {len(prompts)} greedy completions differ from the CPU's; "
        f"next-token logits differ by up to {gap:.2e} ({flips} argmax flips)"
    )
    return {"ok": True, "prompts": len(prompts), "greedy_differ": differ,
            "max_logit_diff": gap, "argmax_flips": flips, **settings}  # fmt: skip


def _qwen3(dev: str, smoke: bool):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = dict(QWEN3_06B)
    if smoke:
        cfg.update(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        )
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(dev):  # initialised there: seconds, not a CPU init of 0.6B weights
        model = Qwen3ForCausalLM(Qwen3Config(**cfg)).to(dtype)
    model.config._attn_implementation = "sdpa"
    return model, cfg, dtype


def engines(dev: str, smoke: bool) -> dict:
    """Rollout tokens per second on the Qwen3-0.6B-sized model: the lean engine against
    Hugging Face ``generate`` (``num_return_sequences``, sampling, no scores kept: what
    TRL's GRPOTrainer runs without vLLM), same prompts and sampling. On CUDA the lean
    engine runs its default (the decode step as a CUDA graph) and its dynamic loop, and
    the graph's greedy tokens are checked against the same fixed-shape step run eagerly."""
    import torch

    from rlpost.llm.model import tiny
    from rlpost.llm.rollout.engines.base import SamplingParams
    from rlpost.llm.rollout.engines.lean import LeanEngine

    model, cfg, _ = _qwen3(dev, smoke)
    model.eval()
    tok = tiny.build_tokenizer()  # pad / eos ids only: the prompts are random ids
    U, n, P, L = (2, 4, 8, 8) if smoke else (32, 8, 64, 128)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, cfg["vocab_size"], (P,), generator=g).tolist() for _ in range(U)]
    sp = SamplingParams(max_new_tokens=L, temperature=1.0)
    lean = {mode: LeanEngine(model, tok, batch_size=U * n, decode=mode)
            for mode in (("auto", "dynamic") if dev == "cuda" else ("auto",))}  # fmt: skip

    ids = torch.tensor(prompts, device=dev)

    def run_hf() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=L,
                min_new_tokens=L,
                num_return_sequences=n,
                pad_token_id=tok.pad_token_id,
                eos_token_id=None,
            )
        return int(out.shape[0] * (out.shape[1] - P))

    def run(engine) -> int:
        return int(engine.generate(prompts, n, sp).mask.sum())

    runs = [("lean", lambda: run(lean["auto"]))]
    if "dynamic" in lean:
        runs.append(("lean dynamic", lambda: run(lean["dynamic"])))
    rows = []
    for name, fn in (*runs, ("hf generate", run_hf)):
        fn()  # warm-up (allocator, kernels)
        _sync(dev)
        t = time.perf_counter()
        made = fn()
        _sync(dev)
        sec = time.perf_counter() - t
        rows.append({"engine": name, "tokens": made, "seconds": round(sec, 3),
                     "tokens_per_s": round(made / sec)})  # fmt: skip
        print(f"  {name}: {made} tokens in {sec:.2f} s, {made / sec:,.0f} tokens/s")
    ratio = rows[0]["tokens_per_s"] / rows[-1]["tokens_per_s"]
    print(f"engines: {U} prompts x {n} x {L} new tokens (prompt {P}); lean / hf = {ratio:.2f}x")
    scaling = decode_scaling(model, tok, prompts, dev, smoke)
    same = None
    if dev == "cuda":  # the replayed graph computes what the eager fixed-shape step does
        greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
        outs = [LeanEngine(model, tok, decode=m).generate(prompts, 1, greedy).completion_ids
                for m in ("graph", "static")]  # fmt: skip
        same = bool(torch.equal(*outs))
        print(f"  graph replay's greedy tokens equal the eager fixed-shape step's: {same}")
    return {"ok": same is not False, "prompts": U, "group": n, "prompt_len": P,
            "new_tokens": L, "rows": rows, "lean_over_hf": round(ratio, 2),
            "graph_equals_static": same, "decode_scaling": scaling}  # fmt: skip


def decode_scaling(model, tok, prompts: list[list[int]], dev: str, smoke: bool) -> list[dict]:
    """The lean engine's default decode (a CUDA graph on CUDA) by batch size: a decode
    step's time (``L`` and 2 new tokens timed, every row to full length, the difference
    over ``L - 2`` steps) and what a call costs besides (the 2-token call: prefill, the
    graph's capture, two steps). Whether a graph per compacted-batch bucket would pay
    depends on both: a step of half the rows must save more than a capture costs."""
    from rlpost.llm.rollout.engines.base import SamplingParams
    from rlpost.llm.rollout.engines.lean import LeanEngine

    sizes, n, L = ((8, 4), 4, 8) if smoke else ((256, 128, 64, 32), 8, 128)
    out = []
    for rows in sizes:
        some = prompts[: max(1, rows // n)]
        engine = LeanEngine(model, tok, batch_size=len(some) * n)
        took = {}
        for new in (2, L):
            sp = SamplingParams(max_new_tokens=new, min_new_tokens=new, temperature=1.0)
            engine.generate(some, n, sp)  # warm-up
            _sync(dev)
            t = time.perf_counter()
            engine.generate(some, n, sp)
            _sync(dev)
            took[new] = time.perf_counter() - t
        step_ms = 1e3 * (took[L] - took[2]) / (L - 2)
        out.append({"rows": len(some) * n, "step_ms": round(step_ms, 3),
                    "call_ms_2_tokens": round(1e3 * took[2], 1),
                    "tokens_per_s": round(len(some) * n * 1e3 / step_ms) if step_ms > 0 else None})  # fmt: skip
        print(f"  decode at {len(some) * n} rows: {step_ms:.2f} ms a step; a 2-token call "
              f"{1e3 * took[2]:.0f} ms")  # fmt: skip
    return out


def model_flops(model, tokens: int) -> float:
    """A training step's model FLOPs over ``tokens`` positions, as MFU counts them: six per
    weight per token (the forward's and the backward's matrix products), the LM head
    included and the input embedding (a lookup) not; attention scores and activation
    recomputation are not counted."""
    head = model.get_output_embeddings()
    lookup = {id(p) for p in model.get_input_embeddings().parameters()}
    lookup -= {id(p) for p in head.parameters()} if head is not None else set()
    unique = {id(p): p for p in model.parameters()}
    return 6.0 * tokens * sum(p.numel() for i, p in unique.items() if i not in lookup)


def peak_flops(dev: str) -> float | None:
    """The device's dense bfloat16 peak (:data:`PEAK_BF16`), or None when unknown (a CPU)."""
    if dev != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def trainer_step(dev: str, smoke: bool) -> dict:
    import torch

    from rlpost.core.presets import PolicyBatch
    from rlpost.llm.config import load_config
    from rlpost.llm.model.policy import completion_logprobs, make_seq_batch

    prompts, group, P, L = (2, 4, 16, 16) if smoke else (8, 8, 256, 768)
    model, cfg, dtype = _qwen3(dev, smoke)
    if not smoke:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=dev == "cuda")
    recipe = load_config(None, ["algo.preset=grpo", "algo.kl_coef=0.0"]).preset().build()
    V = cfg["vocab_size"]
    B = prompts * group
    prompt_ids = [torch.randint(0, V, (P,)).tolist() for _ in range(prompts) for _ in range(group)]
    comp = torch.randint(0, V, (B, L))
    mask = torch.ones(B, L)
    adv = torch.randn(B).repeat_interleave(L).view(B, L).to(dev)

    def step(layout: str) -> None:
        # uniform: the shared-prompt attention op (Triton on CUDA), one group a row;
        # ragged: the packed rows' real tokens end to end, attending by sequence (each
        # [prompt; response] its own causal sequence, no mask: SDPA's flash kernel; the
        # groups whole); ragged-dense: the rows under their 4D mask, long groups split;
        # padded: one row per sequence, shifted and run under plain causal attention
        # (no mask: SDPA's flash kernel), each prompt computed once per response
        base = layout.split("+")[0]  # "padded+fused-...": the padded layout, ops fused
        packed = base != "padded"
        sb = make_seq_batch(prompt_ids, comp, mask, 0, pack=packed, sequences=base == "ragged",
                            layout=base.split("-")[0] if packed else "ragged")  # fmt: skip
        logp, _ = completion_logprobs(model, sb, 1.0)
        m = mask.to(dev)
        batch = PolicyBatch(
            logp, logp.detach(), adv, m, global_tokens=float(m.sum()), global_sequences=float(B)
        )
        loss = recipe.policy_loss(batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    tokens = B * L + prompts * P  # trained completion tokens + the packed prompts
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    flops = model_flops(model, tokens)  # the work a step must do (prompts counted once)
    peak = peak_flops(dev)
    layouts = {}
    from rlpost.kernels.ops.rms_norm import fuse_rms_norms
    from rlpost.kernels.ops.swiglu import fuse_mlps

    # the fused rows last, each routing more of the model's modules for good
    route = {"padded+fused-norm": fuse_rms_norms, "padded+fused-norm+mlp": fuse_mlps}
    for layout in ("uniform", "ragged", "ragged-dense", "padded", *route):
        if layout in route:
            route[layout](model)
        if dev == "cuda":  # the layout's own peak (prime-rl's table reports peak memory)
            torch.cuda.reset_peak_memory_stats()
        try:
            ms = _time(lambda layout=layout: step(layout), dev, 2 if smoke else 5)
        except Exception as exc:  # reported; the other layout still counts
            layouts[layout] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            print(f"trainer step ({layout}): {layouts[layout]['error']}")
            continue
        tps = tokens / (ms / 1e3)
        mfu = flops / (ms / 1e3) / peak if peak else None
        gib = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None
        layouts[layout] = {"step_ms": round(ms, 1), "tokens_per_s": round(tps), "mfu": mfu,
                           "peak_gib": gib}  # fmt: skip
        print(
            f"trainer step ({layout}): {params / 1e6:.0f}M params, {B} x ({P} + {L}) tokens, "
            f"{ms:.0f} ms/step, {tps:,.0f} tokens/s"
            + (f", MFU {mfu:.1%}" if mfu is not None else "")
            + (f", peak {gib:.1f} GiB" if gib is not None else "")
            + f" (prime-rl, one H100: ~{PRIME_RL_TOKENS_PER_S:,})"
        )
    best = min((v for v in layouts.values() if "step_ms" in v), key=lambda v: v["step_ms"],
               default=None)  # fmt: skip
    return {
        "ok": best is not None and "step_ms" in layouts["uniform"],
        "params": params,
        "sequences": B,
        "prompt_len": P,
        "completion_len": L,
        "tokens_per_step": tokens,
        "layouts": layouts,
        "step_ms": best["step_ms"] if best else None,
        "tokens_per_s": best["tokens_per_s"] if best else None,
        "mfu": best["mfu"] if best else None,
        "peak_gib": best["peak_gib"] if best else None,
        "model_flops_per_step": flops,
        "peak_flops": peak,
        "prime_rl_h100_tokens_per_s": PRIME_RL_TOKENS_PER_S,
        "dtype": str(dtype),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="toy sizes; runs on CPU too")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument(
        "--only",
        nargs="+",
        choices=["cuda_tests", "kernels", "tiles", "vllm_engine", "vllm_teacher", "demo",
                 "parity", "engines", "trainer_step"],
        help="run these parts only",
    )  # fmt: skip
    args = ap.parse_args(argv)
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not args.smoke:
        print("no CUDA device: run with --smoke for the CPU rehearsal")
        return 2
    info = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__,
        "smoke": args.smoke,
    }
    print(f"gpu_check on {info['device']} (torch {info['torch']})")
    results: dict = {"info": info}
    parts = [
        ("cuda_tests", lambda: cuda_tests(args.smoke)),
        ("kernels", lambda: kernel_table(dev, args.smoke)),
        ("tiles", lambda: tiles(dev, args.smoke)),
        ("vllm_engine", lambda: vllm_engine(args.smoke)),
        ("vllm_teacher", lambda: vllm_teacher(args.smoke)),
        ("demo", lambda: demo(dev, args.smoke)),
        ("parity", lambda: parity(dev, args.smoke)),
        ("engines", lambda: engines(dev, args.smoke)),
        ("trainer_step", lambda: trainer_step(dev, args.smoke)),
    ]
    only = set(args.only or [name for name, _ in parts])
    parts = [(name, fn) for name, fn in parts if name in only]
    for name, fn in parts:
        print(f"\n== {name}", flush=True)
        t = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as exc:  # report and go on with the other parts
            traceback.print_exc()
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        results[name]["seconds"] = round(time.perf_counter() - t, 1)
        Path(args.out).write_text(json.dumps(results, indent=2))  # kept if a later part hangs
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return 0 if all(r.get("ok") for k, r in results.items() if k != "info") else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
