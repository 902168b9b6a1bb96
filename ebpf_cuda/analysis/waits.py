"""Where the host waits on the GPU, derived from host-side times alone (no CUPTI).

A stream's queued work is known to be done when a call that must wait for it returns:
cudaStreamSynchronize(stream), cudaDeviceSynchronize (every stream), cudaEventSynchronize of
an event recorded on it (the work queued before the record), a synchronous copy or memset
(the legacy default stream), and a cudaStreamQuery/cudaEventQuery answering success. So:

- the work queued before such a call started finished *at or before the call's end*; when
  the call blocked (longer than SYNC_MIN_BLOCKED_NS) it was *not* done at the call's start:
  it finished within [start, end] of the call. From the first work queued after the
  previous proof of completion to that finish, the stream had work outstanding: at least
  until the call's start, at most until its end (`Window.outstanding_bounds`);
- after a proof of completion at time t, the stream is empty until the host queues its next
  work at t': [t, t'] is certain idle time of that stream (`gaps`), a lower bound of its
  idle time (it may have gone idle earlier);
- a query answering not-ready proves the work outstanding at its time (raising the lower
  bound of its window).

cudaEventElapsedTime's results are GPU-measured intervals the program computed: kept as
they are (`elapsed`).
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..spec.apis import Role
from .thresholds import IDLE_GAP_MIN_NS, SYNC_MIN_BLOCKED_NS
from .timeline import LEGACY_STREAM, Call, stream_of

StreamKey = Tuple[int, int]  # (pid, stream handle)
NOT_READY = 600  # cudaErrorNotReady / CUDA_ERROR_NOT_READY


@dataclass
class Window:
    """Work queued on a stream between two proofs of completion, and the proof."""

    stream: StreamKey
    first_submit_ns: int  # the start of the first call that queued work in the window
    submits: int
    proof: Call  # the call whose return proves the work done
    blocked: bool  # the proof call waited (the work was not done when it started)
    busy_at_ns: int = 0  # the latest query that found the work not done (0: none)

    def outstanding_bounds(self) -> Tuple[int, int]:
        """(at least, at most) ns the stream had this window's work outstanding."""
        seen_busy = max(self.proof.start_ns if self.blocked else 0, self.busy_at_ns)
        low = seen_busy - self.first_submit_ns if seen_busy else 0
        return max(0, low), max(0, self.proof.end_ns - self.first_submit_ns)


@dataclass
class Gap:
    """Certain idle time of a stream: from a proof of completion to its next work."""

    stream: StreamKey
    start_ns: int
    end_ns: int
    after: Call  # the proof
    before: Call  # the call that queued the next work

    @property
    def ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Waits:
    """The bounds of a whole trace (see the module's docstring)."""

    windows: List[Window] = field(default_factory=list)
    gaps: List[Gap] = field(default_factory=list)
    elapsed: List[Call] = field(default_factory=list)  # cudaEventElapsedTime calls that worked
    not_ready: Dict[StreamKey, int] = field(default_factory=dict)  # queries saying busy

    def sync_sites(self, calls: Sequence[Call]) -> List[Tuple[str, int, int, int]]:
        """(site, calls, blocked calls, ns waited) of the blocking calls, most time first."""
        sites: Dict[str, List[int]] = {}
        for call in calls:
            if call.blocking:
                row = sites.setdefault(call.site, [0, 0, 0])
                row[0] += 1
                row[1] += call.duration_ns >= SYNC_MIN_BLOCKED_NS
                row[2] += call.duration_ns
        return sorted(((site, *row) for site, row in sites.items()),  # type: ignore[misc]
                      key=lambda r: (-r[3], r[0]))


class _Stream:
    def __init__(self) -> None:
        self.first_submit: Optional[Call] = None  # first work since the last proof
        self.submits = 0
        self.done_at: Optional[Call] = None  # the last proof, while no work came after it
        self.last_submit: Optional[Call] = None
        self.busy_at = 0  # the start of the latest query that found work not done


