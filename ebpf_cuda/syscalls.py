"""The kernel interface: `bpf()`, `perf_event_open()` and perf ioctls through ctypes.

Attribute buffers are packed with `struct` at the offsets of the 6.18 uapi (see the layout
comment above each builder). Every returned file descriptor is wrapped in an `Fd`, which
closes it on `close()`, on leaving a `with` block, or when garbage-collected.
Failures raise the typed exceptions of `errors.py`, each with errno and a readable sentence.
"""
import ctypes
import errno as errnos
import functools
import os
import re
import resource  # (here, not where EMFILE is met: importing it then needs a descriptor)
import struct
import threading
from dataclasses import dataclass, field
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

from . import arch
from .errors import KernelError, PrivilegeError, UnsupportedKernelError, VerifierError

# bpf() commands (enum bpf_cmd)
BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_PROG_LOAD = 5
BPF_PROG_GET_NEXT_ID = 11
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_BTF_LOAD = 18
BPF_LINK_CREATE = 28

# map types (enum bpf_map_type)
BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_PERCPU_HASH = 5
BPF_MAP_TYPE_PERCPU_ARRAY = 6
BPF_MAP_TYPE_LRU_HASH = 9
BPF_MAP_TYPE_LRU_PERCPU_HASH = 10
BPF_MAP_TYPE_STACK_TRACE = 7
BPF_MAP_TYPE_TASK_STORAGE = 29
BPF_MAP_TYPE_RINGBUF = 27

BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2

BPF_PROG_TYPE_KPROBE = 2
BPF_PROG_TYPE_TRACEPOINT = 5
PERF_TYPE_TRACEPOINT = 2

# attach and link types
BPF_PERF_EVENT = 41
BPF_TRACE_UPROBE_MULTI = 48
BPF_TRACE_UPROBE_SESSION = 57  # (Linux 6.13)
BPF_F_UPROBE_MULTI_RETURN = 1
BPF_F_MMAPABLE = 1 << 10  # (map_create: an array whose values user space can mmap)
BPF_LINK_TYPE_PERF_EVENT = 7
BPF_LINK_TYPE_UPROBE_MULTI = 12
BPF_PERF_EVENT_UPROBE = 1
BPF_PERF_EVENT_URETPROBE = 2

BPF_OBJ_NAME_LEN = 16
BPF_LOG_LEVEL1 = 1

# perf_event_open
PERF_ATTR_SIZE = 136  # PERF_ATTR_SIZE_VER8; <72 silently drops config2 (the probe offset)
PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_BPF = 0x40042408

UPROBE_PMU_DIR = "/sys/bus/event_source/devices/uprobe"
UPROBE_PMU_ENV = "EBPF_CUDA_SYSFS_UPROBE"

_PROG_LOAD_ATTR_SIZE = 144  # through log_true_size (offset 140)
_LOAD_RETRIES = 5  # EAGAIN retries, as libbpf
_LOG_START = 1 << 20
_LOG_MIN = 128  # kernels before 6.4 refuse a smaller log buffer (EINVAL)
_LOG_MAX = 1 << 30  # the kernel's own cap on log_size (UINT_MAX >> 2)

_PRIVILEGE_HINT = ("needs root or CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN on kernels before "
                   "5.8)")

_libc = None


def _lib() -> ctypes.CDLL:
    # Opened lazily so that importing this module has no side effects.
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        lib.ioctl.restype = ctypes.c_int
        _libc = lib
    return _libc


# ------------------------------------------------------------------------------------------
# errors


def error_name(err: int) -> str:
    """`Invalid argument (EINVAL)` for errno 22."""
    return "%s (%s)" % (os.strerror(err), errnos.errorcode.get(err, "errno %d" % err))


def kernel_error(what: str, err: int, log: str = "") -> KernelError:
    """The typed exception for a failed kernel call; `what` says what was being done."""
    if err in (errnos.EPERM, errnos.EACCES):
        return PrivilegeError("permission denied while %s: loading eBPF programs and attaching "
                              "uprobes %s" % (what, _PRIVILEGE_HINT), err, log)
    return KernelError("%s failed: %s" % (what, error_name(err)), err, log)


# ------------------------------------------------------------------------------------------
# file descriptors


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


# ------------------------------------------------------------------------------------------
# raw calls


