"""Memory correlation: allocations matched with their frees, misuse flagged, leaks listed.

Allocators and frees are the rows of the function table with role ALLOC or FREE (apis.py):
each names the field that holds the pointer, the fields whose product is the size, and its
memory family. An allocation is released only by a free of its own family (cudaMallocHost
memory by cudaFreeHost, ...); a free from another family is flagged.

Only completed calls (exit events) count: an allocation that failed is not live, a free is
recorded when it succeeded; misuse is flagged whatever the free returned (real CUDA fails a
double free, the flag says why). Pointers allocated before tracing began are unknown to the
tracker: freeing them is flagged as a free of an unknown pointer. With both layers traced,
a driver call inside a runtime call (cudaMalloc's cuMemAlloc_v2) is the same allocation
(layers.LayerFilter).
"""
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ..decode.events import EXIT, Event, PyFrame
from ..spec.apis import TABLE, Api, Role
from ..targets.symbols import AddressResolver, Frame
from ._table import clock, integer, table
from .layers import LayerFilter
from .python_lines import stack_lines


class Allocator(NamedTuple):
    """How one allocation function is read."""

    ptr: str  # out-parameter holding the new pointer
    size: Tuple[str, ...]  # arguments (or out-parameters) whose product is the size in bytes
    frees: Tuple[str, ...]  # the functions that release what it returns


def _frees_of(api: Api) -> Tuple[str, ...]:
    """The free functions of an allocator's family, in table order."""
    return tuple(row.name for row in TABLE if row.role == Role.FREE and row.family == api.family)


# Allocator name → how it is read; free name → the argument holding the pointer it releases.
ALLOCATORS: Dict[str, Allocator] = {
    api.name: Allocator(api.ptr, api.size, _frees_of(api)) for api in TABLE
    if api.role == Role.ALLOC}
FREES: Dict[str, str] = {api.name: api.ptr for api in TABLE if api.role == Role.FREE}

DOUBLE_FREE = "double-free"
UNKNOWN_FREE = "unknown-free"
MISMATCHED_FREE = "mismatched-free"


@dataclass
class Allocation:
    """One successful allocation (live until its free is seen)."""

    pid: int
    tid: int
    comm: str
    ptr: int
    size: int
    api: str
    ts: float
    ts_ns: int
    stack_id: int = 0
    freed_by: Optional[str] = None  # the free's api once released
    freed_ts: Optional[float] = None
    py_stack: Optional[Tuple[PyFrame, ...]] = None  # --py-stacks: the allocating call's


@dataclass
class MemoryWarning:
    """A free that does not match a live allocation; `message` says it in one sentence."""

    kind: str  # DOUBLE_FREE, UNKNOWN_FREE or MISMATCHED_FREE
    message: str
    event: Event
    allocation: Optional[Allocation] = None

    def __str__(self) -> str:
        return self.message


def _size(event: Event, names: Sequence[str]) -> Optional[int]:
    size = 1
    for name in names:
        value = event.args.get(name, event.outs.get(name))
        if not isinstance(value, int):
            return None
        size *= value
    return size


Change = Callable[[Event, int], None]  # (the event that changed it, the pid's live bytes)


