"""The ring buffer reader.

Kernel tests: real ring buffer maps filled by real eBPF programs (assembled here) attached as
uprobes to small C functions (tests/native/ringbuf_target.c) that this process calls through
ctypes. Protocol tests without root: a memfd laid out like the ring's mmap view (data written
twice, as the kernel's double mapping shows it), filled by the test.
"""
import ctypes
import mmap
import os
import struct
import time
from typing import List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ebpf_cuda import asm
from ebpf_cuda.asm import DW, R0, R1, R2, R3, R4, R6, R7, R8, R9, R10, Helper
from ebpf_cuda.errors import DecodeError
from ebpf_cuda.bpf.ringbuf import BUSY_BIT, DISCARD_BIT, HEADER_SIZE, RingBuffer, record_stride

PAGE = mmap.PAGESIZE
SEQ_RECORD = 64  # payload of rb_emit's record: seq, discard flag, six pattern words
BIG_RECORD = 5000  # larger than a page
VAR_WORDS = 32  # rb_emit_var's stack buffer: 256 bytes


# -- expected payloads (mirror the programs below) ----------------------------------------------

def seq_payload(seq: int, discard: int = 0) -> bytes:
    return struct.pack("=8Q", seq, discard, *[seq + (k << 32) for k in range(2, 8)])


def var_payload(seq: int, size: int) -> bytes:
    words = struct.pack("=%dQ" % VAR_WORDS, *[(seq << 8) + k for k in range(VAR_WORDS)])
    return words[:size & 255]


# -- producer programs ---------------------------------------------------------------------------

def _count_drop() -> list:
    """drops[0] += 1 (atomic: programs on several CPUs may fail at once)."""
    return [asm.ld_map_value(R1, "drops"), asm.mov(R2, 1), asm.atomic_add(DW, R1, 0, R2)]


def seq_program() -> list:
    """On rb_emit(seq, discard): reserve a 64-byte record, fill it, submit or discard."""
    fill = []
    for k in range(2, 8):
        fill += [asm.mov(R1, R7), asm.ld_imm64(R2, k << 32), asm.add(R1, R2),
                 asm.stx(DW, R0, 8 * k, R1)]
    return [
        asm.mov(R6, R1),
        asm.ldx(DW, R7, R6, 112),  # rdi: seq
        asm.ldx(DW, R8, R6, 104),  # rsi: discard
        asm.ld_map(R1, "events"), asm.mov(R2, SEQ_RECORD), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE),
        asm.jeq(R0, 0, "drop"),
        asm.stx(DW, R0, 0, R7),
        asm.stx(DW, R0, 8, R8),
        *fill,
        asm.mov(R1, R0), asm.mov(R2, 0),
        asm.jne(R8, 0, "discard"),
        asm.call(Helper.RINGBUF_SUBMIT),
        asm.ja("out"),
        asm.Label("discard"),
        asm.call(Helper.RINGBUF_DISCARD),
        asm.ja("out"),
        asm.Label("drop"),
        *_count_drop(),
        asm.Label("out"),
        asm.mov(R0, 0),
        asm.exit(),
    ]


def var_program() -> list:
    """On rb_emit_var(seq, size): ringbuf_output of `size & 255` bytes of a stack buffer."""
    fill = []
    for k in range(VAR_WORDS):
        fill += [asm.mov(R1, R9), asm.add(R1, k), asm.stx(DW, R10, -8 * VAR_WORDS + 8 * k, R1)]
    return [
        asm.mov(R6, R1),
        asm.ldx(DW, R9, R6, 112), asm.lsh(R9, 8),  # seq << 8
        asm.ldx(DW, R8, R6, 104), asm.and_(R8, 255),  # size, bounded for the verifier
        *fill,
        asm.ld_map(R1, "events"), asm.mov(R2, R10), asm.add(R2, -8 * VAR_WORDS),
        asm.mov(R3, R8), asm.mov(R4, 0),
        asm.call(Helper.RINGBUF_OUTPUT),
        asm.jeq(R0, 0, "out"),
        *_count_drop(),
        asm.Label("out"),
        asm.mov(R0, 0),
        asm.exit(),
    ]


