"""JSON Lines: one object per event (keys: see `Event.to_json`)."""
import json
from typing import IO, Callable, Iterable, List, Optional

from ..events import Decoder, Event

Namer = Callable[[Event, int], Optional[str]]  # (event, address) -> kernel name


class JsonWriter:
    """Writes events as JSON Lines to a stream, in batches."""

    def __init__(self, stream: IO[str], namer: Optional[Namer] = None) -> None:
        self.stream = stream
        self.namer = namer  # launch events get a `kernel` key when it names their func
        self._encode = json.JSONEncoder(separators=(",", ":")).encode
        self._frame_lines = None

    def header(self) -> None:
        """JSON Lines has no header."""

    def lines(self, events: Iterable[Event]) -> List[str]:
        """The JSON lines of some events (no newlines)."""
        return [self._encode(self._object(ev)) for ev in events]

    def write(self, events: Iterable[Event]) -> None:
        self._emit(self.lines(events))

    def write_frames(self, frames: bytes, decoder: Decoder) -> None:
        """Write a batch of ring frames without decoding them into events (the fast path;
        `namer` must then be a KernelNamer or None)."""
        from .lines import frame_chunks

        if self._frame_lines is None:
            from .lines import JsonLines

            self._frame_lines = JsonLines(decoder.table, decoder, self.lines, self.namer)
        for chunk in frame_chunks(frames):
            self._emit(self._frame_lines.lines(chunk))

    def _emit(self, lines: List[str]) -> None:
        if lines:
            self.stream.write("\n".join(lines))
            self.stream.write("\n")

    def _object(self, event: Event) -> dict:
        obj = event.to_json()
        if self.namer is not None and "func" in event.args:
            name = self.namer(event, event.args["func"])
            if name:
                obj["kernel"] = name
        return obj

    def close(self) -> None:
        """Flush; close the stream unless it is stdout or stderr."""
        import sys

        if self.stream in (sys.stdout, sys.stderr):
            self.stream.flush()
        else:
            self.stream.close()
