"""The kernel interface: `bpf()`, `perf_event_open()` and perf ioctls through ctypes. This is
the one module that calls the kernel.

Attribute buffers are packed with `struct` at the offsets of the 6.18 uapi (see the layout
comment above each builder, here and in `kernel_abi.py`, the ABI's numbers, layouts and info
structs as data, whose every name is re-exported here). Every returned file descriptor is
wrapped in an `Fd` (`descriptors.py`), which closes it on `close()`, on leaving a `with` block,
or when garbage-collected.
Failures raise the typed exceptions of `errors.py`, each with errno and a readable sentence.
"""
import ctypes
import errno as errnos
import functools
import os
import struct
import threading
from typing import Iterator, Optional, Sequence, Tuple

from . import arch
from .descriptors import (NR_OPEN, Fd, raise_fd_limit,  # noqa: F401 (re-exported)
                          raise_memlock_limit)
from .errors import KernelError, PrivilegeError, VerifierError
# The kernel's ABI as data (numbers, attribute layouts, info structs, the uprobe PMU) is
# kernel_abi.py's; every name of it is importable from here too, as `syscalls.X`.
from .kernel_abi import (BPF_ANY, BPF_BTF_LOAD, BPF_EXIST,  # noqa: F401 (re-exported)
                         BPF_F_MMAPABLE, BPF_F_UPROBE_MULTI_RETURN, BPF_LINK_CREATE,
                         BPF_LINK_TYPE_PERF_EVENT, BPF_LINK_TYPE_UPROBE_MULTI, BPF_LOG_LEVEL1,
                         BPF_MAP_CREATE, BPF_MAP_DELETE_ELEM, BPF_MAP_GET_NEXT_KEY,
                         BPF_MAP_LOOKUP_AND_DELETE_ELEM, BPF_MAP_LOOKUP_ELEM, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_HASH,
                         BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_LRU_PERCPU_HASH,
                         BPF_MAP_TYPE_PERCPU_ARRAY, BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_RINGBUF,
                         BPF_MAP_TYPE_STACK_TRACE, BPF_MAP_TYPE_TASK_STORAGE, BPF_MAP_UPDATE_ELEM,
                         BPF_NOEXIST, BPF_OBJ_GET_INFO_BY_FD, BPF_OBJ_NAME_LEN, BPF_PERF_EVENT,
                         BPF_PERF_EVENT_UPROBE, BPF_PERF_EVENT_URETPROBE, BPF_PROG_GET_FD_BY_ID,
                         BPF_PROG_GET_NEXT_ID, BPF_PROG_LOAD, BPF_PROG_TYPE_KPROBE,
                         BPF_PROG_TYPE_TRACEPOINT, BPF_TRACE_UPROBE_MULTI, BPF_TRACE_UPROBE_SESSION,
                         LINK_INFO_SIZE, PERF_ATTR_SIZE, PERF_EVENT_IOC_DISABLE,
                         PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_SET_BPF, PERF_FLAG_FD_CLOEXEC,
                         PERF_TYPE_TRACEPOINT, PROG_LOAD_ATTR_SIZE, UPROBE_PMU_DIR, UPROBE_PMU_ENV,
                         LinkInfo, MapInfo, ProgInfo, UprobePmu, address, check_name, elem_attr,
                         map_info_from, prog_info_from, prog_load_attr, uprobe_attr, uprobe_pmu,
                         verifier_reason)

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
# raw calls


def _syscall(nr: int, *args: int) -> Tuple[int, int]:
    """Returns (result, errno); result -1 means failure."""
    lib = _lib()
    ctypes.set_errno(0)
    res = lib.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return res, (ctypes.get_errno() if res < 0 else 0)


def bpf_raw(cmd: int, attr: ctypes.Array) -> Tuple[int, int]:
    """bpf(cmd, attr, sizeof attr) -> (result, errno). No exception. A map, program or BTF
    refused with EPERM is tried once more after raising RLIMIT_MEMLOCK (kernels before 5.11
    charge them to it)."""
    res, err = _syscall(_nr_bpf(), cmd, ctypes.addressof(attr), ctypes.sizeof(attr))
    if res < 0 and err == errnos.EPERM and cmd in _MEMLOCK_CHARGED and raise_memlock_limit():
        res, err = _syscall(_nr_bpf(), cmd, ctypes.addressof(attr), ctypes.sizeof(attr))
    return res, err


