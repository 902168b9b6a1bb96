"""What this kernel can do, found by trying it (never by its version number).

Each probe is cheap (a trivial program, a small map, a link to an invalid target), runs once
per process and is cached. The attach probes live beside the code that uses them
(`uprobe.uprobe_multi_supported`, `uprobe.perf_links_supported`); this module has the others
and `report()`, the one-line summary that `-v` prints.

| feature | used for | fallback when missing |
|---|---|---|
| ring buffer (5.8) | every event | none: UnsupportedKernelError |
| uprobe_multi links (6.6) | one link per program and file; shared programs | perf-event uprobes |
| uprobe PMU (4.17) | perf-event uprobes | none (the tracefs `uprobe_events` interface is not used: every kernel with ring buffers has the PMU) |
| perf-event BPF links (5.15) | perf-event uprobes with cookies | PERF_EVENT_IOC_SET_BPF (no cookies) |
| attach cookies (5.15) | shared programs (function id in the cookie) | one program per function |
| task storage from uprobe programs + kernel BTF | calls in flight per thread | an LRU hash map |
| task_struct's pid, tgid, comm read through bpf_get_current_task_btf (kernel BTF, 5.11) | a record's ids and comm, in two loads each | get_current_pid_tgid, get_current_comm |
| uprobe sessions (6.13) | not used (reported) | |
| uretprobe system call seen by seccomp (6.11 until the Feb 2025 fix) | hazard check | return probes refused for seccomp-filtered targets |
| bpf_get_ns_current_pid_tgid (5.7: every kernel with ring buffers) | pids as a PID namespace numbers them, when the tracer runs in one | none needed |
"""
import ctypes
import errno as errnos
import os
import struct
from typing import Dict, NamedTuple, Optional, Tuple

from .. import syscalls
from ..errors import KernelError

BPF_TRACE_UPROBE_SESSION = syscalls.BPF_TRACE_UPROBE_SESSION
KERNEL_BTF = "/sys/kernel/btf/vmlinux"
NR_URETPROBE_X86_64 = 335  # the uretprobe trampoline's system call (x86-64 only, 6.11+)
NR_SECCOMP_X86_64 = 317
PROC_PID_INIT_INO = 0xEFFFFFFC  # the initial PID namespace's inode (include/linux/proc_ns.h)

_cache: Dict[str, object] = {}


def _cached(name: str, probe):
    if name not in _cache:
        _cache[name] = probe()
    return _cache[name]


def forget() -> None:
    """Probe again next time (tests)."""
    _cache.clear()


# -- small programs ----------------------------------------------------------------------

_EXIT0 = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])  # r0 = 0; exit


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _call(helper: int) -> bytes:
    return _insn(0x85, imm=helper)


def _ld_map_fd(dst: int, fd: int) -> bytes:
    return _insn(0x18, dst, 1, 0, fd) + _insn(0, 0, 0, 0, 0)  # ld_imm64 BPF_PSEUDO_MAP_FD


def _mov_imm(dst: int, imm: int) -> bytes:
    return _insn(0xB7, dst, imm=imm)


def _mov_reg(dst: int, src: int) -> bytes:
    return _insn(0xBF, dst, src)


def _loads(code: bytes, name: str, expected_attach_type: int = 0) -> Optional[str]:
    """None if the kernel loads `code` as a kprobe program, else why not (verifier's line)."""
    try:
        fd, _ = syscalls.prog_load(code, syscalls.BPF_PROG_TYPE_KPROBE, "GPL", name,
                                   expected_attach_type)
    except KernelError as err:
        if err.errno in (errnos.EPERM, errnos.EACCES):
            raise  # no privileges is not a "no"
        return syscalls.verifier_reason(err.log) or syscalls.error_name(err.errno)
    fd.close()
    return None


# -- the probes --------------------------------------------------------------------------


def ring_buffer() -> bool:
    """BPF_MAP_TYPE_RINGBUF (Linux 5.8)."""
    def probe() -> bool:
        try:
            syscalls.map_create(syscalls.BPF_MAP_TYPE_RINGBUF, 0, 0,
                                os.sysconf("SC_PAGE_SIZE"), name="probe_ring").close()
            return True
        except KernelError as err:
            if err.errno in (errnos.EPERM, errnos.EACCES):
                raise
            return False
    return bool(_cached("ring_buffer", probe))


def kernel_btf() -> bool:
    """The kernel describes its own types (CONFIG_DEBUG_INFO_BTF): get_current_task_btf."""
    return os.path.exists(KERNEL_BTF)


def attach_cookies() -> bool:
    """bpf_get_attach_cookie from uprobe programs (Linux 5.15)."""
    code = _mov_reg(6, 1) + _call(174) + _EXIT0
    return _cached("cookies", lambda: _loads(code, "probe_cookie") is None) is True