def big_program() -> list:
    """On rb_emit_big(seq, buf): reserve 5000 bytes and probe_read_user `buf` into them."""
    return [
        asm.mov(R6, R1),
        asm.ldx(DW, R7, R6, 104),  # rsi: buf
        asm.ld_map(R1, "events"), asm.mov(R2, BIG_RECORD), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE),
        asm.jeq(R0, 0, "drop"),
        asm.mov(R8, R0),
        asm.mov(R1, R8), asm.mov(R2, BIG_RECORD), asm.mov(R3, R7),
        asm.call(Helper.PROBE_READ_USER),
        asm.mov(R1, R8), asm.mov(R2, 0),
        asm.call(Helper.RINGBUF_SUBMIT),
        asm.ja("out"),
        asm.Label("drop"),
        *_count_drop(),
        asm.Label("out"),
        asm.mov(R0, 0),
        asm.exit(),
    ]


PROGRAMS = {"rb_emit": seq_program, "rb_emit_var": var_program, "rb_emit_big": big_program}


class Rig:
    """A ring buffer map, a drop counter, the three producers attached, and the target library."""

    def __init__(self, library: str, ring_size: int) -> None:
        from ebpf_cuda.targets.elf import ElfFile
        from ebpf_cuda.bpf.maps import ArrayMap, RingBufMap
        from ebpf_cuda.bpf.programs import Program
        from ebpf_cuda.bpf.uprobe import attach_uprobe

        self.ring = RingBufMap(ring_size, "rb_test")
        self.drops = ArrayMap(8, 1, "rb_drops")
        self.programs = []  # type: list
        self.links = []  # type: list
        elf = ElfFile(library)
        try:
            for symbol, build in PROGRAMS.items():
                program = Program(build(), {"events": self.ring, "drops": self.drops},
                                  name=symbol).load()
                self.programs.append(program)
                self.links.append(attach_uprobe(program, library, elf.symbol_offset(symbol),
                                                what=symbol))
        except BaseException:
            self.close()
            raise
        self.lib = ctypes.CDLL(library)
        for name in ("rb_emit", "rb_emit_var", "rb_emit_big"):
            getattr(self.lib, name).argtypes = [ctypes.c_uint64, ctypes.c_uint64]
        self.lib.rb_emit_many.argtypes = [ctypes.c_uint64] * 3

    def reader(self, **kwargs) -> RingBuffer:
        return RingBuffer.from_map(self.ring, **kwargs)

    def emit_big(self, payload: bytes) -> None:
        buf = ctypes.create_string_buffer(payload, len(payload))
        self.lib.rb_emit_big(0, ctypes.addressof(buf))

    @property
    def dropped(self) -> int:
        return struct.unpack("=Q", self.drops[0])[0]

    def close(self) -> None:
        for link in self.links:
            link.close()
        for program in self.programs:
            program.close()
        self.drops.close()
        self.ring.close()


@pytest.fixture(scope="module")
def target_lib(cc) -> str:
    return str(cc.shared("ringbuf_target.c", "libringbuf_target.so"))


@pytest.fixture
def rig(root, target_lib):
    """Factory: rig(ring_size) -> Rig, torn down after the test."""
    made = []  # type: List[Rig]

    def make(ring_size: int = 64 * 1024) -> Rig:
        made.append(Rig(target_lib, ring_size))
        return made[-1]

    yield make
    for each in made:
        each.close()


def seqs(records: List[bytes]) -> List[int]:
    return [struct.unpack_from("=Q", r)[0] for r in records]


# -- kernel tests ------------------------------------------------------------------------------

@pytest.mark.kernel
def test_records_arrive_exactly_and_in_order(rig):
    r = rig()
    r.lib.rb_emit_many(0, 500, 0)
    with r.reader() as rb:
        assert rb.available() == 500 * record_stride(SEQ_RECORD)
        records = rb.read_batch()
        assert records == [seq_payload(i) for i in range(500)]
        assert rb.available() == 0
        assert rb.consumer_pos == rb.producer_pos == 500 * record_stride(SEQ_RECORD)
    assert r.dropped == 0


@pytest.mark.kernel
def test_discarded_records_are_skipped(rig):
    r = rig()
    r.lib.rb_emit_many(1, 300, 3)  # every seq divisible by 3 is discarded
    with r.reader() as rb:
        got = []  # type: List[bytes]
        assert rb.consume(got.append) == 200
        assert got == [seq_payload(i) for i in range(1, 301) if i % 3]
        assert rb.available() == 0  # the consumer moved past the discarded ones too


@pytest.mark.kernel
def test_payload_lengths_are_exact_and_8_byte_rounded(rig):
    r = rig()
    sizes = [0, 1, 7, 8, 9, 15, 16, 17, 63, 100, 200, 254, 255] + list(range(2, 255, 11))
    for seq, size in enumerate(sizes):
        r.lib.rb_emit_var(seq, size)
    with r.reader() as rb:
        assert rb.producer_pos == sum(record_stride(s) for s in sizes)
        assert rb.read_batch() == [var_payload(seq, size) for seq, size in enumerate(sizes)]
    assert r.dropped == 0


