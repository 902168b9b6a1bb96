"""JSON Lines: one object per event (keys: see `Event.to_json`)."""
import json
from typing import IO, Iterable

from ..events import Event


class JsonWriter:
    """Writes events as JSON Lines to a stream, in batches."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._encode = json.JSONEncoder(separators=(",", ":")).encode

    def header(self) -> None:
        """JSON Lines has no header."""

    def write(self, events: Iterable[Event]) -> None:
        lines = [self._encode(ev.to_json()) for ev in events]
        if lines:
            self.stream.write("\n".join(lines) + "\n")

    def close(self) -> None:
        """Flush; close the stream unless it is stdout or stderr."""
        import sys

        if self.stream in (sys.stdout, sys.stderr):
            self.stream.flush()
        else:
            self.stream.close()
