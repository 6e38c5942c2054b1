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
from collections.abc import Callable
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


class _Server:
    """The server of a federated run: its trainer, its flat weights ``theta`` and the tally
    of the updates folded into them (bytes sent, staleness, the held-out accuracy curve)."""

    def __init__(self, cfg: Config, root: Path, say: Callable[[str], None]):
        """Start the server's trainer (``<run.dir>/server``) and evaluate its weights."""
        from rlpost.llm.trainer import Trainer

        f = cfg.federated
        assert f is not None
        self.f, self.say = f, say
        s = cfg.model_dump()
        s["federated"] = None
        s["run"].update(dir=str(root / "server"), progress=False)
        self.trainer = Trainer(Config.model_validate(s), overwrite=True)
        self.theta = flat_weights(self.trainer.model)
        self.before = self.trainer.eval_metrics()
        self.dense = self.theta.numel() * self.theta.element_size()
        self.sent_bytes, self.updates, self.stale = 0, 0, []
        self.per_update = f.local_steps * cfg.rollout.prompts_per_step * cfg.rollout.group_size
        self.curve = [[0, 0, self.before["eval/accuracy"]]]  # (updates, rollouts, accuracy)

    @property
    def mean_staleness(self) -> float:
        return sum(self.stale) / max(len(self.stale), 1)

    def point(self) -> None:
        """The server's held-out accuracy now, every ``eval_every`` rounds' updates."""
        f = self.f
        if f.eval_every and self.updates % (f.eval_every * f.clients) == 0:
            load_flat(self.trainer.model, self.theta)
            acc = self.trainer.eval_metrics()["eval/accuracy"]
            self.curve.append([self.updates, self.updates * self.per_update, acc])
            self.say(f"{self.updates} updates: server held-out accuracy {acc:.3f}")

    def average(self, outs: list[dict[str, Any]], r: int) -> None:
        """Fold in one synchronous round's updates: their FedAvg step (weighted by samples)."""
        self.sent_bytes += sum(wire_bytes(o["update"]) for o in outs)
        self.updates += len(outs)
        self.stale += [0] * len(outs)
        self.theta = self.theta + aggregate([decode(o["update"]) for o in outs],
                                            samples=[o["samples"] for o in outs])  # fmt: skip
        self.say(f"round {r + 1}/{self.f.rounds}: {len(outs)} updates averaged")
        self.point()

    def apply(self, out: dict[str, Any], version: int) -> None:
        """Fold in one asynchronous update as it arrives (server ``version`` now), scaled by
        ``(1 / K) (1 + s)^-a`` of its staleness ``s``."""
        s_i = version - out["version"]
        self.stale.append(s_i)
        w = staleness_weight(s_i, self.f.staleness) / self.f.clients
        self.theta = self.theta + w * decode(out["update"])
        self.updates += 1
        self.sent_bytes += wire_bytes(out["update"])
        self.point()

    def finish(self, root: Path, t0: float) -> dict[str, Any]:
        """Evaluate the final weights, save them (``<run.dir>/server/final``), close the
        server's trainer; the run's summary."""
        from rlpost.llm.model.policy import save_pretrained_files

        f, server, updates = self.f, self.trainer, self.updates
        load_flat(server.model, self.theta)
        after = server.eval_metrics()
        out_dir = root / "server" / "final"
        out_dir.mkdir(parents=True, exist_ok=True)
        server.model.save_pretrained(str(out_dir), safe_serialization=True)
        save_pretrained_files(server.model, server.tok, out_dir)
        server.close()
        if self.curve[-1][0] != updates:
            self.curve.append([updates, updates * self.per_update, after["eval/accuracy"]])
        return {
            "clients": f.clients,
            "rounds": f.rounds,
            "updates": updates,
            "backend": f.backend,
            "compression": f.compression,
            "bytes_sent": self.sent_bytes,
            "bytes_dense": self.dense * updates,
            "compression_ratio": self.sent_bytes / max(self.dense * updates, 1),
            "mean_staleness": self.mean_staleness,
            "eval_before": self.before["eval/accuracy"],
            "eval_after": after["eval/accuracy"],
            "rollouts": updates * self.per_update,
            "curve": self.curve,
            "model": str(out_dir),
            "seconds": time.perf_counter() - t0,
        }


