"""Attach loaded programs to user-space functions: (file, offset), entry or return, any pid.

Two ways, both ending in an fd-owning `Link` whose close() detaches:
- `attach_uprobe`: one perf event from the uprobe PMU per probe, joined to the program by a
  BPF_PERF_EVENT link (with a cookie), or by the older PERF_EVENT_IOC_SET_BPF ioctl;
- `attach_uprobe_multi`: one BPF_TRACE_UPROBE_MULTI link for many offsets of one file
  (Linux 6.6+, see `uprobe_multi_supported`).
Which one a kernel takes is found by trying (`attach_path`), never from its version. The
legacy tracefs `uprobe_events` interface is not used: every kernel with BPF ring buffers
(5.8+, which the tracer needs) has the uprobe PMU (4.17+).
"""
import contextlib
import errno as errnos
import os
from typing import Dict, Iterator, List, Optional, Sequence, Union

from .. import syscalls
from ..errors import AttachError, KernelError, UnsupportedKernelError
from ..syscalls import Fd, LinkInfo
from . import features
from .programs import EXPECTED_UPROBE_MULTI, Program

ProgramRef = Union[Program, int]

UPROBE_MULTI, PERF_LINK, PERF_IOCTL = "uprobe_multi", "perf_link", "perf_ioctl"
PATHS = {
    UPROBE_MULTI: "uprobe_multi links (one per program and file; function ids in cookies)",
    PERF_LINK: "perf-event uprobes joined by BPF links (one per function and file)",
    PERF_IOCTL: "perf-event uprobes joined by PERF_EVENT_IOC_SET_BPF (no BPF links, "
                "no cookies)",
}



class Link:
    """An attached probe; close() (or leaving `with`, or garbage collection) detaches it."""

    def __init__(self, fds: List[Fd], path: str, offsets: Sequence[int], retprobe: bool,
                 pid: Optional[int], what: str = "", has_bpf_link: bool = True) -> None:
        self._fds = fds  # closed in order: the BPF link first, then the perf event
        self.path = path
        self.offsets = list(offsets)
        self.retprobe = retprobe
        self.pid = pid
        self.what = what
        self.has_bpf_link = has_bpf_link

    @property
    def fd(self) -> int:
        """The BPF link fd (or the perf event fd when attached by ioctl)."""
        return self._fds[0].value

    @property
    def closed(self) -> bool:
        return all(fd.closed for fd in self._fds)

    def info(self) -> LinkInfo:
        """What the kernel recorded for the link: file, offsets, cookies, direction."""
        if not self.has_bpf_link:
            raise ValueError("probe was attached by ioctl: it has no BPF link to query")
        return syscalls.link_info(self.fd)

    def close(self) -> None:
        for fd in self._fds:
            fd.close()

    def __enter__(self) -> "Link":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "uretprobe" if self.retprobe else "uprobe"
        return "Link(%s %s %s, offsets=%s)" % (kind, self.what or "", self.path,
                                               [hex(o) for o in self.offsets])


def _prog_fd(program: ProgramRef) -> int:
    return program.fd if isinstance(program, Program) else int(program)


def _place(path: str, offsets: Sequence[int], what: str) -> str:
    label = "%s in " % what if what else ""
    where = ", ".join("0x%x" % o for o in offsets)
    return "%s%s at offset%s %s" % (label, path, "s" if len(offsets) > 1 else "", where)


def _attach_error(err: KernelError, kind: str, path: str, offsets: Sequence[int],
                  what: str) -> KernelError:
    """Name the probe site; privilege and kernel-feature errors keep their own class."""
    if isinstance(err, (AttachError, UnsupportedKernelError)) or type(err) is not KernelError:
        return err
    reason = syscalls.error_name(err.errno)
    if err.errno == errnos.ESRCH:
        reason = "no such process"
    return AttachError("cannot attach %s to %s: %s" % (kind, _place(path, offsets, what), reason),
                       err.errno, err.log)


PINNED = "/proc/self/fd/"  # a path through a descriptor this process holds (`pinned`)


