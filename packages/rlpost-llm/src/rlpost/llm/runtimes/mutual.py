"""Mutual RL on Ray (catalog 001-11): heterogeneous policies exchanging typed experience.

Each policy of ``mutual.policies`` is an ordinary rlpost-llm trainer in its own Ray actor,
with its own weights, tokenizer, preset and learning rate (``cpus`` per actor: the
multi-worker resource allocation). All of them draw the same prompt stream (the same
``data`` section and seed), so at every step they answer the same prompts. After
generating and scoring, a policy posts its **experience** (:class:`Experience`: prompts,
response texts, the sampled tokens' log-probs with their character offsets, finish
reasons) to the **shared experience exchange**, a Ray actor, and gathers its peers' of the
same step; its preset's ``peers`` (:mod:`rlpost.core.peers`) decides what each peer
response becomes in its batch:

* ``prp`` (peer rollout pooling): trained on, in the pooled group, its density ratio to
  the peer weighted by F-TIS;
* ``xgrpo`` (advantage sharing): in the group baseline only;
* ``sgt`` (success-gated transfer): trained on only when the policy's own verifier
  accepts it and none of the policy's own responses to that prompt succeeded.

The **tokenizer heterogeneity layer** is :mod:`rlpost.llm.model.tokalign`: a peer's response
text is retokenised by the policy's tokenizer (a response the policy cannot represent
exactly is dropped, counted in ``mutual/unaligned``; one longer than its
``rollout.max_new_tokens`` too, in ``mutual/too_long``) and the peer's token log-probs are
carried over by text blocks both tokenizations cover: a block's log-prob under the peer
is the sum of its tokens', spread evenly over the policy's tokens in the block, so every
block's (and the response's) total is exact and only the split inside a block is not
(the "THL residual" of the abstract). A peer's EOS carries its log-prob to the policy's
EOS. Peer responses are re-scored by the policy's own reward functions.

Each policy has its own run directory (``<run.dir>/policies/<name>``) with checkpoints,
metrics and summary; ``--resume`` continues every policy from its newest checkpoint
(the exchange keeps the last ``run.save_every`` steps, so a restarted actor finds its
peers' experience of the steps it redoes).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rlpost.core.peers import BASELINE, DROP, TRAIN, peer_roles
from rlpost.llm.config import Config
from rlpost.llm.model.tokalign import Tokenized, align, block_sums, tokenize_exact


@dataclass
class Experience:
    """One policy's responses of one step, tokenizer-free (plain Python, picklable).

    Row ``i`` answers ``prompts[group[i]]`` with ``texts[i]``; ``offsets[i]`` /
    ``logprobs[i]``: each sampled token's character span in the text and its log-prob
    (EOS excluded: ``eos[i]`` says the response ended with it, ``eos_logprob[i]`` its
    log-prob); ``finish[i]``: "stop" or "length"; ``rewards`` / ``correct``: the
    generating policy's own scores (for reports; receivers re-score)."""

    source: str
    step: int
    prompts: list[str]
    group: list[int]
    texts: list[str]
    ids: list[list[int]]
    offsets: list[list[tuple[int, int]]]
    logprobs: list[list[float]]
    eos: list[bool]
    eos_logprob: list[float]
    finish: list[str]
    rewards: list[float] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)


