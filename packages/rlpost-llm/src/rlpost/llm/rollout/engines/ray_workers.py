"""Rollout workers on Ray: N engine actors behind the :class:`RolloutEngine` protocol.

:class:`RayRolloutEngine` splits a generate call's prompts into contiguous shards of whole
groups, one per worker, and concatenates the workers' batches in prompt order. Each
worker (:class:`RolloutWorker`) holds its own copy of the policy in an in-process engine
(lean or HF ``generate``, one torch thread). After each update the trainer's weights go
into Ray's object store once (``ray.put``); every worker loads them from there.

The same code runs on one machine (a local Ray started here) and on a cluster: call
``ray.init(address=...)`` first, or set ``rollout.ray_address``.

With a LoRA policy the workers get the whole unmerged model and its ``LoraConfig`` once,
then only the adapter tensors after each update (:meth:`RayRolloutEngine.update_adapter`).

Faults: a shard whose worker died is regenerated on a fresh worker that first loads the
current weights. Each shard's seed is drawn before dispatch, so the regenerated shard
holds the rows the dead worker would have returned: nothing is lost and nothing is
counted twice (``restarts`` counts the replacements).

Several versions at once (DORA's multi-version streaming, 001-29): with :attr:`lazy`
set, :meth:`RayRolloutEngine.update_weights` only publishes the new weights (one
``ray.put``) and each :class:`WorkerView` loads them into its worker between two of its
own chunks, so the trainer never waits for a generator and workers run different
versions at the same time. ``versions[i]`` is the version worker ``i`` holds; a whole
:meth:`RayRolloutEngine.generate` (evaluation) first brings every worker up to date.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import torch
from torch import Tensor

from rlpost.llm.rollout.engines.base import RolloutBatch, SamplingParams


class RolloutWorker:
    """One Ray actor: an in-process engine over its own copy of the policy."""

    def __init__(self, config: Any, tokenizer: Any, engine: str, threads: int = 1):
        torch.set_num_threads(threads)
        from transformers import AutoModelForCausalLM

        from rlpost.llm.rollout.engines import make_local_engine

        model = AutoModelForCausalLM.from_config(config)
        self.engine = make_local_engine(engine, model.eval(), tokenizer)
        self.lora = False  # adapters injected (adapter-only sync)

    def load(
        self, state_dict: dict[str, Tensor], version: int, lora: Any = None,
        adapter_only: bool = False,
    ) -> int:  # fmt: skip
        """Load weights as ``version``: whole (``strict``), or, with ``adapter_only``, the
        LoRA tensors alone over the base loaded before. ``lora`` (a peft ``LoraConfig``):
        the policy's adapters, injected into this worker's model on first sight."""
        model = self.engine.model
        if lora is not None and not self.lora:
            from peft import inject_adapter_in_model

            inject_adapter_in_model(lora, model)
            model.eval()
            self.lora = True
        if adapter_only:
            missing, unexpected = model.load_state_dict(state_dict, strict=False)
            if unexpected or any("lora_" in k for k in missing):
                raise RuntimeError(
                    f"adapter sync: unexpected {unexpected[:3]}, missing "
                    f"{[k for k in missing if 'lora_' in k][:3]}"
                )
        else:
            model.load_state_dict(state_dict, strict=True)
        self.engine.policy_version = version
        return os.getpid()

    def generate(self, prompts: list[list[int]], n: int, sp: SamplingParams, seed: int):
        torch.manual_seed(seed)
        return self.engine.generate(prompts, n, sp)


class RayRolloutEngine:
    """``workers`` :class:`RolloutWorker` actors (``engine``: ``auto``, ``lean`` or ``hf``)
    generating for ``model``'s architecture with ``tokenizer``, on the weights of the
    last :meth:`update_weights` (full weights: LoRA merged). ``address``: the Ray cluster
    to join (None: the one this process joined, else a local one)."""

    own_copy = True  # the workers hold their own weights, synced by update_weights
    merged_weights = True  # full weights (LoRA merged), as an external engine needs

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        workers: int,
        engine: str = "auto",
        address: str | None = None,
        threads: int = 1,
    ):
        from rlpost.llm.rollout.cluster import import_ray

        if workers < 1:
            raise ValueError(f"rollout.workers: at least 1, got {workers}")
        ray = import_ray("rollout.workers")
        self.ray = ray
        self._started = not ray.is_initialized()
        self._local = None
        if self._started and address:
            ray.init(
                address=address, include_dashboard=False, log_to_driver=False,
                configure_logging=False,
            )  # fmt: skip
        elif self._started:  # on the loopback, gone with this process
            from rlpost.core.ray_local import init_local_ray

            self._local = init_local_ray(ray, num_cpus=workers)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._spawn_args = (base.config, tokenizer, engine, threads)
        self._cls = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
        self.pad_id = int(tokenizer.pad_token_id)
        self.policy_version = 0
        self.restarts = 0
        self._weights = None
        self._adapters = None  # the latest adapter tensors (adapter-only sync)
        self._lora = None  # the policy's LoraConfig (adapter-only sync)
        self.sent: tuple[list[str], int] = ([], 0)  # the last sync's tensor names and bytes
        self.lazy = False  # publish new weights only; workers load them between chunks
        self._published = threading.Lock()  # guards the weights / version pair
        self.workers = [self._spawn() for _ in range(workers)]  # weights: update_weights
        self.versions = [-1] * workers  # the version each worker holds (-1: none yet)

    def _spawn(self):
        return self._cls.remote(*self._spawn_args)

    def _replace(self, i: int) -> None:
        """A fresh worker in slot ``i``, on the current weights (adapter sync: the base and
        adapters it was first sent, then the latest adapters)."""
        with contextlib.suppress(Exception):  # (already gone)
            self.ray.kill(self.workers[i])
        self.workers[i] = self._spawn()
        self._bring_up(i)
        self.restarts += 1

    def _bring_up(self, i: int) -> None:
        """Worker ``i`` on the published weights (adapter sync: the base and adapters it
        was first sent, then the latest adapters)."""
        with self._published:  # (weights and version read as one pair)
            weights, adapters, v = self._weights, self._adapters, self.policy_version
        w = self.workers[i]
        self.ray.get(w.load.remote(weights, v, self._lora))
        if adapters is not None:
            self.ray.get(w.load.remote(adapters, v, self._lora, True))
        self.versions[i] = v

    def _send(self, weights: Any, version: int, adapter_only: bool) -> None:
        if self.lazy:  # (each worker loads them when its current chunk is done)
            return
        refs = {
            i: w.load.remote(weights, version, self._lora, adapter_only)
            for i, w in enumerate(self.workers)
        }
        for i, ref in refs.items():
            try:
                self.ray.get(ref)
                self.versions[i] = version
            except self.ray.exceptions.RayActorError:
                self._replace(i)

    def current(self, i: int) -> None:
        """Worker ``i`` on the latest published weights, if it holds older ones."""
        if self.versions[i] != self.policy_version:
            try:
                self._bring_up(i)
            except self.ray.exceptions.RayActorError:
                self._replace(i)

    def view(self, i: int) -> WorkerView:
        """An engine that generates on worker ``i`` alone, at the version it holds."""
        return WorkerView(self, i)

    def update_adapter(self, model: torch.nn.Module, version: int) -> None:
        """A LoRA policy's weights as the workers need them (TRL's, verl's and SkyRL's
        adapter sync): the first time the whole unmerged model and its ``LoraConfig`` (the
        workers inject the same adapters), after that the adapter tensors alone, since the
        base is frozen. ``sent``: the tensor names and bytes of the last sync."""
        prefix = "base_model.model."  # PeftModel's: the workers hold the plain model
        sd = {k.removeprefix(prefix): v for k, v in model.state_dict().items()}
        first = self._lora is None  # (whole weights sent before, merged, do not count)
        if not first:
            sd = {k: v for k, v in sd.items() if "lora_" in k}
        cpu = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in sd.items()}
        self.sent = (sorted(cpu), sum(v.numel() * v.element_size() for v in cpu.values()))
        ref = self.ray.put(cpu)
        with self._published:
            if first:
                self._lora = model.peft_config[model.active_adapter]
                self._weights = ref
            else:
                self._adapters = ref
            self.policy_version = version
        self._send(ref, version, adapter_only=not first)

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        cpu = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state_dict.items()}
        self.sent = (sorted(cpu), sum(v.numel() * v.element_size() for v in cpu.values()))
        ref = self.ray.put(cpu)  # once into the object store, read by every worker
        with self._published:
            self._weights, self.policy_version = ref, version
        self._send(ref, version, adapter_only=False)

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> RolloutBatch:
        if self._weights is None:
            raise RuntimeError("RayRolloutEngine: update_weights before the first generate")
        for i in range(len(self.workers)):  # (lazy: the workers a chunk left behind)
            self.current(i)
        W = min(len(self.workers), len(prompts))
        bounds = [round(i * len(prompts) / W) for i in range(W + 1)]
        shards = [prompts[bounds[i] : bounds[i + 1]] for i in range(W)]
        seeds = torch.randint(0, 2**31 - 1, (W,)).tolist()  # drawn before dispatch
        refs = {
            i: self.workers[i].generate.remote(shards[i], n, sampling, seeds[i]) for i in range(W)
        }
        out: dict[int, RolloutBatch] = {}
        while refs:
            i, ref = next(iter(refs.items()))
            try:
                out[i] = self.ray.get(ref)
                del refs[i]
            except self.ray.exceptions.RayActorError:  # the worker died: its whole shard again
                self._replace(i)
                refs[i] = self.workers[i].generate.remote(shards[i], n, sampling, seeds[i])
            except self.ray.exceptions.RayTaskError as exc:  # e.g. non-finite logits
                cause = getattr(exc, "cause", None)
                raise (cause if isinstance(cause, Exception) else exc) from None
        batch = RolloutBatch.concat([out[i] for i in range(W)])
        batch.policy_version = self.policy_version
        return batch

    def sleep(self) -> None:
        """Nothing to release in this process."""

    def wake(self) -> None:
        """Undo :meth:`sleep` (nothing to undo)."""

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                self.ray.kill(w)
        self.workers = []
        if self._started and self.ray.is_initialized():
            self.ray.shutdown()
        if self._local is not None:
            self._local.stop()
            self._local = None


class WorkerView:
    """One worker of a :class:`RayRolloutEngine` as an engine of its own (DORA's
    generators): :meth:`generate` first loads the latest published weights if the worker
    holds older ones (between two chunks, never inside one), then generates there; the
    batch carries the version it was generated with. The seed is drawn before dispatch,
    as :meth:`RayRolloutEngine.generate` draws its shards', so a dead worker is replaced
    and the call repeated with the same seed."""

    def __init__(self, engine: RayRolloutEngine, index: int):
        self.engine, self.index = engine, index
        self.pad_id = engine.pad_id

    @property
    def policy_version(self) -> int:
        return self.engine.versions[self.index]

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> RolloutBatch:
        eng, i = self.engine, self.index
        seed = int(torch.randint(0, 2**31 - 1, ()))
        eng.current(i)
        version = eng.versions[i]
        while True:
            try:
                batch = eng.ray.get(eng.workers[i].generate.remote(prompts, n, sampling, seed))
                break
            except eng.ray.exceptions.RayActorError:
                eng._replace(i)  # (on the published weights: the version moves on)
                version = eng.versions[i]
            except eng.ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                raise (cause if isinstance(cause, Exception) else exc) from None
        batch.policy_version = version
        return batch
