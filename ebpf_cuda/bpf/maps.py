"""eBPF maps as Python objects that own their file descriptor.

Keys and values are `bytes` of the declared sizes, or Python values when a `struct.Struct`
is given for the key and/or value (array maps default to a `<I` key, so their keys are ints).
Per-CPU maps return one value per possible CPU.
"""
from __future__ import annotations
import ctypes
import errno
import functools
import mmap
import os
import struct
from typing import Any, Iterator, List, Optional, Tuple

from .. import kernel_abi, syscalls
from ..spec.layout import MapSpec
from ..syscalls import MapInfo

POSSIBLE_CPUS = "/sys/devices/system/cpu/possible"


@functools.lru_cache(maxsize=None)
def possible_cpus() -> int:
    """Number of possible CPUs (what per-CPU maps are sized by; not os.cpu_count())."""
    with open(POSSIBLE_CPUS) as f:
        return parse_cpu_list(f.read())


def parse_cpu_list(text: str) -> int:
    """`0-3,5` -> 6 (highest CPU + 1, as the kernel sizes per-CPU storage)."""
    last = -1
    for part in text.strip().split(","):
        if part:
            last = max(last, int(part.split("-")[-1]))
    return last + 1


def _round8(n: int) -> int:
    return (n + 7) & ~7


class Map:
    """Base class: owns the map fd (close(), `with`, garbage collection)."""

    map_type = 0

    def __init__(self, key_size: int, value_size: int, max_entries: int, name: str = "",
                 flags: int = 0) -> None:
        self.name = name
        self.key_size = key_size
        self.value_size = value_size
        self.max_entries = max_entries
        self._fd = syscalls.map_create(self.map_type, key_size, value_size, max_entries,
                                       flags, name)

    @property
    def fd(self) -> int:
        """The map's file descriptor (ValueError once closed)."""
        return self._fd.value

    @property
    def closed(self) -> bool:
        return self._fd.closed

    def info(self) -> MapInfo:
        """The kernel's view of the map (type, id, sizes, name)."""
        return syscalls.map_info(self.fd)

    def close(self) -> None:
        self._fd.close()

    def __enter__(self) -> "Map":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "%s(name=%r, fd=%d)" % (type(self).__name__, self.name, self._fd._fd)


class _ElementMap(Map):
    """A map with elements: get/set/delete/iterate."""

    default_key_struct: Optional[struct.Struct] = None
    is_array = False

    def __init__(self, key_size: int, value_size: int, max_entries: int, name: str = "",
                 flags: int = 0, key_struct: Optional[struct.Struct] = None,
                 value_struct: Optional[struct.Struct] = None) -> None:
        self.key_struct = key_struct or self.default_key_struct
        self.value_struct = value_struct
        _check_struct("key", self.key_struct, key_size)
        _check_struct("value", value_struct, value_size)
        super().__init__(key_size, value_size, max_entries, name, flags)

    # encoding ---------------------------------------------------------------------------

    def _key(self, key: Any) -> bytes:
        return _encode(key, self.key_struct, self.key_size, "key")

    def _unkey(self, raw: bytes) -> Any:
        return _decode(raw, self.key_struct)

    def _value(self, value: Any) -> bytes:
        return _encode(value, self.value_struct, self.value_size, "value")

    def _unvalue(self, raw: bytes) -> Any:
        return _decode(raw[:self.value_size], self.value_struct)

    # element access --------------------------------------------------------------------

    def _lookup_size(self) -> int:
        return self.value_size

    def get(self, key: Any, default: Any = None) -> Any:
        """The value under `key`, or `default`."""
        raw = syscalls.map_lookup(self.fd, self._key(key), self._lookup_size())
        return default if raw is None else self._unvalue(raw)

    def __getitem__(self, key: Any) -> Any:
        raw = syscalls.map_lookup(self.fd, self._key(key), self._lookup_size())
        if raw is None:
            raise KeyError(key)
        return self._unvalue(raw)

    def set(self, key: Any, value: Any, flags: int = syscalls.BPF_ANY) -> None:
        """Store a value (flags: syscalls.BPF_ANY / BPF_NOEXIST / BPF_EXIST)."""
        syscalls.map_update(self.fd, self._key(key), self._value(value), flags)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.set(key, value)

    def delete(self, key: Any) -> bool:
        """Remove `key`; False if it was absent."""
        return syscalls.map_delete(self.fd, self._key(key))

    def __delitem__(self, key: Any) -> None:
        if not self.delete(key):
            raise KeyError(key)

    def __contains__(self, key: Any) -> bool:
        return syscalls.map_lookup(self.fd, self._key(key), self._lookup_size()) is not None

    # iteration -------------------------------------------------------------------------

    def _raw_keys(self) -> Iterator[bytes]:
        key = None
        while True:
            key = syscalls.map_next_key(self.fd, key, self.key_size)
            if key is None:
                return
            yield key

    def keys(self) -> Iterator[Any]:
        """Iterate over the keys (a snapshot is not guaranteed while the map changes)."""
        return (self._unkey(k) for k in self._raw_keys())

    __iter__ = keys

    def items(self) -> Iterator[Tuple[Any, Any]]:
        """Iterate over (key, value); keys deleted meanwhile are skipped."""
        for raw in self._raw_keys():
            value = syscalls.map_lookup(self.fd, raw, self._lookup_size())
            if value is not None:
                yield self._unkey(raw), self._unvalue(value)

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.items())

    def __len__(self) -> int:
        return sum(1 for _ in self._raw_keys())

    def clear(self) -> None:
        """Delete every element (array elements cannot be deleted: they are zeroed instead)."""
        zero = b"\0" * self._lookup_size()
        for raw in list(self._raw_keys()):
            if self.is_array:
                syscalls.map_update(self.fd, raw, zero)
            else:
                syscalls.map_delete(self.fd, raw)

    def batch_reader(self) -> "BatchReader":
        """A reader of every element in a few system calls, its buffers made once: keep it
        to read the map again and again."""
        return BatchReader(self)