def derive(calls: Sequence[Call]) -> Waits:
    """The windows, gaps and elapsed times of calls in time order (all threads)."""
    waits = Waits()
    streams: Dict[StreamKey, _Stream] = {}
    events: Dict[Tuple[int, int], Tuple[StreamKey, int]] = {}  # event → (stream, record time)
    for call in calls:
        if call.is_work:
            _submit(waits, streams, call)
        if call.role == Role.EVENT_RECORD and not call.failed:
            key = (call.pid, stream_of(call.args.get("stream")) or LEGACY_STREAM)
            events[(call.pid, call.args.get("event"))] = (key, call.start_ns)
        if call.api == "cudaEventElapsedTime" and not call.failed:
            waits.elapsed.append(call)
        for key in _proves(call, streams, events):
            _prove(waits, streams, key, call)
        if call.ret == NOT_READY:
            _busy(waits, streams, call, events)
    return waits


def _busy(waits: Waits, streams: Dict[StreamKey, _Stream], call: Call,
          events: Dict[Tuple[int, int], Tuple[StreamKey, int]]) -> None:
    """A query found work not done: on its stream, or the stream its event was recorded on."""
    if call.stream is not None:
        key: Optional[StreamKey] = (call.pid, call.stream)
    else:
        found = events.get((call.pid, call.args.get("event")))
        key = found[0] if found is not None else None
    if key is not None:
        waits.not_ready[key] = waits.not_ready.get(key, 0) + 1
        state = streams.get(key)
        if state is not None and state.first_submit is not None:
            state.busy_at = call.start_ns


def _submit(waits: Waits, streams: Dict[StreamKey, _Stream], call: Call) -> None:
    key = (call.pid, call.stream if call.stream is not None else LEGACY_STREAM)
    state = streams.setdefault(key, _Stream())
    if state.done_at is not None:
        gap = Gap(key, state.done_at.end_ns, call.start_ns, state.done_at, call)
        if gap.ns >= IDLE_GAP_MIN_NS:
            waits.gaps.append(gap)
        state.done_at = None
    if state.first_submit is None:
        state.first_submit = call
    state.submits += 1
    state.last_submit = call


def _proves(call: Call, streams: Dict[StreamKey, _Stream],
            events: Dict[Tuple[int, int], Tuple[StreamKey, int]]) -> List[StreamKey]:
    """The streams whose queued work the return of `call` proves done."""
    if call.failed:
        return []
    if call.api in ("cudaDeviceSynchronize", "cuCtxSynchronize"):
        return [key for key in streams if key[0] == call.pid]
    if call.api in ("cudaEventSynchronize", "cuEventSynchronize", "cudaEventQuery",
                    "cuEventQuery"):
        found = events.get((call.pid, call.args.get("event")))
        if found is None:
            return []
        last = streams.get(found[0])  # (work queued after the record is not proven done)
        if last is not None and last.last_submit is not None \
                and last.last_submit.start_ns > found[1]:
            return []
        return [found[0]]
    if call.api in ("cudaStreamSynchronize", "cuStreamSynchronize", "cudaStreamQuery",
                    "cuStreamQuery"):
        return [(call.pid, call.stream if call.stream is not None else LEGACY_STREAM)]
    if call.blocking and call.role in (Role.COPY, Role.MEMSET):
        return [(call.pid, LEGACY_STREAM)]
    return []


def _prove(waits: Waits, streams: Dict[StreamKey, _Stream], key: StreamKey, call: Call) -> None:
    state = streams.setdefault(key, _Stream())
    if state.first_submit is not None and state.first_submit is not call:
        waits.windows.append(Window(key, state.first_submit.start_ns, state.submits, call,
                                    call.duration_ns >= SYNC_MIN_BLOCKED_NS, state.busy_at))
    state.first_submit, state.submits, state.busy_at = None, 0, 0
    state.done_at = call
