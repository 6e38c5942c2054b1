"""The code sandbox: each limit is shown to bite, next to a control run where it does not
apply (so each test would fail without its limit)."""

from __future__ import annotations

import socket
import threading

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
    code = (
        "open('mine.txt', 'w').write('ok')\n"
        "print(open('mine.txt').read())\n"
        f"open({str(target)!r}, 'w').write('escaped')\n"
    )
    r = run_sandboxed(code)
    assert r.stdout.strip() == "ok"  # its own directory is writable
    assert not r.ok and "Read-only file system" in r.stderr and not target.exists()
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
