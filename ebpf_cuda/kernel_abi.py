"""The kernel's BPF and perf ABI as data: command and type numbers, the attribute layouts
that `syscalls` packs (offsets of the 6.18 uapi, written above each packer), the info structs
it reads back, and the uprobe PMU that sysfs describes.

Nothing here calls the kernel: `syscalls.py` is the one module that does, and re-exports
every name below (callers write `syscalls.BPF_MAP_TYPE_HASH`, `syscalls.MapInfo`, ...).
"""
import ctypes
import errno as errnos
import os
import re
import struct
from typing import List, NamedTuple, Optional, Sequence

from .errors import KernelError, UnsupportedKernelError
from .value_class import ValueClass

# bpf() commands (enum bpf_cmd)
BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_PROG_LOAD = 5
BPF_MAP_LOOKUP_AND_DELETE_ELEM = 21  # (hash maps: Linux 5.14+)
BPF_PROG_GET_NEXT_ID = 11
BPF_PROG_GET_FD_BY_ID = 13
BPF_MAP_LOOKUP_BATCH = 24  # (Linux 5.6+)
# Its attr: in_batch, out_batch, keys, values, count, map_fd, elem_flags, flags; the kernel
# writes back at MAP_BATCH_COUNT_AT how many entries it gave.
MAP_BATCH_ATTR = struct.Struct("<QQQQIIQQ")
MAP_BATCH_COUNT_AT = 32
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

PROG_LOAD_ATTR_SIZE = 144  # through log_true_size (offset 140)
LINK_INFO_SIZE = 64


def attr_buffer(size: int) -> ctypes.Array:
    """A zeroed attribute buffer of `size` bytes (the kernel reads the fields it knows)."""
    return ctypes.create_string_buffer(size)


def address(buf: Optional[ctypes.Array]) -> int:
    """A buffer's address for an attribute's pointer field; 0 (NULL) for None."""
    return ctypes.addressof(buf) if buf is not None else 0


def check_name(name: str) -> bytes:
    """Validate a map/program name (<=15 chars of [A-Za-z0-9_.]); ValueError otherwise."""
    if len(name) >= BPF_OBJ_NAME_LEN or not re.fullmatch(r"[A-Za-z0-9_.]*", name):
        raise ValueError("bad eBPF object name %r: use at most 15 characters of A-Z a-z 0-9 _ ."
                         % name)
    return name.encode()


# ------------------------------------------------------------------------------------------
# attribute layouts


def elem_attr(fd: int, key: Optional[ctypes.Array], value: Optional[ctypes.Array],
              flags: int = 0) -> ctypes.Array:
    """The attribute of the map element commands (lookup, update, delete, next key)."""
    # map_fd@0 key@8 value/next_key@16 flags@24
    attr = attr_buffer(32)
    struct.pack_into("<IxxxxQQQ", attr, 0, fd, address(key), address(value), flags)
    return attr


def prog_load_attr(prog_type: int, insns: ctypes.Array, license: ctypes.Array, log_level: int,
                   log: Optional[ctypes.Array], name: bytes,
                   expected_attach_type: int) -> ctypes.Array:
    """BPF_PROG_LOAD's attribute; the kernel writes log_true_size back into it."""
    # prog_type@0 insn_cnt@4 insns@8 license@16 log_level@24 log_size@28 log_buf@32
    # kern_version@40 prog_flags@44 prog_name[16]@48 prog_ifindex@64 expected_attach_type@68
    # ... log_true_size@140 (out)
    attr = attr_buffer(PROG_LOAD_ATTR_SIZE)
    log_size = len(log) if log is not None else 0
    struct.pack_into("<IIQQIIQ", attr, 0, prog_type, len(insns) // 8, address(insns),
                     address(license), log_level, log_size, address(log))
    struct.pack_into("16s", attr, 48, name)
    struct.pack_into("<I", attr, 68, expected_attach_type)
    return attr


def verifier_reason(log: str) -> str:
    """The line of a verifier log that says why it refused (the one before `processed ...`)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("processed ") and i > 0:
            return lines[i - 1]
    return lines[-1] if lines else ""


# ------------------------------------------------------------------------------------------
# info structs


def _name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


class MapInfo(ValueClass):
    """struct bpf_map_info (the fields used here)."""

    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    map_flags: int
    name: str


def map_info_from(raw: bytes) -> MapInfo:
    """struct bpf_map_info from its bytes."""
    fields = struct.unpack_from("<IIIIII", raw, 0)
    return MapInfo(*fields, name=_name(raw[24:40]))


class ProgInfo(ValueClass):
    """struct bpf_prog_info (run statistics need kernel.bpf_stats_enabled=1)."""

    type: int
    id: int
    tag: bytes
    name: str
    run_time_ns: int
    run_cnt: int
    verified_insns: int


def prog_info_from(raw: bytes) -> ProgInfo:
    """struct bpf_prog_info from its bytes."""
    ptype, pid = struct.unpack_from("<II", raw, 0)
    run_time, run_cnt = struct.unpack_from("<QQ", raw, 192)
    verified = struct.unpack_from("<I", raw, 216)[0]
    return ProgInfo(ptype, pid, raw[8:16], _name(raw[64:80]), run_time, run_cnt, verified)


class LinkInfo(ValueClass):
    """struct bpf_link_info; the uprobe fields are filled for perf-event and uprobe_multi links
    when the kernel reports them (`details`): uprobe_multi links always (6.8+), perf-event
    links from 6.6 (before, their info has only type and ids)."""

    type: int
    id: int
    prog_id: int
    path: str
    offsets: List[int]
    cookies: List[int]
    retprobe: bool
    pid: int
    details: bool

    def __init__(self, type: int, id: int, prog_id: int, path: str = "",
                 offsets: Sequence[int] = (), cookies: Sequence[int] = (),
                 retprobe: bool = False, pid: int = 0, details: bool = False) -> None:
        super().__init__(type, id, prog_id, path, list(offsets), list(cookies), retprobe, pid,
                         details)


# ------------------------------------------------------------------------------------------
# the uprobe PMU


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
    attr = attr_buffer(PERF_ATTR_SIZE)
    struct.pack_into("<IIQ", attr, 0, pmu.type, PERF_ATTR_SIZE, config)
    struct.pack_into("<QQ", attr, 56, ctypes.addressof(path), offset)
    return attr
