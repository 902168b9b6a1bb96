"""Offsets of kernel struct members, read from the kernel's own BTF (/sys/kernel/btf/vmlinux).

The Python stack walker (probes/pystack.py) needs one: where task_struct keeps the user
thread pointer (x86-64: `thread.fsbase`, which glibc and musl hand out as pthread_self() and
CPython keeps in each thread state; arm64: `thread.uw.tp_value`, pthread_self() below it).
BTF is the UAPI `linux/btf.h` format: a header, a type section of variable-size entries
(type ids count from 1) and a string section.
"""
import os
import struct
from array import array
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from .. import arch

VMLINUX = "/sys/kernel/btf/vmlinux"
BTF_MAGIC = 0xEB9F
_HEADER = struct.Struct("<HBBIIIII")
_TYPE = struct.Struct("<III")  # name_off, info, size or type
_MEMBER = struct.Struct("<III")  # name_off, type, offset
KIND_STRUCT, KIND_UNION = 4, 5
_QUALIFIERS = (8, 9, 10, 11, 18)  # typedef, volatile, const, restrict, type tag
# Bytes after the common entry, by kind: a constant, or per vlen item.
_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}
_PER_ITEM = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}

_cache: Dict[tuple, object] = {}  # (file, what, name...) -> what was read, or None


def _types(data: bytes) -> Iterator[Tuple[int, int, int, int, int]]:
    """(kind, kind_flag, name_off, size_or_type, offset of the kind data) of each type."""
    magic, _, _, hdr_len, type_off, type_len, _, _ = _HEADER.unpack_from(data)
    if magic != BTF_MAGIC:
        raise ValueError("not BTF (magic %#x)" % magic)
    at, end = hdr_len + type_off, hdr_len + type_off + type_len
    while at < end:
        name_off, info, size = _TYPE.unpack_from(data, at)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        at += _TYPE.size
        yield kind, info >> 31, name_off, size, at
        at += _FIXED.get(kind, 0) + _PER_ITEM.get(kind, 0) * vlen