def _run_local(srv: _Server, cfgs: list[str]) -> None:
    """``backend: local``: synchronous rounds, the clients one after another in this
    process, each round's updates averaged into the server's weights."""
    f = srv.f
    clients = [Client(c, f.compression, f.ratio) for c in cfgs]
    for r in range(f.rounds):
        srv.average([c.work(srv.theta, r, f.local_steps) for c in clients], r)
    for c in clients:
        c.close()


def _run_ray(srv: _Server, cfgs: list[str]) -> None:
    """``backend: ray``: every client a Ray actor; each update is applied the moment it
    arrives and its client sent the new weights at once."""
    from rlpost.llm.rollout.cluster import local_ray

    f = srv.f
    with local_ray(f.workers or f.clients, "federated.backend=ray") as ray:
        Actor = ray.remote(num_cpus=1)(Client)
        actors = [Actor.remote(c, f.compression, f.ratio) for c in cfgs]
        version, left = 0, [f.rounds] * f.clients
        jobs = {}

        def send(i: int) -> None:
            """Client ``i``'s next local steps from the server's weights of ``version``."""
            jobs[actors[i].work.remote(srv.theta, version, f.local_steps)] = i
            left[i] -= 1

        for i in range(len(actors)):
            send(i)
        while jobs:
            (ref,), _ = ray.wait(list(jobs), num_returns=1)
            i = jobs.pop(ref)
            srv.apply(ray.get(ref), version)
            version += 1
            if left[i] > 0:
                send(i)
        srv.say(f"{srv.updates} asynchronous updates applied, mean staleness "
                f"{srv.mean_staleness:.2f}")  # fmt: skip
        ray.get([a.close.remote() for a in actors])


def run_federated(cfg: Config, *, progress: bool = True, overwrite: bool = False) -> dict[str, Any]:
    """Train the server's policy from ``cfg.federated.clients`` clients (see the module
    docstring); returns the summary. A finished federated run in ``run.dir`` is replaced
    only with ``overwrite``."""
    f = cfg.federated
    assert f is not None
    from rlpost.core.io.rundir import lock_run_dir

    root = Path(cfg.run.dir)
    root.mkdir(parents=True, exist_ok=True)
    lock_run_dir(root)  # before anything in it is read or replaced
    if (root / "federated.json").is_file() and not overwrite:
        raise ValueError(f"run.dir {root} holds a federated run: --overwrite replaces it")
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if progress:
            print(f"federated: {msg}", flush=True)

    srv = _Server(cfg, root, say)
    cfgs = [client_config(cfg, i).model_dump_json() for i in range(f.clients)]
    if f.backend == "local":
        _run_local(srv, cfgs)
    else:
        _run_ray(srv, cfgs)
    summary = srv.finish(root, t0)
    (root / "federated.json").write_text(json.dumps(summary, indent=1))
    return summary


def run(cfg: Config, *, resume: bool = False, overwrite: bool = False) -> str:
    """The ``federated`` runtime: clients' compressed updates folded into the server (a
    finished run restarts with ``--overwrite``; there is no mid-run resume)."""
    s = run_federated(cfg, overwrite=overwrite)
    return (
        f"{s['updates']} updates from {s['clients']} clients ({s['backend']}), "
        f"{s['compression']}: {s['compression_ratio']:.1%} of the dense bytes, mean "
        f"staleness {s['mean_staleness']:.2f}; held-out {s['eval_before']:.3f} -> "
        f"{s['eval_after']:.3f}; {s['seconds']:.0f}s; model: {s['model']}"
    )