def task_storage_reason() -> Optional[str]:
    """None when uprobe programs can keep per-thread values in task storage (a task storage
    map, kernel BTF, and bpf_task_storage_get allowed in kprobe-type programs); else why not,
    in words."""
    def probe() -> Optional[str]:
        if not kernel_btf():
            return "the kernel has no BTF (%s)" % KERNEL_BTF
        from . import btf

        try:
            blob = syscalls.btf_load(btf.key_and_bytes(8))
        except KernelError as err:
            if err.errno in (errnos.EPERM, errnos.EACCES):
                raise
            return "BTF cannot be loaded: %s" % syscalls.error_name(err.errno)
        with blob:
            try:
                storage = syscalls.map_create(
                    syscalls.BPF_MAP_TYPE_TASK_STORAGE, 4, 8, 0, 1, "probe_tasks",
                    btf=(blob.value, btf.INT_TYPE_ID, btf.BYTES_TYPE_ID))
            except KernelError as err:
                if err.errno in (errnos.EPERM, errnos.EACCES):
                    raise
                return "no task storage maps (%s)" % syscalls.error_name(err.errno)
            with storage:
                code = (_call(158) + _mov_reg(2, 0) + _ld_map_fd(1, storage.value)
                        + _mov_imm(3, 0) + _mov_imm(4, 0) + _call(156) + _EXIT0)
                why = _loads(code, "probe_tasks")
                return None if why is None else "uprobe programs cannot use it (%s)" % why
    return _cached("task_storage", probe)  # type: ignore[return-value]


def task_storage() -> bool:
    return task_storage_reason() is None


def task_fields() -> Optional[Tuple[int, int, int]]:
    """task_struct's pid, tgid and comm offsets (kernel_btf.task_fields) when uprobe programs
    may load them through bpf_get_current_task_btf's pointer; else None (the helpers read
    them)."""
    def probe() -> Optional[Tuple[int, int, int]]:
        if not kernel_btf():
            return None
        from . import kernel_btf as btf_file

        found = btf_file.task_fields()
        if found is None:
            return None
        pid, tgid, comm = found
        code = (_call(158) + _insn(0x61, 1, 0, pid) + _insn(0x61, 1, 0, tgid)
                + _insn(0x79, 1, 0, comm) + _insn(0x79, 1, 0, comm + 8) + _EXIT0)
        return found if _loads(code, "probe_taskf") is None else None
    return _cached("task_fields", probe)  # type: ignore[return-value]


def uprobe_sessions() -> bool:
    """uprobe_multi links of the session kind (Linux 6.13): the monitor's launch rows
    (probes/calls.session_program)."""
    def probe() -> bool:
        try:
            fd, _ = syscalls.prog_load(_EXIT0, syscalls.BPF_PROG_TYPE_KPROBE, "GPL",
                                       "probe_session", BPF_TRACE_UPROBE_SESSION)
        except KernelError:
            return False
        with fd:
            attr = syscalls._attr(64)
            path = ctypes.create_string_buffer(b"/")
            offsets = (ctypes.c_uint64 * 1)(0)
            struct.pack_into("<IIIIQQQQI", attr, 0, fd.value, 0, BPF_TRACE_UPROBE_SESSION, 0,
                             ctypes.addressof(path), ctypes.addressof(offsets), 0, 0, 1)
            res, err = syscalls.bpf_raw(syscalls.BPF_LINK_CREATE, attr)
            if res >= 0:
                os.close(res)
            return err == errnos.EBADF  # "/" is no regular file: the link type exists
    return bool(_cached("sessions", probe))


def session_is_return_id() -> Optional[int]:
    """The BTF id of the kfunc bpf_session_is_return, where the kernel has uprobe sessions
    (a session program calls it to tell its entry run from its return run); else None."""
    def probe() -> Optional[int]:
        if not uprobe_sessions():
            return None
        from . import kernel_btf

        found = kernel_btf.function("bpf_session_is_return")
        if found is None:
            return None
        # r1 = ctx (what newer kernels' kfunc takes), call it, return 0: the kernel must load
        # it as a session program (JIT, kfunc support, the kfunc allowed for this type).
        code = (_mov_reg(6, 1) + _mov_reg(1, 6) + _insn(0x85, 0, 2, 0, found[0])
                + _EXIT0)
        return found[0] if _loads(code, "probe_kfunc", BPF_TRACE_UPROBE_SESSION) is None \
            else None
    return _cached("session_kfunc", probe)  # type: ignore[return-value]


