"""Run generated code in a sandboxed subprocess (Linux): it sees none of the host's
processes, files, network or IPC, it is limited in time, CPU, memory (of its whole process
tree), processes, file and output size, and nothing it starts outlives it.

:func:`run_sandboxed` writes the code to a fresh directory and starts
``python -I _sandbox_launcher.py`` (standard library only), which isolates the code, in order:

1. **Namespaces** (``unshare``): new user, mount, network (no interface up), IPC (System V
   objects die with it), UTS and PID namespaces. As root the user namespace maps the code to
   a host uid of its own, so host files are not its own and the process limit counts only
   its processes; otherwise to the caller's uid.
2. **A new root** (``pivot_root`` onto a tmpfs): the system directories (``/usr``, ``/lib``,
   ...), the interpreter's prefixes, a minimal ``/etc`` (loader cache, a two-line
   ``passwd``), five devices and a fresh ``/proc`` showing only the sandbox's processes, all
   read-only; the sandbox's own directory is the one writable place. The host's ``/home``,
   ``/root``, ``/tmp``, ``/run`` (its Unix sockets), ``/dev/shm`` and ``/etc`` are not there.
3. **PID 1 of its own**: an init process starts the code, reaps, and polls the resident
   memory of the whole tree (``memory_mb`` for all processes together). When the code
   exits, or any limit is hit, init exits and the kernel kills every process left in the
   namespace, ``setsid`` daemons included. Each process dies with its parent
   (``PR_SET_PDEATHSIG``), so killing the caller (a reward worker past its timeout) kills
   the sandbox too, and the launcher then removes the directory.
4. **Limits** (``setrlimit``, soft = hard): CPU seconds, address space per process, the
   largest file (stdout and stderr are files too, so output is bounded), open files,
   processes, no core dumps.
5. **No privileges left**: every capability dropped from the bounding set and the process,
   ``SECBIT_NOROOT`` locked, ``no_new_privs``: it cannot remount, bring a network up or
   regain a capability by ``exec``.

The wall-clock limit is the caller's: past ``timeout_s`` the launcher's process group is
killed and the rest follows by the death signals; :func:`run_sandboxed` returns only once
the namespace's init is gone. Where namespaces are unavailable (not Linux, user namespaces
disabled) the sandbox refuses with :class:`SandboxError`, unless the user opts in to
resource limits only with ``RLPOST_SANDBOX=limits-only`` (said once, as a warning).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("_sandbox_launcher.py")
OPT_IN = "RLPOST_SANDBOX"
_WEAK: list[str] = []  # the reason, once namespaces were found unavailable and opted out of
_CHECKED: list[bool] = []


class SandboxError(RuntimeError):
    """The sandbox could not be set up here (the code was not run)."""


@dataclass
class SandboxResult:
    returncode: int | None  # None: killed at the wall-clock limit; < 0: by that signal
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    dir: Path  # the sandbox's directory (removed unless keep=True)
    limit: str | None = None  # the limit that stopped it: time, cpu, memory, output/file size

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


_SIGNAL_LIMITS = {-signal.SIGXCPU: "cpu", -signal.SIGXFSZ: "output/file size"}


def run_sandboxed(
    code: str,
    *,
    files: dict[str, str] | None = None,
    timeout_s: float = 10.0,
    cpu_s: int = 10,
    memory_mb: int = 1024,
    file_mb: int = 16,
    processes: int = 32,
    network: bool = False,
    keep: bool = False,
    python: str = sys.executable,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh directory (with ``files`` beside it) under
    the isolation of the module docstring. ``memory_mb`` bounds each process's address
    space and the whole tree's resident memory; ``file_mb`` any file it writes and its
    stdout and stderr; ``processes`` its processes and threads. ``keep``: leave the
    directory for the caller (e.g. to read a result file the code wrote; open it with
    :func:`read_result`), which then removes it."""
    if not sys.platform.startswith("linux"):
        raise SandboxError("the sandbox needs Linux (namespaces, mount, prctl)")
    work = Path(tempfile.mkdtemp(prefix="rlpost-sandbox-")).resolve()
    args = (
        code,
        files or {},
        work,
        timeout_s,
        cpu_s,
        memory_mb,
        file_mb,
        processes,
        network,
        python,
    )
    try:
        res = _run(*args, weak=bool(_WEAK))
    except SandboxError as exc:
        if _WEAK or os.environ.get(OPT_IN) != "limits-only":
            _remove(work)
            raise SandboxError(
                f"{exc}; generated code is not run uncontained (set {OPT_IN}=limits-only "
                "to run it with resource limits only)"
            ) from None
        _WEAK.append(str(exc))
        logger.warning(
            "the code sandbox cannot isolate here (%s): %s=limits-only, so "
            "generated code runs with resource limits only",
            exc,
            OPT_IN,
        )
        res = _run(*args, weak=True)
    except BaseException:
        _remove(work)
        raise
    if not keep:
        _remove(work)
    return res


