"""Adapter-only LoRA sync to rollout workers: the first sync sends the unmerged model and
its LoraConfig, every later one the adapter tensors alone, and the workers then generate
exactly what the merged policy generates. The Ray engine's own code runs here with its
actors called in process (the same calls Ray makes; the Ray round trip itself is in the
slow tier, test_ray_workers.py)."""

import copy

import torch
from transformers import Qwen2ForCausalLM

from rlpost.llm.config import load_config
from rlpost.llm.model import tiny
from rlpost.llm.model.policy import apply_lora
from rlpost.llm.rollout.engines import HFEngine, SamplingParams
from rlpost.llm.rollout.engines.build import sync_weights
from rlpost.llm.rollout.engines.ray_workers import RayRolloutEngine, RolloutWorker


class _Method:
    def __init__(self, fn):
        self.remote = fn


class _Actor:
    """A worker called in this process, through the ``.remote`` calls Ray would make."""

    def __init__(self, worker):
        self.load, self.generate = _Method(worker.load), _Method(worker.generate)


class _InProcessRay:
    put = staticmethod(lambda x: x)
    get = staticmethod(lambda x: x)

    class exceptions:
        RayActorError = type("RayActorError", (Exception,), {})
        RayTaskError = type("RayTaskError", (Exception,), {})


def _engine(tok, config, workers=2):
    eng = RayRolloutEngine.__new__(RayRolloutEngine)
    eng.ray, eng.pad_id, eng.policy_version, eng.restarts = _InProcessRay, tok.pad_token_id, 0, 0
    eng._weights = eng._adapters = eng._lora = None
    eng.sent = ([], 0)
    eng.workers = [_Actor(RolloutWorker(config, tok, "hf")) for _ in range(workers)]
    return eng


def _train_a_little(model):
    with torch.no_grad():  # an update: the adapters move, the base does not
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 0.05)


def test_workers_get_the_adapters_alone_and_generate_what_the_merged_policy_does():
    tok = tiny.build_tokenizer()
    torch.manual_seed(0)
    cfg = load_config(None, ["model.lora={r: 4}"])
    policy = apply_lora(Qwen2ForCausalLM(tiny.tiny_config(tok)), cfg.model.lora)
    eng = _engine(tok, policy.get_base_model().config)
    learner = type("Learner", (), {"sharded": False})()
    sync_weights(eng, cfg, policy, learner, 0, None)
    names, first_bytes = eng.sent
    assert any("lora_" in n for n in names) and any("lora_" not in n for n in names)
    prompts = [
        tok("12+7=", add_special_tokens=False).input_ids,
        tok("3+4=", add_special_tokens=False).input_ids,
    ]
    greedy = SamplingParams(6, 0.0)
    for version in (1, 2):
        _train_a_little(policy)
        sync_weights(eng, cfg, policy, learner, version, None)
        names, nbytes = eng.sent
        assert names and all("lora_" in n for n in names)  # the adapters alone
        assert nbytes < first_bytes / 5
        merged = copy.deepcopy(policy).merge_and_unload().eval()
        want = HFEngine(merged, tok).generate(prompts, 1, greedy)
        got = eng.generate(prompts, 1, greedy)
        assert torch.equal(got.completion_ids, want.completion_ids)
        assert torch.allclose(got.logprobs, want.logprobs, atol=1e-5)
        assert got.policy_version == version