def perf_links() -> bool:
    """BPF_LINK_CREATE(BPF_PERF_EVENT) (Linux 5.15+), probed like libbpf: a link to the
    invalid fd -1 fails with EBADF only when the attach type is known."""
    def probe() -> bool:
        fd, _ = syscalls.prog_load(_EXIT0, syscalls.BPF_PROG_TYPE_KPROBE, "GPL",
                                   "probe_perf_link")
        with fd:
            try:
                syscalls.link_create_perf_event(fd.value, 0xFFFFFFFF).close()
                return True
            except KernelError as err:
                return err.errno == errnos.EBADF
    return bool(_cached("perf_links", probe))


def uprobe_multi() -> bool:
    """uprobe_multi links with a working pid filter (Linux 6.6+).

    Same probe as libbpf's `probe_uprobe_multi_link`: nothing gets attached. A link on the
    directory "/" fails with EBADF when the link type exists; then pid -1 must fail with
    EINVAL (kernels whose pid filter matched threads instead of processes say ESRCH).
    """
    def link_errno(prog_fd: int, pid: int) -> int:
        try:
            syscalls.link_create_uprobe_multi(prog_fd, "/", [0], pid=pid).close()
        except KernelError as err:
            return err.errno
        return 0

    def probe() -> bool:
        try:
            fd, _ = syscalls.prog_load(_EXIT0, syscalls.BPF_PROG_TYPE_KPROBE, "GPL",
                                       "probe_multi", syscalls.BPF_TRACE_UPROBE_MULTI)
        except KernelError as err:
            if type(err) is not KernelError:
                raise  # privilege errors are not a "no"
            return False  # an older kernel rejects the attach type
        with fd:
            if link_errno(fd.value, 0) != errnos.EBADF:
                return False
            return link_errno(fd.value, -1 & 0xFFFFFFFF) == errnos.EINVAL
    return bool(_cached("uprobe_multi", probe))


def uprobe_pmu() -> bool:
    """The uprobe perf PMU in sysfs (Linux 4.17), for perf-event uprobes."""
    try:
        syscalls.uprobe_pmu()
        return True
    except KernelError:
        return False


# -- the PID namespace -------------------------------------------------------------------


class PidNamespace(NamedTuple):
    """A PID namespace as bpf_get_ns_current_pid_tgid takes it: the device of its nsfs file
    in the kernel's own dev_t encoding (MKDEV: major << 20 | minor, which stat's st_dev
    encodes differently once the minor number passes 255) and its inode."""

    dev: int
    ino: int


def pid_namespace() -> Optional[PidNamespace]:
    """The PID namespace this process runs in when it is not the initial one (a container,
    `unshare --pid`): the kernel's pids are then not this process's, and the probes ask for
    pids as this namespace numbers them. None in the initial namespace (or when
    /proc/self/ns/pid cannot be read: the kernel's pids are used, as before)."""
    try:
        info = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    if info.st_ino == PROC_PID_INIT_INO:
        return None
    return PidNamespace(os.major(info.st_dev) << 20 | os.minor(info.st_dev), info.st_ino)


def proc_of_another_namespace() -> bool:
    """True when /proc was mounted for another PID namespace than this process's (`unshare
    --pid --fork` without --mount-proc): its /proc/PID directories are then other
    processes than the pids this process and the probes use."""
    try:
        return int(os.readlink("/proc/self")) != os.getpid()
    except (OSError, ValueError):
        return True


def proc_warning() -> Optional[str]:
    """In a PID namespace whose /proc is another's: what goes wrong, in words (else None)."""
    if pid_namespace() is None or not proc_of_another_namespace():
        return None
    return ("/proc is another PID namespace's than this tracer's (mount its own, e.g. "
            "unshare --pid --fork --mount-proc): the traced processes' mappings and "
            "containers are read from other processes, so kernel names can be missing or "
            "wrong")


# -- the seccomp hazard ------------------------------------------------------------------


def uretprobe_syscall_filtered() -> bool:
    """Whether seccomp filters see the system call of this kernel's uretprobe trampoline.

    On x86-64 from Linux 6.11 a return probe returns through a trampoline that makes the
    `uretprobe` system call. Until "seccomp: passthrough uretprobe systemcall without
    filtering" (6.14, in the 6.12.y and 6.13.y stable kernels from February 2025), seccomp
    filters saw that call: a filter that does not allow it (Docker's default profile,
    systemd's SystemCallFilter=) makes it fail, and the traced process crashes at the
    first return probe. Found by trying, in two short-lived children: the call made
    outside a trampoline kills its caller with SIGILL when it exists; under a filter that
    refuses it, a fixed kernel still lets it through (SIGILL again), an affected one
    returns the filter's errno.
    """
    def probe() -> bool:
        if os.uname().machine != "x86_64":
            return False
        if not _uretprobe_call_kills(filtered=False):
            return False  # no uretprobe system call on this kernel
        return not _uretprobe_call_kills(filtered=True)
    return bool(_cached("uretprobe_seccomp", probe))