def _addr(buf: Optional[ctypes.Array]) -> int:
    return ctypes.addressof(buf) if buf is not None else 0


def _syscall(nr: int, *args: int) -> Tuple[int, int]:
    """Returns (result, errno); result -1 means failure."""
    lib = _lib()
    ctypes.set_errno(0)
    res = lib.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return res, (ctypes.get_errno() if res < 0 else 0)


def bpf_raw(cmd: int, attr: ctypes.Array) -> Tuple[int, int]:
    """bpf(cmd, attr, sizeof attr) -> (result, errno). No exception."""
    return _syscall(_nr_bpf(), cmd, ctypes.addressof(attr), ctypes.sizeof(attr))


@functools.lru_cache(maxsize=None)
def _nr_bpf() -> int:
    """bpf()'s number, found once: uname at every map lookup cost the monitor's reader a
    tenth of its time in a registration burst."""
    return arch.current().nr_bpf


def bpf(cmd: int, attr: ctypes.Array, what: str) -> int:
    """bpf(cmd, attr); raises the typed KernelError naming `what` on failure."""
    res, err = bpf_raw(cmd, attr)
    if res < 0:
        raise kernel_error(what, err)
    return res


def _ioctl(fd: int, request: int, arg: int, what: str) -> None:
    ctypes.set_errno(0)
    res = _lib().ioctl(ctypes.c_int(fd), ctypes.c_ulong(request), ctypes.c_long(arg))
    if res < 0:
        raise kernel_error(what, ctypes.get_errno())


def _attr(size: int) -> ctypes.Array:
    return ctypes.create_string_buffer(size)


def _c_string(text: str) -> ctypes.Array:
    return ctypes.create_string_buffer(os.fsencode(text))


def check_name(name: str) -> bytes:
    """Validate a map/program name (<=15 chars of [A-Za-z0-9_.]); ValueError otherwise."""
    if len(name) >= BPF_OBJ_NAME_LEN or not re.fullmatch(r"[A-Za-z0-9_.]*", name):
        raise ValueError("bad eBPF object name %r: use at most 15 characters of A-Z a-z 0-9 _ ."
                         % name)
    return name.encode()


# ------------------------------------------------------------------------------------------
# maps


def map_create(map_type: int, key_size: int, value_size: int, max_entries: int,
               flags: int = 0, name: str = "", btf: Optional[Tuple[int, int, int]] = None) -> Fd:
    """BPF_MAP_CREATE; returns the map's fd. `btf` is (btf fd, key type id, value type id),
    which some map types need (task storage)."""
    # map_type@0 key_size@4 value_size@8 max_entries@12 map_flags@16 inner_map_fd@20
    # numa_node@24 map_name[16]@28 map_ifindex@44 btf_fd@48 btf_key_type_id@52
    # btf_value_type_id@56
    attr = _attr(60 if btf else 48)
    struct.pack_into("<IIIII", attr, 0, map_type, key_size, value_size, max_entries, flags)
    struct.pack_into("16s", attr, 28, check_name(name))
    if btf:
        struct.pack_into("<III", attr, 48, *btf)
    what = "creating map %r (type %d, key %d B, value %d B, %d entries)" % (
        name, map_type, key_size, value_size, max_entries)
    return Fd(bpf(BPF_MAP_CREATE, attr, what), "map %r" % name)


def btf_load(blob: bytes) -> Fd:
    """BPF_BTF_LOAD: type information some maps need; returns the BTF object's fd."""
    # btf@0 btf_log_buf@8 btf_size@16 btf_log_size@20 btf_log_level@24
    data = ctypes.create_string_buffer(blob, len(blob))
    attr = _attr(28)
    struct.pack_into("<QQI", attr, 0, ctypes.addressof(data), 0, len(blob))
    return Fd(bpf(BPF_BTF_LOAD, attr, "loading BTF type information"), "BTF")


def _elem_attr(fd: int, key: Optional[ctypes.Array], value: Optional[ctypes.Array],
               flags: int = 0) -> ctypes.Array:
    # map_fd@0 key@8 value/next_key@16 flags@24
    attr = _attr(32)
    struct.pack_into("<IxxxxQQQ", attr, 0, fd, _addr(key), _addr(value), flags)
    return attr