_MEMLOCK_CHARGED = (BPF_MAP_CREATE, BPF_PROG_LOAD, BPF_BTF_LOAD)


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


def map_lookup(fd: int, key: bytes, value_size: int) -> Optional[bytes]:
    """The value stored under `key`, or None if absent. `value_size` is the buffer size."""
    kbuf = ctypes.create_string_buffer(key, len(key))
    vbuf = ctypes.create_string_buffer(value_size)
    res, err = bpf_raw(BPF_MAP_LOOKUP_ELEM, elem_attr(fd, kbuf, vbuf))
    if res < 0:
        if err == errnos.ENOENT:
            return None
        raise kernel_error("looking up a map element", err)
    return vbuf.raw


class ElementLookup:
    """Lookups of one map's elements with buffers made once: a registration burst looks up
    a name chunk per record, and making map_lookup's three buffers took about half of each
    lookup's time. With `take`, each element found is deleted as it is read (the names map:
    what the reader has read leaves room for what it has not). Thread-safe (one lookup at a
    time)."""

    def __init__(self, fd: int, key_size: int, value_size: int, take: bool = False) -> None:
        self._key = ctypes.create_string_buffer(key_size)
        self._value = ctypes.create_string_buffer(value_size)
        self._attr = elem_attr(fd, self._key, self._value)
        self._key_size = key_size
        self._fd = fd
        self._lock = threading.Lock()
        # (the call's arguments made once too: bpf_raw makes them at every call)
        self._calls = {cmd: functools.partial(_lib().syscall, *(ctypes.c_long(a) for a in (
            _nr_bpf(), cmd, ctypes.addressof(self._attr), ctypes.sizeof(self._attr))))
            for cmd in (BPF_MAP_LOOKUP_ELEM, BPF_MAP_LOOKUP_AND_DELETE_ELEM)}
        self._call = self._calls[BPF_MAP_LOOKUP_AND_DELETE_ELEM if take else BPF_MAP_LOOKUP_ELEM]
        self._delete_after = False  # (take on a kernel without lookup-and-delete for hashes)

    def __call__(self, key: bytes) -> Optional[bytes]:
        """The value under `key` (of the map's key size), or None if absent."""
        assert len(key) == self._key_size
        with self._lock:
            ctypes.memmove(self._key, key, self._key_size)
            found = self._call() >= 0
            err = ctypes.get_errno()  # (the library is loaded with use_errno)
            if not found and err in _NO_LOOKUP_AND_DELETE and self._call is self._calls[
                    BPF_MAP_LOOKUP_AND_DELETE_ELEM]:
                self._call, self._delete_after = self._calls[BPF_MAP_LOOKUP_ELEM], True
                found = self._call() >= 0
                err = ctypes.get_errno()
            if found:
                if self._delete_after:
                    map_delete(self._fd, key)
                return self._value.raw
        if err == errnos.ENOENT:
            return None
        raise kernel_error("looking up a map element", err)


# What a kernel before 5.14 answers lookup-and-delete on a hash map (ENOTSUPP is 524)
_NO_LOOKUP_AND_DELETE = (errnos.EINVAL, errnos.EOPNOTSUPP, 524)


