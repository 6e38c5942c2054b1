"""Numeric guards every domain's training loop shares.

A step whose loss, gradient or updated parameters are not finite must not reach the
model, and a run that keeps producing such steps must stop with a message instead of
training on garbage or dying later with an unrelated traceback.

:class:`UpdateGuard` wraps an optimiser step:

* :meth:`UpdateGuard.grads_finite` before the step: skip it when a gradient is not finite;
* :meth:`UpdateGuard.step` snapshots the trainable parameters and the optimisers' state
  (when ``rollback``), steps, and restores the snapshot when a parameter came out
  non-finite or the weights exploded (their global norm grew more than ``max_growth``
  times in the one step: finite, but no checkpoint should keep them);
* :meth:`UpdateGuard.rollback` undoes the last applied step later, when its damage shows
  only downstream (e.g. finite but huge weights whose logits overflow at generation);
* :meth:`UpdateGuard.record` counts consecutive bad steps and raises :class:`RunStopped`
  after ``max_consecutive`` of them, naming the reason.

:class:`FailingRewards` stops a run whose reward function fails on every completion,
round after round (:class:`RewardFunctionFailing`, exit 2).

:class:`RunStopped` and :class:`NonFiniteError` carry ``one_line = True``: the command-line
apps print them as one line and exit 3 instead of a traceback.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor


@contextlib.contextmanager
def training_loop() -> Iterator[None]:
    """Mark a run's training loop: a ``ValueError`` / ``FileNotFoundError`` raised inside it
    is the code's (a bug), not the input's, so the command line shows its traceback
    instead of printing it as a one-line input error (it reads ``during_training``).
    Errors that say so themselves (``one_line``, a ``ConfigError``) keep their one line."""
    try:
        yield
    except (ValueError, FileNotFoundError) as exc:
        from rlpost.core.io.config import ConfigError

        if not isinstance(exc, ConfigError) and not getattr(exc, "one_line", False):
            exc.during_training = True  # type: ignore[attr-defined]
        raise


class RunStopped(RuntimeError):
    """The run stopped on purpose (e.g. repeated non-finite steps); the message says why."""

    one_line = True
    exit_code = 3


class NonFiniteError(RuntimeError):
    """A model produced non-finite values (e.g. logits at generation)."""

    one_line = True
    exit_code = 3


def all_finite(tensors: Iterable[Tensor | None]) -> bool:
    """True when every given tensor (``None`` skipped) holds only finite values."""
    ts = [t for t in tensors if t is not None and t.is_floating_point() and t.numel()]
    if not ts:
        return True  # integer tensors are always finite
    if len({(t.device, t.dtype) for t in ts}) == 1:
        # a finite float32 2-norm means every entry is finite (an inf or NaN entry makes
        # it inf or NaN): one fused pass, 6x faster on CPU than the max-abs norm. Its
        # overflow (entries beyond ~1e19) falls through to the exact check below.
        sums = torch._foreach_norm(ts, 2, dtype=torch.float32)
        if bool(torch.isfinite(torch.stack(sums)).all()):
            return True
    return bool(torch.stack([torch.isfinite(t).all() for t in ts]).all())


def global_norm(tensors: Iterable[Tensor]) -> float:
    """The 2-norm of all the tensors together, in float64 (inf when an entry is not finite
    or beyond float32's range, which only an exploded model reaches)."""
    ts = [t.detach() for t in tensors if t.is_floating_point() and t.numel()]
    if not ts:
        return 0.0
    norms = torch.stack([n.to(torch.float64) for n in torch._foreach_norm(ts, 2)])
    return float(norms.norm().cpu())


class UpdateGuard:
    """Skip, roll back and count non-finite updates of ``params`` (see the module doc).

    ``optimizers``: whose state a rollback restores too; ``rollback``: keep a copy of the
    parameters and optimiser state before each step (memory: one more copy of the trainable
    state; with ``False`` a step that makes a parameter non-finite stops the run at once);
    ``max_consecutive``: bad steps in a row before :class:`RunStopped`; ``max_growth``: a
    step that multiplies the weights' global norm by more than this is rejected like a
    non-finite one (None: no such check). :attr:`why` says why the last step was rejected.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        optimizers: Sequence[torch.optim.Optimizer],
        *,
        rollback: bool = True,
        max_consecutive: int = 3,
        max_growth: float | None = 10.0,
    ) -> None:
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {max_consecutive}")
        if max_growth is not None and not max_growth > 1.0:
            raise ValueError(f"max_growth must be > 1 (or None), got {max_growth}")
        self.max_growth = max_growth
        self.why = ""
        self.params = list(params)
        self.optimizers = list(optimizers)
        self.rollback_enabled = rollback
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0
        self.rollbacks = 0
        self._snapshot: tuple[list[Tensor], list[dict]] | None = None
        self._buffers: tuple[list[Tensor], list[dict]] | None = None  # reused by snapshots

    @classmethod
    def configured(
        cls,
        params: Sequence[torch.nn.Parameter],
        optimizers: Sequence[torch.optim.Optimizer],
        cfg,
    ) -> UpdateGuard:
        """A guard set by a run config's ``train.guard`` (a
        :class:`rlpost.core.io.schema.GuardConfig`: ``rollback``, ``max_consecutive``)."""
        trainable = [p for p in params if p.requires_grad]
        return cls(
            trainable,
            optimizers,
            rollback=cfg.rollback,
            max_consecutive=cfg.max_consecutive,
            max_growth=cfg.max_growth,
        )

    def grads_finite(self) -> bool:
        return all_finite(p.grad for p in self.params)

    def params_finite(self) -> bool:
        return all_finite(p.detach() for p in self.params)

    def _take_snapshot(self) -> None:
        """Copy the parameters and the optimisers' state into buffers kept from the last
        snapshot (in place, no allocation) when the state has the same structure, else
        fresh copies: a deep copy of the state dict per step cost more than the step."""
        with torch.no_grad():
            states = [o.state_dict() for o in self.optimizers]  # live tensors: copied below
            old = self._buffers
            if old is not None and _same_structure(old[1], states):
                params, bufs = old
                torch._foreach_copy_(_locals(params), _locals(p.detach() for p in self.params))
                for dst, src in zip(bufs, states, strict=True):
                    _copy_state_(dst, src)
            else:
                params = [p.detach().clone() for p in self.params]
                bufs = [_clone_state(st) for st in states]
        self._buffers = (params, bufs)
        self._snapshot = self._buffers

    def step(self, step_fn) -> bool:
        """Run ``step_fn()`` (the optimisers' steps); False when it left a parameter
        non-finite or exploded the weights (see ``max_growth``), in which case the
        parameters and optimiser states are restored and :attr:`why` says which."""
        if self.rollback_enabled:
            self._take_snapshot()
        growth = self.max_growth
        before = global_norm(self.params) if growth is not None else 0.0
        step_fn()
        if growth is None:
            if self.params_finite():
                return True
            self.why = "an update made parameters non-finite"
        else:  # one pass: a finite norm within bounds means every entry is finite too
            after = global_norm(self.params)
            if after <= growth * max(before, 1e-12):
                return True
            if not self.params_finite():
                self.why = "an update made parameters non-finite"
            else:
                self.why = (
                    f"an update multiplied the weights' norm by {after / max(before, 1e-12):.3g}"
                    f" (train.guard.max_growth={growth:g})"
                )
        if not self.rollback():
            raise RunStopped(
                f"{self.why} and rollback is off; resume from the last checkpoint with a "
                "smaller learning rate"
            )
        self.why += "; it was rolled back"
        return False

    def rollback(self) -> bool:
        """Restore the state before the last :meth:`step`; False when there is no snapshot."""
        if self._snapshot is None:
            return False
        params, states = self._snapshot
        with torch.no_grad():
            for p, saved in zip(self.params, params, strict=True):
                p.copy_(saved)
        for o, st in zip(self.optimizers, states, strict=True):
            o.load_state_dict(_clone_state(st))  # the buffers stay the guard's
        self._snapshot = None
        self.rollbacks += 1
        return True

    def record(self, ok: bool, reason: str = "") -> None:
        """Count a good (``ok``) or bad step; :class:`RunStopped` after too many bad ones."""
        if ok:
            self.consecutive = 0
            return
        self.consecutive += 1
        self.total += 1
        if self.consecutive >= self.max_consecutive:
            raise RunStopped(
                f"{self.consecutive} steps in a row skipped, the last because {reason}; "
                "the run cannot make progress: check the rewards and lower optim.lr, then "
                "--resume"
            )


def _locals(ts) -> list[Tensor]:
    """The tensors, a DTensor (FSDP2's sharded parameters) as its local shard: torch's
    foreach ops have no sharding rule for DTensors, and copying shard into shard is the
    whole copy."""
    return [t.to_local() if hasattr(t, "to_local") else t for t in ts]


def _clone_state(st: dict) -> dict:
    """A copy of an optimiser state dict: tensors cloned, containers rebuilt."""
    if isinstance(st, Tensor):
        return st.detach().clone()
    if isinstance(st, dict):
        return {k: _clone_state(v) for k, v in st.items()}
    if isinstance(st, list):
        return [_clone_state(v) for v in st]
    if isinstance(st, tuple):
        return tuple(_clone_state(v) for v in st)
    return st


def _same_structure(bufs: list, states: list) -> bool:
    """Same keys, tensor shapes and dtypes throughout (the buffers can take a copy)."""

    def same(a, b) -> bool:
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            return (
                isinstance(a, Tensor)
                and isinstance(b, Tensor)
                and a.shape == b.shape
                and a.dtype == b.dtype
                and a.device == b.device
            )
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return True  # plain values are copied by reference below

    return len(bufs) == len(states) and all(same(a, b) for a, b in zip(bufs, states, strict=True))


def _copy_state_(dst: dict, src: dict) -> None:
    """Copy ``src``'s tensors into ``dst``'s (same structure) and its plain values over."""
    for k, v in src.items():
        if isinstance(v, Tensor):
            dst[k].copy_(v)
        elif isinstance(v, dict):
            _copy_state_(dst[k], v)
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for d, x in zip(dst[k], v, strict=True):
                _copy_state_(d, x)
        else:
            dst[k] = _clone_state(v)


def finite_or_nan(values: Tensor) -> tuple[Tensor, int]:
    """``values`` as float32 with every non-finite entry (also a float64 one beyond
    float32's range) set to NaN, and how many there were."""
    v = values.detach().to(torch.float64)
    bad = ~torch.isfinite(v) | (v.abs() > torch.finfo(torch.float32).max)
    out = v.to(torch.float32)
    out[bad] = math.nan
    return out, int(bad.sum())


class RewardFunctionFailing(RuntimeError):
    """A reward function failed on every completion of several scoring rounds in a row
    (a wrong signature, a typo, a missing dependency): an input error, one line, exit 2."""

    one_line = True
    exit_code = 2


_FIX = {
    "error": (
        "fix the function (a verifier is called as fn(completion, example), a TRL-style "
        "one as fn(prompts=[...], completions=[...], **columns))"
    ),
    "timeout": "make it faster or raise reward.timeout_s",
    "oom": "make it leaner or raise reward.memory_mb",
}


class FailingRewards:
    """Counts, per reward function, the scoring rounds in a row on which every one of its
    evaluations failed (raised, timed out or ran out of memory), and stops the run after
    ``limit`` of them (None: never) instead of training on rewards of 0.

    The first such round is reported at once (one line on stderr), with the reason."""

    def __init__(self, names: Sequence[str], limit: int | None, setting: str):
        self.names, self.limit, self.setting = list(names), limit, setting
        self.streak = dict.fromkeys(self.names, 0)

    def record(self, failed: Tensor, failures: Sequence[tuple[int, str, str, str]]) -> None:
        """``failed``: ``[N, K]`` bool, True where function ``k`` failed on completion ``n``;
        ``failures``: ``(row, name, kind, reason)`` of each failed evaluation."""
        from rlpost.core.io.notice import notice

        if failed.shape[0] == 0:
            return
        for j, name in enumerate(self.names):
            if not bool(failed[:, j].all()):
                self.streak[name] = 0
                continue
            self.streak[name] += 1
            kind, reason = next(((k, r) for _, n, k, r in failures if n == name), ("error", ""))
            reason = (reason.strip().splitlines() or [kind])[0][:200]
            what = (
                f"reward function {name!r} failed on all {failed.shape[0]} completions ({reason})"
            )
            if self.limit is not None and self.streak[name] >= self.limit:
                raise RewardFunctionFailing(
                    f"{what}, {self.streak[name]} scoring rounds in a row; "
                    f"{_FIX.get(kind, _FIX['error'])}, or set {self.setting} higher (null: never stop)"
                )
            if self.streak[name] == 1:
                notice(f"{what}; the run stops if it keeps failing")