def map_lookup(fd: int, key: bytes, value_size: int) -> Optional[bytes]:
    """The value stored under `key`, or None if absent. `value_size` is the buffer size."""
    kbuf = ctypes.create_string_buffer(key, len(key))
    vbuf = ctypes.create_string_buffer(value_size)
    res, err = bpf_raw(BPF_MAP_LOOKUP_ELEM, _elem_attr(fd, kbuf, vbuf))
    if res < 0:
        if err == errnos.ENOENT:
            return None
        raise kernel_error("looking up a map element", err)
    return vbuf.raw


class ElementLookup:
    """Lookups of one map's elements with buffers made once: a registration burst looks up
    a name chunk per record, and making map_lookup's three buffers took about half of each
    lookup's time. Thread-safe (one lookup at a time)."""

    def __init__(self, fd: int, key_size: int, value_size: int) -> None:
        self._key = ctypes.create_string_buffer(key_size)
        self._value = ctypes.create_string_buffer(value_size)
        self._attr = _elem_attr(fd, self._key, self._value)
        self._key_size = key_size
        self._lock = threading.Lock()
        # (the call's arguments made once too: bpf_raw makes them at every call)
        self._call = functools.partial(_lib().syscall, *(ctypes.c_long(a) for a in (
            _nr_bpf(), BPF_MAP_LOOKUP_ELEM, ctypes.addressof(self._attr),
            ctypes.sizeof(self._attr))))

    def __call__(self, key: bytes) -> Optional[bytes]:
        """The value under `key` (of the map's key size), or None if absent."""
        assert len(key) == self._key_size
        with self._lock:
            ctypes.memmove(self._key, key, self._key_size)
            if self._call() >= 0:
                return self._value.raw
            err = ctypes.get_errno()  # (the library is loaded with use_errno)
        if err == errnos.ENOENT:
            return None
        raise kernel_error("looking up a map element", err)