@pytest.mark.kernel
def test_record_larger_than_a_page_wrapping_the_data_area(rig):
    ring = 4 * PAGE  # three 5008-byte records fit; they straddle the end as positions advance
    r = rig(ring)
    payloads = [os.urandom(BIG_RECORD) for _ in range(20)]
    got = []  # type: List[bytes]
    straddled = 0
    with r.reader() as rb:
        for i, payload in enumerate(payloads):
            pos = rb.producer_pos
            straddled += (pos & (ring - 1)) + record_stride(BIG_RECORD) > ring
            r.emit_big(payload)
            if i % 2:
                got += rb.read_batch()
        got += rb.read_batch()
    assert straddled >= 3, "the test should make records straddle the end of the data area"
    assert got == payloads
    assert r.dropped == 0


@pytest.mark.kernel
def test_wrap_around_many_times(rig):
    ring = 2 * PAGE
    r = rig(ring)
    got = []  # type: List[bytes]
    variable = []  # type: List[Tuple[int, int]]
    with r.reader() as rb:
        for batch in range(60):  # 60 * 40 * 72 bytes: about 21 times the ring
            r.lib.rb_emit_many(batch * 40, 40, 0)
            got += rb.read_batch()
        assert rb.producer_pos > 20 * ring
        for seq in range(400):  # odd sizes wrap at odd places
            size = (seq * 37) % 256
            r.lib.rb_emit_var(seq, size)
            variable.append((seq, size))
            if seq % 9 == 8:
                got += rb.read_batch()
        got += rb.read_batch()
    expected = [seq_payload(i) for i in range(2400)] + [var_payload(s, n) for s, n in variable]
    assert got == expected
    assert r.dropped == 0


@pytest.mark.kernel
def test_full_ring_keeps_what_fits_and_producers_count_the_rest(rig):
    ring = 2 * PAGE
    r = rig(ring)
    produced = 500
    r.lib.rb_emit_many(0, produced, 0)
    fits = (ring - 1) // record_stride(SEQ_RECORD)  # the kernel keeps prod - cons < size
    with r.reader() as rb:
        received = rb.read_batch()
        assert received == [seq_payload(i) for i in range(fits)]
        assert produced == len(received) + r.dropped
        r.lib.rb_emit_many(1000, 10, 0)  # space is back once consumed
        assert rb.read_batch() == [seq_payload(i) for i in range(1000, 1010)]
    assert r.dropped == produced - fits


@pytest.mark.kernel
def test_poll_times_out_without_data_and_wakes_on_a_record(rig):
    r = rig()
    with r.reader() as rb:
        start = time.monotonic()
        assert rb.poll(0.1) is False
        waited = time.monotonic() - start
        assert 0.09 <= waited < 0.5
        r.lib.rb_emit(7, 0)
        start = time.monotonic()
        assert rb.poll(2.0) is True
        assert time.monotonic() - start < 0.5
        assert rb.read_batch() == [seq_payload(7)]
        assert rb.poll(0) is False


@pytest.mark.kernel
def test_poll_wakes_for_a_record_produced_while_waiting(rig):
    import threading

    r = rig()
    with r.reader() as rb:
        timer = threading.Timer(0.2, r.lib.rb_emit, (9, 0))
        timer.start()
        try:
            start = time.monotonic()
            assert rb.poll(5.0) is True
            assert time.monotonic() - start < 2.0
        finally:
            timer.join()
        assert rb.read_batch() == [seq_payload(9)]


@pytest.mark.kernel
def test_records_iterator_ends_after_quiet_timeout(rig):
    r = rig()
    r.lib.rb_emit_many(0, 10, 0)
    with r.reader() as rb:
        assert seqs(list(rb.records(timeout_s=0.05))) == list(range(10))


@pytest.mark.kernel
def test_leaving_the_records_iterator_early_loses_nothing(rig):
    r = rig()
    r.lib.rb_emit_many(0, 10, 4)
    with r.reader() as rb:
        taken = []  # type: List[bytes]
        for record in rb.records(timeout_s=0.05):
            taken.append(record)
            if len(taken) == 3:
                break
        assert seqs(taken) == [1, 2, 3]
        assert seqs(rb.read_batch()) == [5, 6, 7, 9]


