"""Run generated code in a sandboxed subprocess (Linux): CPU, memory, time and file-size
limits, no network, no writes outside its own directory, no way to undo any of it.

:func:`run_sandboxed` writes the code to a fresh directory and starts
``python -I launcher.py``. The launcher (standard library only) isolates itself, then runs
the code with :mod:`runpy`. The isolation, in order:

1. **Resource limits** (``resource.setrlimit``, soft = hard, so the code cannot raise them):
   ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_AS`` (address space), ``RLIMIT_FSIZE`` (the
   largest file it may write), ``RLIMIT_NOFILE`` and ``RLIMIT_CORE`` 0.
2. **Namespaces** (``os.unshare``): a new network namespace, with no interface up, so no
   address is reachable; and a new mount namespace. Without root, a user namespace first,
   mapping the caller to root inside it.
3. **A read-only file system**: every mount is remounted read-only inside the new mount
   namespace (``mount(2)`` through ``ctypes``), except a bind mount of the sandbox's own
   directory, which stays writable.
4. **No privileges left**: every capability is dropped from the bounding set and from the
   process (``prctl`` / ``capset``), root's special treatment on ``exec`` is switched off
   and locked (``SECBIT_NOROOT``), and ``no_new_privs`` is set. The code can therefore not
   remount, bring the network up or regain a capability by ``exec``; without
   ``CAP_DAC_OVERRIDE`` even root's files obey their permissions.

The wall-clock limit is the parent's: past ``timeout_s`` the whole process group is
killed. A platform where the isolation cannot be set up (not Linux, no namespaces) raises
:class:`SandboxError` instead of running unisolated.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_LAUNCHER = r"""
import ctypes, json, os, resource, runpy, sys

cfg = json.loads(sys.argv[1])
work = cfg["dir"]
libc = ctypes.CDLL(None, use_errno=True)

def fail(what):
    err = ctypes.get_errno()
    sys.stderr.write(f"SANDBOX-SETUP-FAILED: {what}: {os.strerror(err) if err else ''}\n")
    sys.exit(97)

# 1. limits
for name, value in (("RLIMIT_CPU", cfg["cpu_s"]), ("RLIMIT_AS", cfg["memory"]),
                    ("RLIMIT_FSIZE", cfg["fsize"]), ("RLIMIT_NOFILE", 64), ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))

# 2. namespaces
uid, gid = os.getuid(), os.getgid()
flags = os.CLONE_NEWNS | (0 if cfg["network"] else os.CLONE_NEWNET)
try:
    if uid != 0:
        os.unshare(os.CLONE_NEWUSER | flags)
        open("/proc/self/setgroups", "w").write("deny")
        open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
        open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
    else:
        os.unshare(flags)
except OSError as exc:
    fail(f"unshare ({exc})")

# 3. read-only everywhere but the sandbox's directory
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
    fail("mount --make-rprivate /")
if libc.mount(work.encode(), work.encode(), None, MS_BIND, None) != 0:
    fail("bind mount of the sandbox directory")
points = []
for line in open("/proc/self/mounts"):
    p = line.split()[1].encode().decode("unicode_escape")
    if p != work:
        points.append(p)
for p in sorted(points, key=len):
    # keep each mount's own nosuid / nodev / noexec flags (required when remounting)
    try:
        st = os.statvfs(p)
    except OSError:
        st = None
    keep = 0
    if st is not None:
        keep |= MS_NOSUID if st.f_flag & os.ST_NOSUID else 0
        keep |= MS_NODEV if st.f_flag & os.ST_NODEV else 0
        keep |= MS_NOEXEC if st.f_flag & os.ST_NOEXEC else 0
    libc.mount(None, p.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep, None)
for place in {os.path.dirname(work.rstrip("/")) or "/", "/tmp", "/dev/shm", "/var/tmp"}:
    probe = os.path.join(place, ".rlpost-sandbox-probe")
    try:
        open(probe, "w").close()
    except OSError:
        continue
    os.unlink(probe)
    fail(f"{place} is still writable")

# 4. drop every privilege: no capability in the bounding set (so exec regains none), none
# held, root no longer special on exec (securebits), no new privileges
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 38, 24, 28
SECBIT_NOROOT, SECBIT_NOROOT_LOCKED = 1, 2
libc.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED, 0, 0, 0)
for cap in range(64):
    libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]
hdr, data = Header(0x20080522, 0), (Data * 2)()
if libc.capset(ctypes.byref(hdr), data) != 0:
    fail("capset")
if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
    fail("no_new_privs")

os.chdir(work)
sys.argv = ["main.py"]
sys.path.insert(0, work)
runpy.run_path(os.path.join(work, "main.py"), run_name="__main__")
"""


class SandboxError(RuntimeError):
    """The sandbox could not be set up here (the code was not run)."""


@dataclass
class SandboxResult:
    returncode: int | None  # None: killed at the wall-clock limit
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    dir: Path  # the sandbox's directory (removed unless keep=True)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_sandboxed(
    code: str,
    *,
    files: dict[str, str] | None = None,
    timeout_s: float = 10.0,
    cpu_s: int = 10,
    memory_mb: int = 1024,
    file_mb: int = 16,
    network: bool = False,
    keep: bool = False,
    python: str = sys.executable,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh directory (with ``files`` beside it) under
    the isolation of the module docstring; ``keep``: leave the directory for the caller
    (e.g. to read a result file the code wrote), which then removes it."""
    if not sys.platform.startswith("linux"):
        raise SandboxError("the sandbox needs Linux (namespaces, mount, prctl)")
    work = Path(tempfile.mkdtemp(prefix="rlpost-sandbox-"))
    (work / "main.py").write_text(code)
    for name, text in (files or {}).items():
        if "/" in name or name.startswith("."):
            raise ValueError(f"sandbox file names are plain names, got {name!r}")
        (work / name).write_text(text)
    cfg = {
        "dir": str(work.resolve()),
        "cpu_s": int(cpu_s),
        "memory": int(memory_mb) << 20,
        "fsize": int(file_mb) << 20,
        "network": network,
    }
    launcher = work / ".launcher.py"
    launcher.write_text(_LAUNCHER)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-I", str(launcher), json.dumps(cfg)],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    seconds = time.perf_counter() - t0
    if proc.returncode == 97 and "SANDBOX-SETUP-FAILED" in err:
        if not keep:
            _remove(work)
        raise SandboxError(err.strip().splitlines()[-1].replace("SANDBOX-SETUP-FAILED: ", ""))
    res = SandboxResult(None if timed_out else proc.returncode, out, err, seconds, timed_out, work)
    if not keep:
        _remove(work)
    return res


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


__all__ = ["SandboxError", "SandboxResult", "run_sandboxed"]
