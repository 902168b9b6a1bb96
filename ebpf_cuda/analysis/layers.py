"""Counting each operation once when both CUDA layers are traced.

cudaMalloc calls cuMemAlloc_v2, cudaLaunchKernel calls cuLaunchKernel: with both layers
traced, one operation shows as two calls on the same thread, the driver call inside the
runtime call's time span. Records are written at return, so the driver call arrives first.

Every analysis that counts operations uses this one rule, through `outer` (an operation
counts as its runtime call: copies, memsets, allocations, frees) or `inner` (as its driver
call: launches, whose driver handle names every kernel).
"""
from typing import Dict, List, Tuple

from ..decode.events import Event
from ..decode.operations import is_driver


def _start_ns(event: Event) -> int:
    return event.ts_ns - (event.duration_ns or 0)


class LayerFilter:
    """Holds driver calls back until it is known whether a runtime call contains them.

    `driver(event)` holds a driver exit event (and returns the oldest held ones once more
    than `keep` wait on that thread: those were direct driver calls). `runtime(event)` drops
    the held calls that ran inside the runtime call and returns (inner, earlier): `earlier`
    are direct driver calls made before it, now safe to count. `flush()` returns the rest."""

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._held: Dict[int, List[Event]] = {}

    def driver(self, event: Event) -> List[Event]:
        held = self._held.setdefault(event.tid, [])
        held.append(event)
        if len(held) <= self.keep:
            return []
        overflow = held[:-self.keep]
        del held[:-self.keep]
        return overflow

    def runtime(self, event: Event) -> Tuple[List[Event], List[Event]]:
        held = self._held.pop(event.tid, None)
        if not held:
            return [], []
        start, end = _start_ns(event), event.ts_ns
        inner = [e for e in held if _start_ns(e) >= start and e.ts_ns <= end]
        earlier = [e for e in held if e.ts_ns < start]
        later = [e for e in held if _start_ns(e) > end]  # cannot happen in order; keep them
        if later:
            self._held[event.tid] = later
        return inner, earlier

    def outer(self, event: Event) -> List[Event]:
        """Count each operation once, as its runtime call: the exit events that count now
        (a driver call is held until it is known that no runtime call contains it; a
        runtime call counts at once, with the direct driver calls made before it)."""
        if is_driver(event.api):
            return self.driver(event)
        return self.runtime(event)[1] + [event]

    def inner(self, event: Event) -> bool:
        """Count each operation once, as its driver call: whether `event` counts (a driver
        call does; a runtime call only when no driver call ran inside it)."""
        if is_driver(event.api):
            self.driver(event)  # kept for the runtime call around it; it counts already
            return True
        return not self.runtime(event)[0]

    def flush(self) -> List[Event]:
        rest = sorted((e for held in self._held.values() for e in held), key=lambda e: e.ts_ns)
        self._held.clear()
        return rest
