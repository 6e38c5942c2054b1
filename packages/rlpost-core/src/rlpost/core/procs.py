"""Worker processes that take what they start along when they die (Linux; standard
library only: the reward pool's workers never import torch themselves)."""

from __future__ import annotations

import os
import signal
import sys


def take_descendants_along(trainer_pid: int) -> None:
    """Linux: the worker dies with the trainer even when stuck in C code, and every
    process a reward function started, ``setsid`` ones included, dies with the worker.

    The process the pool started stays a thin shell in the host's PID namespace; the
    worker itself continues in a forked child that is PID 1 of a new PID namespace and dies
    with the shell. When the worker dies, the kernel kills everything left in its
    namespace. (Orphans that exit stay zombies until then.) Without the right to create a
    PID namespace (an unprivileged user), the worker at least becomes the child subreaper
    of what its functions start, so orphans stay below it.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig, pr_set_child_subreaper = 1, 36
    parent = os.getppid()
    libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
    try:
        os.unshare(os.CLONE_NEWPID)
    except OSError:
        libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)
        return
    worker = os.fork()
    if worker == 0:  # the worker, PID 1 of the new namespace
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        return
    os.closerange(3, 1 << 16)  # the shell holds no pipe of the worker's open
    try:  # the fork server's children keep it alive, so watch the trainer itself
        watched = [os.pidfd_open(trainer_pid), os.pidfd_open(worker)]
        import select

        if watched[0] in select.select(watched, [], [])[0]:
            os.kill(worker, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    code = os.waitstatus_to_exitcode(os.waitpid(worker, 0)[1])
    os._exit(code if code >= 0 else 128 - code)


__all__ = ["take_descendants_along"]