def map_update(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
    """Store `value` under `key` (flags: BPF_ANY, BPF_NOEXIST, BPF_EXIST)."""
    kbuf = ctypes.create_string_buffer(key, len(key))
    vbuf = ctypes.create_string_buffer(value, len(value))
    bpf(BPF_MAP_UPDATE_ELEM, _elem_attr(fd, kbuf, vbuf, flags), "updating a map element")


def map_delete(fd: int, key: bytes) -> bool:
    """Delete `key`; False if it was absent."""
    kbuf = ctypes.create_string_buffer(key, len(key))
    res, err = bpf_raw(BPF_MAP_DELETE_ELEM, _elem_attr(fd, kbuf, None))
    if res < 0:
        if err == errnos.ENOENT:
            return False
        raise kernel_error("deleting a map element", err)
    return True


def map_next_key(fd: int, key: Optional[bytes], key_size: int) -> Optional[bytes]:
    """The key after `key` (the first key when `key` is None), or None at the end."""
    kbuf = ctypes.create_string_buffer(key, len(key)) if key is not None else None
    nbuf = ctypes.create_string_buffer(key_size)
    res, err = bpf_raw(BPF_MAP_GET_NEXT_KEY, _elem_attr(fd, kbuf, nbuf))
    if res < 0:
        if err == errnos.ENOENT:
            return None
        raise kernel_error("iterating map keys", err)
    return nbuf.raw


# ------------------------------------------------------------------------------------------
# programs


def _prog_load_attr(prog_type: int, insns: ctypes.Array, license: ctypes.Array, log_level: int,
                    log: Optional[ctypes.Array], name: bytes,
                    expected_attach_type: int) -> ctypes.Array:
    # prog_type@0 insn_cnt@4 insns@8 license@16 log_level@24 log_size@28 log_buf@32
    # kern_version@40 prog_flags@44 prog_name[16]@48 prog_ifindex@64 expected_attach_type@68
    # ... log_true_size@140 (out)
    attr = _attr(_PROG_LOAD_ATTR_SIZE)
    struct.pack_into("<IIQQIIQ", attr, 0, prog_type, len(insns) // 8, _addr(insns),
                     _addr(license), log_level, len(log) if log is not None else 0, _addr(log))
    struct.pack_into("16s", attr, 48, name)
    struct.pack_into("<I", attr, 68, expected_attach_type)
    return attr


def _load_once(prog_type: int, insns: ctypes.Array, license: ctypes.Array, log_level: int,
               log: Optional[ctypes.Array], name: bytes,
               expected_attach_type: int) -> Tuple[int, int, int]:
    """One load with EAGAIN retries, and EMFILE ones while the descriptor limit can be raised
    -> (fd or -1, errno, log_true_size)."""
    tries = 0
    while True:
        attr = _prog_load_attr(prog_type, insns, license, log_level, log, name,
                               expected_attach_type)
        res, err = bpf_raw(BPF_PROG_LOAD, attr)
        if res < 0 and err == errnos.EMFILE and raise_fd_limit():
            continue
        tries += 1
        if not (res < 0 and err == errnos.EAGAIN) or tries >= _LOAD_RETRIES:
            break
    true_size = struct.unpack_from("<I", attr, 140)[0]
    return res, err, true_size


def _load_with_log(prog_type: int, insns: ctypes.Array, license: ctypes.Array, name: bytes,
                   expected_attach_type: int, size: int) -> Tuple[int, int, str]:
    """Load with log_level 1, growing the buffer on ENOSPC -> (fd or -1, errno, log).

    Kernels before 6.4 report no log_true_size: the buffer then grows fourfold each time."""
    size = max(size, _LOG_MIN)
    while True:
        log = ctypes.create_string_buffer(size)
        res, err, true_size = _load_once(prog_type, insns, license, BPF_LOG_LEVEL1, log, name,
                                         expected_attach_type)
        if res >= 0 or err != errnos.ENOSPC or size >= _LOG_MAX:
            return res, err, log.value.decode(errors="replace")
        size = min(_LOG_MAX, max(size * 4, true_size + 1))


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


def verifier_reason(log: str) -> str:
    """The line of a verifier log that says why it refused (the one before `processed ...`)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("processed ") and i > 0:
            return lines[i - 1]
    return lines[-1] if lines else ""


def prog_load(insns: bytes, prog_type: int = BPF_PROG_TYPE_KPROBE, license: str = "GPL",
              name: str = "", expected_attach_type: int = 0,
              log_level: int = 0) -> Tuple[Fd, str]:
    """BPF_PROG_LOAD -> (program fd, verifier log).

    The first attempt runs without a log (fast). On failure the load is repeated with
    log_level 1 so that a rejection raises VerifierError carrying the log. Pass log_level=1 to
    get the log of a successful load too.
    """
    if len(insns) % 8 or not insns:
        raise ValueError("program bytes must be a non-empty multiple of 8, got %d" % len(insns))
    ibuf = ctypes.create_string_buffer(insns, len(insns))
    lbuf = ctypes.create_string_buffer(license.encode())
    bname = check_name(name)
    log = ""
    if log_level:
        res, err, log = _load_with_log(prog_type, ibuf, lbuf, bname, expected_attach_type,
                                       _LOG_START)
    else:
        res, err, _ = _load_once(prog_type, ibuf, lbuf, 0, None, bname, expected_attach_type)
        if res < 0 and err != errnos.EPERM:
            res, err, log = _load_with_log(prog_type, ibuf, lbuf, bname, expected_attach_type,
                                           _LOG_START)
    if res >= 0:
        return Fd(res, "program %r" % name), log
    raise _load_error(name, err, log)


def _load_error(name: str, err: int, log: str) -> KernelError:
    what = "loading eBPF program %r" % name
    if not log.strip():
        return kernel_error(what, err)
    return VerifierError("the verifier rejected eBPF program %r: %s (%s)"
                         % (name, verifier_reason(log), error_name(err)), err, log)


# ------------------------------------------------------------------------------------------
# object info


def obj_info(fd: int, size: int, what: str, fill=None) -> bytes:
    """BPF_OBJ_GET_INFO_BY_FD into a zeroed `size`-byte info struct (optionally pre-filled)."""
    info = ctypes.create_string_buffer(size)
    if fill is not None:
        fill(info)
    attr = _attr(16)
    struct.pack_into("<IIQ", attr, 0, fd, size, ctypes.addressof(info))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "reading info of " + what)
    return info.raw


def _name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


@dataclass
class MapInfo:
    """struct bpf_map_info (the fields used here)."""

    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    map_flags: int
    name: str


def map_info(fd: int) -> MapInfo:
    """struct bpf_map_info of a map fd."""
    raw = obj_info(fd, 104, "a map")
    fields = struct.unpack_from("<IIIIII", raw, 0)
    return MapInfo(*fields, name=_name(raw[24:40]))


def prog_ids() -> Iterator[int]:
    """The id of every BPF program loaded on the machine, ascending (BPF_PROG_GET_NEXT_ID:
    root), e.g. to read another process's programs' run statistics."""
    attr = _attr(12)
    while True:
        res, err = bpf_raw(BPF_PROG_GET_NEXT_ID, attr)
        if res < 0:
            if err == errnos.ENOENT:
                return
            raise kernel_error("listing the programs", err)
        next_id = struct.unpack_from("<I", attr, 4)[0]
        yield next_id
        struct.pack_into("<I", attr, 0, next_id)


def prog_fd_by_id(prog_id: int) -> Fd:
    """A descriptor of the program with id `prog_id` (BPF_PROG_GET_FD_BY_ID: root)."""
    attr = _attr(12)
    struct.pack_into("<I", attr, 0, prog_id)
    return Fd(bpf(BPF_PROG_GET_FD_BY_ID, attr, "opening program %d" % prog_id),
              "program %d" % prog_id)


@dataclass
class ProgInfo:
    """struct bpf_prog_info (run statistics need kernel.bpf_stats_enabled=1)."""

    type: int
    id: int
    tag: bytes
    name: str
    run_time_ns: int
    run_cnt: int
    verified_insns: int


def prog_info(fd: int) -> ProgInfo:
    """struct bpf_prog_info of a program fd."""
    raw = obj_info(fd, 232, "a program")
    ptype, pid = struct.unpack_from("<II", raw, 0)
    run_time, run_cnt = struct.unpack_from("<QQ", raw, 192)
    verified = struct.unpack_from("<I", raw, 216)[0]
    return ProgInfo(ptype, pid, raw[8:16], _name(raw[64:80]), run_time, run_cnt, verified)


@dataclass
class LinkInfo:
    """struct bpf_link_info; the uprobe fields are filled for perf-event and uprobe_multi links
    when the kernel reports them (`details`): uprobe_multi links always (6.8+), perf-event
    links from 6.6 (before, their info has only type and ids)."""

    type: int
    id: int
    prog_id: int
    path: str = ""
    offsets: List[int] = field(default_factory=list)
    cookies: List[int] = field(default_factory=list)
    retprobe: bool = False
    pid: int = 0
    details: bool = False


_LINK_INFO_SIZE = 64


def link_info(fd: int) -> LinkInfo:
    """Link type and ids; for uprobe links also the file, offsets, cookies and direction."""
    raw = obj_info(fd, _LINK_INFO_SIZE, "a link")
    ltype, lid, prog_id = struct.unpack_from("<III", raw, 0)
    info = LinkInfo(ltype, lid, prog_id)
    if ltype == BPF_LINK_TYPE_PERF_EVENT:
        _perf_link_info(fd, info)
    elif ltype == BPF_LINK_TYPE_UPROBE_MULTI:
        _uprobe_multi_link_info(fd, info)
    return info


def _perf_link_info(fd: int, info: LinkInfo) -> None:
    # perf_event.type@16; uprobe: file_name@24 name_len@32 offset@36 cookie@40
    path = ctypes.create_string_buffer(4096)

    def fill(buf: ctypes.Array) -> None:
        struct.pack_into("<QI", buf, 24, ctypes.addressof(path), len(path))

    raw = obj_info(fd, _LINK_INFO_SIZE, "a perf-event link", fill)
    ptype = struct.unpack_from("<I", raw, 16)[0]
    if ptype not in (BPF_PERF_EVENT_UPROBE, BPF_PERF_EVENT_URETPROBE):
        return
    offset, cookie = struct.unpack_from("<IQ", raw, 36)  # packed: cookie@40
    info.path = os.fsdecode(path.value)
    info.offsets, info.cookies = [offset], [cookie]
    info.retprobe = ptype == BPF_PERF_EVENT_URETPROBE
    info.details = True


def _uprobe_multi_link_info(fd: int, info: LinkInfo) -> None:
    # uprobe_multi: path@16 offsets@24 ref_ctr_offsets@32 cookies@40 path_size@48 count@52
    # flags@56 pid@60. A first call without arrays returns the count.
    raw = obj_info(fd, _LINK_INFO_SIZE, "a uprobe_multi link")
    count = struct.unpack_from("<I", raw, 52)[0]
    path = ctypes.create_string_buffer(4096)
    offsets = (ctypes.c_uint64 * max(count, 1))()
    cookies = (ctypes.c_uint64 * max(count, 1))()

    def fill(buf: ctypes.Array) -> None:
        struct.pack_into("<QQQQII", buf, 16, ctypes.addressof(path), ctypes.addressof(offsets),
                         0, ctypes.addressof(cookies), len(path), count)

    raw = obj_info(fd, _LINK_INFO_SIZE, "a uprobe_multi link", fill) if count else raw
    flags, pid = struct.unpack_from("<II", raw, 56)
    info.path = os.fsdecode(path.value)
    info.offsets, info.cookies = list(offsets[:count]), list(cookies[:count])
    info.retprobe = bool(flags & BPF_F_UPROBE_MULTI_RETURN)
    info.pid = pid
    info.details = bool(path.value)


# ------------------------------------------------------------------------------------------
# links


def link_create_perf_event(prog_fd: int, perf_fd: int, cookie: int = 0) -> Fd:
    """BPF_LINK_CREATE(BPF_PERF_EVENT): run the program on the perf event, with a cookie."""
    # prog_fd@0 target_fd@4 attach_type@8 flags@12 perf_event.bpf_cookie@16
    attr = _attr(24)
    struct.pack_into("<IIIIQ", attr, 0, prog_fd, perf_fd, BPF_PERF_EVENT, 0, cookie)
    fd = bpf(BPF_LINK_CREATE, attr, "linking a program to a perf event")
    return Fd(fd, "perf-event link")


def link_create_uprobe_multi(prog_fd: int, path: str, offsets: Sequence[int],
                             cookies: Optional[Sequence[int]] = None, flags: int = 0,
                             pid: int = 0, attach_type: int = BPF_TRACE_UPROBE_MULTI) -> Fd:
    """BPF_LINK_CREATE(BPF_TRACE_UPROBE_MULTI, or _SESSION): one link, many offsets of one
    file."""
    if not offsets:
        raise ValueError("uprobe_multi needs at least one offset")
    if cookies is not None and len(cookies) != len(offsets):
        raise ValueError("got %d cookies for %d offsets" % (len(cookies), len(offsets)))
    cpath = _c_string(path)
    coffsets = (ctypes.c_uint64 * len(offsets))(*offsets)
    ccookies = (ctypes.c_uint64 * len(offsets))(*cookies) if cookies is not None else None
    # prog_fd@0 target_fd@4 attach_type@8 flags@12 path@16 offsets@24 ref_ctr_offsets@32
    # cookies@40 cnt@48 flags@52 pid@56
    attr = _attr(64)
    struct.pack_into("<IIIIQQQQIII", attr, 0, prog_fd, 0, attach_type, 0,
                     ctypes.addressof(cpath), ctypes.addressof(coffsets), 0, _addr(ccookies),
                     len(offsets), flags, pid)
    fd = bpf(BPF_LINK_CREATE, attr, "creating a uprobe_multi link")
    return Fd(fd, "uprobe_multi link")


# ------------------------------------------------------------------------------------------
# perf events


class UprobePmu(NamedTuple):
    """The dynamic uprobe PMU: its perf type and the config bits of its format fields."""

    type: int
    retprobe_bit: Optional[int]
    ref_ctr_shift: Optional[int]


def _read_text(path: str) -> Optional[str]:
    """A sysfs file's text; None when it cannot be read. Out of file descriptors is no
    missing file: that is said as it is (a PMU taken for absent sent users to their kernel)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as err:
        if err.errno in (errnos.EMFILE, errnos.ENFILE):
            raise KernelError("cannot read %s: %s" % (path, err.strerror), err.errno) from None
        return None


def _config_bit(text: Optional[str]) -> Optional[int]:
    """First bit of a sysfs format line such as `config:0` or `config:32-63`."""
    m = re.match(r"config:(\d+)", text or "")
    return int(m.group(1)) if m else None


def uprobe_pmu(sysfs_dir: Optional[str] = None) -> UprobePmu:
    """Read the uprobe PMU from sysfs (`sysfs_dir`, else $EBPF_CUDA_SYSFS_UPROBE, else
    /sys/bus/event_source/devices/uprobe); UnsupportedKernelError if it is missing."""
    root = sysfs_dir or os.environ.get(UPROBE_PMU_ENV) or UPROBE_PMU_DIR
    if root in _pmus:
        return _pmus[root]
    type_text = _read_text(os.path.join(root, "type"))
    if type_text is None or not type_text.isdigit():
        raise UnsupportedKernelError(
            "this kernel has no uprobe perf PMU (%s/type is missing): uprobes need Linux 4.17 "
            "or newer built with CONFIG_UPROBE_EVENTS (the tracefs uprobe_events interface "
            "of older kernels is not used)" % root, errnos.ENOENT)
    fmt = os.path.join(root, "format")
    pmu = UprobePmu(int(type_text), _config_bit(_read_text(os.path.join(fmt, "retprobe"))),
                    _config_bit(_read_text(os.path.join(fmt, "ref_ctr_offset"))))
    _pmus[root] = pmu  # read once: it does not change while the kernel runs
    return pmu


_pmus: dict = {}


def uprobe_attr(pmu: UprobePmu, path: ctypes.Array, offset: int, retprobe: bool,
                ref_ctr_offset: int = 0) -> ctypes.Array:
    """A 136-byte perf_event_attr for a uprobe at file `offset` of the file named by `path`."""
    config = 0
    if retprobe:
        if pmu.retprobe_bit is None:
            raise UnsupportedKernelError("this kernel's uprobe PMU has no retprobe format bit: "
                                         "return probes are not supported")
        config |= 1 << pmu.retprobe_bit
    if ref_ctr_offset:
        if pmu.ref_ctr_shift is None:
            raise UnsupportedKernelError("this kernel's uprobe PMU has no ref_ctr_offset field")
        config |= ref_ctr_offset << pmu.ref_ctr_shift
    # type@0 size@4 config@8 ... flags@40 (all 0: enabled later by ioctl) config1@56 config2@64
    attr = _attr(PERF_ATTR_SIZE)
    struct.pack_into("<IIQ", attr, 0, pmu.type, PERF_ATTR_SIZE, config)
    struct.pack_into("<QQ", attr, 56, ctypes.addressof(path), offset)
    return attr


def perf_event_open_uprobe(path: str, offset: int, retprobe: bool = False,
                           pid: Optional[int] = None, ref_ctr_offset: int = 0,
                           sysfs_dir: Optional[str] = None) -> Fd:
    """perf_event_open for a uprobe (disabled until `perf_event_enable`).

    pid None traces every process (pid -1 on cpu 0, like libbpf; the program still runs on
    every CPU), else only that process.
    """
    pmu = uprobe_pmu(sysfs_dir)
    cpath = _c_string(path)
    attr = uprobe_attr(pmu, cpath, offset, retprobe, ref_ctr_offset)
    target, cpu = (-1, 0) if pid is None else (pid, -1)
    res, err = _syscall(arch.current().nr_perf_event_open, ctypes.addressof(attr), target, cpu,
                        -1, PERF_FLAG_FD_CLOEXEC)
    if res < 0:
        kind = "uretprobe" if retprobe else "uprobe"
        raise kernel_error("opening a %s perf event at %s:0x%x" % (kind, path, offset), err)
    return Fd(res, "uprobe perf event")


def perf_event_open_tracepoint(tracepoint_id: int, what: str) -> Fd:
    """perf_event_open for a kernel tracepoint (by its tracefs id), all processes; a BPF
    program attached to it runs on every CPU (disabled until `perf_event_enable`)."""
    attr = _attr(PERF_ATTR_SIZE)
    struct.pack_into("<IIQ", attr, 0, PERF_TYPE_TRACEPOINT, PERF_ATTR_SIZE, tracepoint_id)
    res, err = _syscall(arch.current().nr_perf_event_open, ctypes.addressof(attr), -1, 0, -1,
                        PERF_FLAG_FD_CLOEXEC)
    if res < 0:
        raise kernel_error("opening the tracepoint %s" % what, err)
    return Fd(res, "tracepoint perf event")


def perf_event_enable(fd: int) -> None:
    _ioctl(fd, PERF_EVENT_IOC_ENABLE, 0, "enabling a perf event")


def perf_event_set_bpf(fd: int, prog_fd: int) -> None:
    """Attach a program to a perf event the pre-5.15 way (no cookie)."""
    _ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd, "attaching a program to a perf event")
