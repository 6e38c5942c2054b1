"""The RL trainer with its policy on a CUDA GPU (``run.device``). The ``@cuda`` cases need
one (CI has none; ``tools/gpu_check.sh`` runs them on a lent GPU); the others run
everywhere."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlpost.llm.trainer import Trainer

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def parity_reward(completion: str, example) -> float:
    """Varied rewards, so that the advantages (and the gradients) are not zero."""
    return float(len(completion) % 2 == 0)


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without a GPU, on any machine (these run on a GPU machine too)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_a_missing_gpu_is_one_line_at_load(fast_cfg, no_gpu):
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        fast_cfg("run.device=cuda")
    with pytest.raises(ValueError, match="device 'gpu0'"):
        fast_cfg("run.device=gpu0")


def test_auto_is_the_cpu_without_a_gpu(fast_cfg, no_gpu):
    tr = Trainer(fast_cfg("run.device=auto"))
    assert next(tr.model.parameters()).device.type == "cpu"
    tr.close()


@cuda
def test_cuda_update_matches_the_cpu_update(tmp_path, fast_cfg, applied_grads):
    """The same collected batch, the same initial weights: the update's gradients on the
    GPU equal the CPU's (fp32; reduction order only), and so does its loss."""
    cpu = Trainer(fast_cfg("run.device=cpu", f"run.dir={tmp_path}/cpu"), reward_fn=parity_reward)
    gpu = Trainer(fast_cfg("run.device=cuda", f"run.dir={tmp_path}/gpu"), reward_fn=parity_reward)
    assert next(gpu.model.parameters()).is_cuda
    col = cpu.collect()
    assert col.rewards.std() > 0
    g_cpu, m_cpu = applied_grads(cpu, lambda: cpu.update(col))
    g_gpu, m_gpu = applied_grads(gpu, lambda: gpu.update(col))
    assert g_cpu.keys() == g_gpu.keys() and any(g.abs().sum() > 0 for g in g_cpu.values())
    off = {  # name: (largest difference, largest CPU gradient entry)
        k: (float((g_gpu[k].cpu() - g).abs().max()), float(g.abs().max()))
        for k, g in g_cpu.items()
        if not torch.allclose(g_gpu[k].cpu(), g, rtol=1e-3, atol=1e-6)
    }
    assert not off, off
    assert m_gpu["entropy"] == pytest.approx(m_cpu["entropy"], rel=1e-4, abs=1e-6)
    cpu.close()
    gpu.close()


@cuda
def test_cuda_training_resumes_to_the_uninterrupted_run(tmp_path, fast_cfg):
    """GRPO end to end on the GPU (the lean engine samples there): a run stopped at its
    checkpoint and resumed ends where the uninterrupted run ends (GPU atomics: to float
    tolerance), and the checkpoint is the GPU policy's weights, readable on the CPU."""
    args = ["run.device=cuda", "train.steps=4", "run.save_every=2", "rollout.max_new_tokens=8"]
    full = Trainer(fast_cfg(*args, f"run.dir={tmp_path}/full"), reward_fn=parity_reward)
    full.train()
    assert next(full.model.parameters()).is_cuda
    full.close()
    half = Trainer(fast_cfg(*args, f"run.dir={tmp_path}/half"), reward_fn=parity_reward)
    half.train(until=2)
    half.close()
    resumed = Trainer(
        fast_cfg(*args, f"run.dir={tmp_path}/half"), reward_fn=parity_reward, resume=True
    )
    resumed.train()
    resumed.close()
    final = "checkpoints/step-000004/model.safetensors"
    a = load_file(tmp_path / "full" / final)
    b = load_file(tmp_path / "half" / final)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].device.type == "cpu"
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)


@cuda
def test_cuda_evaluation_decodes_what_the_cpu_decodes(fast_cfg):
    """``rlpost-llm eval`` on the GPU (``run.device``): the greedy completions of the
    held-out prompts are the CPU's (float32; only the reduction order differs)."""
    from rlpost.llm.data.prompts import encode_prompt, make_prompt_source
    from rlpost.llm.rollout.engines.base import SamplingParams
    from rlpost.llm.tools.evaluate import _policy_engine

    texts = {}
    for device in ("cpu", "cuda"):
        cfg = fast_cfg(f"run.device={device}", "data.eval_size=32")
        tok, engine = _policy_engine(cfg)
        assert next(engine.model.parameters()).device.type == device
        src = make_prompt_source(cfg.data.task, dict(cfg.data.task_params), None, 32, 0)
        prompts = [encode_prompt(tok, e.prompt) for e in src.eval_examples]
        texts[device] = engine.generate(prompts, 1, SamplingParams(8, 0.0)).texts(tok)
    assert texts["cuda"] == texts["cpu"]


@cuda
def test_cuda_a_model_passed_on_the_cpu_goes_to_the_gpu(fast_cfg):
    from rlpost.llm.model.policy import load_policy

    model, tok = load_policy(fast_cfg("run.device=cpu"), progress=False)
    tr = Trainer(fast_cfg("run.device=cuda"), model=model, tokenizer=tok, reward_fn=parity_reward)
    assert next(tr.model.parameters()).is_cuda
    tr.train()
    tr.close()


@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_ragged_rows_by_sequence_equal_the_dense_rows(dtype):
    """On the GPU the ragged layout attending by sequence (each ``[prompt; response]`` its
    own causal sequence, no mask) gives the dense rows' log-probs and gradients; in
    bfloat16 it runs on SDPA's flash kernel alone (the dense rows' mask rules it out)."""
    import copy

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny
    from rlpost.llm.model.policy import completion_logprobs, make_seq_batch

    torch.manual_seed(0)
    tok = tiny.build_tokenizer()
    base = Qwen2ForCausalLM(tiny.tiny_config(tok)).to("cuda", getattr(torch, dtype)).train()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, len(tok), (n,), generator=g).tolist() for n in (9, 30)]
    prompts = [prompts[0]] * 4 + [prompts[1]] * 4
    comp = torch.randint(3, len(tok), (8, 96), generator=g)
    lengths = torch.randint(40, 97, (8, 1), generator=g)
    mask = (torch.arange(96)[None] < lengths).float()
    sb = make_seq_batch(prompts, comp, mask, tok.pad_token_id, pack=True, layout="ragged")
    out = {}
    for by_sequence in (False, True):
        sb.packed.sequences = by_sequence  # (the same rows, with their mask, either way)
        m = copy.deepcopy(base)
        only_flash = by_sequence and dtype == "bfloat16"
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if only_flash else torch.enable_grad():
            lp, _ = completion_logprobs(m, sb, 1.0)
            (lp.float() * mask.cuda()).sum().backward()
        out[by_sequence] = (
            lp.detach().float() * mask.cuda(),
            [p.grad.float() for p in m.parameters()],
        )
    tol = 1e-4 if dtype == "float32" else 3e-2
    a, b = out[True], out[False]
    assert float((a[0] - b[0]).abs().max()) < tol * 10
    for ga, gb in zip(a[1], b[1], strict=True):
        assert float((ga - gb).norm()) <= tol * float(gb.norm()) + 1e-6
