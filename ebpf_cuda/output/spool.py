"""A first-in first-out queue of ring frames on disk, between the ring reader and a slower
consumer (the text and JSON lines).

Formatting a line costs CPython microseconds, copying a frame a fraction of one; the ring
buffer holds a few MiB, tens of milliseconds at high call rates. So the reader only moves
frames from the ring into the spool, and a formatter thread takes them out in order. When
formatting falls behind, the backlog waits here, in an unlinked temporary file (page cache and
disk, not the tracer's memory), instead of in the ring: nothing is lost, the lines come later.
The file is a ring of `limit` bytes, the most backlog it may hold, so it never takes more
disk than that, also when the formatter stays behind for hours; it is emptied each time the
formatter catches up. Past `limit` bytes of backlog (or when the disk is full) batches are
dropped and counted.

A formatter that keeps up finds a batch or two waiting: those first `memory` bytes of backlog
are the reader's own batches, handed over as they are (no write to the file, no read back);
only a backlog past them goes to the file, and while the file holds some, every batch put
goes there after them (so the batches in memory are always the oldest: order is kept).

    spool = Spool(limit=1 << 30)
    reader:    spool.put(frames) ... spool.close()
    formatter: for frames in spool: ...
"""
import errno
import os
import threading
from collections import deque
from typing import Deque, Iterator, Optional, Tuple

from ..spec import record

DEFAULT_LIMIT = 2 << 30  # bytes of backlog: ~13M records, a minute at 200k calls/s behind
READ_BYTES = 2048 * record.FRAME_SIZE  # frames handed to the formatter at once
# Backlog kept in memory before the file (the CLI's spool): 3 full reader batches, ~6k
# calls (enough while the lines keep up; 4 MiB cost +4 MB of RSS when they were behind)
MEMORY = 1 << 20


class Spool:
    """Frames put by one thread, taken in order by another (see the module's docstring)."""

    def __init__(self, directory: Optional[str] = None, limit: int = DEFAULT_LIMIT,
                 memory: int = 0) -> None:
        self.limit = limit
        self.memory = memory  # bytes of backlog held in memory, before the file
        self._held: Deque[Tuple[bytes, int]] = deque()  # (frames, their calls), oldest first
        self._held_bytes = 0
        self._size = max(limit, 1)  # (the file's bytes: a ring; a frame's offset mod this)
        self._fd, self.where = _unnamed_file(directory)  # where: the file, in words (-v)
        self._ready = threading.Condition()
        self._head = 0  # next byte to take (an offset in the stream of frames put)
        self._tail = 0  # end of the frames put (likewise)
        self._calls = 0  # call records in the backlog (hello records are no events)
        self._closed = False
        self._abandoned = False
        self.dropped = 0  # calls not kept: past the limit, or the disk refused them
        self.error: Optional[str] = None  # why calls were dropped, besides the limit
        self.abandoned = 0  # calls left unread by abandon()

    @property
    def closed(self) -> bool:
        """True once `close()` or `abandon()` was called."""
        return self._closed

    @property
    def backlog(self) -> int:
        """Calls put and not yet taken."""
        return self._calls

    @property
    def waiting(self) -> bool:
        """Whether frames were put and not taken yet (hello records too)."""
        return self._tail != self._head or bool(self._held)

    def put(self, frames: bytes) -> None:
        """Append a batch of whole frames (dropped and counted when it does not fit)."""
        with self._ready:
            backlog = self._tail - self._head + self._held_bytes
            if self._abandoned or backlog + len(frames) > self.limit:
                self.dropped += record.call_count(frames)
                return
            if self._tail == self._head and self._held_bytes + len(frames) <= self.memory \
                    and len(frames) <= READ_BYTES:
                calls = record.call_count(frames)
                self._held.append((frames, calls))
                self._held_bytes += len(frames)
                self._calls += calls
                self._ready.notify()
                return
            try:
                self._write(frames, self._tail)
            except OSError as err:  # ENOSPC, EFBIG, EIO: counted as lost, not fatal
                self.dropped += record.call_count(frames)
                self.error = err.strerror
                return
            self._tail += len(frames)
            self._calls += record.call_count(frames)
            self._ready.notify()

    def _write(self, data: bytes, at: int) -> None:
        """`data` at offset `at` of the stream, in the ring (wrapping at its end). The bytes
        not taken yet are never overwritten: put lets the backlog hold `limit` at most."""
        start = at % self._size
        first = min(len(data), self._size - start)
        write_all_at(self._fd, memoryview(data)[:first], start)
        if first < len(data):
            write_all_at(self._fd, memoryview(data)[first:], 0)

    def _read(self, at: int, length: int) -> bytes:
        start = at % self._size
        first = min(length, self._size - start)
        data = os.pread(self._fd, first, start)
        return data + os.pread(self._fd, length - first, 0) if first < length else data

    def close(self) -> None:
        """No more frames will be put; iteration ends once the backlog is taken."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def abandon(self) -> None:
        """Stop now: iteration ends, the backlog is counted in `abandoned` (a second
        interrupt while the lines are still being written)."""
        with self._ready:
            self._abandoned = self._closed = True
            self.abandoned += self._calls
            self._calls = 0
            self._held.clear()
            self._held_bytes = 0
            self._head = self._tail
            self._ready.notify_all()

    def take(self) -> Optional[bytes]:
        """The next frames (up to READ_BYTES), waiting for them; None at the end."""
        with self._ready:
            while self._head == self._tail and not self._held and not self._closed:
                self._ready.wait()
            if self._held:  # (older than any in the file)
                frames, calls = self._held.popleft()
                self._held_bytes -= len(frames)
                self._calls -= calls
                return frames
            if self._head == self._tail:
                return None
            start, end = self._head, min(self._tail, self._head + READ_BYTES)
        frames = self._read(start, end - start)  # bytes the putter no longer touches
        calls = record.call_count(frames)
        with self._ready:
            if self._abandoned:
                return None
            self._head = end
            self._calls -= calls
            if self._head == self._tail:  # caught up: empty the file
                os.ftruncate(self._fd, 0)
                self._head = self._tail = 0
        return frames

    def __iter__(self) -> Iterator[bytes]:
        while True:
            frames = self.take()
            if frames is None:
                return
            yield frames

    def discard(self) -> None:
        """Close the file (its space is freed: it has no name)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_all_at(fd: int, data: bytes, offset: int) -> None:
    """All of `data` at `offset` of `fd`; a short write is retried, so a full disk raises
    (OSError: ENOSPC)."""
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        if done == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[done:], offset + done


def _unnamed_file(directory: Optional[str]) -> Tuple[int, str]:
    """A file without a name in `directory` (default $TMPDIR or /tmp): gone with its last
    descriptor, also when the tracer is killed. (fd, where it lives, in words).

    O_TMPFILE makes it nameless from the start. A file system that refuses O_TMPFILE (9p,
    some FUSE and network file systems, old kernels) gets a named file, created exclusively
    and unlinked at once: nameless too, except for the instant between the two calls (a
    tracer killed just then leaves an empty ebpf-cuda-spool-* file behind).
    """
    directory = directory or os.environ.get("TMPDIR") or "/tmp"
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        return fd, "an unnamed file (O_TMPFILE) in %s" % directory
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    import tempfile

    fd, name = tempfile.mkstemp(prefix="ebpf-cuda-spool-", dir=directory)  # 0600, O_EXCL
    try:
        os.unlink(name)
    except OSError:
        os.close(fd)
        raise
    return fd, ("%s, unlinked at once (%s refuses O_TMPFILE)"
                % (name, directory))
