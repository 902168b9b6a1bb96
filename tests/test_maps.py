"""Map CRUD and iteration against the real kernel, for every map type."""
import errno
import gc
import struct

import pytest

from ebpf_cuda.bpf import maps
from ebpf_cuda import syscalls
from ebpf_cuda.errors import KernelError
from kernel_fds import open_fds

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")


def test_parse_cpu_list():
    assert maps.parse_cpu_list("0-1\n") == 2
    assert maps.parse_cpu_list("0") == 1
    assert maps.parse_cpu_list("0-3,5,8-9") == 10


def test_possible_cpus_from_sysfs():
    with open(maps.POSSIBLE_CPUS) as f:
        assert maps.possible_cpus() == maps.parse_cpu_list(f.read())


@pytest.mark.kernel
def test_hash_map_bytes_crud_and_iteration(root):
    with maps.HashMap(8, 16, 8, name="h.bytes") as m:
        assert m.info().name == "h.bytes" and m.info().type == syscalls.BPF_MAP_TYPE_HASH
        keys = [bytes([i]) * 8 for i in range(3)]
        for i, k in enumerate(keys):
            m[k] = bytes([i + 10]) * 16
        assert m[keys[1]] == bytes([11]) * 16
        assert sorted(m.keys()) == keys and len(m) == 3
        assert dict(m.items())[keys[2]] == bytes([12]) * 16
        assert sorted(m.values())[0] == bytes([10]) * 16
        assert keys[0] in m and b"z" * 8 not in m
        del m[keys[0]]
        assert m.get(keys[0]) is None and m.get(keys[0], b"d") == b"d"
        with pytest.raises(KeyError):
            m[keys[0]]
        with pytest.raises(KeyError):
            del m[keys[0]]
        assert m.delete(keys[1]) and not m.delete(keys[1])
        m.clear()
        assert list(m.keys()) == []


@pytest.mark.kernel
def test_hash_map_flags_and_full(root):
    with maps.HashMap(4, 8, 1, key_struct=U32, value_struct=U64) as m:
        m[1] = 5
        with pytest.raises(KernelError) as info:
            m.set(1, 6, syscalls.BPF_NOEXIST)
        assert info.value.errno == errno.EEXIST
        with pytest.raises(KernelError) as info:
            m[2] = 1  # full (non-LRU hash)
        assert info.value.errno == errno.E2BIG
        m.set(1, 7, syscalls.BPF_EXIST)
        assert m[1] == 7


@pytest.mark.kernel
def test_struct_keys_and_tuple_values(root):
    pair = struct.Struct("<IQ")
    with maps.HashMap(4, pair.size, 4, key_struct=U32, value_struct=pair) as m:
        m[3] = (1, 2)
        assert m[3] == (1, 2)
        assert list(m.items()) == [(3, (1, 2))]


def test_size_checks():
    with pytest.raises(ValueError, match="key struct"):
        maps.HashMap(8, 8, 1, key_struct=U32)


@pytest.mark.kernel
def test_wrong_length_bytes(root):
    with maps.HashMap(4, 4, 1) as m:
        with pytest.raises(ValueError, match="key must be 4 bytes"):
            m[b"abc"] = b"abcd"


@pytest.mark.kernel
def test_lru_hash_evicts(root):
    with maps.LruHashMap(4, 4, 4, key_struct=U32, value_struct=U32) as m:
        for i in range(64):
            m[i] = i * 2
        items = dict(m.items())
        assert 0 < len(items) <= 4  # preallocated: never more than max_entries, never E2BIG
        assert m[63] == 126
        assert all(v == k * 2 for k, v in items.items())


@pytest.mark.kernel
def test_array_map(root):
    with maps.ArrayMap(8, 4, name="arr", value_struct=U64) as m:
        assert list(m.items()) == [(0, 0), (1, 0), (2, 0), (3, 0)]
        m[2] = 99
        assert m[2] == 99 and len(m) == 4
        with pytest.raises(KeyError):
            m[4]
        m.clear()  # zeroes: array elements cannot be deleted
        assert m[2] == 0


@pytest.mark.kernel
def test_mapped_array_map_reads_every_value_through_its_mapping(root):
    slot = struct.Struct("<QQQ")  # (24 bytes: its own stride; a 12-byte value pads to 16)
    with maps.MappedArrayMap(slot.size, 1000, name="slots", value_struct=slot) as m:
        assert m.info().map_flags & syscalls.BPF_F_MMAPABLE
        assert m.values() == bytes(24 * 1000)
        m[0] = (1, 2, 3)
        m[999] = (7, 8, 9)
        values = m.values()  # (the kernel's memory as it is now: no syscall)
        assert len(values) == 24 * 1000
        assert slot.unpack_from(values, 0) == (1, 2, 3)
        assert slot.unpack_from(values, 24 * 999) == (7, 8, 9)
        m[0] = (4, 5, 6)
        assert slot.unpack_from(m.values(), 0) == (4, 5, 6)
        assert m.values(998, 5) == bytes(24) + slot.pack(7, 8, 9)  # (a range, cut at the end)
        assert m.values(0, 1) == slot.pack(4, 5, 6) and m.values(1, 2) == bytes(48)
    with maps.MappedArrayMap(12, 10, name="padded") as m:
        m[9] = b"abcdefghijkl"
        assert m.stride == 16 and m.values()[16 * 9:16 * 9 + 12] == b"abcdefghijkl"
    assert m.closed


