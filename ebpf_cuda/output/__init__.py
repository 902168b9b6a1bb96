"""Ways to present events. Each is a `Sink`: the CLI hands every decoded batch to each sink
it built, then closes them (when summaries and reports are written)."""
import sys
from typing import IO, Callable, Iterable, List, Optional

from ..events import Decoder, Event

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


class LineWriter:
    """A sink writing one or more lines per event (text, JSON Lines). Subclasses give
    `lines(events)` and `_frame_lines(decoder)`, the same lines straight from ring frames
    (output/lines.py), which the CLI uses when the writer is the only output."""

    def __init__(self, stream: IO[str], namer: Optional[Callable] = None) -> None:
        self.stream = stream
        self.namer = namer  # KernelNamer or a namer(event, address) -> name or None
        self._from_frames = None

    def header(self) -> None:
        """No header by default."""

    def lines(self, events: Iterable[Event]) -> List[str]:
        raise NotImplementedError

    def _frame_lines(self, decoder: Decoder):
        raise NotImplementedError

    def write(self, events: Iterable[Event]) -> None:
        self._emit(self.lines(events))

    def write_frames(self, frames: bytes, decoder: Decoder) -> None:
        """Write a batch of ring frames without decoding them into events (the fast path;
        `namer` must then have `name_for`, as KernelNamer and FoundNames do, or be None)."""
        from .lines import frame_chunks

        if self._from_frames is None:
            self._from_frames = self._frame_lines(decoder)
        for chunk in frame_chunks(frames):
            self._emit(self._from_frames.lines(chunk))

    def _emit(self, lines: List[str]) -> None:
        if lines:
            self.stream.write("\n".join(lines))
            self.stream.write("\n")

    def close(self) -> None:
        """Flush; close the stream unless it is stdout or stderr."""
        finish(self.stream)