_ENOTSUPP = 524  # the kernel's own "not supported" (not in errno)
_BATCH_ATTR, _BATCH_COUNT_AT = kernel_abi.MAP_BATCH_ATTR, kernel_abi.MAP_BATCH_COUNT_AT


class BatchReader:
    """Every (key, value) of a map as raw bytes (not decoded through the map's structs) in
    a few BPF_MAP_LOOKUP_BATCH calls (two system calls per entry with get-next-key and
    lookup: 10,000 of them for the monitor's full launches map, ~0.2 s); one element at a
    time where the kernel has no batches."""

    BATCH = 512  # entries per call (ENOSPC, a hash bucket holding more: twice as many)

    def __init__(self, element_map: _ElementMap) -> None:
        self.map = element_map
        self.value_size = element_map._lookup_size()  # (per-CPU maps: every CPU's value)
        self.tokens = (ctypes.create_string_buffer(8), ctypes.create_string_buffer(8))
        self.batches = True  # (False once the kernel said it has none)
        self._room(self.BATCH)

    def _room(self, count: int) -> None:
        self.count = count
        self.keys = ctypes.create_string_buffer(count * self.map.key_size)
        self.values = ctypes.create_string_buffer(count * self.value_size)

    def items(self) -> List[Tuple[bytes, bytes]]:
        """Every element now (those deleted meanwhile may be left out)."""
        if self.batches:
            try:
                return self._batched()
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP, _ENOTSUPP):
                    raise
                self.batches = False
        found = []
        for key in self.map._raw_keys():
            value = syscalls.map_lookup(self.map.fd, key, self.value_size)
            if value is not None:
                found.append((key, value))
        return found

    def _batched(self) -> List[Tuple[bytes, bytes]]:
        ksize, vsize = self.map.key_size, self.value_size
        return [(keys[i * ksize:(i + 1) * ksize], values[i * vsize:(i + 1) * vsize])
                for count, keys, values in self._batches() for i in range(count)]

    def _batches(self) -> Iterator[Tuple[int, bytes, bytes]]:
        """(count, keys, values) of each batch: the entries packed, as the kernel gave them.
        OSError where the kernel has no batches."""
        first = True
        while True:
            attr = ctypes.create_string_buffer(_BATCH_ATTR.size)
            _BATCH_ATTR.pack_into(
                attr, 0, 0 if first else ctypes.addressof(self.tokens[0]),
                ctypes.addressof(self.tokens[1]), ctypes.addressof(self.keys),
                ctypes.addressof(self.values), self.count, self.map.fd, 0, 0)
            res, err = syscalls.bpf_raw(kernel_abi.BPF_MAP_LOOKUP_BATCH, attr)
            if res < 0 and err == errno.ENOSPC and self.count < self.map.max_entries:
                self._room(self.count * 2)  # (the same batch again, with more room)
                continue
            if res < 0 and err != errno.ENOENT:
                raise OSError(err, os.strerror(err))
            yield (struct.unpack_from("<I", attr, _BATCH_COUNT_AT)[0], self.keys.raw,
                   self.values.raw)
            if res < 0:  # ENOENT: that was the last batch
                return
            ctypes.memmove(self.tokens[0], self.tokens[1], 8)
            first = False


