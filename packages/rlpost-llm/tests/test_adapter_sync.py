"""Adapter-only LoRA sync to rollout workers: the first sync sends the unmerged model and
its LoraConfig, every later one the adapter tensors alone, and the workers then generate
exactly what the merged policy generates. The Ray engine's own code runs here with its
actors called in process (the same calls Ray makes; the Ray round trip itself is in the
slow tier, test_ray_workers.py)."""

import copy
import threading

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
    eng.sent, eng.lazy, eng._published = ([], 0), False, threading.Lock()
    eng.workers = [_Actor(RolloutWorker(config, tok, "hf")) for _ in range(workers)]
    eng.versions = [-1] * workers
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


class _FakeVLLM:
    """vLLM's interface as the engine uses it (``LLM``, ``SamplingParams``, ``LoRARequest``),
    serving what vLLM would serve from the same files: the base model read from the
    folder the engine wrote, with the adapter of the request loaded by PEFT from the folder
    the engine wrote it to, decoded greedily. vLLM cannot run on this machine; this checks
    that what the engine hands it is the base alone plus a loadable adapter."""

    def __init__(self, tok):
        fake = self

        class LLM:
            def __init__(self, model, **kwargs):
                fake.kwargs = kwargs
                self.base = Qwen2ForCausalLM.from_pretrained(model).eval()

            def get_tokenizer(self):
                return tok

            def reset_prefix_cache(self):
                pass

            def generate(self, reqs, sp, use_tqdm=False, lora_request=None):
                from peft import PeftModel

                fake.requests.append(lora_request)
                model = copy.deepcopy(self.base)
                if lora_request is not None:
                    model = PeftModel.from_pretrained(model, lora_request.lora_path)
                    model = model.merge_and_unload()
                prompts = [r["prompt_token_ids"] for r in reqs]
                b = HFEngine(model.eval(), tok).generate(prompts, sp.n, SamplingParams(
                    sp.max_tokens, sp.temperature))  # fmt: skip
                outs = []
                for i in range(len(prompts)):
                    comps = []
                    for row in range(i * sp.n, (i + 1) * sp.n):
                        keep = b.mask[row] > 0
                        ids = b.completion_ids[row][keep].tolist()
                        lps = b.logprobs[row][keep].tolist()
                        comps.append(type("C", (), {
                            "token_ids": ids, "finish_reason": b.finish_reasons[row],
                            "logprobs": [{t: type("L", (), {"logprob": x})} for t, x in
                                         zip(ids, lps, strict=True)],
                        }))  # fmt: skip
                    outs.append(type("O", (), {"outputs": comps}))
                return outs

        class SamplingParams_:
            def __init__(self, **kw):
                self.__dict__.update(kw)

        class LoRARequest:
            def __init__(self, name, int_id, path):
                self.lora_name, self.lora_int_id, self.lora_path = name, int_id, path

        self.kwargs, self.requests = {}, []
        self.module = type("vllm", (), {"LLM": LLM, "SamplingParams": SamplingParams_})
        self.request_module = type("request", (), {"LoRARequest": LoRARequest})


def test_vllm_serves_the_base_with_the_adapter_it_was_last_sent(tmp_path, monkeypatch):
    import sys

    from rlpost.llm.rollout.engines.build import _vllm
    from rlpost.llm.train.forward import merged_state_dict

    tok = tiny.build_tokenizer()
    fake = _FakeVLLM(tok)
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    monkeypatch.setitem(sys.modules, "vllm.lora", type("lora", (), {}))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", fake.request_module)
    torch.manual_seed(0)
    cfg = load_config(None, ["model.lora={r: 4}", "rollout.engine=vllm"])
    policy = apply_lora(Qwen2ForCausalLM(tiny.tiny_config(tok)), cfg.model.lora)
    _train_a_little(policy)  # as a resumed run's: the engine must not merge them twice
    eng = _vllm(cfg, policy, tok, tmp_path, merged_state_dict)
    assert fake.kwargs["enable_lora"] and fake.kwargs["max_lora_rank"] == 8  # r=4 rounded up
    learner = type("Learner", (), {"sharded": False})()
    prompts = [tok(p, add_special_tokens=False).input_ids for p in ("12+7=", "3+4=")]
    greedy = SamplingParams(6, 0.0)
    whole = sum(v.numel() * v.element_size() for v in merged_state_dict(policy).values())
    for version in (1, 2):
        _train_a_little(policy)
        sync_weights(eng, cfg, policy, learner, version, merged_state_dict)
        names, nbytes = eng.sent
        assert names and all("lora_" in n for n in names) and nbytes < whole / 20
        merged = copy.deepcopy(policy).merge_and_unload().eval()
        want = HFEngine(merged, tok).generate(prompts, 1, greedy)
        got = eng.generate(prompts, 1, greedy)
        assert torch.equal(got.completion_ids, want.completion_ids)
        assert torch.allclose(got.logprobs, want.logprobs, atol=1e-5)
        req = fake.requests[-1]
        assert req.lora_int_id == version + 1 and got.policy_version == version
        assert sorted(p.name for p in (tmp_path / "vllm-lora").iterdir()) == [f"v{version:06d}"]