def check_sandbox() -> None:
    """Set the sandbox up once, at the start of a run that will need it: raises
    :class:`SandboxError` (naming the opt-in) where it cannot isolate, or warns once when
    the user opted in to resource limits only."""
    if not _CHECKED:
        run_sandboxed("pass\n", timeout_s=60)
        _CHECKED.append(True)


def _run(
    code: str,
    files: dict[str, str],
    work: Path,
    timeout_s: float,
    cpu_s: int,
    memory_mb: int,
    file_mb: int,
    processes: int,
    network: bool,
    python: str,
    *,
    weak: bool,
) -> SandboxResult:
    (work / "main.py").write_text(code)
    for name, text in files.items():
        if "/" in name or name.startswith("."):
            raise ValueError(f"sandbox file names are plain names, got {name!r}")
        (work / name).write_text(text)
    status_r, status_w = os.pipe()
    cfg = {
        "dir": str(work),
        "cpu_s": int(cpu_s),
        "memory": int(memory_mb) << 20,
        "tree_memory": int(memory_mb) << 20,
        "fsize": int(file_mb) << 20,
        "nproc": int(processes) + 2,  # + the namespace's holder and init
        "network": network,
        "keep": _kept(python, work),
        "root": os.geteuid() == 0,
        "parent": os.getpid(),
        "status_fd": status_w,
        "weak": weak,
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        rc, timed_out = _launch(python, cfg, work, out, err, status_w, timeout_s)
        status = _read_status(status_r)
        seconds = time.perf_counter() - t0
        stdout, stderr = _read_capped(out, cfg["fsize"]), _read_capped(err, cfg["fsize"])
        # Python ignores SIGXFSZ: a write past the cap fails with EFBIG instead of killing
        full = max(os.fstat(out.fileno()).st_size, os.fstat(err.fileno()).st_size) >= cfg["fsize"]
    if not status and not timed_out and "SANDBOX-SETUP-FAILED" in stderr:
        line = next(x for x in stderr.splitlines() if "SANDBOX-SETUP-FAILED" in x)
        raise SandboxError(line.replace("SANDBOX-SETUP-FAILED: ", ""))
    if timed_out:
        return SandboxResult(None, stdout, stderr, seconds, True, work, "time")
    if "limit" in status:
        stderr += f"\nsandbox: {status.get('detail', status['limit'])}\n"
        return SandboxResult(-signal.SIGKILL, stdout, stderr, seconds, False, work, status["limit"])
    rc = status.get("exit", rc)
    limit = _SIGNAL_LIMITS.get(rc) or ("output/file size" if full and rc != 0 else None)
    return SandboxResult(rc, stdout, stderr, seconds, False, work, limit)


def _launch(python: str, cfg: dict, work: Path, out, err, status_w: int, timeout_s: float):
    """Start the launcher with stdout / stderr to the files ``out`` / ``err``; past
    ``timeout_s`` kill its process group (the rest dies with it). Returns (its return code,
    timed out)."""
    try:
        proc = subprocess.Popen(
            [python, "-I", str(LAUNCHER), json.dumps(cfg)],
            cwd=work,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=(status_w,),
            env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
        )
    finally:
        os.close(status_w)
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(), True


def _kept(python: str, work: Path) -> list[tuple[str, bool]]:
    """What the code needs from the host: the interpreter's prefixes (read-only), then its
    own directory (writable, mounted last so no read-only parent covers it)."""
    exe = os.path.abspath(python)
    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.dirname(exe)),
        os.path.dirname(os.path.dirname(os.path.realpath(exe))),
    }
    ro = sorted((p for p in paths if p and p != "/"), key=len)
    return [(p, False) for p in ro] + [(str(work), True)]


def _read_status(fd: int, wait_s: float = 30.0) -> dict:
    """The init's last word; EOF means every process that held the pipe (launcher, holder,
    init) is gone, and with the init the whole namespace."""
    chunks, deadline = [], time.monotonic() + wait_s
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            data = os.read(fd, 4096)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(fd)
    try:
        return json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}


def _read_capped(f, cap: int) -> str:
    f.seek(0)
    return f.read(cap).decode("utf-8", errors="replace")


def read_result(work: Path, name: str, max_bytes: int = 16 << 20) -> bytes | None:
    """Read a file the code left in its directory without following a link, opening a FIFO
    or reading more than ``max_bytes``: None when it is missing or not a regular file."""
    import stat

    try:
        fd = os.open(work / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
        return data if len(data) <= max_bytes else None
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


__all__ = ["SandboxError", "SandboxResult", "check_sandbox", "read_result", "run_sandboxed"]
