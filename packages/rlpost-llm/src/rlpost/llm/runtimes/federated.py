"""Federated RL post-training with compressed, asynchronous updates (catalog 001-07).

``federated.clients`` clients each run an ordinary rlpost-llm trainer on their own prompt
stream (``data.seed + i``: IID shards of the task) for ``local_steps`` steps from the
server's weights, then send back their update (trained minus received weights, the
trainable parameters only) compressed with error feedback
(:mod:`rlpost.core.federated`). The server folds the updates in:

* ``backend: local``, synchronous rounds, clients one after another in this process: the
  FedAvg step ``theta += mean_i(update_i)`` (weighted by samples) each round;
* ``backend: ray``, asynchronous: every client is a Ray actor; the server applies each
  update the moment it arrives, ``theta += (1 / K) (1 + s)^-a update`` with ``s`` the
  number of server versions since that client's weights were sent, and sends the client
  the new weights at once (slow clients never hold the others back).

The server's weights are evaluated before and after (held-out greedy accuracy) and saved
as a ``from_pretrained`` folder in ``<run.dir>/server``; the summary (bytes sent against
the dense size, staleness, accuracy) goes to ``<run.dir>/federated.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlpost.core.federated import ErrorFeedback, aggregate, decode, staleness_weight, wire_bytes
from rlpost.llm.config import Config


def _params(model: torch.nn.Module) -> list[Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def flat_weights(model: torch.nn.Module) -> Tensor:
    return torch.nn.utils.parameters_to_vector(_params(model)).detach().clone()


@torch.no_grad()
def load_flat(model: torch.nn.Module, flat: Tensor) -> None:
    """Copy ``flat`` into the trainable parameters in place (``vector_to_parameters``
    would re-point them at views of ``flat``, which the optimiser and the update guard
    do not follow, and training would then write into ``flat``)."""
    i = 0
    for p in _params(model):
        n = p.numel()
        p.copy_(flat[i : i + n].view_as(p))
        i += n


def client_config(cfg: Config, index: int) -> Config:
    """Client ``index``'s trainer: its own prompt stream and run directory, all its rounds'
    steps."""
    assert cfg.federated is not None
    f = cfg.federated
    c = cfg.model_dump()
    c["federated"] = None
    c["data"]["seed"] = cfg.data.seed + 1 + index
    c["train"]["steps"] = f.rounds * f.local_steps
    c["run"].update(
        dir=str(Path(cfg.run.dir) / "clients" / str(index)), progress=False, eval_every=0
    )
    return Config.model_validate(c)


class Client:
    """One client: a trainer and its error-feedback memory (a Ray actor's body)."""

    def __init__(self, cfg_json: str, kind: str, ratio: float, threads: int = 1):
        from rlpost.llm.trainer import Trainer

        torch.set_num_threads(threads)
        self.trainer = Trainer(Config.model_validate_json(cfg_json), overwrite=True)
        self.ef = ErrorFeedback(kind, ratio)

    def work(self, weights: Tensor, version: int, steps: int) -> dict[str, Any]:
        """Train ``steps`` local steps from ``weights``; the compressed update."""
        t = self.trainer
        load_flat(t.model, weights)
        t.train(until=t.step + steps)
        delta = flat_weights(t.model) - weights
        sent = self.ef.compress(delta)
        rows = t.cfg.rollout.prompts_per_step * t.preset.group_size * steps
        return {"update": sent, "version": version, "samples": float(rows), "step": t.step}

    def close(self) -> None:
        if self.trainer.step >= self.trainer.total_steps:
            self.trainer.train()  # ends the finished run (closes it, writes its summary)
        else:
            self.trainer.close()


def run_federated(cfg: Config, *, progress: bool = True, overwrite: bool = False) -> dict[str, Any]:
    """Train the server's policy from ``cfg.federated.clients`` clients (see the module
    docstring); returns the summary. A finished federated run in ``run.dir`` is replaced
    only with ``overwrite``."""
    from rlpost.llm.model.policy import save_pretrained_files
    from rlpost.llm.trainer import Trainer

    f = cfg.federated
    assert f is not None
    root = Path(cfg.run.dir)
    if (root / "federated.json").is_file() and not overwrite:
        raise ValueError(f"run.dir {root} holds a federated run: --overwrite replaces it")
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if progress:
            print(f"federated: {msg}", flush=True)

    s = cfg.model_dump()
    s["federated"] = None
    s["run"].update(dir=str(root / "server"), progress=False)
    server = Trainer(Config.model_validate(s), overwrite=True)
    theta = flat_weights(server.model)
    before = server._eval_metrics()
    dense = theta.numel() * theta.element_size()
    sent_bytes, updates, stale = 0, 0, []
    per_update = f.local_steps * cfg.rollout.prompts_per_step * cfg.rollout.group_size
    curve = [[0, 0, before["eval/accuracy"]]]  # (updates, rollouts, server accuracy)

    def point() -> None:
        """The server's held-out accuracy now, every ``eval_every`` rounds' updates."""
        if f.eval_every and updates % (f.eval_every * f.clients) == 0:
            load_flat(server.model, theta)
            acc = server._eval_metrics()["eval/accuracy"]
            curve.append([updates, updates * per_update, acc])
            say(f"{updates} updates: server held-out accuracy {acc:.3f}")

    cfgs = [client_config(cfg, i).model_dump_json() for i in range(f.clients)]
    if f.backend == "local":
        clients = [Client(c, f.compression, f.ratio) for c in cfgs]
        for r in range(f.rounds):
            outs = [c.work(theta, r, f.local_steps) for c in clients]
            sent_bytes += sum(wire_bytes(o["update"]) for o in outs)
            updates += len(outs)
            stale += [0] * len(outs)
            theta = theta + aggregate([decode(o["update"]) for o in outs],
                                      samples=[o["samples"] for o in outs])  # fmt: skip
            say(f"round {r + 1}/{f.rounds}: {len(outs)} updates averaged")
            point()
        for c in clients:
            c.close()
    else:
        from rlpost.llm.runtimes.cluster import local_ray

        with local_ray(f.workers or f.clients, "federated.backend=ray") as ray:
            Actor = ray.remote(num_cpus=1)(Client)
            actors = [Actor.remote(c, f.compression, f.ratio) for c in cfgs]
            version, left = 0, [f.rounds] * f.clients
            jobs = {}
            for i, a in enumerate(actors):
                jobs[a.work.remote(theta, version, f.local_steps)] = i
                left[i] -= 1
            while jobs:
                (ref,), _ = ray.wait(list(jobs), num_returns=1)
                i = jobs.pop(ref)
                out = ray.get(ref)
                s_i = version - out["version"]
                stale.append(s_i)
                w = staleness_weight(s_i, f.staleness) / f.clients
                theta = theta + w * decode(out["update"])
                version += 1
                updates += 1
                sent_bytes += wire_bytes(out["update"])
                point()
                if left[i] > 0:
                    jobs[actors[i].work.remote(theta, version, f.local_steps)] = i
                    left[i] -= 1
            say(f"{updates} asynchronous updates applied, mean staleness "
                f"{sum(stale) / max(len(stale), 1):.2f}")  # fmt: skip
            ray.get([a.close.remote() for a in actors])
    load_flat(server.model, theta)
    after = server._eval_metrics()
    out_dir = root / "server" / "final"
    out_dir.mkdir(parents=True, exist_ok=True)
    server.model.save_pretrained(str(out_dir), safe_serialization=True)
    save_pretrained_files(server.model, server.tok, out_dir)
    server.close()
    if curve[-1][0] != updates:
        curve.append([updates, updates * per_update, after["eval/accuracy"]])
    summary = {
        "clients": f.clients,
        "rounds": f.rounds,
        "updates": updates,
        "backend": f.backend,
        "compression": f.compression,
        "bytes_sent": sent_bytes,
        "bytes_dense": dense * updates,
        "compression_ratio": sent_bytes / max(dense * updates, 1),
        "mean_staleness": sum(stale) / max(len(stale), 1),
        "eval_before": before["eval/accuracy"],
        "eval_after": after["eval/accuracy"],
        "rollouts": updates * per_update,
        "curve": curve,
        "model": str(out_dir),
        "seconds": time.perf_counter() - t0,
    }
    (root / "federated.json").write_text(json.dumps(summary, indent=1))
    return summary
