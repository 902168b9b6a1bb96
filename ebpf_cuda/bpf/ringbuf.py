"""Reading a BPF ring buffer (`BPF_MAP_TYPE_RINGBUF`) from user space.

Layout (kernel `ringbuf.c`): offset 0 of the map fd is the consumer page (we write
`consumer_pos` there), offset one page is the producer page (`producer_pos`), followed by the
data area. The kernel lets a reader map the data area twice back to back, so that a record
wrapping past the end is contiguous; we map it once and join the two pieces of such a record
ourselves, because every page of a mapping counts in our RSS (a second copy of a 4 MiB ring
is 4 MiB more). Positions are ever-growing byte counters; `pos & (size - 1)` indexes the data
area.

Each record is an 8-byte header, `len` (u32: payload length in bits 0-29, BUSY bit 31 while
the producer writes it, DISCARD bit 30 if it was dropped) and a kernel-internal `pg_off`,
followed by the payload, padded so the next header is 8-byte aligned.

Ordering: positions and `len` words are each read as one aligned load through a typed
memoryview (never assembled from byte slices) and a payload is copied only after its `len`
was seen without BUSY; `consumer_pos` is published with one aligned store after a batch. On
x86-64 (TSO) plain aligned loads and stores carry acquire/release semantics, which is what the
protocol needs.

A `RingBuffer` does not own the map fd: the map object that created it closes it.
Not thread-safe: use one reader per ring.
"""
import mmap
import select
import struct
from typing import Any, Callable, Iterator, List, Optional

from ..errors import DecodeError, KernelError

BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
LEN_MASK = DISCARD_BIT - 1
HEADER_SIZE = 8

Callback = Callable[[bytes], Any]


def record_stride(payload_len: int) -> int:
    """Bytes one record with a `payload_len`-byte payload occupies in the ring (header included)."""
    return (payload_len + HEADER_SIZE + 7) & ~7


def _check_size(size: int, page_size: int) -> None:
    if size <= 0 or size & (size - 1) or size % page_size:
        raise ValueError("ring buffer size must be a power of two and a multiple of the page "
                         "size (%d), got %d" % (page_size, size))


def _map(fd: int, length: int, prot: int, offset: int, what: str) -> mmap.mmap:
    try:
        return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=prot, offset=offset)
    except OSError as err:
        raise KernelError("could not mmap the ring buffer %s (fd %d, %d bytes at offset %d): %s"
                          % (what, fd, length, offset, err.strerror), err.errno or 0) from err