class _Types:
    """The type entries of a BTF blob by id (from 1), each decoded when asked for: a list
    of vmlinux's ~150,000 entries as tuples would take ~26 MB at its peak, for a lookup."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = array("I", [0])  # (where each entry's kind data begins; id 0: none)
        self.at.extend(entry[4] for entry in _types(data))

    def __len__(self) -> int:
        return len(self.at)

    def __getitem__(self, type_id: int) -> Tuple[int, int, int, int, int]:
        if type_id == 0:
            return (0, 0, 0, 0, 0)
        at = self.at[type_id]
        name_off, info, size = _TYPE.unpack_from(self.data, at - _TYPE.size)
        return (info >> 24) & 0x1F, info >> 31, name_off, size, at


def _string(data: bytes, strings: int, off: int) -> str:
    end = data.index(b"\0", strings + off)
    return data[strings + off:end].decode("ascii", "replace")


def member_offset(path: Sequence[str], btf_path: str = VMLINUX) -> Optional[int]:
    """Byte offset of a member path such as ("task_struct", "thread", "fsbase"): the first
    name is a struct, the others members of members. None when the kernel has no BTF or
    no such member."""
    return _cached(btf_path, ("member",) + tuple(path), lambda data: _member_offset(data, path))


def _cached(btf_path: str, key: tuple, read):
    """read(the BTF's bytes), once per (file, key); None when the file cannot be read or
    is no BTF. For the kernel's own BTF, what was read is also kept on disk per kernel
    build (`_disk_file`): parsing vmlinux's ~150,000 types in Python costs ~100 ms of every
    start-up otherwise."""
    memo = (btf_path,) + key
    if memo not in _cache:
        disk = _disk_file(btf_path)
        stored = _disk_read(disk)
        name = "\0".join(key)
        if name in stored:
            found = stored[name]
            _cache[memo] = tuple(found) if isinstance(found, list) else found
            return _cache[memo]
        try:
            with open(btf_path, "rb") as f:
                data = f.read()
            _cache[memo] = read(data)
        except (OSError, ValueError, struct.error):
            _cache[memo] = None
            return None
        if disk is not None:
            stored[name] = _cache[memo]
            _disk_write(disk, stored)
    return _cache[memo]


def _disk_file(btf_path: str) -> Optional[str]:
    """The cache file of the kernel's BTF, named after this kernel's build (its release,
    version string and the BTF file's size and time: a new kernel gets a new file), in
    $XDG_CACHE_HOME/ebpf-cuda or ~/.cache/ebpf-cuda; None for other BTF files."""
    if btf_path != VMLINUX:
        return None
    import zlib  # (not hashlib: its import costs ~7-12 ms of a start-up that reads the BTF)

    try:
        info = os.stat(btf_path)
    except OSError:
        return None
    build = "%s|%s|%d|%d" % (os.uname().release, os.uname().version, info.st_size,
                             info.st_mtime_ns)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = "%08x%08x" % (zlib.crc32(build.encode()), zlib.adler32(build.encode()))
    return os.path.join(base, "ebpf-cuda", "btf-%s.marshal" % digest)


def _disk_read(path: Optional[str]) -> Dict[str, object]:
    """What the cache file holds (nothing when it is missing, unreadable or not ours)."""
    if path is None:
        return {}
    import marshal  # (built in: json's import was ~2 ms of every start)

    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if info.st_uid != os.geteuid() or info.st_mode & 0o022:  # (not ours alone)
                return {}
            stored = marshal.load(f)
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    if not isinstance(stored, dict):
        return {}
    return {k: v for k, v in stored.items()
            if v is None or isinstance(v, int) or (isinstance(v, list) and all(
                isinstance(i, int) for i in v))}


def _disk_write(path: str, stored: Dict[str, object]) -> None:
    """Replace the cache file at once (a file half written is never read); a cache that
    cannot be written is only slower next time."""
    import marshal
    import tempfile

    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            marshal.dump({k: list(v) if isinstance(v, tuple) else v  # (read back as lists)
                          for k, v in stored.items()}, f)
        os.replace(temporary, path)
    except (OSError, ValueError):
        pass


def _member_offset(data: bytes, path: Sequence[str]) -> Optional[int]:
    _, _, _, hdr_len, _, _, str_off, str_len = _HEADER.unpack_from(data)
    strings = hdr_len + str_off
    name_off = _string_offset(data[strings:strings + str_len], path[0])
    if name_off is None:
        return None
    types = _Types(data)
    first = next((t for t in _types(data) if t[0] == KIND_STRUCT and t[2] == name_off
                  and _vlen(data, t)), None)
    if first is None:
        return None
    bits, current = 0, first
    for name in path[1:]:
        found = next((m for m in _members(data, current) if
                      _string(data, strings, m[0]) == name), None)
        if found is None:
            return None
        bits += found[2]
        current = types[found[1]]
        while current[0] in _QUALIFIERS:
            current = types[current[3]]
    return bits // 8 if bits % 8 == 0 else None


def _string_offset(strings: bytes, name: str) -> Optional[int]:
    """The offset of `name` in a string section (BTF keeps each string once)."""
    at = strings.find(b"\0" + name.encode() + b"\0")
    return None if at < 0 else at + 1


def _vlen(data: bytes, entry: Tuple[int, int, int, int, int]) -> int:
    return struct.unpack_from("<I", data, entry[4] - 8)[0] & 0xFFFF


def _members(data: bytes, entry: Tuple[int, int, int, int, int]) -> List[Tuple[int, int, int]]:
    """(name offset, type id, bit offset) of a struct's members."""
    if entry[0] not in (KIND_STRUCT, KIND_UNION):
        return []
    members = []
    for j in range(_vlen(data, entry)):
        m_name, m_type, m_off = _MEMBER.unpack_from(data, entry[4] + 12 * j)
        members.append((m_name, m_type, m_off & 0xFFFFFF if entry[1] else m_off))
    return members


def thread_pointer_offset(btf_path: str = VMLINUX) -> Optional[int]:
    """Where task_struct keeps a thread's user thread pointer on this architecture
    (arch.Arch.thread_pointer: x86-64's fs base, arm64's tp_value); None without BTF."""
    return member_offset(("task_struct",) + arch.current().thread_pointer, btf_path)


TASK_FIELDS = ("pid", "tgid", "comm")


def task_fields(btf_path: str = VMLINUX) -> Optional[Tuple[int, int, int]]:
    """Byte offsets of task_struct's pid, tgid and comm: the probes read them through
    bpf_get_current_task_btf's pointer (two loads each) rather than by a helper call apiece
    (~20 ns for get_current_pid_tgid, ~70 for get_current_comm here). None without BTF."""
    found = _cached(btf_path, ("task_fields",), lambda data: _direct_members(
        data, "task_struct", TASK_FIELDS))
    return tuple(found) if found is not None else None  # type: ignore[return-value]


def _direct_members(data: bytes, struct_name: str,
                    names: Sequence[str]) -> Optional[Tuple[int, ...]]:
    """Byte offsets of members `names` of struct `struct_name` (each byte-aligned), in one
    pass over the types that stops at the struct."""
    _, _, _, hdr_len, _, _, str_off, str_len = _HEADER.unpack_from(data)
    strings = hdr_len + str_off
    name_off = _string_offset(data[strings:strings + str_len], struct_name)
    if name_off is None:
        return None
    entry = next((t for t in _types(data) if t[0] == KIND_STRUCT and t[2] == name_off
                  and _vlen(data, t)), None)
    if entry is None:
        return None
    bits = {_string(data, strings, m[0]): m[2] for m in _members(data, entry)}
    if any(name not in bits or bits[name] % 8 for name in names):
        return None
    return tuple(bits[name] // 8 for name in names)


KIND_FUNC, KIND_FUNC_PROTO = 12, 13


def function(name: str, btf_path: str = VMLINUX) -> Optional[Tuple[int, int]]:
    """(BTF type id, number of parameters) of the kernel function `name` (a kfunc's call
    instruction names it by that id); None when the kernel has no BTF or no such function."""
    return _cached(btf_path, ("function", name), lambda data: _function(data, name))


def _function(data: bytes, name: str) -> Optional[Tuple[int, int]]:
    _, _, _, hdr_len, _, _, str_off, str_len = _HEADER.unpack_from(data)
    name_off = _string_offset(data[hdr_len + str_off:hdr_len + str_off + str_len], name)
    if name_off is None:
        return None
    types = _Types(data)
    for type_id, entry in enumerate(_types(data), 1):
        if entry[0] == KIND_FUNC and entry[2] == name_off and entry[3] < len(types):
            proto = types[entry[3]]
            if proto[0] == KIND_FUNC_PROTO:
                return type_id, _vlen(data, proto)
    return None
