"""JSON Lines: one object per event (keys: see `Event.to_json`). An event the decoder made
has its `ts` written from its wall-clock ns, `S.NNNNNNNNN` (exact, and cheaper to write than
a float's shortest repr: output/lines.py writes it so too)."""
import json
from typing import IO, Callable, Iterable, List, Optional

from ..decode.events import Decoder, Event
from . import LineWriter

Namer = Callable[[Event, int], Optional[str]]  # (event, address) -> kernel name


class JsonWriter(LineWriter):
    """Writes events as JSON Lines to a stream, in batches."""

    def __init__(self, stream: IO[str], namer: Optional[Namer] = None) -> None:
        super().__init__(stream, namer)  # launch events get a `kernel` key when it names them
        self._encode = json.JSONEncoder(separators=(",", ":")).encode

    def lines(self, events: Iterable[Event]) -> List[str]:
        """The JSON lines of some events (no newlines)."""
        return [self._line(ev) for ev in events]

    def _line(self, event: Event) -> str:
        obj = self._object(event)
        if event.wall_ns is None:
            return self._encode(obj)
        obj["ts"] = 0  # ("ts" is the first key: its text replaced by the exact time's)
        return '{"ts":%d.%09d' % divmod(event.wall_ns, 1_000_000_000) + self._encode(obj)[7:]

    def _frame_lines(self, decoder: Decoder):
        from .lines import JsonLines

        return JsonLines(decoder.table, decoder, self.slow_lines, self.namer, self.context)

    def _object(self, event: Event) -> dict:
        obj = event.to_json()
        if self.namer is not None and "func" in event.args:
            name = self.namer(event, event.args["func"])
            if name:
                obj["kernel"] = name
        return obj

    def gpu_lines(self, records: List) -> List[str]:
        """The GPU's samples and events (gpu/records.py): `{"type": "gpu_sample", ...}`,
        `{"type": "gpu_event", ...}`."""
        return [self._encode(record.to_json()) for record in records]