def _matching_prefix(got: bytes, want: bytes) -> int:
    """How many leading 4-byte words of `got` equal those of `want` (binary search, memcmp)."""
    got_view, want_view = memoryview(got), memoryview(want)
    low, high = 0, len(got) // 4
    while low < high:
        mid = (low + high + 1) // 2
        if got_view[:4 * mid] == want_view[:4 * mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _committed_run(words: memoryview, off: int, count: int, step: int, expected: bytes) -> int:
    """How many of the `count` records from data offset `off` (`step` words apart) are
    committed with the expected header: their headers in one strided copy, compared in C."""
    first = off >> 2
    headers = words[first:first + count * step:step]
    try:
        got = headers.tobytes()  # one aligned 4-byte load per header
    finally:
        headers.release()
    want = expected[:4 * count]
    return count if got == want else _matching_prefix(got, want)


def _past_untaken(hdr: int, record_size: int, cons: int, taken_some: bool) -> Optional[int]:
    """At a record `drain_frames` did not take (header `hdr`, at position `cons`): how far to
    move on (a discarded record's stride; 0 to look again), or None to stop the batch.
    A record of another size raises DecodeError unless records were taken before it."""
    if hdr & BUSY_BIT:
        return None
    if hdr & DISCARD_BIT:
        return record_stride(hdr & LEN_MASK)
    if hdr == record_size:
        return 0  # was BUSY when the headers were read, committed since
    if taken_some:
        return None  # hand over what came before; the next call reports this one
    raise DecodeError("ring buffer record at position %d has a %d-byte payload, "
                      "expected %d" % (cons, hdr & LEN_MASK, record_size))


class RingBuffer:
    """A consumer of one BPF ring buffer map.

    `size` is the map's `max_entries` (data area bytes). `callback`, if given, is the default
    for `consume()` and receives whatever `close()` drains.
    """

    def __init__(self, map_fd: int, size: int, callback: Optional[Callback] = None) -> None:
        page = mmap.PAGESIZE
        _check_size(size, page)
        self.map_fd = map_fd
        self.size = size
        self.page_size = page
        self.callback = callback
        self._mask = size - 1
        self._closed = False
        self._expected_headers = {}  # type: Dict[int, bytes]
        self._consumer_map = _map(map_fd, page, mmap.PROT_READ | mmap.PROT_WRITE, 0,
                                  "consumer page")
        try:
            self._data_map = _map(map_fd, page + size, mmap.PROT_READ, page,
                                  "producer page and data")
        except KernelError:
            self._consumer_map.close()
            raise
        self._consumer_words = memoryview(self._consumer_map).cast("Q")
        self._data_qwords = memoryview(self._data_map).cast("Q")  # [0] is producer_pos
        self._data_words = memoryview(self._data_map).cast("I")  # record `len` words
        self._epoll = None  # type: Optional[select.epoll]  # created by the first wait
        self._data_end = page + size  # offset of the data area's end in our mapping

    def _bytes_at(self, off: int, length: int) -> bytes:
        """`length` bytes from mapping offset `off`, wrapping past the data area's end."""
        end, data = off + length, self._data_map
        if end <= self._data_end:
            return data[off:end]
        return data[off:self._data_end] + data[self.page_size:self.page_size + end - self._data_end]

    @classmethod
    def from_map(cls, ring_map: Any, callback: Optional[Callback] = None) -> "RingBuffer":
        """A reader for a `maps.RingBufMap` (anything with `.fd` and `.size`)."""
        return cls(ring_map.fd, ring_map.size, callback)

    # -- positions ---------------------------------------------------------------------------

    @property
    def consumer_pos(self) -> int:
        """Bytes consumed so far (ever-growing counter)."""
        return self._consumer_words[0]

    @property
    def producer_pos(self) -> int:
        """Bytes reserved by producers so far (ever-growing counter)."""
        return self._data_qwords[0]

    def available(self) -> int:
        """Bytes (headers and padding included) between the consumer and producer positions."""
        return self._data_qwords[0] - self._consumer_words[0]

    def fileno(self) -> int:
        """The map fd: readable (EPOLLIN) while unconsumed data remains."""
        return self.map_fd

    # -- waiting -----------------------------------------------------------------------------

    def poll(self, timeout_s: Optional[float] = None) -> bool:
        """Wait up to `timeout_s` seconds (None: forever) for data; True if some is pending.

        Returns at once, without a syscall, while unconsumed bytes remain (possibly a record
        still being written, which `consume()` then leaves for the next round).
        """
        if self.available() > 0:
            return True
        if self._epoll is None:
            self._epoll = self._open_epoll()
        events = self._epoll.poll(-1 if timeout_s is None else timeout_s)
        return bool(events) or self.available() > 0

    def _open_epoll(self) -> "select.epoll":
        waiter = select.epoll()
        try:
            waiter.register(self.map_fd, select.EPOLLIN)
        except OSError as err:
            waiter.close()
            raise KernelError("cannot wait on ring buffer fd %d with epoll: %s"
                              % (self.map_fd, err.strerror), err.errno or 0) from err
        return waiter

    # -- variable-size records ---------------------------------------------------------------

    def consume(self, callback: Optional[Callback] = None,
                max_records: Optional[int] = None) -> int:
        """Hand every committed record to `callback(bytes)`, in ring order; returns the count.

        Stops at the first record still being written (BUSY) and, if given, after
        `max_records`. Discarded records are skipped. If the callback raises, the records
        handed over so far (including that one) count as consumed.
        """
        sink = callback or self.callback
        if sink is None:
            raise ValueError("consume() needs a callback (none given and no default set)")
        return self._drain(sink, -1 if max_records is None else max_records)

    def read_batch(self, max_records: Optional[int] = None) -> List[bytes]:
        """Every committed record (at most `max_records`) as a list of bytes."""
        out = []  # type: List[bytes]
        self._drain(out.append, -1 if max_records is None else max_records)
        return out

    def records(self, timeout_s: Optional[float] = None) -> Iterator[bytes]:
        """Yield records as they arrive; ends once none arrives for `timeout_s` seconds.

        Each record is marked consumed as it is yielded, so leaving the loop early loses
        nothing: the next read starts with the record after the last one yielded.
        """
        while True:
            got = False
            for record in self._each_ready():
                got = True
                yield record
            if not got and not self.poll(timeout_s):
                return

    def _each_ready(self) -> Iterator[bytes]:
        """Committed records one by one, publishing consumer_pos before each yield."""
        if self._closed:
            raise ValueError("ring buffer is closed")
        words = self._data_words
        producer, consumer = self._data_qwords, self._consumer_words
        mask, base = self._mask, self.page_size
        while True:
            cons = consumer[0]  # re-read: other reads may have run while we were suspended
            if cons >= producer[0]:
                return
            off = base + (cons & mask)
            hdr = words[off >> 2]
            if hdr & BUSY_BIT:
                return
            consumer[0] = cons + (((hdr & LEN_MASK) + 15) & ~7)
            if not hdr & DISCARD_BIT:
                yield self._bytes_at(off + 8, hdr)

    def _drain(self, sink: Callback, limit: int) -> int:
        if self._closed:
            raise ValueError("ring buffer is closed")
        if limit == 0:
            return 0
        # The hot loop touches only locals: attribute lookups cost more than the work.
        data, words, data_end = self._data_map, self._data_words, self._data_end
        producer, consumer = self._data_qwords, self._consumer_words
        mask, base = self._mask, self.page_size
        count = 0
        cons = consumer[0]
        try:
            while True:
                prod = producer[0]
                if cons >= prod:
                    return count
                while cons < prod:
                    off = base + (cons & mask)
                    hdr = words[off >> 2]
                    if hdr < DISCARD_BIT:  # the common case: no flag set, hdr is the length
                        cons += (hdr + 15) & ~7  # header + payload, rounded up to 8
                        off += 8
                        sink(data[off:off + hdr] if off + hdr <= data_end
                             else self._bytes_at(off, hdr))
                        count += 1
                        if count == limit:
                            return count
                    elif hdr & BUSY_BIT:
                        return count  # committed out of order: wait for this one, never skip
                    else:
                        cons += ((hdr & LEN_MASK) + 15) & ~7  # discarded: skip it
                consumer[0] = cons  # publish each pass so producers get the space back early
        finally:
            consumer[0] = cons

    # -- fixed-size records ------------------------------------------------------------------

    def drain_frames(self, record_size: int, max_records: Optional[int] = None) -> bytes:
        """All committed records of payload size `record_size` as one bytes object of frames
        (up to where the producers were when it was called).

        Each frame is the 8-byte header followed by the payload, so a decoder reads them all
        with `struct.iter_unpack("=8x" + payload_format, frames)`: one copy, no per-record
        Python work. `record_size` must be a positive multiple of 8 (frames are then
        back to back). `max_records` bounds the batch (and so the memory it takes).
        Discarded records are left out; draining stops at a BUSY record. A record wrapping
        the end of the data area is joined from its two pieces (the data is mapped once).
        A committed record of another size ends the batch; when it is the first one,
        `DecodeError` is raised (it and those after it stay in the ring for `consume()`).
        """
        stride = self._fixed_stride(record_size)
        if self._closed:
            raise ValueError("ring buffer is closed")
        expected = self._expected(record_size, stride)
        data, words = self._data_map, self._data_words
        producer, consumer = self._data_qwords, self._consumer_words
        mask, base = self._mask, self.page_size
        step = stride // 4
        chunks = []  # type: List[bytes]
        taken = 0
        cons = consumer[0]
        # (what the producers had written at the call: read once, not again each pass, else
        # a reader chasing a fast producer walks a few records a pass, each pass costing
        # about as much as a long run: the rest is the next call's)
        prod = producer[0]
        try:
            while True:
                if cons >= prod:
                    break
                off = base + (cons & mask)
                # the records that lie whole before the data area's end
                count = min((prod - cons) // stride, (self._data_end - off) // stride)
                if max_records is not None:
                    if taken >= max_records:
                        break
                    count = min(count, max_records - taken)
                if count == 0 and prod - cons >= stride and words[off >> 2] == record_size:
                    chunks.append(self._bytes_at(off, stride))  # a record wrapping the end
                    cons += stride
                    taken += 1
                    continue
                good = _committed_run(words, off, count, step, expected) if count else 0
                if good:
                    chunks.append(data[off:off + good * stride])  # copied after the headers
                    cons += good * stride
                    taken += good
                    continue
                skip = _past_untaken(words[off >> 2], record_size, cons, bool(chunks))
                if skip is None:
                    break
                cons += skip
        finally:
            consumer[0] = cons
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def drain_fixed(self, record_size: int) -> bytes:
        """Like `drain_frames` but with the headers stripped: payloads back to back.

        Costs one extra pass of strided copies (done in C); prefer `drain_frames` with an
        `8x` pad in the struct format when speed matters.
        """
        frames = self.drain_frames(record_size)
        count = len(frames) // (record_size + HEADER_SIZE)
        if not count:
            return b""
        words_per_record = record_size // 8
        payloads = bytearray(count * record_size)
        source = memoryview(frames).cast("Q")
        target = memoryview(payloads).cast("Q")
        try:
            for word in range(words_per_record):
                # word `word` of every payload: skip the 1-word header of each frame
                target[word::words_per_record] = source[word + 1::words_per_record + 1]
        finally:
            source.release()
            target.release()
        return bytes(payloads)

    def _fixed_stride(self, record_size: int) -> int:
        if record_size <= 0 or record_size % 8:
            raise ValueError("fixed records need a payload size that is a positive multiple "
                             "of 8, got %d" % record_size)
        if record_size + HEADER_SIZE > self.size:
            raise ValueError("a %d-byte record does not fit in a %d-byte ring"
                             % (record_size, self.size))
        return record_size + HEADER_SIZE

    def _expected(self, record_size: int, stride: int) -> bytes:
        """`len` words of `size // stride` committed, kept records of this size (cached)."""
        cached = self._expected_headers.get(record_size)
        if cached is None:
            cached = struct.pack("=I", record_size) * (self.size // stride + 1)
            self._expected_headers[record_size] = cached
        return cached

    # -- lifetime ----------------------------------------------------------------------------

    def close(self, drain: bool = True) -> List[bytes]:
        """Unmap the ring; first, unless `drain` is False, read what remains.

        Remaining records go to the default callback if one was given, else they are
        returned. Closing twice is harmless. The map fd stays open.
        """
        if self._closed:
            return []
        remaining = []  # type: List[bytes]
        try:
            if drain:
                if self.callback is not None:
                    self._drain(self.callback, -1)
                else:
                    self._drain(remaining.append, -1)
        finally:
            self._release()
        return remaining

    def _release(self) -> None:
        self._closed = True
        for view in (self._consumer_words, self._data_qwords, self._data_words):
            view.release()
        self._consumer_map.close()
        self._data_map.close()
        if self._epoll is not None:
            self._epoll.close()

    @property
    def closed(self) -> bool:
        """Whether `close()` has run."""
        return self._closed

    def __enter__(self) -> "RingBuffer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
