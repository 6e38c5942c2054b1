"""Contract checks for registry entries, built from their declarations (like ``torch.testing``).

:func:`check_entry` runs the checks every entry of a registry must pass, with inputs made
from what the entry declares (:mod:`rlpost.core.contract`): each input it ``needs`` or
``reads`` holds a valid tensor; every other gated input holds a value that raises
:class:`UndeclaredInputError` the moment the entry touches it (any tensor operation,
``.shape`` included). So an entry that reads an input it did not declare fails here,
whatever it does with it, and one that declares too little cannot pass by luck.

The checks per registry (shapes ``B = 6`` rows in two groups of 3, ``T = 5`` tokens):

* advantages: output type and shape (``[B, T]`` with a mask, ``[B]`` without), finite,
  exactly 0 on masked tokens, float metrics; a degenerate group gives no NaN;
* ratios: differentiable ``[B, T]`` log-ratio, 0 and zero gradient on masked tokens;
* corrections: detached, finite, non-negative ``[B, T]`` weights and mask, 0 where masked;
* objectives: finite ``[B, T]`` loss, 0 and zero gradient on masked tokens; with zero
  advantages the gradient is exactly 0 at the old policy and never pushes away from it
  off-policy (per token, or summed over the batch for group-coupled entries); one in
  ``INERT_AT_ZERO_ADVANTAGE`` has loss and gradient exactly 0 off-policy too;
* aggregations: finite scalar, zero gradient on masked tokens;
* KL estimators: finite ``[B, T]``, zero gradient where masked, KL(pi || pi) = 0;
* distillation estimators: finite ``[B, T]`` loss, 0 and zero gradient where masked; a
  student equal to its teacher has loss and gradient exactly 0;
* preference losses: ``[B]`` losses and detached rewards; at a tie (equal chosen and
  rejected statistics) the gradient raises the chosen and lowers the rejected response;
* optimisers: a step on a small model moves its parameters, all finite;
* regularisers: a finite ``[D]`` gradient and a state that round-trips;
* token weightings: detached, finite, non-negative ``[B, T]`` weights, 0 where masked.

Required parameters without defaults are filled by type (1.0, 1, False).
Use it for your own entries: ``check_entry(OBJECTIVES, "my_objective", clip=0.3)``.

:func:`kill_at_first_checkpoint` interrupts a training command for a kill-then-resume test.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlpost.core.advantages import ADVANTAGES, AdvantageInput, AdvantageOutput, TrainingDynamics
from rlpost.core.aggregation import AGGREGATIONS, AggregationInput
from rlpost.core.contract import ContractError, Coupling, Input
from rlpost.core.distill import DISTILL_ESTIMATORS, DistillInput, TeacherDistributions
from rlpost.core.kl import KL_ESTIMATORS, KLInput
from rlpost.core.objectives import INERT_AT_ZERO_ADVANTAGE, OBJECTIVES, ObjectiveInput
from rlpost.core.optim import OPTIMIZERS, OptimizerInput
from rlpost.core.preference import PREFERENCE_LOSSES, PreferenceInput
from rlpost.core.ratios import CORRECTIONS, RATIOS, RatioInput, TokenDistributions
from rlpost.core.registry import Bound, Registry
from rlpost.core.regularizers import REGULARIZERS, GradientInput
from rlpost.core.weights import TOKEN_WEIGHTINGS, TokenWeightInput

B, T, K, V = 6, 5, 2, 7
GROUPS = (0, 0, 0, 1, 1, 1)


class UndeclaredInputError(ContractError):
    """An entry touched an input it did not declare."""


_METADATA = frozenset(
    {"shape", "dtype", "device", "ndim", "dim", "size", "numel", "is_floating_point", "is_complex"}
)


def _name(func: Any) -> str:
    owner = getattr(func, "__self__", None)  # a property's __get__ names its descriptor
    return getattr(owner, "__name__", "") if func.__name__ == "__get__" else func.__name__


class _UndeclaredTensor(Tensor):
    """A tensor that raises on every use except metadata queries (shape, dtype, ...,
    which dataclass validation in ``dataclasses.replace`` makes): stands in for an
    undeclared tensor input."""

    _what: str = "?"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if _name(func) in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        what = next((a._what for a in args if isinstance(a, _UndeclaredTensor)), cls._what)
        raise UndeclaredInputError(
            f"the entry used {what}, which it did not declare (needs= / reads= at registration)"
        )


class _UndeclaredObject:
    """Stands in for an undeclared non-tensor input (dynamics, distributions, events)."""

    def __init__(self, what: str):
        object.__setattr__(self, "_what", what)

    def _fail(self, *_: Any, **__: Any) -> Any:
        raise UndeclaredInputError(
            f"the entry used {object.__getattribute__(self, '_what')}, which it did not "
            "declare (needs= / reads= at registration)"
        )

    def __getattr__(self, name: str) -> Any:
        self._fail()

    __eq__ = __ne__ = __bool__ = __len__ = __iter__ = _fail  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]


def _undeclared(value: Any, what: str) -> Any:
    if isinstance(value, float):
        value = torch.tensor(value)
    if isinstance(value, Tensor):
        t = value.detach().as_subclass(_UndeclaredTensor)
        t._what = what
        return t
    return _UndeclaredObject(what)


def poison_undeclared(registry: Registry, bound: Bound, inp: Any, samples: dict[str, Any]) -> Any:
    """``inp`` with every gated input ``bound`` did not declare set to a raising stand-in
    (``samples``: a valid value per field, used for the stand-in's type)."""
    for i in registry.gated - bound.reads:
        for f in registry.inputs[i]:
            object.__setattr__(inp, f, _undeclared(samples[f], f"{i} ({f})"))
    return inp


def _mask() -> Tensor:
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    return (torch.arange(T) < lengths[:, None]).float()


def _logps(seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)
    old = (logp.detach() + 0.1 * torch.randn(B, T, generator=g)).clamp(max=0)
    return logp, old


def _dists(seed: int = 1) -> TokenDistributions:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g)
    tokens = torch.randint(0, V, (B, T), generator=g)
    return TokenDistributions.from_logits(
        logits, logits + torch.randn(B, T, V, generator=g), tokens
    )