_FILTER_ERRNO = errnos.ENOTRECOVERABLE  # what the probe's filter answers, to recognise it


def _uretprobe_call_kills(filtered: bool) -> bool:
    """In a child: (under a filter refusing it) make the uretprobe call; True when it was
    killed by SIGILL (the call reached the kernel's handler)."""
    libc = syscalls._lib()  # opened before the fork: the child takes no loader lock
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            import faulthandler
            import signal

            faulthandler.disable()  # (pytest enables it) the SIGILL must just kill
            signal.signal(signal.SIGILL, signal.SIG_DFL)
            if filtered:
                code = 4
                if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
                    os._exit(code)
                insns = [  # classic BPF: refuse uretprobe with _FILTER_ERRNO, allow the rest
                    (0x20, 0, 0, 0),  # ld [nr]
                    (0x15, 0, 1, NR_URETPROBE_X86_64),  # jeq #335, 0, 1
                    (0x06, 0, 0, 0x00050000 | _FILTER_ERRNO),  # ret ERRNO
                    (0x06, 0, 0, 0x7FFF0000),  # ret ALLOW
                ]
                raw = b"".join(struct.pack("<HBBI", *i) for i in insns)
                buf = ctypes.create_string_buffer(raw, len(raw))
                prog = struct.pack("<HxxxxxxQ", len(insns), ctypes.addressof(buf))
                pbuf = ctypes.create_string_buffer(prog, len(prog))
                if libc.syscall(ctypes.c_long(NR_SECCOMP_X86_64), ctypes.c_long(1),
                                ctypes.c_long(0), ctypes.c_void_p(ctypes.addressof(pbuf))) != 0:
                    os._exit(code)
            libc.syscall(ctypes.c_long(NR_URETPROBE_X86_64))
            code = 0 if ctypes.get_errno() in (errnos.ENOSYS, _FILTER_ERRNO) else 5
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == 4  # SIGILL


def seccomp_mode(pid: Optional[int] = None) -> int:
    """The `Seccomp:` line of /proc/PID/status (0 none, 1 strict, 2 filter); 0 if unknown."""
    try:
        with open("/proc/%s/status" % (pid if pid is not None else "self")) as f:
            for line in f:
                if line.startswith("Seccomp:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def uretprobe_hazard(pid: Optional[int]) -> bool:
    """Whether return probes would crash process `pid` (None: this process, whose filters a
    command started by the tracer inherits): it is under a seccomp filter and this kernel
    lets filters see the uretprobe system call."""
    return seccomp_mode(pid) == 2 and uretprobe_syscall_filtered()


_HAZARD = ("this kernel lets seccomp filters see the uretprobe system call that return "
           "probes make (Linux 6.11 until the February 2025 fix, in 6.12.y, 6.13.y and 6.14+)")


def return_probe_hazard(pid: Optional[int], command: bool) -> Optional[str]:
    """None when return probes cannot crash the traced processes; else why they would, in
    words. With `pid` or a `command` (which inherits this process's seccomp filters) the
    sentence is a refusal (the caller raises it); system-wide, where any process may be
    under a filter (containers), a warning."""
    if pid is not None or command:
        if not uretprobe_hazard(pid):
            return None
        who = ("process %d" % pid if pid is not None
               else "the command (it inherits this process's seccomp filter)")
        return ("return probes would crash %s, which runs under a seccomp filter: %s; trace "
                "entries only with -r, or update the kernel" % (who, _HAZARD))
    if not uretprobe_syscall_filtered():
        return None
    return ("return probes crash processes under a seccomp filter (containers): %s; trace "
            "those with -r" % _HAZARD)


# -- the summary -------------------------------------------------------------------------


def report() -> str:
    """One line: the kernel and what it has, for `-v`."""
    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    why = task_storage_reason()
    parts = [
        "ring buffer %s" % yes(ring_buffer()),
        "BTF %s" % yes(kernel_btf()),
        "task storage %s" % ("yes" if why is None else "no: " + why),
        "uprobe_multi %s" % yes(uprobe_multi()),
        "uprobe PMU %s" % yes(uprobe_pmu()),
        "perf-event links %s" % yes(perf_links()),
        "cookies %s" % yes(attach_cookies()),
        "uprobe sessions %s" % ("yes (the monitor's sampled launch returns)"
                                if session_is_return_id() is not None else
                                yes(uprobe_sessions())),
        _pid_namespace_report(),
    ]
    return "kernel %s: %s" % (os.uname().release, ", ".join(parts))


def _pid_namespace_report() -> str:
    ns = pid_namespace()
    if ns is None:
        return "PID namespace: the initial one"
    return "PID namespace %d: pids as it numbers them (bpf_get_ns_current_pid_tgid)" % ns.ino
