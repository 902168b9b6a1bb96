"""JSON Lines: one object per event (keys: see `Event.to_json`)."""
import json
from typing import IO, Callable, Iterable, Optional

from ..events import Event

Namer = Callable[[Event, int], Optional[str]]  # (event, address) -> kernel name


class JsonWriter:
    """Writes events as JSON Lines to a stream, in batches."""

    def __init__(self, stream: IO[str], namer: Optional[Namer] = None) -> None:
        self.stream = stream
        self.namer = namer  # launch events get a `kernel` key when it names their func
        self._encode = json.JSONEncoder(separators=(",", ":")).encode

    def header(self) -> None:
        """JSON Lines has no header."""

    def write(self, events: Iterable[Event]) -> None:
        lines = [self._encode(self._object(ev)) for ev in events]
        if lines:
            self.stream.write("\n".join(lines) + "\n")

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