@pytest.mark.kernel
def test_a_mapped_array_that_cannot_be_mapped_is_a_kernel_error(root, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(maps.mmap, "mmap", refuse)
    with pytest.raises(KernelError, match="could not mmap the array map slots") as caught:
        maps.MappedArrayMap(24, 1000, name="slots")
    assert caught.value.errno == errno.ENOMEM


@pytest.mark.kernel
def test_percpu_array_map(root):
    ncpu = maps.possible_cpus()
    with maps.PerCpuArrayMap(4, 2, value_struct=U32) as m:
        assert m[0] == [0] * ncpu
        m[1] = list(range(1, ncpu + 1))
        assert m[1] == list(range(1, ncpu + 1))
        m[0] = 7  # one value: copied to every CPU
        assert m[0] == [7] * ncpu
        with pytest.raises(ValueError, match="per-CPU values"):
            m[0] = [1] * (ncpu + 1)
        assert dict(m.items())[1] == list(range(1, ncpu + 1))


@pytest.mark.kernel
def test_percpu_array_bytes_are_padded_per_cpu(root):
    ncpu = maps.possible_cpus()
    with maps.PerCpuArrayMap(3, 1) as m:  # 3-byte values sit in 8-byte slots
        m[0] = [bytes([i, i, i]) for i in range(ncpu)]
        assert m[0] == [bytes([i, i, i]) for i in range(ncpu)]


@pytest.mark.kernel
def test_ringbuf_map(root):
    with maps.RingBufMap(1 << 14, name="events") as rb:
        assert rb.size == 1 << 14 and rb.fd >= 0
        info = rb.info()
        assert (info.type, info.max_entries, info.name) == (27, 1 << 14, "events")
    for bad in (1000, 12288, 0):
        with pytest.raises(ValueError, match="power of two"):
            maps.RingBufMap(bad)


def test_map_name_validation():
    with pytest.raises(ValueError, match="bad eBPF object name"):
        maps.HashMap(4, 4, 1, name="cuda-launch")
    with pytest.raises(ValueError):
        maps.ArrayMap(4, 1, name="a_name_that_is_16")


@pytest.mark.kernel
def test_maps_close_their_fds(root):
    before = open_fds()
    m = maps.HashMap(4, 4, 1)
    fd = m.fd
    assert str(fd) in open_fds()
    m.close()
    assert m.closed and open_fds() == before
    with pytest.raises(ValueError):
        m.fd
    maps.ArrayMap(4, 1)
    maps.RingBufMap(4096)
    gc.collect()
    assert open_fds() == before


@pytest.mark.kernel
def test_element_lookup_reuses_its_buffers(root):
    """syscalls.ElementLookup (probe_name's): the value of each key asked, None for a key
    the map lacks, never a previous answer; a failure other than absence raises."""
    m = maps.HashMap(8, 16, 64, name="lookup")
    try:
        for k in range(10):
            m.set(U64.pack(k), bytes([k]) * 16)
        lookup = syscalls.ElementLookup(m.fd, 8, 16)
        assert [lookup(U64.pack(k)) for k in range(10)] == [bytes([k]) * 16 for k in range(10)]
        assert lookup(U64.pack(99)) is None and lookup(U64.pack(3)) == b"\x03" * 16
    finally:
        m.close()
    with pytest.raises(KernelError) as caught:
        lookup(U64.pack(3))  # (its map closed: the descriptor is gone)
    assert caught.value.errno in (errno.EBADF, errno.EINVAL)  # (or its number reused)


@pytest.mark.kernel
def test_batch_reader_reads_every_element_in_batches_and_element_by_element(root):
    """More entries than one batch takes (its buffers grow or it calls again), as raw bytes
    whatever the map's structs; the same where the kernel has no batches."""
    with maps.HashMap(8, 16, 2048, key_struct=U64) as m:
        for i in range(1500):
            m.set(i, struct.pack("<QQ", i, 2 * i))
        expected = sorted((U64.pack(i), struct.pack("<QQ", i, 2 * i)) for i in range(1500))
        reader = m.batch_reader()
        assert sorted(reader.items()) == expected and reader.batches
        assert sorted(reader.items()) == expected  # (again, with the same buffers)
        reader.batches = False  # (as after EINVAL: the element-wise way)
        assert sorted(reader.items()) == expected
    with maps.HashMap(4, 8, 16) as empty:
        assert empty.batch_reader().items() == []


@pytest.mark.kernel
def test_batch_reader_of_a_per_cpu_array_gives_every_cpu_s_value(root):
    ncpu = maps.possible_cpus()
    with maps.PerCpuArrayMap(8, 3, value_struct=U64) as m:
        m.set(1, [cpu + 1 for cpu in range(ncpu)])
        items = dict(m.batch_reader().items())
    assert sorted(items) == [U32.pack(i) for i in range(3)]
    assert items[U32.pack(1)] == b"".join(U64.pack(cpu + 1) for cpu in range(ncpu))
    assert items[U32.pack(0)] == bytes(8 * ncpu)