@pytest.mark.kernel
def test_consume_limits_and_default_callback(rig):
    r = rig()
    r.lib.rb_emit_many(0, 10, 0)
    got = []  # type: List[bytes]
    with r.reader(callback=got.append) as rb:
        assert rb.consume(max_records=4) == 4
        assert seqs(got) == [0, 1, 2, 3]
        assert rb.read_batch(max_records=3) == [seq_payload(i) for i in (4, 5, 6)]
        assert rb.consume() == 3
    assert seqs(got) == [0, 1, 2, 3, 7, 8, 9]


@pytest.mark.kernel
def test_callback_error_keeps_records_after_it(rig):
    r = rig()
    r.lib.rb_emit_many(0, 5, 0)

    def fail_on_two(record: bytes) -> None:
        if seqs([record]) == [2]:
            raise RuntimeError("boom")

    with r.reader() as rb:
        with pytest.raises(RuntimeError):
            rb.consume(fail_on_two)
        assert seqs(rb.read_batch()) == [3, 4]


@pytest.mark.kernel
def test_close_drains_what_remains(rig):
    r = rig()
    rb = r.reader()
    r.lib.rb_emit_many(0, 6, 2)
    assert seqs(rb.close()) == [1, 3, 5]
    assert rb.closed and rb.close() == []
    with pytest.raises(ValueError):
        rb.read_batch()

    got = []  # type: List[bytes]
    with r.reader(callback=got.append):
        r.lib.rb_emit_many(10, 3, 0)
    assert seqs(got) == [10, 11, 12]

    r.lib.rb_emit_many(20, 3, 0)
    assert r.reader().close(drain=False) == []
    assert seqs(r.reader().close()) == [20, 21, 22]  # left in the ring, not lost


@pytest.mark.kernel
def test_drain_frames_and_fixed_after_wraps_with_discards(rig):
    ring = 2 * PAGE
    r = rig(ring)
    frames = []  # type: List[bytes]
    payloads = []  # type: List[bytes]
    with r.reader() as rb:
        for batch in range(30):
            r.lib.rb_emit_many(batch * 50, 50, 7)
            if batch % 2:
                payloads.append(rb.drain_fixed(SEQ_RECORD))
            else:
                frames.append(rb.drain_frames(SEQ_RECORD))
        assert rb.available() == 0
    kept = [i for i in range(1500) if i % 7]
    from_frames = [fields for chunk in frames for fields in struct.iter_unpack("=8x8Q", chunk)]
    from_payloads = [fields for chunk in payloads for fields in struct.iter_unpack("=8Q", chunk)]
    got = sorted(from_frames + from_payloads)
    assert [fields[0] for fields in got] == kept
    assert all(struct.pack("=8Q", *fields) == seq_payload(fields[0]) for fields in got)
    headers = [struct.unpack_from("=I", chunk, off)[0] for chunk in frames
               for off in range(0, len(chunk), record_stride(SEQ_RECORD))]
    assert set(headers) == {SEQ_RECORD}


@pytest.mark.kernel
def test_drain_frames_stops_at_a_record_of_another_size(rig):
    r = rig()
    r.lib.rb_emit_many(0, 3, 0)
    r.lib.rb_emit_var(99, 24)
    r.lib.rb_emit_many(3, 2, 0)
    with r.reader() as rb:
        frames = rb.drain_frames(SEQ_RECORD)  # the records before the odd one
        assert [f[0] for f in struct.iter_unpack("=8x8Q", frames)] == [0, 1, 2]
        with pytest.raises(DecodeError):
            rb.drain_frames(SEQ_RECORD)
        assert rb.read_batch() == [var_payload(99, 24), seq_payload(3), seq_payload(4)]


# -- protocol tests on a memfd laid out like the ring's mapping (no kernel ring, no root) -----