def _zero_grad_on_mask(loss: Tensor, x: Tensor, m: Tensor, who: str) -> Tensor:
    (g,) = torch.autograd.grad(loss, x, allow_unused=True, retain_graph=True)
    _require(g is not None and bool(torch.isfinite(g).all()), who, "gradient is not finite")
    _require(bool((g[m == 0] == 0).all()), who, "masked tokens got a nonzero gradient")
    return g


def _require(ok: bool, who: str, what: str) -> None:
    if not ok:
        raise AssertionError(f"{who}: {what}")


def _fill_required(params_cls: type, given: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(params_cls)
    out = dict(given)
    sample = {float: 1.0, int: 1, bool: False, str: ""}
    for f in dataclasses.fields(params_cls):
        missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if missing and f.name not in out:
            out[f.name] = sample.get(hints[f.name], 1.0)
    return out


def _call(registry: Registry, bound: Bound, inp: Any) -> Any:
    """The raw entry on ``inp`` (undeclared inputs already poisoned), bypassing the
    :class:`Bound` wrapper that would hide them."""
    del registry  # the bound entry's own registry holds it (also for test registries)
    return bound.registry.get(bound.name).fn(inp, bound.params)


# ------------------------------------------------------------------------- per registry


def _check_advantage(bound: Bound) -> None:
    who = str(bound)
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])  # group 1 is degenerate
    if Input.VECTOR_REWARDS in bound.reads:
        r = torch.stack([r, torch.tensor([0.5, 0.2, 0.1, 0.3, 0.3, 0.3])], 1)
    m = _mask()
    g = torch.Generator().manual_seed(3)
    samples = {
        "values": torch.randn(B, T, generator=g),
        "logprobs": -torch.rand(B, T, generator=g) * m,
        "prompt_features": torch.randn(B, 4, generator=g),
        "completion_features": torch.randn(B, 4, generator=g),
        "reward_mask": torch.ones(B, K, dtype=torch.bool),
        "turn_ids": torch.zeros(B, T, dtype=torch.long),
        "turn_rewards": torch.randn(B, 1, generator=g),
        "dynamics": TrainingDynamics(progress=0.5, entropy=0.8, initial_entropy=1.0),
        "teacher_logprobs": -torch.rand(B, T, generator=g) * m,
    }
    for masked in (True, False) if Input.MASK not in bound.needs else (True,):
        kw = {f: samples[f] for i in bound.reads for f in ADVANTAGES.inputs[i] if f in samples}
        if not masked:  # token-level inputs come with a mask
            token_level = ("values", "logprobs", "turn_ids", "teacher_logprobs")
            kw = {k: v for k, v in kw.items() if k not in token_level}
            if Input.TURNS in bound.reads:
                kw.pop("turn_rewards", None)
        if any(
            not ADVANTAGES.present(i, AdvantageInput(r, **kw)) for i in bound.needs - {Input.MASK}
        ):
            continue  # e.g. values without a mask: not a valid call
        inp = AdvantageInput(r, torch.tensor(GROUPS), m if masked else None, **kw)
        out = _call(ADVANTAGES, bound, poison_undeclared(ADVANTAGES, bound, inp, samples))
        _require(isinstance(out, AdvantageOutput), who, "must return AdvantageOutput")
        shape = (B, T) if masked else (B,)
        _require(tuple(out.advantages.shape) == shape, who, f"advantages must be {shape}")
        _require(bool(torch.isfinite(out.advantages).all()), who, "advantages not finite")
        if masked:
            _require(bool((out.advantages[m == 0] == 0).all()), who, "nonzero on masked tokens")
        _require(all(isinstance(v, float) for v in out.metrics.values()), who, "metrics not float")


