"""Ways to present events. Each is a `Sink`: the CLI hands every decoded batch to each sink
it built, then closes them (when summaries and reports are written)."""
import errno
import os
import select
import stat
import sys
from typing import IO, TYPE_CHECKING, Callable, Iterable, List, NamedTuple, Optional

from ..decode.events import Decoder, Event

if TYPE_CHECKING:
    from ..decode.devices import DeviceTracker
    from ..decode.graphs import GraphTracker
    from ..gpu.feed import GpuFeed
    from ..targets.containers import Containers

PIPE_BUF = getattr(select, "PIPE_BUF", 4096)  # a pipe takes a write this long in one piece
FILE_WRITE = 1 << 16  # bytes of whole lines per write to a regular file

try:
    from typing import Protocol
except ImportError:  # Python 3.7 and older have no Protocol; a plain base class does
    Protocol = object  # type: ignore


class Sink(Protocol):
    """Receives batches of events."""

    def header(self) -> None:
        """Called once before the first batch."""

    def write(self, events: List[Event]) -> None:
        """Called with each batch, in order."""

    def close(self) -> None:
        """Called once at the end (flush, write summaries, close files)."""


def finish(stream: IO[str]) -> None:
    """Flush `stream`; close it unless it is stdout or stderr."""
    if stream in (sys.stdout, sys.stderr):
        stream.flush()
    else:
        stream.close()


class DecodeContext(NamedTuple):
    """What the reader knows besides the records, for a line writer: given once, by whoever
    builds the outputs (Stream.deliver binds every line writer it is handed)."""

    # The enrichers (names, graphs, communicators, containers, devices, Python stacks): what
    # records formatted from frames but decoded on the slow path get, as decoded events do.
    annotate: Optional[Callable[[List[Event]], None]] = None
    detour: Optional["GraphTracker"] = None  # which records take the slow path (lines.py)
    containers: Optional["Containers"] = None  # lines name them (text: not the tracer's own)
    devices: Optional["DeviceTracker"] = None  # JSON lines show each call's device
    namer: Optional[Callable] = None  # replaces the writer's (behind a spool: FoundNames)
    # The GPU's samples and events as they come, written among the calls (gpu/feed.py; one
    # feed a writer); None: all of them at the end (`note_gpu`)
    gpu: Optional["GpuFeed"] = None


class LineWriter:
    """A sink writing one or more lines per event (text, JSON Lines). Subclasses give
    `lines(events)` and `_frame_lines(decoder)`, the same lines straight from ring frames
    (output/lines.py, given this writer's `context`), which the CLI uses when the writer is
    the only output."""

    def __init__(self, stream: IO[str], namer: Optional[Callable] = None) -> None:
        self.stream = stream
        self.namer = namer  # KernelNamer or a namer(event, address) -> name or None
        self.context = DecodeContext()  # (`bind`)
        self._from_frames = None
        self._fd: Optional[int] = None  # the stream's file descriptor (-1: none, use write)
        self._chunk = FILE_WRITE
        self._encoding = "utf-8"

    def bind(self, context: DecodeContext) -> None:
        """What the reader knows besides the records (once, before the first batch)."""
        self.context = context
        if context.namer is not None:
            self.namer = context.namer

    def header(self) -> None:
        """No header by default."""

    def lines(self, events: Iterable[Event]) -> List[str]:
        raise NotImplementedError

    def _frame_lines(self, decoder: Decoder):
        raise NotImplementedError

    def write(self, events: Iterable[Event]) -> None:
        feed = self.context.gpu
        if feed is None:
            self._emit(self.lines(events))
            return
        for piece, due in feed.split_events(list(events)):
            self._emit(self.lines(piece))
            self._emit(self.gpu_lines(due))

    def gpu_lines(self, records: List) -> List[str]:
        """Lines of the GPU's records (gpu/records.py): none by default."""
        return []

    def note_gpu(self, records: List) -> None:
        """At the end of the trace: the GPU's records not written among the calls yet (with
        a feed), or all of them (`records`, in time order)."""
        if self.context.gpu is not None:
            records = self.context.gpu.rest()
        self._emit(self.gpu_lines(records))

    def slow_lines(self, events: List[Event]) -> List[str]:
        """Lines of records the frame templates do not cover, decoded into events."""
        if self.context.annotate is not None:
            self.context.annotate(events)
        return self.lines(events)

    def prepare(self, decoder: Decoder) -> None:
        """Compile the frame templates now, for `write_frames` with this decoder (before the
        trace starts: a failure then, such as too many open files, is no write error)."""
        if self._from_frames is None:
            from . import lines  # noqa: F401 (imported now, not at the first batch)

            self._from_frames = self._frame_lines(decoder)

    def write_frames(self, frames: bytes, decoder: Decoder) -> None:
        """Write a batch of ring frames without decoding them into events (the fast path;
        `namer` must then have `name_for`, as KernelNamer and FoundNames do, or be None)."""
        from .lines import frame_chunks

        if self._from_frames is None:
            self._from_frames = self._frame_lines(decoder)
        feed = self.context.gpu
        for chunk in frame_chunks(frames):
            if feed is None:
                self._emit(self._from_frames.lines(chunk))
                continue
            for piece, due in feed.split_frames(chunk):
                if piece:
                    self._emit(self._from_frames.lines(piece))
                self._emit(self.gpu_lines(due))

    def _emit(self, lines: List[str]) -> None:
        """Whole lines: on a file descriptor, each write ends at a line's end, and is at
        most PIPE_BUF bytes when it is not a regular file (a pipe or terminal shared with
        the traced program, whose output then falls between lines, never inside one)."""
        if not lines:
            return
        text = "\n".join(lines) + "\n"
        fd = self._fd if self._fd is not None else self._target()
        if fd < 0:
            self.stream.write(text)
            return
        self.stream.flush()  # what the stream holds (a header) goes first
        write_lines(fd, text.encode(self._encoding, "backslashreplace"), self._chunk)

    def _target(self) -> int:
        """The stream's file descriptor and how much to write at once (first use)."""
        try:
            fd = self.stream.fileno()
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except (AttributeError, OSError, ValueError):
            fd, regular = -1, False
        self._fd, self._chunk = fd, FILE_WRITE if regular else PIPE_BUF
        self._encoding = getattr(self.stream, "encoding", None) or "utf-8"
        return fd

    def close(self) -> None:
        """Flush; close the stream unless it is stdout or stderr."""
        finish(self.stream)


def write_lines(fd: int, data: bytes, limit: int = PIPE_BUF) -> None:
    """Write `data` (whole lines) to `fd` in writes of at most `limit` bytes that each end
    at a line's end (a line longer than `limit` in one write of its own). A short write is
    finished, a non-blocking descriptor (shared with a program that made it so) waited
    for; OSError for a write the system refuses (ENOSPC, EPIPE, EFBIG, EIO)."""
    start, size = 0, len(data)
    view = memoryview(data)
    while start < size:
        end = start + limit
        if end >= size:
            end = size
        else:
            cut = data.rfind(b"\n", start, end)
            if cut < 0:
                cut = data.find(b"\n", end)
                end = size if cut < 0 else cut + 1
            else:
                end = cut + 1
        _write_all(fd, view[start:end])
        start = end


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        try:
            done = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
            continue
        if done <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[done:]
