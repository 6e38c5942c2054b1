"""Rollout engine on vLLM (extra ``[vllm]``, GPU only), colocated with the trainer.

vLLM runs in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so weights are
synced in memory with ``load_weights`` on the engine's model; ``sleep``/``wake`` release
and restore its KV cache (and weights, level 1 offloads them to CPU) between rollouts.
Log-probs are requested as *processed* log-probs (after temperature / top-p), matching
what :class:`~rlpost.llm.rollout.engines.hf.HFEngine` returns.

Only exercised on a GPU; on CPU the trainer's tests drive a fake engine through the
same :class:`~rlpost.llm.rollout.engines.base.RolloutEngine` protocol.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from torch import Tensor

from rlpost.llm.rollout.engines.base import RolloutBatch, SamplingParams

#: the LoRA ranks vLLM accepts for ``max_lora_rank`` (a policy's rank is rounded up)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _import_vllm():
    try:
        import vllm
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from rlpost.core import MissingDependency

        raise MissingDependency(
            "the vLLM rollout engine needs the [vllm] extra on a CUDA machine: "
            "`uv sync --no-group lerobot --group vllm` (or `pip install rlpost-llm[vllm]`)"
        ) from exc
    return vllm


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "bfloat16",
        enable_sleep_mode: bool = True,
        seed: int = 0,
        max_model_len: int | None = None,
        lora_rank: int | None = None,
        lora_dir: str | None = None,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weight sync
        vllm = _import_vllm()
        self._vllm = vllm
        lora = {}
        if lora_rank is not None:  # adapter-only sync: vLLM serves the base + our adapter
            rank = min((r for r in VLLM_LORA_RANKS if r >= lora_rank), default=lora_rank)
            lora = {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1}
        self.llm = vllm.LLM(
            model=model_path,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            enable_sleep_mode=enable_sleep_mode,
            seed=seed,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            **lora,
        )
        self.lora_dir = lora_dir
        self.lora_request = None  # the adapter generation runs with (adapter-only sync)
        self.sent: tuple[list[str], int] = ([], 0)  # the last sync's tensor names and bytes
        tok = self.llm.get_tokenizer()
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        self.policy_version = 0
        self.asleep = False

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> RolloutBatch:
        vllm = self._vllm
        sp = vllm.SamplingParams(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            min_tokens=sampling.min_new_tokens,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's log-prob only
        )
        reqs = [{"prompt_token_ids": p} for p in prompts]
        lora = {"lora_request": self.lora_request} if self.lora_request is not None else {}
        outputs = self.llm.generate(reqs, sp, use_tqdm=False, **lora)
        rows = []
        for i, out in enumerate(outputs):
            for comp in out.outputs:
                toks = list(comp.token_ids)
                lps = [float(d[t].logprob) for d, t in zip(comp.logprobs, toks, strict=True)]
                reason = "length" if comp.finish_reason == "length" else "stop"
                rows.append((prompts[i], toks, lps, reason))
        return RolloutBatch.from_rows(rows, len(prompts), n, self.pad_id, self.policy_version)

    def update_adapter(self, model: Any, version: int) -> None:
        """A LoRA policy's adapters alone (the base is frozen, and vLLM holds it): written
        in PEFT's format (``adapter_model.safetensors`` + ``adapter_config.json``) to
        ``lora_dir/v<version>`` and used by the next generations as a ``LoRARequest`` with
        a new id, so vLLM loads the new adapter instead of its cached one."""
        if self.lora_dir is None:
            raise RuntimeError("VLLMEngine: update_adapter needs an engine built with lora_rank")
        from vllm.lora.request import LoRARequest

        root = Path(self.lora_dir)
        path = root / f"v{version:06d}"
        model.save_pretrained(str(path), safe_serialization=True)
        for old in root.glob("v*"):  # one adapter on disk: the one in use
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        names = [k for k in model.state_dict() if "lora_" in k]
        sd = model.state_dict()
        self.sent = (sorted(names), sum(sd[k].numel() * sd[k].element_size() for k in names))
        self.lora_request = LoRARequest(f"policy-v{version}", version + 1, str(path))
        self.llm.reset_prefix_cache()
        self.policy_version = version

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        weights = list(state_dict.items())
        self.sent = (sorted(state_dict), sum(v.numel() * v.element_size() for _, v in weights))

        def load(worker):  # runs inside the (in-process) vLLM worker
            worker.model_runner.model.load_weights(weights=weights)

        self.llm.collective_rpc(load)
        self.llm.reset_prefix_cache()
        self.policy_version = version

    def sleep(self) -> None:
        if not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


class VLLMScorer:
    """A frozen distillation teacher on vLLM (GPU): the log-probs, and the top-K, that it
    gives each token of given completions, read from vLLM's ``prompt_logprobs`` over
    prompt + completion (one forward, no sampling). Prompt log-probs come from the raw
    logits: they equal the teacher's distribution at temperature 1, so the student must
    sample at temperature 1 (checked at load)."""

    def __init__(
        self,
        model_path: str,
        gpu_memory_utilization: float = 0.2,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = _import_vllm()
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=model_path,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            max_model_len=max_model_len,
        )
        self.vocab_size = len(self.llm.get_tokenizer())

    def score(
        self, prompts: list[list[int]], completions: list[list[int]], topk: int | None
    ) -> list[tuple[list[float], list[list[tuple[int, float]]]]]:
        """Per completion: each token's log-prob, and (``topk``) the teacher's top-K
        ``(id, log-prob)`` at each position, highest first."""
        sp = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=topk or 0)
        reqs = [{"prompt_token_ids": p + c} for p, c in zip(prompts, completions, strict=True)]
        out = []
        for p, c, res in zip(
            prompts, completions, self.llm.generate(reqs, sp, use_tqdm=False), strict=True
        ):
            per_pos = res.prompt_logprobs[
                len(p) : len(p) + len(c)
            ]  # position 0 of a prompt is None
            lps = [float(d[t].logprob) for d, t in zip(per_pos, c, strict=True)]
            tops = []
            if topk:
                for d in per_pos:
                    best = sorted(d.items(), key=lambda kv: -kv[1].logprob)[:topk]
                    tops.append([(int(t), float(v.logprob)) for t, v in best])
            out.append((lps, tops))
        return out