def _ratio_samples() -> tuple[Tensor, Tensor, Tensor, dict[str, Any]]:
    logp, old = _logps()
    samples = {"rollout_logp": old + 0.05, "advantages": torch.randn(B), "dists": _dists()}
    return logp, old, _mask(), samples


def _ratio_input(bound: Bound, reg: Registry) -> tuple[Any, Tensor, Tensor]:
    logp, old, m, samples = _ratio_samples()
    kw = {f: samples[f] for i in bound.reads for f in reg.inputs[i]}
    inp = RatioInput(logp, old, m, **kw)
    return poison_undeclared(reg, bound, inp, samples), logp, m


def _check_ratio(bound: Bound) -> None:
    who = str(bound)
    inp, logp, m = _ratio_input(bound, RATIOS)
    out = _call(RATIOS, bound, inp)
    _require(tuple(out.log_ratio.shape) == (B, T), who, "log_ratio must be [B, T]")
    _require(bool(torch.isfinite(out.log_ratio).all()), who, "log_ratio not finite")
    _require(bool((out.log_ratio[m == 0] == 0).all()), who, "log_ratio nonzero where masked")
    _zero_grad_on_mask(out.log_ratio.sum(), logp, m, who)


def _check_correction(bound: Bound) -> None:
    who = str(bound)
    inp, _, m = _ratio_input(bound, CORRECTIONS)
    out = _call(CORRECTIONS, bound, inp)
    _require(out.weights.shape == out.mask.shape == (B, T), who, "weights / mask must be [B, T]")
    _require(not out.weights.requires_grad, who, "corrections must be detached")
    _require(
        bool((out.weights[m == 0] == 0).all() and (out.mask[m == 0] == 0).all()),
        who,
        "nonzero weight or mask on masked tokens",
    )
    _require(
        bool((out.weights >= 0).all() and torch.isfinite(out.weights).all()),
        who,
        "weights must be finite and >= 0",
    )


def _objective_input(bound: Bound, logp: Tensor, old: Tensor, adv: Tensor) -> ObjectiveInput:
    samples = {
        "clip_range": torch.full((B, T), 0.2),
        "group_ids": torch.tensor(GROUPS),
        "trigger_pos": torch.tensor([-1, 1, 0, 2, -1, 0]),
        "dynamics": TrainingDynamics(progress=0.5, entropy=0.8, initial_entropy=1.0),
    }
    kw = {f: samples[f] for i in bound.reads for f in OBJECTIVES.inputs[i]}
    inp = ObjectiveInput(logp, old, adv, _mask(), **kw)
    return poison_undeclared(OBJECTIVES, bound, inp, samples)


