"""CoPD: co-evolving policy distillation on Ray (catalog 001-26).

Mixed RLVR over several capabilities pays an inter-capability divergence cost; training
experts apart and distilling them afterwards (MOPD) leaves a behavioural gap the student
cannot fully absorb. CoPD trains the experts *in parallel* and adds on-policy distillation
*during* each expert's RLVR, the experts teaching each other, so their behaviour stays
consistent while each keeps its own skill; the co-evolved experts are then consolidated.

Here, for the domains of ``data.mixture``, expert ``i`` is an ordinary rlpost-llm trainer
(a Ray actor, one CPU each) on the whole mixture where

* its own domain earns the verifier's reward (the preset's RL term), and
* every other domain ``j`` earns none and is distilled from expert ``j`` (reverse KL,
  routed by ``meta["domain"]``; ``teacher_mask`` 0 on its own domain),

with the preset's weights (``copd``: GRPO + ``topk`` OPD). Training runs in
``copd.rounds`` rounds: each expert trains its share of steps against its peers' weights
of the round's start; then the driver collects every expert's weights and sends each
expert its peers' (Ray's object store; no other channel). Each expert checkpoints at the
end of every round into its own run directory (``<run.dir>/experts/<domain>``). An actor
that dies is restarted by Ray and resumes from its newest checkpoint; the driver re-sends
that round's peer weights and the round continues, so the run loses nothing. Finally the
experts are consolidated (``copd.consolidate``): ``mopd`` distils them into one student
from ``model.path`` (``<run.dir>/student``), ``average`` takes their mean weights.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from rlpost.llm.config import Config


def expert_config(cfg: Config, domain: str, domains: list[str], round_steps: int) -> Config:
    """Expert ``domain``'s trainer config: the mixture with reward on its own domain only,
    its peers as the teachers of theirs, its own run directory, a checkpoint every round."""
    c = cfg.model_dump()
    c["copd"] = None
    for d in c["data"]["mixture"]:
        d["reward"] = d["task"] == domain
    peers = [d for d in domains if d != domain]
    # the peers start where the expert does (model.path); their weights arrive each round
    c["distill"]["teachers"] = [{"path": cfg.model.path, "domains": [p]} for p in peers]
    c["run"].update(
        dir=str(Path(cfg.run.dir) / "experts" / domain), save_every=round_steps, progress=False
    )
    return Config.model_validate(c)


class Expert:
    """One CoPD expert: a trainer that resumes from its run directory when one exists
    (the body of the Ray actor; usable without Ray in tests)."""

    def __init__(self, cfg_json: str, domain: str, peers: list[str], threads: int = 1):
        from rlpost.core.io.checkpoint import latest_checkpoint
        from rlpost.llm.config import Config
        from rlpost.llm.trainer import Trainer

        torch.set_num_threads(threads)
        cfg = Config.model_validate_json(cfg_json)
        self.domain, self.peers = domain, peers
        resume = latest_checkpoint(Path(cfg.run.dir) / "checkpoints") is not None
        self.trainer = Trainer(cfg, resume=resume)
        self.resumed_at = self.trainer.step if resume else None
        self.incarnation = uuid.uuid4().hex  # a restarted actor is a new incarnation

    def info(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "step": self.trainer.step,
            "resumed_at": self.resumed_at,
            "incarnation": self.incarnation,
        }

    def train_to(self, step: int) -> dict[str, Any]:
        """Train until ``step`` (idempotent: a resumed expert continues from its checkpoint)."""
        self.trainer.train(until=step)
        return self.info()

    def weights(self) -> dict[str, torch.Tensor]:
        from rlpost.llm.train.forward import merged_state_dict

        return {
            k: v.detach().cpu().clone() for k, v in merged_state_dict(self.trainer.model).items()
        }

    def set_peer(self, peer: str, weights: dict[str, torch.Tensor]) -> None:
        """Load ``peer``'s weights into the teacher that scores its domain."""
        teachers = self.trainer.components.get("teachers").teachers
        assert teachers is not None
        for t in teachers.teachers:
            if peer in t.domains:
                assert t.model is not None
                t.model.load_state_dict(weights)

    def finish(self) -> dict[str, Any]:
        """End the run (closes it, writes its summary); its last held-out metrics."""
        from rlpost.llm.tools.runlog import read_metrics

        res = self.trainer.train()
        rows = [r for r in read_metrics(self.trainer.run_dir) if "eval/accuracy" in r]
        ev = {k: v for k, v in rows[-1].items() if k.startswith("eval/")} if rows else {}
        return {**self.info(), "seconds": res["seconds"], **ev}