def _offsets(tok, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The text of ``ids`` and each token's character span in it (by decoding prefixes:
    correct for any tokenizer that decodes a prefix to a prefix of the text)."""
    out, prev = [], 0
    text = ""
    for k in range(len(ids)):
        text = tok.decode(ids[: k + 1], skip_special_tokens=False)
        end = max(prev, len(text))
        out.append((prev, end))
        prev = end
    return text, out


def export_experience(trainer, col, source: str) -> Experience:
    """``col`` (a policy's collected step) as :class:`Experience` for its peers."""
    tok, batch = trainer.tok, col.batch
    eos_id = tok.eos_token_id
    groups: dict[int, int] = {}
    prompts: list[str] = []
    rows = dict(group=[], texts=[], ids=[], offsets=[], logprobs=[], eos=[], eos_logprob=[])
    own_rows = col.own()  # a policy passes on only what it generated itself
    group, lengths = batch.group.tolist(), batch.lengths.tolist()
    for i in torch.nonzero(own_rows).flatten().tolist():
        g, n = group[i], lengths[i]
        if g not in groups:
            groups[g] = len(prompts)
            prompts.append(col.examples[i].prompt)
        ids = batch.completion_ids[i, :n].tolist()
        lp = batch.logprobs[i, :n].tolist()
        ends = bool(ids) and ids[-1] == eos_id
        if ends:
            ids, lp, eos_lp = ids[:-1], lp[:-1], lp[-1]
        else:
            eos_lp = 0.0
        text, offs = _offsets(tok, ids)
        for k, v in (
            ("group", groups[g]), ("texts", text), ("ids", ids), ("offsets", offs),
            ("logprobs", lp), ("eos", ends), ("eos_logprob", eos_lp),
        ):  # fmt: skip
            rows[k].append(v)
    return Experience(
        source=source,
        step=trainer.step,
        prompts=prompts,
        finish=[r for r, o in zip(batch.finish_reasons, own_rows.tolist(), strict=True) if o],
        rewards=col.rewards[own_rows].tolist(),
        correct=[bool(c) for c in col.accuracy[own_rows].tolist()],
        **rows,
    )


def carry_logprobs(own: Tokenized, peer: Tokenized, peer_logprobs: list[float]) -> torch.Tensor:
    """``[len(own.ids)]``: the peer's log-probs of the text carried onto the policy's
    tokens: each aligned block's sum spread evenly over the policy's tokens in it."""
    al = align(own, peer)
    blocks = block_sums(torch.tensor(peer_logprobs, dtype=torch.float32), al.b)
    out = torch.zeros(len(own.ids))
    for k, (s, e) in enumerate(al.a):
        if e > s:
            out[s:e] = blocks[k] / (e - s)
    return out


def _retokenize(tok, exp: Experience, r: int) -> tuple[list[int], list[float]] | None:
    """Peer response ``r`` of ``exp`` in the policy's tokens: its ids (with the policy's EOS
    when the peer's ended with its own) and the peer's log-probs carried onto them; ``None``
    when the policy's tokenizer cannot represent the text exactly."""
    text = exp.texts[r]
    try:
        mine = tokenize_exact(tok, text)  # one tokenisation: its ids and offsets
    except ValueError:
        return None
    ids = mine.ids
    theirs = Tokenized(text, exp.ids[r], [tuple(o) for o in exp.offsets[r]])
    lp = carry_logprobs(mine, theirs, exp.logprobs[r]).tolist()
    if exp.eos[r]:
        ids, lp = [*ids, tok.eos_token_id], [*lp, exp.eos_logprob[r]]
    return ids, lp


def _candidates(trainer, col, peers: list[Experience]):
    """The peers' responses the policy can take, as ``(own row of the prompt, ids,
    log-probs, finish reason, group)``, with their texts, and the counts of those it
    cannot: ``unmatched`` (a prompt it did not draw), ``unaligned``, ``too_long``."""
    budget = trainer.cfg.rollout.max_new_tokens
    first: dict[str, int] = {}
    for i, ex in enumerate(col.examples):
        first.setdefault(ex.prompt, i)
    cand: list[tuple[int, list[int], list[float], str, int]] = []  # (own row, ids, lp, fin, g)
    texts: list[str] = []
    dropped = {"unaligned": 0, "unmatched": 0, "too_long": 0}
    for exp in peers:
        for r in range(len(exp)):
            row = first.get(exp.prompts[exp.group[r]])
            if row is None:
                dropped["unmatched"] += 1
                continue
            mine = _retokenize(trainer.tok, exp, r)
            if mine is None:
                dropped["unaligned"] += 1
                continue
            ids, lp = mine
            if not ids or len(ids) > budget:
                dropped["too_long"] += 1
                continue
            cand.append((row, ids, lp, exp.finish[r], int(col.batch.group[row])))
            texts.append(exp.texts[r])
    return cand, texts, dropped


def _score_candidates(
    trainer, col, cand, texts: list[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The policy's own ``(rewards, reward components, correct)`` of the candidates."""
    k = len(trainer.scorer.names)
    if cand:
        res = trainer.scorer.pool.score(texts, [col.examples[c[0]] for c in cand])
        p_rewards, p_comp = res.rewards, res.components
    else:
        p_rewards, p_comp = torch.zeros(0), torch.zeros(0, k)
    p_correct = trainer.scorer.accuracy(p_comp) if cand else torch.zeros(0)
    return p_rewards, p_comp, p_correct


def _exchange_metrics(sharing, col, peers, cand, keep, roles, p_correct, dropped):
    """The ``mutual/*`` metrics of one exchange (``rescue`` mode: also the groups that
    had no success of their own and those a peer's response rescued)."""
    batch = col.batch
    metrics = {
        "mutual/received": float(sum(len(e) for e in peers)),
        "mutual/trained": float((roles == TRAIN).sum()),
        "mutual/baseline": float((roles == BASELINE).sum()),
        "mutual/unaligned": float(dropped["unaligned"]),
        "mutual/unmatched": float(dropped["unmatched"]),
        "mutual/too_long": float(dropped["too_long"]),
        "mutual/peer_accuracy": float(p_correct.mean()) if len(cand) else 0.0,
    }
    if sharing.mode == "rescue":
        solved = torch.zeros(int(batch.group.max()) + 1).index_add_(0, batch.group, col.accuracy)
        metrics["mutual/rescue_groups"] = float((solved == 0).sum())
        metrics["mutual/rescued_groups"] = float(
            len({cand[i][4] for i in keep if int(roles[i]) == TRAIN})
        )
    return metrics


def _merge(col, cand, keep: list[int], roles: torch.Tensor, scores, metrics: dict[str, float]):
    """``col`` with the kept candidates added to their prompts' groups (groups stay
    contiguous), with their ``scores`` ``(rewards, components, correct)`` and roles."""
    from rlpost.llm.rollout.engines.base import RolloutBatch

    batch = col.batch
    n_own = len(batch)
    p_rewards, p_comp, p_correct = scores
    lens = batch.lengths.tolist()
    rows = [
        (batch.prompt_ids[i], batch.completion_ids[i, : lens[i]].tolist(),
         batch.logprobs[i, : lens[i]].tolist(), batch.finish_reasons[i])
        for i in range(n_own)
    ]  # fmt: skip
    rows += [(batch.prompt_ids[cand[i][0]], cand[i][1], cand[i][2], cand[i][3]) for i in keep]
    group = torch.cat([batch.group, torch.tensor([cand[i][4] for i in keep], dtype=torch.long)])
    order = torch.argsort(group, stable=True)  # groups stay contiguous
    merged = RolloutBatch.from_rows(
        [rows[i] for i in order.tolist()], len(rows), 1, batch.pad_id, batch.policy_version
    )
    merged = replace(merged, group=group[order])
    all_roles = torch.cat([torch.zeros(n_own, dtype=torch.long), roles[keep]])[order]
    examples = [col.examples[i] for i in range(n_own)] + [col.examples[cand[i][0]] for i in keep]
    kept = torch.tensor(keep, dtype=torch.long)
    return replace(
        col,
        batch=merged,
        examples=[examples[i] for i in order.tolist()],
        rewards=torch.cat([col.rewards, p_rewards[kept]])[order],
        components=torch.cat([col.components, p_comp[kept]])[order],
        accuracy=torch.cat([col.accuracy, p_correct[kept]])[order],
        metrics=metrics,
        old_logp=None,
        roles=all_roles,
    )


def import_experience(trainer, col, peers: list[Experience]):
    """``col`` with the peers' responses added as the preset's ``peers`` says: each kept
    response retokenised into the policy's group of its prompt, re-scored by the policy's
    reward functions, carrying the peer's log-probs as its rollout log-probs; rows tagged
    in ``roles`` (``OWN``, ``TRAIN``, ``BASELINE``). A policy that shares nothing (its
    preset has no ``peers``) gets ``col`` back with its roles set."""
    sharing = trainer.preset.peers
    metrics = dict(col.metrics)
    if sharing is None or not peers:
        return replace(col, roles=torch.zeros(len(col.batch), dtype=torch.long), metrics=metrics)
    cand, texts, dropped = _candidates(trainer, col, peers)
    p_rewards, p_comp, p_correct = _score_candidates(trainer, col, cand, texts)
    roles = peer_roles(
        sharing,
        col.batch.group,
        col.accuracy,
        torch.tensor([c[4] for c in cand], dtype=torch.long),
        p_correct,
    )
    keep = [i for i in range(len(cand)) if int(roles[i]) != DROP]
    metrics.update(_exchange_metrics(sharing, col, peers, cand, keep, roles, p_correct, dropped))
    return _merge(col, cand, keep, roles, (p_rewards, p_comp, p_correct), metrics)


# ------------------------------------------------------------------------------ runtime


class ExperienceExchange:
    """The shared experience exchange: policies post their experience of a step and gather
    their peers' of the same step, waiting until every peer has posted. The last
    ``retain`` steps are kept (a restarted policy redoes the steps since its checkpoint).
    Thread-safe: the body of a threaded Ray actor, or shared by the threads of a local
    run; :meth:`abort` wakes every waiting policy with an error (a peer failed)."""

    def __init__(self, retain: int):
        import threading

        self.retain = max(1, retain)
        self.posts: dict[int, dict[str, Experience]] = {}
        self.aborted: str | None = None
        self._cond = threading.Condition()

    def post(self, step: int, name: str, exp: Experience) -> None:
        with self._cond:
            self.posts.setdefault(step, {})[name] = exp
            for s in [s for s in self.posts if s < step - self.retain]:
                del self.posts[s]
            self._cond.notify_all()

    def gather(self, step: int, names: list[str]) -> list[Experience]:
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self.aborted is not None or all(n in self.posts.get(step, {}) for n in names)
                )
            )
            if self.aborted is not None:
                raise RuntimeError(f"mutual: the run stopped: {self.aborted}")
            return [self.posts[step][n] for n in names]

    def abort(self, why: str) -> None:
        with self._cond:
            self.aborted = why
            self._cond.notify_all()


class Exchanger:
    """The trainer's exchange hook: post this step's experience, gather the peers',
    return the batch with theirs added (:func:`import_experience`). ``exchange``: an
    :class:`ExperienceExchange` or a Ray actor handle of one."""

    def __init__(self, exchange, name: str, peers: list[str]):
        self.exchange, self.name, self.peers = exchange, name, peers

    def _call(self, method: str, *args):
        fn = getattr(self.exchange, method)
        if hasattr(fn, "remote"):
            import ray

            return ray.get(fn.remote(*args))
        return fn(*args)

    def __call__(self, trainer, col):
        t0 = time.perf_counter()
        self._call("post", trainer.step, self.name, export_experience(trainer, col, self.name))
        theirs = self._call("gather", trainer.step, self.peers)
        out = import_experience(trainer, col, theirs)
        out.metrics["time/exchange"] = time.perf_counter() - t0
        return out


def policy_config(cfg: Config, name: str) -> Config:
    """Policy ``name``'s trainer config: its weights, preset and learning rate, its own run
    directory, the run's ``mutual`` section with ``member`` set."""
    assert cfg.mutual is not None
    pol = next(p for p in cfg.mutual.policies if p.name == name)
    c = cfg.model_dump()
    c["mutual"]["member"] = name
    c["model"]["path"] = pol.path
    if pol.preset is not None:
        c["algo"]["preset"] = pol.preset
    if pol.lr is not None:
        c["optim"]["lr"] = pol.lr
    c["run"].update(dir=str(Path(cfg.run.dir) / "policies" / name), progress=False)
    return Config.model_validate(c)


class Policy:
    """One Mutual RL policy: a trainer (resumed from its run directory when it has a
    checkpoint) with the exchange hook (the body of the Ray actor)."""

    def __init__(self, cfg_json: str, exchange, threads: int | None = 1):
        from rlpost.core.io.checkpoint import latest_checkpoint
        from rlpost.llm.trainer import Trainer

        if threads is not None:
            torch.set_num_threads(threads)
        cfg = Config.model_validate_json(cfg_json)
        assert cfg.mutual is not None and cfg.mutual.member is not None
        self.name = cfg.mutual.member
        peers = [p.name for p in cfg.mutual.policies if p.name != self.name]
        resume = latest_checkpoint(Path(cfg.run.dir) / "checkpoints") is not None
        self.trainer = Trainer(cfg, resume=resume)
        self.trainer.components.get("peer_exchange").channel = Exchanger(exchange, self.name, peers)
        self.incarnation = uuid.uuid4().hex

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "step": self.trainer.step, "incarnation": self.incarnation}

    def run(self) -> dict[str, Any]:
        from rlpost.llm.tools.runlog import read_metrics

        res = self.trainer.train()
        rows = read_metrics(self.trainer.run_dir)
        ev = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
        out = {**self.info(), "preset": self.trainer.preset.name, "seconds": res["seconds"]}
        if ev:
            out["eval_before"], out["eval_after"] = ev[0], ev[-1]
        for key in ("mutual/trained", "mutual/rescued_groups", "mutual/unaligned"):
            vals = [r[key] for r in rows if key in r]
            if vals:
                out[key.removeprefix("mutual/")] = float(sum(vals))
        return out


