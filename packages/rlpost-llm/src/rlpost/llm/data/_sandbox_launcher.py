"""The sandbox's launcher (standard library only): ``python -I _sandbox_launcher.py CFG``.

Three processes, each with one job (see :mod:`rlpost.llm.data.sandbox` for the why):

- **launcher** (host namespaces): writes the user-namespace maps of its child, removes the
  sandbox directory if the caller dies, exits with the code's status;
- **holder**: enters new user, mount, network, IPC, UTS and PID namespaces, forks the init;
- **init** (PID 1 of the new PID namespace): builds the new root, forks the code's process,
  reaps, and watches the memory of the whole tree. When it exits, the kernel kills every
  process left in the namespace (daemons, ``setsid`` children), so nothing outlives it.

Every process below the caller dies with its parent (``PR_SET_PDEATHSIG``). The final
status goes to the caller through ``status_fd``, which the code's process closes first,
so the code cannot forge it.
"""

import contextlib
import ctypes
import json
import os
import platform
import resource
import signal
import sys
import time

CFG = json.loads(sys.argv[1])
WORK = CFG["dir"]
LIBC = ctypes.CDLL(None, use_errno=True)
KEPT = []  # (path, writable, O_PATH descriptor, is a directory), opened by the launcher

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 38, 24, 28
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_NOATIME = 1, 2, 4, 8, 32, 1024
MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
UID_BASE = 0x7E000000
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}
FLAG_OF_STAT = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_KEPT = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime")
DEVICES = ("null", "zero", "full", "random", "urandom")


def fail(what):
    err = ctypes.get_errno()
    sys.stderr.write(f"SANDBOX-SETUP-FAILED: {what}{': ' + os.strerror(err) if err else ''}\n")
    sys.stderr.flush()
    os._exit(97)


def report(**status):
    """The final word to the caller (only the launcher, holder and init hold this pipe)."""
    with contextlib.suppress(OSError):
        os.write(CFG["status_fd"], json.dumps(status).encode())


def die_with_parent(parent_pid, sig=signal.SIGKILL):
    LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(137)


def exit_code(status):
    return os.waitstatus_to_exitcode(status)


# ----------------------------------------------------------------------------- the code's process


def set_limits():
    for name, value in (
        ("RLIMIT_CPU", CFG["cpu_s"]),
        ("RLIMIT_AS", CFG["memory"]),
        ("RLIMIT_FSIZE", CFG["fsize"]),
        ("RLIMIT_NOFILE", 64),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    if CFG.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (CFG["nproc"], CFG["nproc"]))


def drop_privileges():
    """No capability left in the bounding set or held, root not special on exec, no new
    privileges: the code cannot remount, bring a network up or regain a capability."""
    SECBIT_NOROOT, SECBIT_NOROOT_LOCKED = 1, 2
    LIBC.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED, 0, 0, 0)
    for cap in range(64):
        LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    hdr, data = Header(0x20080522, 0), (Data * 2)()
    if LIBC.capset(ctypes.byref(hdr), data) != 0:
        fail("capset")
    if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail("no_new_privs")


def code_process():
    """Run the code in this (forked) process and leave with its exit status; never return
    into the caller's stack."""
    code = 0
    try:
        run_code()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            sys.stderr.write(f"{exc.code}\n")
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code & 0xFF)


def run_code():
    os.close(CFG["status_fd"])
    set_limits()
    if not CFG["weak"]:
        drop_privileges()
    else:
        LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.chdir(WORK)
    sys.argv = ["main.py"]
    sys.path.insert(0, WORK)
    import runpy

    runpy.run_path(os.path.join(WORK, "main.py"), run_name="__main__")


# ----------------------------------------------------------------------------- the new root