def resolve_path(path: str, what: str = "") -> str:
    """The real file behind `path` (uprobes are keyed by inode), AttachError if missing.

    A symlink is replaced by its target only when both name the same inode: paths through
    /proc/PID/root must stay as given, because readlink resolves them in our own namespace.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise AttachError("cannot attach uprobe to %s%s: %s"
                          % ("%s in " % what if what else "", path, exc.strerror),
                          exc.errno or 0) from None
    if path.startswith(PINNED):
        return path  # (a file held open: the kernel follows the fd to it, whatever its name)
    real = os.path.realpath(path)
    try:
        same = os.stat(real)
        if (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino):
            return real
    except OSError:
        pass
    return os.path.abspath(path)


def _check_offsets(offsets: Sequence[int]) -> None:
    for off in offsets:
        if off < 0 or off >= 1 << 64:
            raise ValueError("bad uprobe file offset %r" % off)


def attach_uprobe(program: ProgramRef, path: str, offset: int, retprobe: bool = False,
                  pid: Optional[int] = None, cookie: int = 0, what: str = "") -> Link:
    """Run `program` when the instruction at file `offset` of `path` executes (entry probe),
    or when the function starting there returns (`retprobe=True`).

    `pid` limits the probe to one process; `cookie` is what get_attach_cookie returns;
    `what` is a human label (the function name) for error messages. A program loaded for
    uprobe_multi links is attached as its copy loaded for perf events
    (`Program.for_perf_event`): kernels differ in whether they take the other.
    """
    _check_offsets([offset])
    if isinstance(program, Program):
        program = program.for_perf_event()
    prog_fd = _prog_fd(program)
    kind = "uretprobe" if retprobe else "uprobe"
    real = resolve_path(path, what)
    while True:
        try:
            pfd = syscalls.perf_event_open_uprobe(real, offset, retprobe, pid)
        except KernelError as err:
            if err.errno == errnos.EMFILE and syscalls.raise_fd_limit():
                continue
            raise _attach_error(err, kind, real, [offset], what) from None
        try:
            fds = _bind_program(pfd, prog_fd, cookie)
            syscalls.perf_event_enable(pfd.value)
        except KernelError as err:
            pfd.close()
            if err.errno == errnos.EMFILE and syscalls.raise_fd_limit():
                continue
            raise _attach_error(err, kind, real, [offset], what) from None
        return Link(fds, real, [offset], retprobe, pid, what, has_bpf_link=len(fds) == 2)


def _bind_program(pfd: Fd, prog_fd: int, cookie: int) -> List[Fd]:
    """Join program and perf event: a BPF link (5.15+), else the SET_BPF ioctl (no cookie).

    The program must have been loaded with expected_attach_type 0: perf links refuse one
    loaded for uprobe_multi (EINVAL), and the ioctl takes it on some 6.18 builds only.
    """
    if perf_links_supported():
        return [syscalls.link_create_perf_event(prog_fd, pfd.value, cookie), pfd]
    if cookie:
        raise UnsupportedKernelError(
            "uprobe cookies need BPF perf-event links (Linux 5.15+), which this kernel lacks")
    syscalls.perf_event_set_bpf(pfd.value, prog_fd)
    return [pfd]


def perf_links_supported() -> bool:
    """Whether BPF_LINK_CREATE(BPF_PERF_EVENT) exists (Linux 5.15+): features.perf_links."""
    return features.perf_links()


def attach_path() -> str:
    """How this kernel's probes are attached (UPROBE_MULTI, PERF_LINK or PERF_IOCTL; PATHS
    says each in words), from what it was found to accept."""
    if uprobe_multi_supported():
        return UPROBE_MULTI
    return PERF_LINK if perf_links_supported() else PERF_IOCTL


def attach_uprobe_multi(program: ProgramRef, path: str, offsets: Sequence[int],
                        cookies: Optional[Sequence[int]] = None, retprobe: bool = False,
                        pid: Optional[int] = None, what: str = "",
                        session: bool = False) -> Link:
    """Attach `program` at many offsets of one file with one uprobe_multi link (Linux 6.6+).

    The program must have been loaded with expected_attach_type=48 (EXPECTED_UPROBE_MULTI),
    or with `session` 57 (BPF_TRACE_UPROBE_SESSION, Linux 6.13: the program runs at entry
    and, when it returned 0 there, at return). `cookies[i]` is what get_attach_cookie
    returns when `offsets[i]` fires.
    """
    _check_offsets(offsets)
    attach_type = syscalls.BPF_TRACE_UPROBE_SESSION if session else EXPECTED_UPROBE_MULTI
    if isinstance(program, Program) and program.expected_attach_type != attach_type:
        raise ValueError("program %r must be loaded with expected_attach_type=%d for "
                         "this link" % (program.name, attach_type))
    prog_fd = _prog_fd(program)
    kind = "uprobe session" if session else "uretprobe_multi" if retprobe else "uprobe_multi"
    real = resolve_path(path, what)
    flags = syscalls.BPF_F_UPROBE_MULTI_RETURN if retprobe else 0
    try:
        fd = syscalls.link_create_uprobe_multi(prog_fd, real, offsets, cookies, flags, pid or 0,
                                               attach_type)
    except KernelError as err:
        raise _attach_error(err, kind, real, offsets, what) from None
    return Link([fd], real, offsets, retprobe, pid, what)


def uprobe_multi_supported() -> bool:
    """Whether this kernel has uprobe_multi links with a working pid filter:
    features.uprobe_multi."""
    return features.uprobe_multi()


@contextlib.contextmanager
def pinned(paths: Sequence[str]) -> Iterator[Dict[str, str]]:
    """Each file of `paths` held open (O_PATH) while its links are made: path -> a path
    through that descriptor. A file's links are made one after the other; made by its path,
    a file replaced there meanwhile (a reinstall) would get the rest of them."""
    fds: Dict[str, int] = {}
    through: Dict[str, str] = {}
    try:
        for path in paths:
            if path in through:
                continue
            try:
                fds[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
                through[path] = PINNED + str(fds[path])
            except OSError:
                through[path] = path  # (its links fail as they would have, and say why)
        yield through
    finally:
        for fd in fds.values():
            os.close(fd)
