"""Ways to present events. Each is a `Sink`: the CLI hands every decoded batch to each sink
it built, then closes them (when summaries and reports are written)."""
from typing import List

from ..events import Event

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