def _check_objective(bound: Bound) -> None:
    who = str(bound)
    logp, old = _logps()
    m = _mask()
    out = _call(OBJECTIVES, bound, _objective_input(bound, logp, old, torch.randn(B)))
    _require(tuple(out.loss.shape) == (B, T), who, "loss must be [B, T]")
    _require(bool(torch.isfinite(out.loss).all()), who, "loss not finite")
    _require(bool((out.loss[m == 0] == 0).all()), who, "loss nonzero on masked tokens")
    _require(all(isinstance(v, float) for v in out.metrics.values()), who, "metrics not float")
    _zero_grad_on_mask(out.loss.sum(), logp, m, who)
    # zero advantages: no push at the old policy, never away from it off-policy
    zero = torch.zeros(B)
    out = _call(OBJECTIVES, bound, _objective_input(bound, logp, old, zero))
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    pull = g * (logp.detach() - old)
    ok = bool(pull.sum() >= 0) if bound.coupling >= Coupling.GROUP else bool((pull >= 0).all())
    _require(ok, who, "with zero advantages the gradient pushes away from the old policy")
    at_old = old.clone().requires_grad_(True)
    out = _call(OBJECTIVES, bound, _objective_input(bound, at_old, old, zero))
    (g,) = torch.autograd.grad(out.loss.sum(), at_old)
    _require(bool((g == 0).all()), who, "zero advantages at the old policy give a nonzero gradient")
    if bound.name in INERT_AT_ZERO_ADVANTAGE:  # declared linear in A: inert off-policy too
        out = _call(OBJECTIVES, bound, _objective_input(bound, logp, old, zero))
        (g,) = torch.autograd.grad(out.loss.sum(), logp)
        inert = bool((out.loss == 0).all() and (g == 0).all())
        _require(inert, who, "declared inert at zero advantage, but moves off-policy rows")


def _check_aggregation(bound: Bound) -> None:
    who = str(bound)
    logp, _ = _logps()
    m = _mask()
    samples = {"generation_budget": float(T)}
    kw = {f: samples[f] for i in bound.reads for f in AGGREGATIONS.inputs[i]}
    inp = poison_undeclared(AGGREGATIONS, bound, AggregationInput(logp * 2, m, **kw), samples)
    out = _call(AGGREGATIONS, bound, inp)
    _require(out.loss.dim() == 0 and bool(torch.isfinite(out.loss)), who, "finite scalar expected")
    _zero_grad_on_mask(out.loss, logp, m, who)


def _check_kl(bound: Bound) -> None:
    who = str(bound)
    logp, old = _logps()
    m = _mask()
    samples = {"advantages": torch.randn(B), "ref_entropy": torch.rand(B, T)}
    kw = {f: samples[f] for i in bound.reads for f in KL_ESTIMATORS.inputs[i]}

    def make(x: Tensor, ref: Tensor) -> KLInput:
        return poison_undeclared(KL_ESTIMATORS, bound, KLInput(x, ref, m, **kw), samples)

    out = _call(KL_ESTIMATORS, bound, make(logp, old))
    _require(tuple(out.kl.shape) == (B, T), who, "kl must be [B, T]")
    _require(
        bool(torch.isfinite(out.kl).all() and (out.kl[m == 0] == 0).all()),
        who,
        "kl not finite or nonzero where masked",
    )
    _zero_grad_on_mask(out.kl.sum(), logp, m, who)
    same = _call(KL_ESTIMATORS, bound, make(old, old)).kl
    _require(bool((same == 0).all()), who, "KL of a policy with itself must be 0")