def map_update(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
    """Store `value` under `key` (flags: BPF_ANY, BPF_NOEXIST, BPF_EXIST)."""
    kbuf = ctypes.create_string_buffer(key, len(key))
    vbuf = ctypes.create_string_buffer(value, len(value))
    bpf(BPF_MAP_UPDATE_ELEM, elem_attr(fd, kbuf, vbuf, flags), "updating a map element")


def map_delete(fd: int, key: bytes) -> bool:
    """Delete `key`; False if it was absent."""
    kbuf = ctypes.create_string_buffer(key, len(key))
    res, err = bpf_raw(BPF_MAP_DELETE_ELEM, elem_attr(fd, kbuf, None))
    if res < 0:
        if err == errnos.ENOENT:
            return False
        raise kernel_error("deleting a map element", err)
    return True


def map_next_key(fd: int, key: Optional[bytes], key_size: int) -> Optional[bytes]:
    """The key after `key` (the first key when `key` is None), or None at the end."""
    kbuf = ctypes.create_string_buffer(key, len(key)) if key is not None else None
    nbuf = ctypes.create_string_buffer(key_size)
    res, err = bpf_raw(BPF_MAP_GET_NEXT_KEY, elem_attr(fd, kbuf, nbuf))
    if res < 0:
        if err == errnos.ENOENT:
            return None
        raise kernel_error("iterating map keys", err)
    return nbuf.raw


# ------------------------------------------------------------------------------------------
# programs


def _load_once(prog_type: int, insns: ctypes.Array, license: ctypes.Array, log_level: int,
               log: Optional[ctypes.Array], name: bytes,
               expected_attach_type: int) -> Tuple[int, int, int]:
    """One load with EAGAIN retries, and EMFILE ones while the descriptor limit can be raised
    -> (fd or -1, errno, log_true_size)."""
    tries = 0
    while True:
        attr = prog_load_attr(prog_type, insns, license, log_level, log, name,
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


def map_info(fd: int) -> MapInfo:
    """struct bpf_map_info of a map fd."""
    return map_info_from(obj_info(fd, 104, "a map"))


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


def prog_info(fd: int) -> ProgInfo:
    """struct bpf_prog_info of a program fd."""
    return prog_info_from(obj_info(fd, 232, "a program"))



def link_info(fd: int) -> LinkInfo:
    """Link type and ids; for uprobe links also the file, offsets, cookies and direction."""
    raw = obj_info(fd, LINK_INFO_SIZE, "a link")
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

    raw = obj_info(fd, LINK_INFO_SIZE, "a perf-event link", fill)
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
    raw = obj_info(fd, LINK_INFO_SIZE, "a uprobe_multi link")
    count = struct.unpack_from("<I", raw, 52)[0]
    path = ctypes.create_string_buffer(4096)
    offsets = (ctypes.c_uint64 * max(count, 1))()
    cookies = (ctypes.c_uint64 * max(count, 1))()

    def fill(buf: ctypes.Array) -> None:
        struct.pack_into("<QQQQII", buf, 16, ctypes.addressof(path), ctypes.addressof(offsets),
                         0, ctypes.addressof(cookies), len(path), count)

    raw = obj_info(fd, LINK_INFO_SIZE, "a uprobe_multi link", fill) if count else raw
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
                     ctypes.addressof(cpath), ctypes.addressof(coffsets), 0, address(ccookies),
                     len(offsets), flags, pid)
    fd = bpf(BPF_LINK_CREATE, attr, "creating a uprobe_multi link")
    return Fd(fd, "uprobe_multi link")


# ------------------------------------------------------------------------------------------
# perf events


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


# ------------------------------------------------------------------------------------------
# cgroups

FILEID_KERNFS = 0xFE  # a kernfs node's handle: its 64-bit id (a cgroup v2 id)
_O_PATH = 0o10000000
_O_CLOEXEC = 0o2000000


def cgroup_path(mount_fd: int, cgroup_id: int) -> Optional[str]:
    """The path of cgroup v2 `cgroup_id` (bpf_get_current_cgroup_id's) below the cgroup2
    mount open at `mount_fd`, as this process sees it; None when it is gone or cannot be
    opened (open_by_handle_at needs CAP_DAC_READ_SEARCH)."""
    handle = ctypes.create_string_buffer(struct.pack("<IiQ", 8, FILEID_KERNFS, cgroup_id), 16)
    lib = _lib()
    fd = lib.open_by_handle_at(mount_fd, handle, _O_PATH | _O_CLOEXEC)
    if fd < 0:
        return None
    try:
        return os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return None
    finally:
        os.close(fd)