class FakeRing:
    """A memfd with the ring's mmap layout; the test plays the kernel producer.

    Offset 0: consumer page; offset PAGE: producer page; offset 2 * PAGE: the data area,
    followed by its second copy (each write goes to both, as the kernel's double map shows).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("fake_ringbuf")
        os.ftruncate(self.fd, 2 * PAGE + 2 * size)
        self.prod = 0

    def _write_data(self, pos: int, raw: bytes) -> None:
        for copy in (0, self.size):
            index = pos & (self.size - 1)
            first = raw[:self.size - index]
            os.pwrite(self.fd, first, 2 * PAGE + copy + index)
            if len(first) < len(raw):  # wraps: the rest continues at the start of this copy
                os.pwrite(self.fd, raw[len(first):], 2 * PAGE + copy)

    def reserve(self, length: int) -> int:
        """Write a BUSY header for a `length`-byte payload and publish producer_pos."""
        pos = self.prod
        self._write_data(pos, struct.pack("=II", length | BUSY_BIT, 0))
        self.prod += record_stride(length)
        os.pwrite(self.fd, struct.pack("=Q", self.prod), PAGE)
        return pos

    def commit(self, pos: int, payload: bytes, discard: bool = False) -> None:
        self._write_data(pos + HEADER_SIZE, payload)
        self._write_data(pos, struct.pack("=I", len(payload) | (DISCARD_BIT if discard else 0)))

    def add(self, payload: bytes, discard: bool = False) -> None:
        self.commit(self.reserve(len(payload)), payload, discard)

    @property
    def consumer_pos(self) -> int:
        return struct.unpack("=Q", os.pread(self.fd, 8, 0))[0]

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def fake():
    ring = FakeRing(PAGE)
    yield ring
    ring.close()


def test_stops_at_a_busy_record_and_resumes_after_commit(fake):
    rb = RingBuffer(fake.fd, fake.size)
    fake.add(b"a" * 5)
    busy = fake.reserve(16)
    fake.add(b"c" * 8)  # committed after a busy one: must wait its turn
    assert rb.read_batch() == [b"a" * 5]
    assert rb.consumer_pos == busy
    assert rb.read_batch() == []
    assert rb.drain_frames(16) == b""
    fake.commit(busy, b"b" * 16)
    assert rb.read_batch() == [b"b" * 16, b"c" * 8]
    assert fake.consumer_pos == fake.prod
    rb.close()


def test_drain_frames_stops_at_busy_and_skips_discarded(fake):
    rb = RingBuffer(fake.fd, fake.size)
    fake.add(b"\x01" * 16)
    fake.add(b"\x02" * 16, discard=True)
    fake.add(b"\x03" * 24, discard=True)  # another size, but discarded: skipped
    fake.add(b"\x04" * 16)
    busy = fake.reserve(16)
    fake.add(b"\x05" * 16)
    frames = rb.drain_frames(16)
    assert [f[1][:1] for f in struct.iter_unpack("=I4x16s", frames)] == [b"\x01", b"\x04"]
    assert rb.consumer_pos == busy
    fake.commit(busy, b"\x06" * 16)
    assert rb.drain_fixed(16) == b"\x06" * 16 + b"\x05" * 16
    rb.close()


def test_bad_sizes_are_refused(fake):
    with pytest.raises(ValueError):
        RingBuffer(fake.fd, 3 * PAGE)
    rb = RingBuffer(fake.fd, fake.size)
    for bad in (0, 12, -8, fake.size):
        with pytest.raises(ValueError):
            rb.drain_frames(bad)
    rb.close()


record_lists = st.lists(st.tuples(st.integers(0, 600), st.booleans()), max_size=60)


@settings(max_examples=150, deadline=None)
@given(records=record_lists, drain_every=st.integers(1, 7))
def test_any_record_sequence_is_read_back_exactly(records, drain_every):
    fake = FakeRing(PAGE)
    rb = RingBuffer(fake.fd, fake.size)
    try:
        got, want = [], []  # type: Tuple[List[bytes], List[bytes]]
        for i, (length, discard) in enumerate(records):
            payload = bytes([i % 251 + 1]) * length
            if fake.prod + record_stride(length) - fake.consumer_pos >= fake.size:
                got += rb.read_batch()  # full: the kernel would refuse; consume first
            fake.add(payload, discard)
            if not discard:
                want.append(payload)
            if i % drain_every == 0:
                got += rb.read_batch()
        got += rb.read_batch()
        assert got == want
        assert rb.available() == 0
    finally:
        rb.close()
        fake.close()


@settings(max_examples=100, deadline=None)
@given(flags=st.lists(st.booleans(), max_size=200), chunk=st.integers(1, 60))
def test_fixed_frames_match_general_reader(flags, chunk):
    fake = FakeRing(PAGE)
    rb = RingBuffer(fake.fd, fake.size)
    try:
        got, want = [], []  # type: Tuple[List[bytes], List[bytes]]
        for i, discard in enumerate(flags):
            payload = struct.pack("=QQ", i, ~i & 0xFFFFFFFFFFFFFFFF)
            fake.add(payload, discard)
            if not discard:
                want.append(payload)
            if i % chunk == 0:
                got += [p for (p,) in struct.iter_unpack("=16s", rb.drain_fixed(16))]
        got += [p for (p,) in struct.iter_unpack("=8x16s", rb.drain_frames(16))]
        assert got == want
    finally:
        rb.close()
        fake.close()