def _average(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: sum(s[k].float() for s in states) / len(states) for k in states[0]}


class _Experts:
    """The experts' Ray actors of a CoPD run and what the driver keeps of them: each one's
    incarnation (a new one means Ray restarted it), its restarts, and the peer weights of
    the round (``states``: each domain's expert's weights, in the object store)."""

    def __init__(self, ray, cfg: Config, domains: list[str], round_steps: int, say):
        """Start one actor per domain (restarted by Ray when it dies)."""
        Actor = ray.remote(num_cpus=1, max_restarts=-1)(Expert)
        cfgs = {d: expert_config(cfg, d, domains, round_steps) for d in domains}
        self.actors = {
            d: Actor.remote(cfgs[d].model_dump_json(), d, [p for p in domains if p != d])
            for d in domains
        }
        self.ray, self.domains, self.say = ray, domains, say
        self.restarts = {d: 0 for d in domains}
        self.states: dict[str, Any] = {}
        self.seen = {d: ray.get(self.actors[d].info.remote())["incarnation"] for d in domains}

    def ensure(self, d: str, r: int) -> None:
        """A restarted expert (a new incarnation, resumed from its checkpoint) gets
        this round's peer weights again before it trains."""
        ray, actor = self.ray, self.actors[d]
        while True:
            try:
                now = ray.get(actor.info.remote())["incarnation"]
                break
            except ray.exceptions.RayActorError:
                time.sleep(0.5)  # still restarting
        if now != self.seen[d]:
            self.seen[d] = now
            self.restarts[d] += 1
            self.say(f"expert {d} restarted in round {r + 1}, resumed from its checkpoint")
            ray.get([actor.set_peer.remote(p, w) for p, w in self.states.items() if p != d])

    def train_round(self, r: int, target: int) -> None:
        """Round ``r``: every expert trains until step ``target``; one that dies meanwhile
        is re-sent the round's peer weights and trains again from its checkpoint."""
        ray, actors = self.ray, self.actors
        for d in self.domains:
            self.ensure(d, r)
        pending = {d: actors[d].train_to.remote(target) for d in self.domains}
        while pending:
            d, ref = next(iter(pending.items()))
            try:
                ray.get(ref)
                del pending[d]
            except ray.exceptions.RayActorError:
                self.ensure(d, r)  # Ray restarts it from its checkpoint: resend, retry
                pending[d] = actors[d].train_to.remote(target)

    def exchange(self, r: int) -> None:
        """The end of round ``r``: collect every expert's weights and send each expert its
        peers'."""
        ray, actors, domains = self.ray, self.actors, self.domains
        new = {}
        for d in domains:  # (a death now: it restarts from this round's checkpoint)
            while d not in new:
                try:
                    new[d] = ray.put(ray.get(actors[d].weights.remote()))
                except ray.exceptions.RayActorError:
                    self.ensure(d, r)
        self.states = new
        for d in domains:
            ray.get([actors[d].set_peer.remote(p, new[p]) for p in domains if p != d])

    def finish(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        """End every expert's run; their results and final weights (the actors killed)."""
        ray = self.ray
        experts = {d: ray.get(self.actors[d].finish.remote()) for d in self.domains}
        finals = {d: ray.get(self.states[d]) for d in self.domains}
        for a in self.actors.values():
            ray.kill(a)
        return experts, finals


def run_copd(
    cfg: Config,
    *,
    kill: Any = None,
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train the experts of ``cfg.copd`` in parallel on local Ray (or the cluster
    ``ray.init`` connects to), then consolidate them. ``kill(round, actors)``: called after
    each round (tests use it to kill an actor). Returns a summary (per-expert held-out
    accuracy per domain, the consolidated model's, and timings). ``resume``: continue the
    experts of a run in ``run.dir`` from their checkpoints; ``overwrite``: replace it."""
    from rlpost.llm.rollout.cluster import claim_run_dir, local_ray

    assert cfg.copd is not None
    domains = cfg.copd.experts or [d.task for d in cfg.data.mixture]
    round_steps = cfg.train.steps // cfg.copd.rounds
    root = Path(cfg.run.dir)
    claim_run_dir(root, "experts", "CoPD", resume=resume, overwrite=overwrite)
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if progress:
            print(f"copd: {msg}", flush=True)

    with local_ray(cfg.copd.workers or len(domains), "copd") as ray:
        team = _Experts(ray, cfg, domains, round_steps, say)
        for r in range(cfg.copd.rounds):
            target = (r + 1) * round_steps
            team.train_round(r, target)
            team.exchange(r)
            say(f"round {r + 1}/{cfg.copd.rounds}: step {target}, weights exchanged")
            if kill is not None:
                kill(r, team.actors)
        experts, finals = team.finish()
    summary: dict[str, Any] = {
        "experts": experts,
        "restarts": team.restarts,
        "rounds": cfg.copd.rounds,
        "expert_seconds": time.perf_counter() - t0,
    }
    summary["student"] = consolidate(cfg, domains, finals, say)
    summary["seconds"] = time.perf_counter() - t0
    (root / "copd.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def consolidate(
    cfg: Config, domains: list[str], finals: dict[str, dict[str, torch.Tensor]], say
) -> dict[str, Any] | None:
    """One model from the co-evolved experts (``copd.consolidate``), evaluated per domain."""
    from rlpost.llm.tools.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    assert cfg.copd is not None
    how = cfg.copd.consolidate
    if how == "none":
        return None
    root = Path(cfg.run.dir)
    c = cfg.model_dump()
    c["copd"] = None
    c["run"].update(dir=str(root / "student"), progress=False)
    if how == "average":
        c["distill"]["teachers"] = []
        c["algo"].update(preset="grpo", distill=None)
        tr = Trainer(Config.model_validate(c), overwrite=True)
        tr.model.load_state_dict(_average(list(finals.values())))
        m = tr.eval_metrics()
        tr.close()
        say("consolidated by averaging the experts' weights")
        return {"how": how, **m}
    n = cfg.copd.consolidate_steps
    c["distill"]["teachers"] = [
        {"path": str(root / "experts" / d), "domains": [d]} for d in domains
    ]
    c["algo"]["preset"] = "mopd"
    c["train"]["steps"] = n
    c["run"].update(save_every=n, eval_every=n)
    say(f"consolidating: MOPD from the experts, {n} steps")
    res = Trainer(Config.model_validate(c), overwrite=True).train()
    last = [r for r in read_metrics(root / "student") if "eval/accuracy" in r][-1]
    return {
        "how": how,
        "steps": res["steps"],
        "seconds": res["seconds"],
        **{k: v for k, v in last.items() if k.startswith("eval/")},
    }


def summary_table(summary: dict[str, Any]) -> str:
    """Held-out accuracy per domain of each expert and of the consolidated model."""
    rows = {f"expert {d}": e for d, e in summary["experts"].items()}
    if summary.get("student"):
        rows[f"student ({summary['student']['how']})"] = summary["student"]
    keys = sorted({k for r in rows.values() for k in r if k.startswith("eval/")})
    head = f"{'model':<24}" + "".join(f"{k.removeprefix('eval/'):>22}" for k in keys)
    lines = [head]
    for name, r in rows.items():
        lines.append(f"{name:<24}" + "".join(f"{r.get(k, float('nan')):>22.3f}" for k in keys))
    restarts = sum(summary["restarts"].values())
    lines.append(
        f"{summary['rounds']} rounds, {restarts} expert restart(s), {summary['seconds']:.0f} s"
    )
    return "\n".join(lines)


def run(cfg: Config, *, resume: bool = False, overwrite: bool = False) -> str:
    """The ``copd`` runtime: experts in parallel on Ray, then one model; its table."""
    return summary_table(run_copd(cfg, resume=resume, overwrite=overwrite))