class LeakTracker:
    """Matches allocations with frees by (pid, pointer). Feed it events (any iterable, in
    order): `feed(event)` returns the warnings that event raised; `on_warning` (if given) is
    called with each as it happens. Afterwards `leaks()` lists what was never freed and
    `timeline` holds (ts, pid, live bytes) after every change (unless `keep_timeline` is
    False; `on_change` is told each change as it is made). It is also a sink."""

    def __init__(self, on_warning: Optional[Callable[[MemoryWarning], None]] = None,
                 allocators: Optional[Dict[str, Allocator]] = None,
                 frees: Optional[Dict[str, str]] = None, keep_timeline: bool = True,
                 on_change: Optional[Change] = None) -> None:
        self.allocators = ALLOCATORS if allocators is None else allocators
        self.frees = FREES if frees is None else frees
        self.on_warning = on_warning
        self.on_change = on_change
        self.keep_timeline = keep_timeline
        self.live: Dict[Tuple[int, int], Allocation] = {}
        self.freed: Dict[Tuple[int, int], Allocation] = {}  # last release of each pointer
        self.warnings: List[MemoryWarning] = []
        self.timeline: List[Tuple[float, int, int]] = []
        self.allocations = 0  # successful allocations (each counted once across layers)
        self.releases = 0  # successful frees of a live allocation
        self._live_bytes: Dict[int, int] = {}
        self._peak: Dict[int, int] = {}
        self._layers = LayerFilter()

    @property
    def double_frees(self) -> int:
        """Frees of a pointer already freed (and not allocated again)."""
        return sum(1 for w in self.warnings if w.kind == DOUBLE_FREE)

    def feed(self, event: Event) -> List[MemoryWarning]:
        """Account for one event; the warnings it raised (usually none). A driver call made
        inside a runtime call (cudaMalloc's cuMemAlloc_v2) is the same allocation: driver
        calls are held back until that is known (see LayerFilter)."""
        if event.phase != EXIT or not (event.api in self.allocators or event.api in self.frees):
            return []
        return self._account(self._layers.outer(event))

    def flush(self) -> List[MemoryWarning]:
        """Account for the driver calls still held back (at the end of a trace)."""
        return self._account(self._layers.flush())

    def _account(self, events: List[Event]) -> List[MemoryWarning]:
        raised: List[MemoryWarning] = []
        for event in events:
            raised += self._apply(event)
        return raised

    def _apply(self, event: Event) -> List[MemoryWarning]:
        if event.api in self.allocators:
            self._allocated(event, self.allocators[event.api])
            return []
        if event.api in self.frees:
            return self._freed(event, event.args.get(self.frees[event.api]))
        return []

    def feed_all(self, events: Iterable[Event]) -> List[MemoryWarning]:
        """Feed a whole stream of events (held-back driver calls included); all warnings."""
        raised: List[MemoryWarning] = []
        for event in events:
            raised += self.feed(event)
        return raised + self.flush()

    def _allocated(self, event: Event, allocator: Allocator) -> None:
        ptr = event.outs.get(allocator.ptr)
        size = _size(event, allocator.size)
        if event.ret != 0 or not ptr or size is None:
            return  # failed, or a zero-byte allocation (NULL): nothing is live
        key = (event.pid, ptr)
        self.freed.pop(key, None)
        self.allocations += 1
        self.live[key] = Allocation(event.pid, event.tid, event.comm, ptr, size, event.api,
                                    event.ts, event.ts_ns, event.stack_id,
                                    py_stack=event.py_stack)
        self._change(event, size)

    def _freed(self, event: Event, ptr: Optional[int]) -> List[MemoryWarning]:
        if not ptr:
            return []  # freeing NULL does nothing
        key = (event.pid, ptr)
        allocation = self.live.get(key)
        if allocation is None:
            earlier = self.freed.get(key)
            if earlier is not None:
                return self._warn(DOUBLE_FREE, event, earlier, "double free: %s(0x%x) in pid %d: "
                                  "%d bytes from %s, already freed by %s" % (
                                      event.api, ptr, event.pid, earlier.size, earlier.api,
                                      earlier.freed_by))
            return self._warn(UNKNOWN_FREE, event, None, "free of an unknown pointer: %s(0x%x) "
                              "in pid %d" % (event.api, ptr, event.pid))
        raised = []
        if event.api not in self.allocators[allocation.api].frees:
            raised = self._warn(MISMATCHED_FREE, event, allocation, "mismatched free: %s(0x%x) "
                                "in pid %d releases memory of %s (freed by %s)" % (
                                    event.api, ptr, event.pid, allocation.api,
                                    " or ".join(self.allocators[allocation.api].frees)))
        if event.ret == 0:
            del self.live[key]
            allocation.freed_by, allocation.freed_ts = event.api, event.ts
            self.freed[key] = allocation
            self.releases += 1
            self._change(event, -allocation.size)
        return raised

    def _warn(self, kind: str, event: Event, allocation: Optional[Allocation],
              message: str) -> List[MemoryWarning]:
        warning = MemoryWarning(kind, message, event, allocation)
        self.warnings.append(warning)
        if self.on_warning is not None:
            self.on_warning(warning)
        return [warning]

    def _change(self, event: Event, delta: int) -> None:
        live = self._live_bytes.get(event.pid, 0) + delta
        self._live_bytes[event.pid] = live
        self._peak[event.pid] = max(self._peak.get(event.pid, 0), live)
        if self.keep_timeline:
            self.timeline.append((event.ts, event.pid, live))
        if self.on_change is not None:
            self.on_change(event, live)

    def live_bytes(self, pid: int) -> int:
        """Bytes allocated and not yet freed by process `pid`."""
        return self._live_bytes.get(pid, 0)

    def peak_bytes(self, pid: int) -> int:
        """The most bytes process `pid` had live at once."""
        return self._peak.get(pid, 0)

    def pids(self) -> List[int]:
        """The processes that allocated memory, in order."""
        return sorted(self._peak)

    def leaks(self) -> List[Allocation]:
        """Allocations never freed, oldest first."""
        self.flush()
        return sorted(self.live.values(), key=lambda a: (a.ts_ns, a.pid, a.ptr))

    # Sink protocol
    def header(self) -> None:
        """Nothing to write."""

    def write(self, events: Iterable[Event]) -> None:
        watched_allocs, watched_frees = self.allocators, self.frees
        for event in events:
            if event.api in watched_allocs or event.api in watched_frees:
                self.feed(event)

    def close(self) -> None:
        """Account for what is still held back; `format_leaks` writes the report."""
        self.flush()


