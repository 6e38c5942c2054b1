"""Reward functions computed out of process, with real time and memory limits.

Every domain scores with :class:`RewardPool`: the LLM trainer its verifiers of
completions, the diffusion trainer a user's image reward, one image per item.

A *reward function* is any picklable, module-level callable ``fn(item, example) ->
float`` (an LLM verifier gets the completion text and its
:class:`rlpost.llm.data.tasks.Example`; a diffusion reward goes through an adapter that
scores one image and its prompt). Bound methods of picklable objects (e.g.
``task.score``) and picklable callable instances work too. A function may carry an
optional ``warmup`` attribute, a zero-argument callable that every worker process runs
once before it takes work (to import heavy modules such as sympy outside the per-item
time limit).

:class:`RewardPool` evaluates every ``(item, reward function)`` pair in a pool of
persistent worker processes (``forkserver`` or ``spawn`` start method, never ``fork``:
the trainer holds torch threads). An evaluation that exceeds ``timeout_s`` gets its
worker killed and replaced and scores ``0`` (counted in ``reward/timeouts``); one that
allocates past the worker's memory cap (``memory_mb`` above what the worker held when it
became ready, an ``RLIMIT_AS`` limit) fails with ``MemoryError`` and scores ``0`` (counted
in ``reward/oom``); one that raises, returns something that is not a number finite in
float32 (the dtype rewards are used in), or kills its worker (``os._exit``, segfault)
scores ``0`` (counted in ``reward/errors``). Every other item still gets its real reward,
and :meth:`RewardPool.score` never hangs.

The worker side of this module (:func:`_worker_main` and its helpers) uses only the
standard library and never imports torch itself. (Importing any ``rlpost`` module
imports ``rlpost.core`` and so torch; with the forkserver start method the fork server
preloads this module once, so workers inherit torch instead of importing it, and each
worker limits torch to one thread.)
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.util
import io
import logging
import math
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass
from multiprocessing.connection import wait as _wait_any
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rlpost.core.procs import take_descendants_along

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch

__all__ = [
    "FLOAT32_MAX",
    "MainGuardError",
    "RewardPool",
    "RewardResult",
    "Verifier",
    "check_main_guard",
]

#: The largest finite float32: a reward above it would be ``inf`` once stored.
FLOAT32_MAX = 3.4028234663852886e38

logger = logging.getLogger(__name__)


@runtime_checkable
class Verifier(Protocol):
    """A reward function: ``fn(item, example) -> float`` (an LLM verifier: ``fn(completion,
    example)``).

    It must be picklable (a module-level function, or an instance of a
    module-level class) because :class:`RewardPool` runs it in worker processes.
    It may define an optional ``warmup`` attribute: a zero-argument callable that
    each worker process calls once at start-up, before it reports ready and
    outside any per-item time limit.
    """

    def __call__(self, completion: str, example: Any, /) -> float: ...


# ----------------------------------------------------------------------------- shared helpers


class _RecordingPickler(pickle.Pickler):
    """A pickler that notes the modules of the classes and functions it pickles by reference."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)):
            module = getattr(obj, "__module__", None)
            if module:
                self.modules.add(module)
        return NotImplemented


def _dumps(obj: Any) -> tuple[bytes, set[str]]:
    """Pickle ``obj``; also return the modules its classes and functions live in."""
    buf = io.BytesIO()
    pickler = _RecordingPickler(buf)
    pickler.dump(obj)
    return buf.getvalue(), pickler.modules


def _module_files(modules: set[str]) -> dict[str, str]:
    """Source file of each (already imported) module, for workers that cannot import it by name."""
    out = {}
    for name in modules:
        if name in ("__main__", "__mp_main__", "builtins"):
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            out[name] = path
    return out


class _Unpickler(pickle.Unpickler):
    """Unpickler that can load a module from its file when it is not importable by name.

    pytest's ``--import-mode=importlib`` and scripts give modules names that a
    fresh process cannot import (e.g. ``packages.rlpost-llm.tests.test_x``); the
    parent sends each module's file so the worker can load it under that name.
    """

    def __init__(self, data: bytes, module_files: dict[str, str]) -> None:
        super().__init__(io.BytesIO(data))
        self._files = module_files

    def find_class(self, module: str, name: str) -> Any:
        if module in self._files:
            if module not in sys.modules:
                try:
                    importlib.import_module(module)
                except ImportError:
                    _load_module_from_file(module, self._files[module])
            # Not super().find_class: its __import__ would re-import the top-level package.
            obj: Any = sys.modules[module]
            for part in name.split("."):
                obj = getattr(obj, part)
            return obj
        return super().find_class(module, name)


