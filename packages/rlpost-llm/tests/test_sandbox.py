"""The code sandbox: each limit is shown to bite, next to a control run where it does not
apply (so each test would fail without its limit)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rlpost.llm.data.sandbox import run_sandboxed


def test_an_infinite_loop_is_killed():
    r = run_sandboxed("while True:\n    pass\n", cpu_s=1, timeout_s=20)
    assert not r.ok and r.seconds < 10  # killed by its CPU limit (SIGXCPU / SIGKILL)
    r = run_sandboxed("import time\ntime.sleep(60)\n", timeout_s=1.5)
    assert r.timed_out and r.returncode is None and r.seconds < 10  # the wall clock
    assert run_sandboxed("x = sum(range(10**6))\nprint(x)\n").stdout.strip() == str(
        sum(range(10**6))
    )  # control: finite work finishes


def test_network_access_is_blocked():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    threading.Thread(target=lambda: [server.accept() for _ in range(2)], daemon=True).start()
    code = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "print('connected')\n"
    )
    assert run_sandboxed(code, network=True).stdout.strip() == "connected"  # control
    r = run_sandboxed(code)
    assert not r.ok and "connected" not in r.stdout and "unreachable" in r.stderr
    server.close()


def test_writes_outside_its_directory_are_blocked(tmp_path):
    target = tmp_path / "escape.txt"
    inside = Path(sys.prefix) / "escape.txt"  # the interpreter's prefix is there, read-only
    code = (
        "open('mine.txt', 'w').write('ok')\n"
        "print(open('mine.txt').read())\n"
        f"for path in ({str(target)!r}, {str(inside)!r}):\n"
        "    try:\n"
        "        open(path, 'w').write('escaped')\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__, exc.strerror)\n"
    )
    r = run_sandboxed(code)
    assert r.ok and r.stdout.splitlines()[0] == "ok"  # its own directory is writable
    # the host's /tmp is not even there; what is there is read-only
    assert r.stdout.splitlines()[1:] == [
        "FileNotFoundError No such file or directory",
        "OSError Read-only file system",
    ]
    assert not target.exists() and not inside.exists()
    # it cannot undo the read-only mounts or raise its own limits either
    undo = (
        "import ctypes, resource\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.mount(None, b'/', None, 4096 | 32, None))\n"
        "try:\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n"
        "    print('raised')\n"
        "except (ValueError, OSError):\n"
        "    print('refused')\n"
    )
    assert run_sandboxed(undo).stdout.split() == ["-1", "refused"]


def test_memory_is_capped():
    code = "x = bytearray(400 * 1024 * 1024)\nprint('allocated')\n"
    assert run_sandboxed(code, memory_mb=2048).stdout.strip() == "allocated"  # control
    r = run_sandboxed(code, memory_mb=200)
    assert not r.ok and "MemoryError" in r.stderr


def _alive_with(marker: str) -> list[int]:
    """Host pids whose command line carries ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_it_cannot_signal_or_see_host_processes():
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = (
            "import os, signal\n"
            f"try:\n    os.kill({victim.pid}, signal.SIGKILL)\n    print('sent')\n"
            "except ProcessLookupError:\n    print('no such process')\n"
            "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        )
        r = run_sandboxed(code)
        lines = r.stdout.splitlines()
        assert lines[0] == "no such process" and victim.poll() is None  # the victim lives
        assert lines[1] == "[1, 2]"  # its init and itself: no host process is visible
    finally:
        victim.kill()
        victim.wait()


def test_host_unix_sockets_are_out_of_reach(tmp_path):
    path = str(tmp_path / "host.sock")
    abstract = "\0rlpost-test-" + uuid.uuid4().hex
    servers = []
    for address in (path, abstract):
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(address)
        srv.listen(4)
        servers.append(srv)
    os.chmod(path, 0o777)
    code = (
        "import socket\n"
        f"for address in ({path!r}, {abstract!r}):\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        "        s.connect(address)\n"
        "        print('connected')\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__)\n"
    )
    for address in (path, abstract):  # control: both are reachable from the host
        socket.socket(socket.AF_UNIX).connect(address)
    r = run_sandboxed(code)
    assert r.stdout.split() == ["FileNotFoundError", "ConnectionRefusedError"], r
    for srv in servers:
        srv.close()


def test_system_v_shared_memory_dies_with_it():
    key = 0x52000000 + os.getpid() % 0xFFFF
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"shm = libc.shmget({key}, 100 << 20, 0o1666)\n"
        "print('created' if shm >= 0 else 'refused')\n"
    )
    r = run_sandboxed(code)
    assert r.stdout.strip() == "created"
    keys = [int(line.split()[0]) for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
    assert key not in keys  # its IPC namespace (and the segment) are gone


@pytest.mark.parametrize("daemon", [False, True], ids=["holds-stdout", "daemon"])
def test_nothing_it_starts_outlives_it(daemon):
    marker = "rlpost-orphan-" + uuid.uuid4().hex
    spawn = (
        "import subprocess, sys\n"
        f"cmd = [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}]\n"
    )
    if daemon:  # double fork, new session, every descriptor closed
        spawn += (
            "import os\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        for fd in range(3):\n"
            "            os.close(fd)\n"
            "        os.execv(cmd[0], cmd)\n"
            "    os._exit(0)\n"
            "os.wait()\n"
        )
    else:  # a new session that keeps the sandbox's stdout open
        spawn += "subprocess.Popen(cmd, start_new_session=True)\n"
    t0 = time.monotonic()
    r = run_sandboxed(spawn + "import time\ntime.sleep(1)\nprint('parent done')\n", timeout_s=20)
    assert r.ok and r.stdout.strip() == "parent done"
    assert time.monotonic() - t0 < 15  # it did not wait for the child's stdout
    assert _alive_with(marker) == []
    assert not r.dir.exists()


def test_the_process_count_is_capped():
    code = (
        "import os, time\n"
        "kids = []\n"
        "try:\n"
        "    for _ in range(40):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(3)\n"
        "            os._exit(0)\n"
        "        kids.append(pid)\n"
        "except BlockingIOError:\n"
        "    pass\n"
        "print(len(kids))\n"
    )
    assert run_sandboxed(code, processes=64, timeout_s=30).stdout.strip() == "40"  # control
    assert int(run_sandboxed(code, processes=10, timeout_s=30).stdout.strip()) < 10


def test_the_memory_of_the_whole_tree_is_capped():
    code = (
        "import os, time\n"
        "for _ in range(4):\n"
        "    if os.fork() == 0:\n"
        "        x = b'x' * (250 << 20)\n"
        "        time.sleep(5)\n"
        "        os._exit(0)\n"
        "for _ in range(4):\n"
        "    os.wait()\n"
        "print('all held')\n"
    )
    assert run_sandboxed(code, memory_mb=2048, timeout_s=30).stdout.strip() == "all held"
    r = run_sandboxed(code, memory_mb=600, timeout_s=30)  # each child fits, the four do not
    assert not r.ok and r.limit == "memory" and "all held" not in r.stdout


def test_output_is_bounded():
    code = "import sys\nfor _ in range(200):\n    sys.stdout.write('x' * (1 << 20))\n"
    r = run_sandboxed(code, file_mb=4)
    assert not r.ok and r.limit == "output/file size" and len(r.stdout) <= 4 << 20
    assert run_sandboxed(code, file_mb=256).ok  # control


def test_a_killed_caller_takes_the_sandbox_and_its_directory_with_it(tmp_path):
    marker = "rlpost-caller-" + uuid.uuid4().hex
    (tmp_path / "code.py").write_text(
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}],"
        " start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    (tmp_path / "caller.py").write_text(
        "import pathlib, sys\n"
        "from rlpost.llm.data.sandbox import run_sandboxed\n"
        "run_sandboxed(pathlib.Path(sys.argv[1]).read_text(), timeout_s=60)\n"
    )
    scratch = tmp_path / "scratch"  # where the caller's sandbox directories go
    scratch.mkdir()
    caller = subprocess.Popen(
        [sys.executable, str(tmp_path / "caller.py"), str(tmp_path / "code.py")],
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _alive_with(marker):
        time.sleep(0.2)
    assert _alive_with(marker) and list(scratch.iterdir()), "the sandboxed child never started"
    caller.send_signal(signal.SIGKILL)  # as the reward pool does past its timeout
    caller.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_alive_with(marker) or list(scratch.iterdir())):
        time.sleep(0.2)
    assert _alive_with(marker) == [] and list(scratch.iterdir()) == []