def _check_struct(what: str, st: Optional[struct.Struct], size: int) -> None:
    if st is not None and st.size != size:
        raise ValueError("%s struct %r is %d bytes, but the map's %s size is %d"
                         % (what, st.format, st.size, what, size))


def _encode(obj: Any, st: Optional[struct.Struct], size: int, what: str) -> bytes:
    if st is not None:
        return st.pack(*obj) if isinstance(obj, tuple) else st.pack(obj)
    raw = bytes(obj)
    if len(raw) != size:
        raise ValueError("%s must be %d bytes, got %d" % (what, size, len(raw)))
    return raw


def _decode(raw: bytes, st: Optional[struct.Struct]) -> Any:
    if st is None:
        return raw
    fields = st.unpack(raw)
    return fields[0] if len(fields) == 1 else fields


class _PerCpu(_ElementMap):
    """Per-CPU values: one slot of round_up(value_size, 8) bytes per possible CPU."""

    def _lookup_size(self) -> int:
        return _round8(self.value_size) * possible_cpus()

    def _unvalue(self, raw: bytes) -> List[Any]:
        step = _round8(self.value_size)
        return [_decode(raw[i:i + self.value_size], self.value_struct)
                for i in range(0, len(raw), step)]

    def _value(self, value: Any) -> bytes:
        """A list gives one value per CPU; anything else is copied to every CPU."""
        ncpu = possible_cpus()
        per_cpu = value if isinstance(value, list) else [value] * ncpu
        if len(per_cpu) != ncpu:
            raise ValueError("need %d per-CPU values, got %d" % (ncpu, len(per_cpu)))
        pad = b"\0" * (_round8(self.value_size) - self.value_size)
        return b"".join(_encode(v, self.value_struct, self.value_size, "value") + pad
                        for v in per_cpu)


class HashMap(_ElementMap):
    """BPF_MAP_TYPE_HASH: fails with E2BIG when full."""

    map_type = syscalls.BPF_MAP_TYPE_HASH


class LruHashMap(_ElementMap):
    """BPF_MAP_TYPE_LRU_HASH: evicts the least recently used element when full."""

    map_type = syscalls.BPF_MAP_TYPE_LRU_HASH


class ArrayMap(_ElementMap):
    """BPF_MAP_TYPE_ARRAY: u32 keys 0..max_entries-1, every element exists (zeroed)."""

    map_type = syscalls.BPF_MAP_TYPE_ARRAY
    default_key_struct = struct.Struct("<I")
    is_array = True

    def __init__(self, value_size: int, max_entries: int, name: str = "", flags: int = 0,
                 value_struct: Optional[struct.Struct] = None) -> None:
        super().__init__(4, value_size, max_entries, name, flags, value_struct=value_struct)