def run_mutual(
    cfg: Config, *, progress: bool = True, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train the policies of ``cfg.mutual`` together: as Ray actors on local Ray (or the
    cluster ``ray.init`` connects to), or (``mutual.backend=local``) in threads of this
    process. Returns a summary: each policy's held-out accuracy before and after, and
    what it took from its peers."""
    from rlpost.llm.rollout.cluster import claim_run_dir

    assert cfg.mutual is not None
    root = Path(cfg.run.dir)
    claim_run_dir(root, "policies", "Mutual RL", resume=resume, overwrite=overwrite)
    names = [p.name for p in cfg.mutual.policies]
    cpus = {p.name: p.cpus for p in cfg.mutual.policies}
    cfgs = {n: policy_config(cfg, n) for n in names}  # validated before Ray starts
    t0 = time.perf_counter()
    retain = max(cfg.run.save_every, 1) + 1
    if cfg.mutual.backend == "local":
        results, restarts = _run_local(cfgs, retain, progress), {n: 0 for n in names}
    else:
        results, restarts = _run_ray(cfgs, cpus, retain, progress)
    summary = {
        "policies": results,
        "restarts": restarts,
        "steps": cfg.train.steps,
        "seconds": time.perf_counter() - t0,
    }
    (root / "mutual.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _say(progress: bool, r: dict[str, Any]) -> None:
    if progress:
        held = (
            f": held-out {r['eval_before']:.3f} -> {r['eval_after']:.3f}"
            if "eval_after" in r
            else ""
        )
        print(f"mutual: {r['name']} ({r['preset']}) done{held}", flush=True)


def _run_ray(cfgs: dict[str, Config], cpus: dict[str, int], retain: int, progress: bool):
    """Each policy a Ray actor (restarted from its checkpoint if it dies), the exchange a
    threaded Ray actor."""
    from rlpost.llm.rollout.cluster import local_ray

    names = list(cfgs)
    with local_ray(sum(cpus.values()), "mutual.backend=ray") as ray:
        Exchange = ray.remote(num_cpus=0, max_restarts=-1)(ExperienceExchange)
        exchange = Exchange.options(max_concurrency=2 * len(names) + 2).remote(retain)
        actors = {
            n: ray.remote(num_cpus=cpus[n], max_restarts=-1)(Policy).remote(
                cfgs[n].model_dump_json(), exchange, cpus[n]
            )
            for n in names
        }
        if progress:
            print(f"mutual: {len(names)} policies on Ray ({', '.join(names)})", flush=True)
        pending = {n: actors[n].run.remote() for n in names}
        results, restarts = {}, {n: 0 for n in names}
        while pending:
            done, _ = ray.wait(list(pending.values()), num_returns=1)
            n = next(k for k, v in pending.items() if v == done[0])
            try:
                results[n] = ray.get(done[0])
                del pending[n]
                _say(progress, results[n])
            except ray.exceptions.RayActorError:  # restarted from its checkpoint: go on
                restarts[n] += 1
                pending[n] = actors[n].run.remote()
        for a in actors.values():
            ray.kill(a)
        ray.kill(exchange)
    return results, restarts


def _run_local(cfgs: dict[str, Config], retain: int, progress: bool) -> dict[str, Any]:
    """Each policy in a thread of this process, one in-process exchange; the first error
    stops every policy and is raised."""
    from concurrent.futures import ThreadPoolExecutor

    exchange = ExperienceExchange(retain)
    policies = {n: Policy(c.model_dump_json(), exchange, threads=None) for n, c in cfgs.items()}

    def run(p: Policy) -> dict[str, Any]:
        try:
            return p.run()
        except BaseException as exc:
            exchange.abort(f"policy {p.name}: {exc}")
            raise

    with ThreadPoolExecutor(len(policies), thread_name_prefix="mutual") as pool:
        futures = {n: pool.submit(run, p) for n, p in policies.items()}
        results = {n: f.result() for n, f in futures.items()}
    for r in results.values():
        _say(progress, r)
    return results


def summary_table(summary: dict[str, Any]) -> str:
    """Each policy's held-out accuracy before and after (``-``: not evaluated, with
    ``run.eval_every=0``), and what it took from its peers."""

    def acc(r: dict[str, Any], k: str) -> str:
        return f"{r[k]:>8.3f}" if k in r else f"{'-':>8}"

    head = f"{'policy':<12}{'preset':<10}{'before':>8}{'after':>8}{'trained peer rows':>19}"
    lines = [head]
    for n, r in summary["policies"].items():
        lines.append(
            f"{n:<12}{r['preset']:<10}{acc(r, 'eval_before')}{acc(r, 'eval_after')}"
            f"{r.get('trained', 0.0):>19.0f}"
        )
    lines.append(f"{summary['steps']} steps, {summary['seconds']:.0f} s")
    return "\n".join(lines)


__all__ = [
    "Exchanger",
    "Experience",
    "ExperienceExchange",
    "Policy",
    "carry_logprobs",
    "export_experience",
    "import_experience",
    "policy_config",
    "run_mutual",
    "summary_table",
]


def run(cfg: Config, *, resume: bool = False, overwrite: bool = False) -> str:
    """The ``mutual`` runtime: the policies side by side on Ray; their table."""
    return summary_table(run_mutual(cfg, resume=resume, overwrite=overwrite))
