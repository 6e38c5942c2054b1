"""A local Ray started by a command (rollout workers, CoPD, Mutual RL, federated, the robot
fleet) listens on the loopback only, and none of its processes outlives the command, even
one killed with SIGKILL. Before: every server listened on all interfaces, and the
dashboard and runtime-env agents survived the driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

DRIVER = """
import sys, time
import ray
from rlpost.llm.rollout.cluster import local_ray

with local_ray(1, "test"):
    @ray.remote
    def f():
        return 1

    assert ray.get(f.remote()) == 1
    print("up", flush=True)
    time.sleep(300)
"""


def _tree(root: int) -> set[int]:
    parents = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def _listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets in LISTEN state that ``pids`` hold."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                out.append(cols[1].split(":")[0])
    return out


LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def test_a_local_ray_listens_on_the_loopback_and_dies_with_its_driver(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(  # the test process's own setting must not decide it
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None
    )
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env=env)  # fmt: skip
    try:
        assert driver.stdout.readline().strip() == "up"
        time.sleep(1.0)
        tree = _tree(driver.pid)
        addresses = _listening(tree | {driver.pid})
        assert addresses and set(addresses) <= LOOPBACK, addresses
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in tree):
            time.sleep(0.25)
        left = [p for p in tree if os.path.exists(f"/proc/{p}")]
        assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes() for p in left]
    finally:
        if driver.poll() is None:
            driver.kill()