def _check_distill(bound: Bound) -> None:
    who = str(bound)
    g = torch.Generator().manual_seed(7)
    m = _mask()
    s_logits = torch.randn(B, T, V, generator=g)
    t_logits = s_logits + torch.randn(B, T, V, generator=g)
    tokens = torch.randint(0, V, (B, T), generator=g)
    full = {Input.TEACHER_FULL} <= bound.reads

    def make(student_logits: Tensor, teacher_logits: Tensor) -> tuple[DistillInput, Tensor]:
        s_all = student_logits.log_softmax(-1).detach().requires_grad_(True)
        t_all = teacher_logits.log_softmax(-1)
        ids = torch.arange(V).expand(B, T, V) if full else t_all.topk(K, -1).indices
        hit = ids == tokens[..., None]
        col = torch.where(hit.any(-1), hit.float().argmax(-1), torch.full_like(tokens, -1))
        dists = TeacherDistributions(s_all.gather(-1, ids), t_all.gather(-1, ids), col.long())
        logp = s_all.gather(-1, tokens[..., None])[..., 0]
        samples = {
            "teacher_logp": t_all.gather(-1, tokens[..., None])[..., 0],
            "topk": dists,
            "full": dists,
            "spans": torch.arange(T).expand(B, T).clone(),  # one token per block
        }
        kw = {f: samples[f] for i in bound.reads for f in DISTILL_ESTIMATORS.inputs[i]}
        inp = poison_undeclared(DISTILL_ESTIMATORS, bound, DistillInput(logp, m, **kw), samples)
        return inp, s_all

    inp, s_all = make(s_logits, t_logits)
    out = _call(DISTILL_ESTIMATORS, bound, inp)
    _require(tuple(out.loss.shape) == (B, T), who, "loss must be [B, T]")
    _require(
        bool(torch.isfinite(out.loss).all() and (out.loss[m == 0] == 0).all()),
        who,
        "loss not finite or nonzero where masked",
    )
    _require(not out.kl.requires_grad, who, "kl must be detached")
    (gs,) = torch.autograd.grad(out.loss.sum(), s_all)
    _require(bool(torch.isfinite(gs).all()), who, "gradient is not finite")
    _require(bool((gs[m == 0] == 0).all()), who, "masked tokens got a nonzero gradient")
    same, s_same = make(s_logits, s_logits)
    out = _call(DISTILL_ESTIMATORS, bound, same)
    (g0,) = torch.autograd.grad(out.loss.sum(), s_same)
    _require(
        bool((out.loss == 0).all() and (g0 == 0).all()),
        who,
        "a student equal to its teacher must have zero loss and zero gradient",
    )


def _check_preference(bound: Bound) -> None:
    who = str(bound)
    g = torch.Generator().manual_seed(4)
    base = -torch.rand(B, generator=g) * 20 - 1
    c = base.clone().requires_grad_(True)  # a tie: chosen and rejected alike
    r = base.clone().requires_grad_(True)
    samples = {
        "ref_chosen_logp": base + 1,
        "ref_rejected_logp": base + 1,
        "chosen_len": torch.full((B,), 7),
        "rejected_len": torch.full((B,), 7),
    }
    kw = {f: samples[f] for i in bound.reads for f in PREFERENCE_LOSSES.inputs[i]}
    inp = poison_undeclared(PREFERENCE_LOSSES, bound, PreferenceInput(c, r, **kw), samples)
    out = _call(PREFERENCE_LOSSES, bound, inp)
    shapes = (out.loss.shape, out.chosen_reward.shape, out.rejected_reward.shape)
    _require(all(tuple(s) == (B,) for s in shapes), who, "loss and rewards must be [B]")
    _require(bool(torch.isfinite(out.loss).all()), who, "loss not finite")
    _require(not out.chosen_reward.requires_grad, who, "rewards must be detached")
    gc, gr = torch.autograd.grad(out.loss.sum(), (c, r))
    _require(
        bool((gc <= 0).all() and (gr >= 0).all() and (gc < 0).any()),
        who,
        "at a tie the loss must raise the chosen and lower the rejected response",
    )


def _check_optimizer(bound: Bound) -> None:
    who = str(bound)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    named = list(net.named_parameters())
    inp = OptimizerInput.split(named, not_matrix={"1.weight"}, lr=1e-2)
    opt = _call(OPTIMIZERS, bound, inp)
    _require(isinstance(opt, torch.optim.Optimizer), who, "must return a torch Optimizer")
    before = [p.detach().clone() for p in net.parameters()]
    net(torch.randn(5, 4)).square().mean().backward()
    opt.step()
    moved = [not torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True)]
    _require(all(moved), who, "every parameter with a gradient must move")
    _require(all(bool(torch.isfinite(p).all()) for p in net.parameters()), who, "non-finite step")


def _check_regularizer(bound: Bound) -> None:
    who = str(bound)
    D, M = 12, 3
    g = torch.Generator().manual_seed(5)
    grad = torch.randn(D, generator=g)
    samples = {
        "aux_grads": torch.randn(M, D, generator=g),
        "grad_samples": grad + 0.1 * torch.randn(M, D, generator=g),
        "parameters": torch.randn(D, generator=g),
        "task_boundary": "begin",
    }
    kw = {f: samples[f] for i in bound.reads for f in REGULARIZERS.inputs[i]}
    state: dict = {}
    for boundary in ("begin", "end", None):
        if "task_boundary" in kw:
            kw["task_boundary"] = boundary
        inp = poison_undeclared(
            REGULARIZERS, bound, GradientInput(grad, state=state, **kw), samples
        )
        out = _call(REGULARIZERS, bound, inp)
        _require(tuple(out.grad.shape) == (D,), who, "grad must be [D]")
        _require(bool(torch.isfinite(out.grad).all()), who, "grad not finite")
        state = out.state