def mount(src, dst, fstype=None, flags=0, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if LIBC.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        fail(f"mount {src} on {dst}")


def locked_flags(path):
    """The flags a remount must keep (in a user namespace they cannot be cleared)."""
    st = os.statvfs(path)
    return sum(ms for stf, ms in FLAG_OF_STAT if st.f_flag & stf)


def bind(src, dst, *, writable=False, flags_of=None):
    mount(src, dst, None, MS_BIND | MS_REC)
    if not writable:
        keep = locked_flags(flags_of or dst)
        mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep)


def place(src, dst, isdir=None):
    """An empty file or directory at ``dst`` to mount ``src`` on."""
    if os.path.isdir(src) if isdir is None else isdir:
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()


def mirror(host, dst, writable=False):
    """``host`` at ``dst``: a symbolic link copied as one, anything else bound."""
    if os.path.islink(host):
        os.symlink(os.readlink(host), dst)
    elif os.path.exists(host):
        place(host, dst)
        bind(host, dst, writable=writable)


def minimal_etc(new):
    """A two-line ``passwd`` and ``group``, and the loader's files: nothing else of /etc."""
    os.makedirs(new + "/etc")
    with open(new + "/etc/passwd", "w") as f:
        f.write("root:x:0:0:sandbox:/:/bin/false\nnobody:x:65534:65534::/:/bin/false\n")
    with open(new + "/etc/group", "w") as f:
        f.write("root:x:0:\nnogroup:x:65534:\n")
    for name in ETC_KEPT:
        mirror("/etc/" + name, new + "/etc/" + name)


def minimal_dev(new):
    for name in DEVICES:
        mirror("/dev/" + name, new + "/dev/" + name, writable=True)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, new + "/dev/" + name)


def kept_paths(new):
    """The interpreter's prefixes (read-only) and the sandbox's directory (writable), from
    the descriptors the holder opened; then those descriptors closed, as an open one of a
    host directory would be a way out."""
    covered = tuple("/" + d + "/" for d in SYSTEM_DIRS)
    for path, writable, fd, isdir in KEPT:
        if not writable and (path + "/").startswith(covered):
            continue
        src = f"/proc/self/fd/{fd}"
        place(path, new + path, isdir)
        bind(src, new + path, writable=writable, flags_of=src)
    for _, _, fd, _ in KEPT:
        os.close(fd)


def pivot(new):
    """Make ``new`` the root, detach the host's, and make the new one read-only."""
    os.makedirs(new + "/.oldroot")
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        fail(f"pivot_root: unknown architecture {platform.machine()}")
    if LIBC.syscall(number, new.encode(), (new + "/.oldroot").encode()) != 0:
        fail("pivot_root")
    os.chdir("/")
    if LIBC.umount2(b"/.oldroot", MNT_DETACH) != 0:
        fail("detaching the host's root")
    os.rmdir("/.oldroot")
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for probe_dir in ("/", "/tmp", os.path.dirname(WORK.rstrip("/")) or "/"):
        probe = os.path.join(probe_dir, ".rlpost-sandbox-probe")
        try:
            open(probe, "w").close()
        except OSError:
            continue
        fail(f"{probe_dir} is still writable")


def build_root(new):
    """A tmpfs root holding the system directories, a minimal /etc and /dev, a fresh /proc
    and the kept paths (the interpreter, the sandbox's directory), all read-only but the
    directory; nothing of the host's home, temporary or configuration directories.
    Returns whether /proc could be mounted (the tree's memory is read there)."""
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=8m")
    for d in SYSTEM_DIRS:
        mirror("/" + d, new + "/" + d)
    minimal_etc(new)
    minimal_dev(new)
    os.makedirs(new + "/tmp")
    kept_paths(new)
    os.makedirs(new + "/proc")
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    proc = LIBC.mount(b"proc", (new + "/proc").encode(), b"proc", flags, None) == 0
    pivot(new)
    return proc


# ----------------------------------------------------------------------------- the three processes


def tree_rss():
    """Resident bytes of every process in the namespace but the init (pid 1)."""
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1":
            try:
                with open(f"/proc/{name}/statm") as f:
                    total += int(f.read().split()[1]) * page
            except (OSError, ValueError, IndexError):
                pass
    return total


