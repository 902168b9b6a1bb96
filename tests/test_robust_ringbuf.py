"""Regression: a record that commits between the reader's two looks at its header is read.

bench/soak.py found it: `drain_frames` reads all headers in one strided copy, then re-reads the
first mismatching one alone. When the producer committed that record in between, the re-read
saw a committed record of the right size and `DecodeError("... has a 152-byte payload,
expected 152")` stopped the tracer. The race is replayed here deterministically on a memfd
laid out like the ring's mapping (consumer page, producer page, data area twice).
"""
import mmap
import os
import struct

from ebpf_cuda.bpf.ringbuf import BUSY_BIT, HEADER_SIZE, RingBuffer

PAGE = mmap.PAGESIZE
RECORD = 16


class CommitOnBulkRead:
    """Stands in for the reader's `len`-word view: the first strided (bulk) read sees the
    header BUSY, and the producer commits the record right after it."""

    def __init__(self, words: memoryview, commit) -> None:
        self.words, self.commit, self.done = words, commit, False

    def __getitem__(self, key):
        view = self.words[key]
        if isinstance(key, slice) and not self.done:
            outer = self

            class Snapshot:
                def tobytes(self) -> bytes:
                    raw = view.tobytes()
                    outer.done = True
                    outer.commit()
                    return raw

                def release(self) -> None:
                    view.release()

            return Snapshot()
        return view


def test_record_committed_between_header_reads_is_not_an_error():
    fd = os.memfd_create("robust_ring")
    try:
        os.ftruncate(fd, 2 * PAGE + 2 * PAGE)
        payload = struct.pack("=QQ", 7, 8)

        def write(offset: int, raw: bytes) -> None:
            for copy in (0, PAGE):
                os.pwrite(fd, raw, 2 * PAGE + copy + offset)

        write(0, struct.pack("=II", RECORD | BUSY_BIT, 0))  # reserved, not yet committed
        os.pwrite(fd, struct.pack("=Q", RECORD + HEADER_SIZE), PAGE)  # producer_pos

        def commit() -> None:
            write(HEADER_SIZE, payload)
            write(0, struct.pack("=I", RECORD))

        ring = RingBuffer(fd, PAGE)
        try:
            ring._data_words = CommitOnBulkRead(ring._data_words, commit)
            frames = ring.drain_frames(RECORD)
            frames += ring.drain_frames(RECORD)
            assert frames == struct.pack("=II", RECORD, 0) + payload
        finally:
            ring._data_words = ring._data_words.words
            ring.close(drain=False)
    finally:
        os.close(fd)