def _check_token_weighting(bound: Bound) -> None:
    who = str(bound)
    m = _mask()
    h = torch.rand(B, T, generator=torch.Generator().manual_seed(6)) * 3
    samples = {"dynamics": TrainingDynamics(progress=0.5, entropy=0.8, initial_entropy=1.0)}
    kw = {f: samples[f] for i in bound.reads for f in TOKEN_WEIGHTINGS.inputs[i]}
    inp = poison_undeclared(TOKEN_WEIGHTINGS, bound, TokenWeightInput(h, m, **kw), samples)
    out = _call(TOKEN_WEIGHTINGS, bound, inp)
    w = out.weights
    _require(tuple(w.shape) == (B, T) and not w.requires_grad, who, "weights: detached [B, T]")
    _require(bool(torch.isfinite(w).all() and (w >= 0).all()), who, "weights finite and >= 0")
    _require(bool((w[m == 0] == 0).all()), who, "nonzero weight on masked tokens")


CHECKS: dict[int, Callable[[Bound], None]] = {
    id(ADVANTAGES): _check_advantage,
    id(RATIOS): _check_ratio,
    id(CORRECTIONS): _check_correction,
    id(OBJECTIVES): _check_objective,
    id(AGGREGATIONS): _check_aggregation,
    id(KL_ESTIMATORS): _check_kl,
    id(DISTILL_ESTIMATORS): _check_distill,
    id(PREFERENCE_LOSSES): _check_preference,
    id(OPTIMIZERS): _check_optimizer,
    id(REGULARIZERS): _check_regularizer,
    id(TOKEN_WEIGHTINGS): _check_token_weighting,
}


def check_entry(
    registry: Registry, name: str, *, like: Registry | None = None, **params: Any
) -> None:
    """Run the contract checks of ``registry``'s kind on entry ``name`` built with
    ``params`` (required ones filled by type). ``like``: use the checks of that registry
    (for a new registry with the same input type, e.g. in tests). Raises
    :class:`UndeclaredInputError` when the entry touches an input it did not declare and
    ``AssertionError`` naming the failed property otherwise."""
    entry = registry.get(name)
    bound = registry.build(name, **_fill_required(entry.params_cls, params))
    try:
        check = CHECKS[id(like if like is not None else registry)]
    except KeyError:
        raise ValueError(f"no contract checks for {registry.kind}; pass like=") from None
    check(bound)


def kill_at_first_checkpoint(
    argv: list[str], run_dir: str | Path, env: dict[str, str] | None = None, timeout_s: float = 300
) -> int:
    """Start the training command ``argv`` (writing ``run_dir``), ``SIGKILL`` it the moment
    its first checkpoint is published (``checkpoints/latest.json``) and return that
    checkpoint's step: how every domain's kill-then-resume test interrupts a run. Raises
    AssertionError when the run ended by itself before it could be killed."""
    import json
    import os
    import signal
    import subprocess
    import time

    latest = Path(run_dir) / "checkpoints" / "latest.json"
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout_s
    while not latest.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run must be killed, not finish"
    return int(json.loads(latest.read_text())["step"])


__all__ = ["UndeclaredInputError", "check_entry", "kill_at_first_checkpoint", "poison_undeclared"]


def name_comparisons(root: Path, names: set[str]) -> set[tuple[str, str]]:
    """``(file under root, name)`` for every comparison (``==``, ``in (...)``, ...) in the
    Python sources under ``root`` whose operand is a string constant in ``names``: where a
    package dispatches on a registered entry's name instead of through its registry."""
    import ast

    found = set()
    for path in Path(root).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for side in [node.left, *node.comparators]:
                consts = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                for c in consts:
                    if isinstance(c, ast.Constant) and c.value in names:
                        found.add((str(path.relative_to(root)), c.value))
    return found
