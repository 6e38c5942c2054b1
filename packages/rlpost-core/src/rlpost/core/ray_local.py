"""A local Ray that this command owns: on the loopback only, gone when the command is.

``ray.init()`` without an address starts a one-machine cluster whose servers (GCS, raylet,
workers, agents) listen on every interface, and whose dashboard and runtime-env agents
outlive a driver killed with SIGKILL. :func:`init_local_ray` starts it with the node
address on the loopback (Ray then binds every server there) and a reaper: a small process
that records the driver's descendants while it lives and kills those left when it dies,
however it dies. Joining a cluster (an address given) goes through plain ``ray.init``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

_REAPER = r"""
import os, select, signal, sys, time

driver, me = int(sys.argv[1]), os.getpid()


def table():
    # pid -> (parent, start time): the start time tells a reused pid from the original
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(name)] = (int(fields[1]), fields[19])
            except (OSError, IndexError, ValueError):
                pass
    return out


def descendants(t, roots):
    found, frontier = {}, set(roots)
    while frontier:
        frontier = {p for p, (pp, _) in t.items() if pp in frontier and p not in found and p != me}
        found.update({p: t[p][1] for p in frontier})
    return found


try:
    fd = os.pidfd_open(driver)
except OSError:
    sys.exit(0)
seen = {}
while not select.select([fd], [], [], 0.25)[0]:
    seen.update(descendants(table(), [driver]))
time.sleep(0.5)  # Ray's own fate sharing first
for _ in range(3):
    t = table()
    alive = {p: s for p, s in seen.items() if p in t and t[p][1] == s}
    alive.update(descendants(t, alive))
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    seen.update(alive)
    time.sleep(0.2)
"""

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class LocalRay:
    """The reaper of a local Ray started by :func:`init_local_ray`; :meth:`stop` after
    ``ray.shutdown()`` (nothing is left to reap then)."""

    def __init__(self, reaper: subprocess.Popen | None) -> None:
        self.reaper = reaper

    def stop(self) -> None:
        if self.reaper is not None and self.reaper.poll() is None:
            self.reaper.kill()
            self.reaper.wait()
        self.reaper = None


def init_local_ray(ray: Any, **kwargs: Any) -> LocalRay:
    """``ray.init(**kwargs)`` for a cluster of this machine alone: every Ray server on the
    loopback, and every process it starts killed when this process dies (Linux)."""
    # Ray places a one-machine cluster's node on the loopback (and binds its servers
    # there) when multi-node clusters are off; it reads this at import and at init
    os.environ[LOOPBACK_ENV] = "0"  # inherited by Ray's processes
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is not None and hasattr(constants, "ENABLE_RAY_CLUSTER"):
        constants.ENABLE_RAY_CLUSTER = False
    reaper = None
    if sys.platform.startswith("linux"):
        reaper = subprocess.Popen(
            [sys.executable, "-I", "-c", _REAPER, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
              **kwargs}  # fmt: skip
    try:
        ray.init(**kwargs)
    except BaseException:
        LocalRay(reaper).stop()
        raise
    return LocalRay(reaper)


__all__ = ["LocalRay", "init_local_ray"]