StackOf = Callable[[int], List[int]]  # stack id → return addresses, innermost first
# (pid, stack id) → the frames, innermost first, symbolized already (a saved trace's)
FramesOf = Callable[[int, int], Sequence[Optional[Frame]]]


def format_leaks(tracker: LeakTracker, stack_of: Optional[StackOf] = None,
                 resolver: Optional[AddressResolver] = None,
                 frames_of: Optional[FramesOf] = None) -> str:
    """The leak report: allocations never freed (pointer, size, allocator, time, thread) and,
    with `stack_of`, each one's user call stack symbolized through `resolver` (with
    `frames_of` instead: symbolized already, a saved trace's); then, for
    those that have one (--py-stacks), its Python stack (`py#0 FILE:LINE FUNCTION`, innermost
    first)."""
    leaks = tracker.leaks()
    if not leaks:
        return "Leaks: none (%d allocations, all freed)" % tracker.allocations
    total = sum(a.size for a in leaks)
    lines = ["Leaks: %d of %d allocations never freed, %s bytes in %d process%s" % (
        len(leaks), tracker.allocations, integer(total), len({a.pid for a in leaks}),
        "" if len({a.pid for a in leaks}) == 1 else "es")]
    headers = ("PID", "TID", "Pointer", "Size (bytes)", "Allocator", "Time")
    rows = [(str(a.pid), str(a.tid), "0x%x" % a.ptr, integer(a.size), a.api, clock(a.ts))
            for a in leaks]
    rendered = table(headers, rows, left=(2, 4, 5)).split("\n")
    lines += rendered[:2]
    resolver = resolver or AddressResolver()
    for allocation, row in zip(leaks, rendered[2:]):
        lines.append(row)
        if stack_of is not None:
            lines += format_stack(allocation.pid, stack_of(allocation.stack_id), resolver)
        elif frames_of is not None:
            lines += format_frames(frames_of(allocation.pid, allocation.stack_id)
                                   if allocation.stack_id else ())
        lines += stack_lines(allocation.py_stack)
    return "\n".join(lines)


def format_stack(pid: int, addresses: Sequence[int], resolver: AddressResolver) -> List[str]:
    """One indented line per frame: `#0 cudaMalloc+0x0 (libcudart.so.12)`."""
    if not addresses:
        return ["      (no stack)"]
    return format_frames(resolver.stack(pid, addresses), addresses)


def format_frames(frames: Sequence[Optional[Frame]], addresses: Sequence[int] = ()
                  ) -> List[str]:
    """One indented line per frame (one in no file: its address, "?" when not kept)."""
    if not frames:
        return ["      (no stack)"]
    return ["      #%d %s" % (depth, frame if frame is not None else
                               "0x%x" % addresses[depth] if depth < len(addresses) else "?")
            for depth, frame in enumerate(frames)]