def _load_module_from_file(name: str, path: str) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load module {name!r} from {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def _as_reward(value: Any) -> tuple[str, float | str]:
    """``("ok", float)`` for a number finite in float32, else ``("err", reason)``."""
    if isinstance(value, (str, bytes, bytearray)):
        return "err", f"returned {type(value).__name__} {value!r:.80}, not a number"
    try:
        reward = float(value)
    except Exception as e:
        return "err", f"returned {type(value).__name__}, not a number ({e})"
    if not math.isfinite(reward):
        return "err", f"returned non-finite reward {reward}"
    if abs(reward) > FLOAT32_MAX:
        return "err", f"returned {reward:g}, which is infinite in float32"
    return "ok", reward


def _evaluate(
    fn: Callable[..., Any], completion: str, example: Any, catch: type[BaseException]
) -> tuple[str, float | str]:
    """Run one reward evaluation, turning exceptions of type ``catch`` into ``("err", reason)``."""
    try:
        value = fn(completion, example)
    except MemoryError as e:
        return "oom", f"MemoryError: {e}"
    except catch as e:
        return "err", f"{type(e).__name__}: {e}"
    return _as_reward(value)


def _vm_bytes() -> int | None:
    """This process's virtual memory size (Linux), or None."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cap_memory(memory_mb: float | None) -> None:
    """Limit this worker's address space to what it holds now plus ``memory_mb``."""
    if memory_mb is None:
        return
    try:
        import resource
    except ImportError:  # not on this platform
        return
    now = _vm_bytes()
    if now is None:
        return
    limit = now + int(memory_mb * 2**20)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


# ----------------------------------------------------------------------------- the main guard

#: The exit code of a worker that found itself re-running the user's training script.
REIMPORTED_EXIT = 86
MAIN_GUARD = (
    "reward worker processes re-import your script's main module, and it starts training "
    'at import time: put the training code under  if __name__ == "__main__":  '
    "(the reward functions themselves may stay at the top level)"
)


class MainGuardError(RuntimeError):
    """A script without ``if __name__ == "__main__":`` started training in a worker."""

    one_line = True
    exit_code = 2


def check_main_guard() -> None:
    """Called where a run starts (the run directory, the reward pool): inside a process that
    multiprocessing is bootstrapping (re-importing the parent's main module), a run must
    not start; the process says why and exits with :data:`REIMPORTED_EXIT`, which the
    pool turns into :class:`MainGuardError` at once instead of restarting it."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        print(f"rlpost: {MAIN_GUARD}", file=sys.stderr, flush=True)
        os._exit(REIMPORTED_EXIT)


# ----------------------------------------------------------------------------- worker side (no torch)


def _exit_when_orphaned(ppid: int) -> None:
    """Exit the worker if its parent (trainer, or forkserver) goes away."""
    while True:
        time.sleep(1.0)
        if os.getppid() != ppid:
            os._exit(0)


def _one_torch_thread() -> None:
    """If torch is loaded in this worker (never imported here), keep it to one thread."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def _preload_in_forkserver(ctx: Any) -> None:
    """Ask the fork server, if it is not running yet, to also import this module.

    Workers forked from it then inherit ``rlpost.llm`` (and the torch it pulls in)
    instead of importing it on every (re)start.  Uses the documented
    ``set_forkserver_preload`` and keeps the modules already listed there.
    """
    from multiprocessing import forkserver

    current = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
    if __name__ not in current:
        ctx.set_forkserver_preload([*current, __name__])


def _worker_main(
    conn: Any,
    fns_blob: bytes,
    module_files: dict[str, str],
    memory_mb: float | None = None,
    trainer_pid: int = 0,
) -> None:
    """Worker process loop.

    Protocol (parent -> worker): ``("run", new_module_files, [(tid, fn_index, payload)])``
    where ``payload`` pickles ``(completion, example)``; ``("stop",)``.
    Worker -> parent: ``("ready", pid)`` once, ``("fail", traceback)`` if the reward
    functions cannot be loaded or warmed up, then one ``("res", tid, status, value)``
    per item, in order (``status`` is ``"ok"`` with a float or ``"err"`` with a reason).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    take_descendants_along(trainer_pid)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    files = dict(module_files)
    try:
        fns = _Unpickler(fns_blob, files).load()
        for fn in fns:
            warmup = getattr(fn, "warmup", None)
            if callable(warmup):
                warmup()
        _one_torch_thread()
        _cap_memory(memory_mb)
    except BaseException:
        conn.send(("fail", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] != "run":
            return
        files.update(msg[1])
        if msg[1]:
            _one_torch_thread()  # new modules may have imported torch
        for tid, k, payload in msg[2]:
            try:
                completion, example = _Unpickler(payload, files).load()
            except BaseException as e:
                conn.send(("res", tid, "err", f"cannot unpickle the example: {e!r}"))
                continue
            conn.send(("res", tid, *_evaluate(fns[k], completion, example, BaseException)))


# ----------------------------------------------------------------------------- parent side


@dataclass
class RewardResult:
    """Rewards of one :meth:`RewardPool.score` call.

    Attributes:
        rewards: ``[N]`` float32, the weighted sum of the components.
        components: ``[N, K]`` float32, one column per reward function (in ``names`` order);
            failed evaluations (timeouts, errors) are 0.
        names: the K reward function names.
        metrics: ``reward/timeouts``, ``reward/oom`` and ``reward/errors`` (counts in
            this call), ``reward/worker_restarts``, ``reward/mean``, ``reward/std``,
            ``reward/time_s``, and per component ``reward/<name>/mean``,
            ``reward/<name>/timeouts``, ``reward/<name>/oom``, ``reward/<name>/errors``.
        failed: ``[N, K]`` bool, True where the evaluation timed out, ran out of memory
            or errored.
    """

    rewards: torch.Tensor
    components: torch.Tensor
    names: list[str]
    metrics: dict[str, float]
    failed: torch.Tensor | None = None


class _Worker:
    """Parent-side handle of one worker process."""

    __slots__ = ("born", "conn", "inflight", "known_modules", "proc", "ready", "t0")

    def __init__(self, proc: Any, conn: Any) -> None:
        self.proc = proc
        self.conn = conn
        self.ready = False
        self.born = time.monotonic()
        self.inflight: collections.deque[int] = collections.deque()  # tids, in worker order
        self.t0 = 0.0  # when the worker started its current item
        self.known_modules: set[str] = set()


class _Call:
    """Book-keeping of one pooled :meth:`RewardPool.score` call (items are ``tid = row * K + k``)."""

    def __init__(self, n: int, k: int) -> None:
        self.k = k
        self.values = [0.0] * (n * k)
        self.status = ["pending"] * (n * k)  # -> "ok" | "err" | "timeout" | "oom"
        self.reasons: dict[int, str] = {}
        self.remaining = n * k
        self.pending: collections.deque[int] = collections.deque()
        self.payloads: list[bytes | None] = []
        self.files: dict[str, str] = {}

    def resolve(self, tid: int, status: str, value: float | str) -> None:
        if self.status[tid] != "pending":
            return
        self.status[tid] = status
        if status == "ok":
            self.values[tid] = float(value)
        else:
            self.reasons[tid] = str(value)
        self.remaining -= 1


def _callable_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class RewardPool:
    """Evaluate reward functions in worker processes with a per-item time limit.

    Args:
        reward_fns: one reward function, or ``{name: fn}`` (column order = dict order).
            Each is a picklable ``fn(completion, example) -> float`` (see :class:`Verifier`).
        weights: ``{name: weight}`` for every name (default: all 1.0);
            ``rewards = components @ weights``.
        workers: number of worker processes.  ``0`` runs everything in this process
            with no time limit and no crash isolation: for debugging only.
        timeout_s: wall-clock limit of one evaluation; past it the worker is killed.
        memory_mb: how much more address space than it held when ready a worker may
            take (``RLIMIT_AS``; Linux); past it the evaluation fails with MemoryError,
            scores 0 and is counted in ``reward/oom``. None: no cap. Ignored with
            ``workers=0``.
        start_method: ``"forkserver"`` (default: the fork server preloads this module,
            so starting or replacing a worker is a cheap fork) or ``"spawn"`` (every
            worker imports everything afresh).  ``"fork"`` is refused (the trainer
            holds torch threads).
        start_timeout_s: limit for a (re)started worker to load the reward functions
            and run their ``warmup``; not counted against ``timeout_s``.
        max_chunk: most items sent to a worker in one message.

    Workers start in the constructor and persist across calls; use the pool as a
    context manager or call :meth:`close`.  One :meth:`score` call takes at most
    about ``ceil(N * K / workers) * timeout_s`` plus worker restarts in the worst case.
    Like any spawn/forkserver child, each new worker re-imports the program's
    ``__main__`` module (keep heavy work under ``if __name__ == "__main__":``).
    A pool is not thread-safe: call it from one thread.
    """

    def __init__(
        self,
        reward_fns: dict[str, Callable[..., Any]] | Callable[..., Any],
        weights: dict[str, float] | None = None,
        workers: int = 2,
        timeout_s: float = 5.0,
        *,
        memory_mb: float | None = 1024.0,
        start_method: str = "forkserver",
        start_timeout_s: float = 120.0,
        max_chunk: int = 16,
    ) -> None:
        check_main_guard()
        self._closed = True
        self._slots: list[_Worker] = []
        if isinstance(reward_fns, dict):
            fns = dict(reward_fns)
        elif callable(reward_fns):
            fns = {_callable_name(reward_fns): reward_fns}
        else:
            raise TypeError(
                f"reward_fns must be a callable or a dict of callables, got {reward_fns!r}"
            )
        if not fns:
            raise ValueError("reward_fns is empty")
        for name, fn in fns.items():
            if not callable(fn):
                raise TypeError(f"reward function {name!r} is not callable: {fn!r}")
        if weights is None:
            weights = dict.fromkeys(fns, 1.0)
        if set(weights) != set(fns):
            raise ValueError(f"weights keys {sorted(weights)} != reward names {sorted(fns)}")
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a positive finite number, got {timeout_s}")
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")

        self.names: list[str] = list(fns)
        self.weights: list[float] = [float(weights[n]) for n in self.names]
        self.workers = workers
        self.timeout_s = float(timeout_s)
        if memory_mb is not None and not memory_mb > 0:
            raise ValueError(f"memory_mb must be positive (or None: no cap), got {memory_mb}")
        self.memory_mb = memory_mb
        self.start_timeout_s = float(start_timeout_s)
        self.max_chunk = max(1, int(max_chunk))
        #: ``(row, name, "timeout" | "error", reason)`` of each failed evaluation of the last call.
        self.last_failures: list[tuple[int, str, str, str]] = []
        self._fns = list(fns.values())
        self._call: _Call | None = None
        self._restarts = 0
        self._start_failures = 0
        self._closed = False
        if workers == 0:
            return
        import multiprocessing

        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            _preload_in_forkserver(self._ctx)
        try:
            self._fns_blob, modules = _dumps(self._fns)
        except Exception as e:
            raise TypeError(
                f"reward functions must be picklable (module-level callables): {e}"
            ) from e
        self._fn_files = _module_files(modules)
        self._slots = [self._spawn() for _ in range(workers)]

    # -- public API -----------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """Process ids of the current worker processes (empty for ``workers=0``)."""
        return [w.proc.pid for w in self._slots]

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every worker has loaded the reward functions (and run their warmup).

        Raises:
            RuntimeError: a worker cannot load the reward functions.
            TimeoutError: not ready within ``timeout`` seconds.
        """
        self._check_open()
        self._start_failures = 0
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        while not all(w.ready for w in self._slots):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"reward workers not ready after {timeout} s")
            self._pump(max_wait=max(0.0, deadline - time.monotonic()))

    def score(self, completions: Sequence[Any], examples: Sequence[Any]) -> RewardResult:
        """Reward of every item under every reward function.

        Args:
            completions: N items (an LLM's generated texts, after the prompt).
            examples: the N examples they answer (an LLM's prompts and answers).

        Returns:
            A :class:`RewardResult`; failed evaluations score 0 and are counted in
            ``metrics["reward/timeouts"]`` / ``["reward/oom"]`` / ``["reward/errors"]``.
        """
        self._check_open()
        n, k = len(completions), len(self._fns)
        if len(examples) != n:
            raise ValueError(f"{n} completions but {len(examples)} examples")
        t_start = time.monotonic()
        restarts_before = self._restarts
        if self.workers == 0:
            call = _Call(n, k)
            for tid in range(n * k):
                row, j = divmod(tid, k)
                call.resolve(
                    tid, *_evaluate(self._fns[j], completions[row], examples[row], Exception)
                )
        else:
            call = self._score_in_pool(completions, examples)
        return self._result(call, n, time.monotonic() - t_start, self._restarts - restarts_before)

    def close(self) -> None:
        """Terminate the worker processes (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for w in self._slots:
            with contextlib.suppress(Exception):
                w.proc.terminate()
        deadline = time.monotonic() + 2.0
        for w in self._slots:
            with contextlib.suppress(Exception):
                w.proc.join(max(0.0, deadline - time.monotonic()))
                if w.proc.is_alive():
                    w.proc.kill()
                    w.proc.join(5.0)
            with contextlib.suppress(Exception):
                w.conn.close()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # No contextlib here: module globals may already be gone at interpreter exit.
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass

    # -- internals --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("RewardPool is closed")

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child_conn, self._fns_blob, self._fn_files, self.memory_mb, os.getpid()),
            name="rlpost-reward-worker",
            daemon=True,
        )
        proc.start()
        child_conn.close()
        return _Worker(proc, parent_conn)

    def _score_in_pool(self, completions: Sequence[str], examples: Sequence[Any]) -> _Call:
        n, k = len(completions), len(self._fns)
        call = _Call(n, k)
        modules: set[str] = set()
        for row in range(n):
            try:
                blob, mods = _dumps((completions[row], examples[row]))
            except Exception as e:
                call.payloads.append(None)
                for j in range(k):
                    call.resolve(row * k + j, "err", f"cannot pickle the example: {e!r}")
                continue
            call.payloads.append(blob)
            modules |= mods
            call.pending.extend(range(row * k, row * k + k))
        call.files = _module_files(modules)
        self._call = call
        self._start_failures = 0
        try:
            while call.remaining > 0:
                self._dispatch(call)
                self._pump()
        except BaseException:
            # Workers still busy with this call would answer into the next one: replace them.
            for idx, w in enumerate(self._slots):
                if w.inflight:
                    w.inflight.clear()
                    self._kill(w)
                    self._slots[idx] = self._spawn()
            raise
        finally:
            self._call = None
        return call

    def _dispatch(self, call: _Call) -> None:
        """Send a chunk of pending items to every idle, ready worker."""
        for w in self._slots:
            if not call.pending:
                return
            if not w.ready or w.inflight:
                continue
            size = max(1, min(self.max_chunk, len(call.pending) // (2 * self.workers)))
            tids = [call.pending.popleft() for _ in range(min(size, len(call.pending)))]
            tasks = [(t, t % call.k, call.payloads[t // call.k]) for t in tids]
            new_files = {m: f for m, f in call.files.items() if m not in w.known_modules}
            try:
                w.conn.send(("run", new_files, tasks))
            except (OSError, ValueError):  # worker already gone; _pump notices and replaces it
                call.pending.extendleft(reversed(tids))
                continue
            w.known_modules.update(new_files)
            w.inflight.extend(tids)
            w.t0 = time.monotonic()

    def _pump(self, max_wait: float = 1.0) -> None:
        """Wait for one round of worker events; handle results, deaths and deadlines."""
        now = time.monotonic()
        deadlines = [max_wait + now]
        for w in self._slots:
            if w.inflight:
                deadlines.append(w.t0 + self.timeout_s)
            elif not w.ready:
                deadlines.append(w.born + self.start_timeout_s)
        waitables = [w.conn for w in self._slots] + [w.proc.sentinel for w in self._slots]
        _wait_any(waitables, timeout=max(0.0, min(deadlines) - now))
        now = time.monotonic()
        for idx, w in enumerate(self._slots):
            alive = w.proc.is_alive()  # before draining: a dead worker's last results are kept
            try:
                while w.conn.poll():
                    self._handle(w, w.conn.recv(), now)
            except (EOFError, OSError):
                alive = False
            if not alive:
                self._replace(idx, "died")
            elif w.inflight and now >= w.t0 + self.timeout_s:
                self._replace(idx, "timeout")
            elif not w.ready and now >= w.born + self.start_timeout_s:
                self._replace(idx, "start timeout")

    def _handle(self, w: _Worker, msg: tuple, now: float) -> None:
        kind = msg[0]
        if kind == "res":
            _, tid, status, value = msg
            if w.inflight and w.inflight[0] == tid:
                w.inflight.popleft()
                w.t0 = now
                if self._call is not None:
                    self._call.resolve(tid, status, value)
        elif kind == "ready":
            w.ready = True
        elif kind == "fail":
            raise RuntimeError(f"a reward worker could not load the reward functions:\n{msg[1]}")

    def _replace(self, idx: int, reason: str) -> None:
        """Kill worker ``idx`` and start a new one; charge its current item, requeue the rest."""
        w = self._slots[idx]
        self._kill(w)
        if w.proc.exitcode == REIMPORTED_EXIT:
            raise MainGuardError(MAIN_GUARD)
        call = self._call
        if w.inflight and call is not None:
            tid = w.inflight.popleft()
            if reason == "timeout":
                call.resolve(tid, "timeout", f"exceeded timeout_s={self.timeout_s}")
            else:
                call.resolve(tid, "err", f"worker process died (exit code {w.proc.exitcode})")
            call.pending.extendleft(reversed(w.inflight))
            w.inflight.clear()
        elif not w.ready:
            self._start_failures += 1
            if self._start_failures > 2 + 2 * self.workers:
                raise RuntimeError(
                    f"reward workers keep dying before taking work (last: {reason}, "
                    f"exit code {w.proc.exitcode})"
                )
        self._slots[idx] = self._spawn()
        self._restarts += 1

    @staticmethod
    def _kill(w: _Worker) -> None:
        with contextlib.suppress(Exception):
            if w.proc.is_alive():
                w.proc.kill()
            w.proc.join(5.0)
        with contextlib.suppress(Exception):
            w.conn.close()

    def _result(self, call: _Call, n: int, elapsed: float, restarts: int) -> RewardResult:
        import torch

        k = len(self._fns)
        components = torch.tensor(call.values, dtype=torch.float32).reshape(n, k)
        failed = torch.tensor([s != "ok" for s in call.status], dtype=torch.bool).reshape(n, k)
        rewards = components @ torch.tensor(self.weights, dtype=torch.float32)
        self.last_failures = []
        counts = {(j, kind): 0 for j in range(k) for kind in ("timeout", "oom", "error")}
        for tid, status in enumerate(call.status):
            if status != "ok":
                row, j = divmod(tid, k)
                kind = status if status in ("timeout", "oom") else "error"
                counts[j, kind] += 1
                self.last_failures.append((row, self.names[j], kind, call.reasons.get(tid, "")))
        metrics = {
            "reward/mean": rewards.mean().item() if n else 0.0,
            "reward/std": rewards.std(correction=0).item() if n else 0.0,
            "reward/timeouts": float(sum(counts[j, "timeout"] for j in range(k))),
            "reward/oom": float(sum(counts[j, "oom"] for j in range(k))),
            "reward/errors": float(sum(counts[j, "error"] for j in range(k))),
            "reward/worker_restarts": float(restarts),
            "reward/time_s": elapsed,
        }
        for j, name in enumerate(self.names):
            metrics[f"reward/{name}/mean"] = components[:, j].mean().item() if n else 0.0
            metrics[f"reward/{name}/timeouts"] = float(counts[j, "timeout"])
            metrics[f"reward/{name}/oom"] = float(counts[j, "oom"])
            metrics[f"reward/{name}/errors"] = float(counts[j, "error"])
        if self.last_failures:
            logger.debug("reward failures: %s", self.last_failures[:5])
        return RewardResult(rewards, components, list(self.names), metrics, failed)