def init():
    """PID 1: build the root, start the code, reap, watch the tree's memory."""
    die_with_parent(None)
    watch = build_root("/tmp")
    code_pid = os.fork()
    if code_pid == 0:
        code_process()
    limit = CFG["tree_memory"]
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid, status = 0, 0
        if pid == code_pid:
            report(exit=exit_code(status))
            os._exit(0)
        if pid:
            continue
        if watch and limit and tree_rss() > limit:
            report(limit="memory", detail=f"the process tree used over {limit >> 20} MB")
            os._exit(0)
        time.sleep(0.02)


def holder(sync_r, sync_w, launcher_pid):
    die_with_parent(launcher_pid)
    flags = (
        os.CLONE_NEWUSER
        | os.CLONE_NEWNS
        | os.CLONE_NEWNET
        | os.CLONE_NEWIPC
        | os.CLONE_NEWUTS
        | os.CLONE_NEWPID
    )
    if CFG["network"]:
        flags &= ~os.CLONE_NEWNET
    try:
        os.unshare(flags)
    except OSError as exc:
        fail(f"unshare ({exc.strerror}; user namespaces unavailable?)")
    open_kept()  # in the new mount namespace (a bind source must be), as the caller still
    os.write(sync_w, b"u")
    if os.read(sync_r, 1) != b"m":
        os._exit(97)
    os.setresgid(0, 0, 0)
    if CFG["root"]:
        os.setgroups([])  # root's supplementary groups would still open host files
    os.setresuid(0, 0, 0)
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    pid = os.fork()
    if pid == 0:
        init()
    status = os.waitpid(pid, 0)[1]
    os._exit(min(255, abs(exit_code(status))))


def write_maps(pid):
    if os.geteuid() == 0:
        # a host uid of its own (unique while this launcher lives), so that RLIMIT_NPROC
        # counts the sandbox's processes only and no host file is the code's own
        uid = gid = UID_BASE + os.getpid()
        os.chown(WORK, uid, gid)
    else:
        uid, gid = os.getuid(), os.getgid()
        with open(f"/proc/{pid}/setgroups", "w") as f:
            f.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def open_kept():
    """Descriptors of what the code needs, opened with the caller's file rights (as root,
    the code's own uid could not traverse ``/root`` to the interpreter)."""
    import stat

    for path, writable in CFG["keep"]:
        try:
            fd = os.open(path, os.O_PATH)
        except OSError:
            continue
        KEPT.append((path, writable, fd, stat.S_ISDIR(os.fstat(fd).st_mode)))


def launcher():
    LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if CFG["weak"]:
        code_pid = os.fork()
        if code_pid == 0:
            code_process()
        report(exit=exit_code(os.waitpid(code_pid, 0)[1]))
        return
    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    me, child = os.getpid(), []

    def caller_died(*_):
        """The caller is gone: nobody will remove the directory or wait for the code."""
        if child:
            os.kill(child[0], signal.SIGKILL)
        import shutil

        shutil.rmtree(WORK, ignore_errors=True)
        os._exit(137)

    signal.signal(signal.SIGTERM, caller_died)
    if os.getppid() != CFG["parent"]:
        caller_died()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.close(up_r)
        os.close(down_w)
        holder(down_r, up_w, me)
    child.append(pid)
    os.close(up_w)
    os.close(down_r)
    if os.read(up_r, 1) == b"u":
        try:
            write_maps(pid)
        except OSError as exc:
            os.kill(pid, signal.SIGKILL)
            sys.stderr.write(f"SANDBOX-SETUP-FAILED: user-namespace maps ({exc.strerror})\n")
            os._exit(97)
        os.write(down_w, b"m")
    status = os.waitpid(pid, 0)[1]
    os._exit(exit_code(status))


if __name__ == "__main__":
    launcher()
