"""The GPU's records handed to a text or JSON writer among the calls, as they come.

The sampler's lists grow on its threads; a writer asks, for each batch of calls it is about
to write, where the records ready by then fall: each goes before the first call that ended
after the record's time (ring frames come in the order their calls ended; a decoded event's
time is its line's). A record not ready when later calls were written (a round is appended
once every device is sampled: some milliseconds after its time, ~50 ms on an H100) comes
with the next batch; what is left at the end, with `rest()`.
"""
import struct
from typing import Callable, List, Optional, Sequence, Tuple

from ..spec import record

Ready = Callable[[], int]  # how many of the events are ready (their last launches filled)
Since = Callable[[], Optional[int]]  # when the sampler's round under way began (None: none)


class GpuFeed:
    """Records of `samples` and the first `events_ready()` of `events` (the sampler's lists,
    read as they grow), handed out in time order, for one writer: a record waits while an
    older one may still come (an event not ready yet, a round under way since
    `round_since()`)."""

    def __init__(self, samples: Sequence, events: Sequence,
                 events_ready: Optional[Ready] = None,
                 round_since: Optional[Since] = None, drop: bool = False) -> None:
        self._samples, self._events = samples, events
        # `drop`: the samples taken leave the sampler's list (this writer is their only
        # reader: a long trace's samples are not kept to its end)
        self._drop = drop
        self._ready = events_ready or (lambda: len(events))
        self._round_since = round_since or (lambda: None)
        self._taken = [0, 0]  # samples and events taken from the lists so far
        self._pending: List = []  # taken, not yet handed out, oldest first
        self._hold: Optional[int] = None  # records at or after this time wait

    def _refresh(self) -> None:
        # (the round first: one that ends after this look appended samples no older)
        since = self._round_since()
        samples = len(self._samples)  # (read once: the sampler appends meanwhile)
        new = list(self._samples[self._taken[0]:samples])
        ready = min(self._ready(), len(self._events))
        if ready > self._taken[1]:
            new += self._events[self._taken[1]:ready]
        self._taken = [samples, max(ready, self._taken[1])]
        if self._drop and samples:
            del self._samples[:samples]  # (the sampler only appends: the rest is new)
            self._taken[0] = 0
        waiting = self._events[ready:ready + 1]  # (the oldest event not ready)
        holds = [t for t in (since, waiting[0].ts_ns if waiting else None) if t is not None]
        self._hold = min(holds) if holds else None
        if new:
            self._pending = sorted(self._pending + new, key=lambda r: r.ts_ns)

    def split_frames(self, frames: bytes) -> List[Tuple[bytes, List]]:
        """`frames` cut into pieces, each with the records that go after it: (piece,
        records), in order; the records after the last piece's calls stay pending."""
        self._refresh()
        if not self._pending or not frames or not self._cut_in(_key(frames, -1)):
            return [(frames, [])]  # (the common case: nothing goes inside this batch)
        ends = record.frame_column(frames, record.TS_EXIT, "Q")
        starts = record.frame_column(frames, record.TS_ENTER, "Q")
        cuts = self._cuts([end or start for start, end in zip(starts, ends)])
        size, pieces, at = record.FRAME_SIZE, [], 0
        for index, due in cuts:
            pieces.append((frames[at * size:index * size], due))
            at = index
        pieces.append((frames[at * size:], []))
        return [(piece, due) for piece, due in pieces if piece or due]

    def split_events(self, events: Sequence) -> List[Tuple[Sequence, List]]:
        """The same for decoded events, by each one's time."""
        self._refresh()
        if not self._pending or not len(events) or not self._cut_in(events[-1].ts_ns):
            return [(events, [])]
        pieces, at = [], 0
        for index, due in self._cuts([event.ts_ns for event in events]):
            pieces.append((events[at:index], due))
            at = index
        pieces.append((events[at:], []))
        return [(piece, due) for piece, due in pieces if len(piece) or due]

    def _cut_in(self, last: int) -> bool:
        """Whether a pending record goes before a call that ended at `last` or earlier."""
        first = self._pending[0].ts_ns
        return first < last and (self._hold is None or first < self._hold)

    def _cuts(self, times: List[int]) -> List[Tuple[int, List]]:
        """(index, records): the records go before the call at `index`, the first whose
        time is after theirs."""
        cuts, pending, hold = [], self._pending, self._hold
        for index, ts in enumerate(times):
            if not pending or (hold is not None and pending[0].ts_ns >= hold):
                break
            if ts > pending[0].ts_ns:
                due = []
                while pending and pending[0].ts_ns < ts and (hold is None or
                                                             pending[0].ts_ns < hold):
                    due.append(pending.pop(0))
                cuts.append((index, due))
        return cuts

    def rest(self) -> List:
        """Every record not handed out yet (at the end of the trace), in time order."""
        self._refresh()
        rest, self._pending = self._pending, []
        return rest


def _key(frames: bytes, index: int) -> int:
    """When the call of a frame ended (an enter record of --entries: when it began)."""
    at = (index % (len(frames) // record.FRAME_SIZE)) * record.FRAME_SIZE + record.FRAME_HEADER
    end = struct.unpack_from("=Q", frames, at + record.TS_EXIT)[0]
    return end or struct.unpack_from("=Q", frames, at + record.TS_ENTER)[0]