def test_without_namespaces_it_refuses_unless_the_user_opts_in(monkeypatch, caplog):
    """Where the kernel refuses namespaces, generated code is not run uncontained: one
    error naming the opt-in; with RLPOST_SANDBOX=limits-only it runs under resource limits
    only, said once."""
    import logging

    from rlpost.llm.data import sandbox

    real = sandbox._run

    def no_namespaces(*args, weak, **kw):
        if not weak:
            raise sandbox.SandboxError(
                "unshare (Operation not permitted; user namespaces unavailable?)"
            )
        return real(*args, weak=weak, **kw)

    monkeypatch.setattr(sandbox, "_run", no_namespaces)
    monkeypatch.setattr(sandbox, "_WEAK", [])
    monkeypatch.delenv("RLPOST_SANDBOX", raising=False)
    with pytest.raises(sandbox.SandboxError, match="RLPOST_SANDBOX=limits-only"):
        run_sandboxed("print('ran')\n")
    monkeypatch.setenv("RLPOST_SANDBOX", "limits-only")
    with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
        first = run_sandboxed("print('ran')\n")
        second = run_sandboxed(
            "import resource\nprint(resource.getrlimit(resource.RLIMIT_CPU)[0])\n", cpu_s=7
        )
    assert first.stdout.strip() == "ran" and second.stdout.strip() == "7"  # limits still set
    warnings = [r for r in caplog.records if "resource limits only" in r.getMessage()]
    assert len(warnings) == 1
