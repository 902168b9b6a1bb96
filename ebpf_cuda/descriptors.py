"""File descriptors: `Fd`, the owner of each one the kernel returns, and raising the
process's descriptor limit when EMFILE is met (perf-event uprobes take two each), and its
locked-memory limit when a kernel before 5.11 charges BPF objects to it (EPERM).

`syscalls.py` re-exports them (`syscalls.Fd`, `syscalls.raise_fd_limit`,
`syscalls.raise_memlock_limit`).
"""
import os
import resource  # (here, not where EMFILE is met: importing it then needs a descriptor)
import threading


class Fd:
    """Owns one kernel file descriptor; closes it on close(), `with` exit or garbage collection."""

    def __init__(self, fd: int, what: str = "fd") -> None:
        self._fd = fd
        self.what = what

    @property
    def value(self) -> int:
        """The descriptor number; ValueError once closed."""
        if self._fd < 0:
            raise ValueError("%s is closed" % self.what)
        return self._fd

    def fileno(self) -> int:
        return self.value

    def __int__(self) -> int:
        return self.value

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "Fd":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser (e.g. at shutdown)
            pass

    def __repr__(self) -> str:
        return "Fd(%d, %r)" % (self._fd, self.what)


NR_OPEN = "/proc/sys/fs/nr_open"


def raise_fd_limit() -> bool:
    """Make room for more descriptors (EMFILE): perf-event uprobes take two each (the event
    and its BPF link) and their programs one or two, so hundreds of functions in a few files
    pass the usual soft limit of 1024 (6.1's quick start did). The soft limit doubles (at
    least 1024 more), up to the hard limit, which root (CAP_SYS_RESOURCE) may raise up to
    fs.nr_open. True if the limit was raised. (A command the tracer starts after attaching
    inherits the raised soft limit.) Loads in worker threads and attaches may meet EMFILE at
    once: one raises at a time."""
    with _fd_limit_lock:
        return _raise_fd_limit()


_fd_limit_lock = threading.Lock()


def _raise_fd_limit() -> bool:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    want = max(2 * soft, soft + 1024)
    new_hard = hard
    if want > hard:
        try:
            with open(NR_OPEN) as f:
                ceiling = int(f.read())
        except (OSError, ValueError):
            ceiling = hard
        new_hard = max(hard, min(want, ceiling))
    new_soft = min(want, new_hard)
    if new_soft <= soft:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, new_hard))
    except (OSError, ValueError):
        if new_hard == hard or hard <= soft:
            return False
        try:  # no CAP_SYS_RESOURCE: up to the hard limit only
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            return False
    return True



_memlock_before = None  # (soft, hard) before raise_memlock_limit raised it, else None


def raise_memlock_limit() -> bool:
    """Kernels before 5.11 charge maps, programs and BTF to RLIMIT_MEMLOCK (later ones to the
    memory cgroup) and refuse with EPERM past it: Debian 11's 5.10 refused the 4 MiB ring
    buffer under the usual 8 MiB limit. Raise it to unlimited (as libbpf does); True if it
    was raised, so that the refused call is worth one more try. A command the tracer starts
    gets the limit it had before (`restore_memlock_limit`, in the child)."""
    global _memlock_before
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK,
                           (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (OSError, ValueError):  # (no CAP_SYS_RESOURCE: up to the hard limit)
        if soft == hard:
            return False
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
        except (OSError, ValueError):
            return False
    if _memlock_before is None:
        _memlock_before = (soft, hard)
    return True


def restore_memlock_limit() -> None:
    """(In a started command's child, before exec) the locked-memory limit as it was before
    the tracer raised it: the traced program is not changed. Best effort."""
    if _memlock_before is not None:
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, _memlock_before)
        except (OSError, ValueError):
            pass