class MappedArrayMap(ArrayMap):
    """An ArrayMap created mmap-able (BPF_F_MMAPABLE, Linux 5.5): `values()` reads every
    element at once through a read-only mapping, without a syscall per element or batch
    (the monitor reads its launch slots so at every tick)."""

    def __init__(self, value_size: int, max_entries: int, name: str = "",
                 value_struct: Optional[struct.Struct] = None) -> None:
        super().__init__(value_size, max_entries, name, syscalls.BPF_F_MMAPABLE,
                         value_struct=value_struct)
        self.stride = _round8(value_size)  # (the kernel's element size)
        length = -(-self.stride * max_entries // mmap.PAGESIZE) * mmap.PAGESIZE
        try:
            self._mapping = mmap.mmap(self.fd, length, flags=mmap.MAP_SHARED,
                                      prot=mmap.PROT_READ)
        except OSError as err:
            self.close()
            from ..errors import KernelError

            raise KernelError("could not mmap the array map %s (%d bytes): %s"
                              % (name, length, err.strerror), err.errno or 0) from err

    def values(self, first: int = 0, count: Optional[int] = None) -> bytes:
        """Every element's value (or `count` from index `first`), `stride` bytes each in
        index order (a copy: nothing keeps the mapping exported)."""
        end = self.max_entries if count is None else min(first + count, self.max_entries)
        return self._mapping[self.stride * first:self.stride * end]

    def close(self) -> None:
        mapping = getattr(self, "_mapping", None)
        if mapping is not None:
            mapping.close()
        super().close()


class PerCpuArrayMap(_PerCpu):
    """BPF_MAP_TYPE_PERCPU_ARRAY: like ArrayMap, values are lists with one item per CPU."""

    map_type = syscalls.BPF_MAP_TYPE_PERCPU_ARRAY
    default_key_struct = struct.Struct("<I")
    is_array = True

    def __init__(self, value_size: int, max_entries: int, name: str = "", flags: int = 0,
                 value_struct: Optional[struct.Struct] = None) -> None:
        super().__init__(4, value_size, max_entries, name, flags, value_struct=value_struct)


class RingBufMap(Map):
    """BPF_MAP_TYPE_RINGBUF of `size` data bytes (a power of two, multiple of the page size).

    Only creation lives here; reading is `ringbuf.py`'s job.
    """

    map_type = syscalls.BPF_MAP_TYPE_RINGBUF

    def __init__(self, size: int, name: str = "") -> None:
        if size <= 0 or size & (size - 1) or size % mmap.PAGESIZE:
            raise ValueError("ring buffer size must be a power of two and a multiple of %d, "
                             "got %d" % (mmap.PAGESIZE, size))
        from ..errors import KernelError, UnsupportedKernelError

        try:
            super().__init__(0, 0, size, name)
        except KernelError as err:
            from . import features

            if type(err) is KernelError and not features.ring_buffer():
                raise UnsupportedKernelError(
                    "this kernel has no BPF ring buffer (Linux 5.8+), which every event goes "
                    "through", err.errno) from None
            raise

    @property
    def size(self) -> int:
        """Data bytes of the ring."""
        return self.max_entries


class StackTraceMap(_ElementMap):
    """BPF_MAP_TYPE_STACK_TRACE: stack id (u32) → up to `depth` return addresses (u64).

    Filled by the get_stackid helper; `addresses(stack_id)` reads one stack back."""

    map_type = syscalls.BPF_MAP_TYPE_STACK_TRACE

    def __init__(self, max_entries: int, depth: int = 127, name: str = "") -> None:
        super().__init__(4, 8 * depth, max_entries, name, key_struct=struct.Struct("<I"))

    def addresses(self, stack_id: int) -> List[int]:
        """The return addresses of a stack, innermost first ([] if unknown)."""
        raw = self.get(stack_id)
        if raw is None:
            return []
        words = struct.unpack("<%dQ" % (len(raw) // 8), raw)
        return [w for w in words if w]


class TaskStorageMap(Map):
    """BPF_MAP_TYPE_TASK_STORAGE: `value_size` bytes per thread, created on first use by a
    program (bpf_task_storage_get) and freed with the thread. Needs BTF for its types
    (built here) and a kernel with task storage (5.11+) and its own BTF (get_current_task_btf).
    Programs reach it; user space does not need to."""

    map_type = syscalls.BPF_MAP_TYPE_TASK_STORAGE
    NO_PREALLOC = 1

    def __init__(self, value_size: int, name: str = "") -> None:
        from . import btf, features

        # Creating the map is not enough: kprobe-type programs must also be allowed
        # bpf_task_storage_get (and the kernel must have its BTF for get_current_task_btf).
        why = features.task_storage_reason()
        if why is not None:
            from ..errors import UnsupportedKernelError

            raise UnsupportedKernelError("task storage for uprobe programs: %s" % why)
        self._btf = syscalls.btf_load(btf.key_and_bytes(value_size))
        try:
            self.name, self.key_size, self.value_size, self.max_entries = name, 4, value_size, 0
            self._fd = syscalls.map_create(
                self.map_type, 4, value_size, 0, self.NO_PREALLOC, name,
                btf=(self._btf.value, btf.INT_TYPE_ID, btf.BYTES_TYPE_ID))
        except BaseException:
            self._btf.close()
            raise

    def close(self) -> None:
        super().close()
        self._btf.close()


def create_map(spec: MapSpec) -> Map:
    """A new map from its spec."""
    if spec.type == "RingBuf":
        return RingBufMap(spec.entries, name=spec.name)
    if spec.type == "TaskStorage":
        return TaskStorageMap(spec.value_size, name=spec.name)
    if spec.type == "StackTrace":
        return StackTraceMap(spec.entries, name=spec.name)
    if spec.type == "PerCpuArray":
        return PerCpuArrayMap(spec.value_size, spec.entries, name=spec.name,
                              value_struct=spec.value_struct)
    if spec.type == "MappedArray":
        return MappedArrayMap(spec.value_size, spec.entries, name=spec.name,
                              value_struct=spec.value_struct)
    if spec.type == "Array":
        return ArrayMap(spec.value_size, spec.entries, name=spec.name,
                        value_struct=spec.value_struct)
    kind = {"Hash": HashMap, "LruHash": LruHashMap}[spec.type]
    return kind(spec.key_size, spec.value_size, spec.entries, name=spec.name,
                key_struct=spec.key_struct, value_struct=spec.value_struct)
