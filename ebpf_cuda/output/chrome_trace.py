"""Chrome trace-event format (JSON array), opened by Perfetto UI and chrome://tracing.

One track per process and thread (`process_name`/`thread_name` metadata), each call a complete
slice (`"ph":"X"`) with its arguments, return name and duration; counters (`"ph":"C"`) for
live device memory and bytes copied per direction, per process; instant markers (`"ph":"i"`)
for failed calls, double frees and, at the end, leaked allocations. Timestamps are the kernel's
CLOCK_MONOTONIC in microseconds (`ts_ns / 1000`).

The array is streamed: `[` at `header()`, each batch as it comes, `]` at `close()`; memory
stays constant whatever the number of events (only per-process state and live allocations
are kept).
"""
import json
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from ..analysis.memory import ALLOCATORS, FREES, Allocator
from ..analysis.summary import copy_bytes, copy_operation
from ..apis import BY_NAME
from ..elf import demangle
from ..events import ENTER, EXIT, Event
from ..values import field_kinds, trace_value
from . import finish

Namer = Callable[[Event, int], Optional[str]]  # (event, function address) -> kernel name
Emit = Callable[[Dict[str, Any]], None]


class ApiInfo:
    """What the writer needs to know of a function, computed once per name: its category
    and the kinds of its values."""

    def __init__(self, name: str) -> None:
        row = BY_NAME.get(name)
        self.category = row.category if row else "other"
        self.kinds: Dict[str, str] = field_kinds(row) if row is not None else {}


_INFO: Dict[str, ApiInfo] = {}


def api_info(name: str) -> ApiInfo:
    """The cached `ApiInfo` of a function name (unknown names get an empty one)."""
    info = _INFO.get(name)
    if info is None:
        info = _INFO[name] = ApiInfo(name)
    return info


def arg_value(kind: Optional[str], value: Any) -> Any:
    """An argument as shown in the trace viewer (values.trace_value: addresses and handles as
    hex text, dim3 as a list, the rest as is)."""
    return trace_value(kind, value)


@dataclass
class Allocation:
    """A live device allocation."""

    pid: int
    tid: int
    ptr: int
    size: int
    api: str
    ts_ns: int


@dataclass
class MemoryChange:
    """What one call did to device memory."""

    ptr: int
    size: int  # bytes allocated (> 0) or freed (< 0); 0 for a double free
    double_free: bool = False


def _device_allocators() -> Dict[str, Allocator]:
    """The analysis table's allocators of device memory (those not freed by a host free)."""
    return {name: a for name, a in ALLOCATORS.items()
            if not any("Host" in free for free in a.frees)}


class MemoryTracker:
    """Live device memory per process, by the allocator/free tables of `analysis.memory`
    (the `LeakTracker` has the full correlation; this keeps no timeline, so memory grows
    with live allocations only, and freed addresses until they are allocated again).
    A free of a pointer freed before and not allocated again is a double free (flagged
    whatever the free returned: real CUDA fails it)."""

    def __init__(self) -> None:
        self.allocators = _device_allocators()
        self.frees = {name: arg for name, arg in FREES.items() if "Host" not in name}
        self.live: Dict[Tuple[int, int], Allocation] = {}
        self.freed: Set[Tuple[int, int]] = set()
        self._bytes: Dict[int, int] = {}
        self.peak: Dict[int, int] = {}
        self.double_frees = 0

    def live_bytes(self, pid: int) -> int:
        return self._bytes.get(pid, 0)

    def update(self, ev: Event) -> Optional[MemoryChange]:
        """Account for an exit event; None when it changed nothing."""
        if ev.phase != EXIT:
            return None
        allocator = self.allocators.get(ev.api)
        if allocator is not None:
            return self._alloc(ev, allocator) if ev.ret == 0 else None
        if ev.api in self.frees:
            return self._free(ev, ev.args.get(self.frees[ev.api]))
        return None

    def _alloc(self, ev: Event, allocator: Allocator) -> Optional[MemoryChange]:
        ptr = ev.outs.get(allocator.ptr)
        size = 1
        for name in allocator.size:
            value = ev.args.get(name, ev.outs.get(name))
            size *= value if isinstance(value, int) else 0
        if not ptr or not size:
            return None
        key = (ev.pid, ptr)
        self.freed.discard(key)
        old = self.live.pop(key, None)
        self._add(ev.pid, size - (old.size if old else 0))
        self.live[key] = Allocation(ev.pid, ev.tid, ptr, size, ev.api, ev.ts_ns)
        return MemoryChange(ptr, size)

    def _free(self, ev: Event, ptr: Any) -> Optional[MemoryChange]:
        if not ptr:
            return None  # freeing NULL does nothing
        key = (ev.pid, ptr)
        alloc = self.live.get(key)
        if alloc is None:
            if key in self.freed:
                self.double_frees += 1
                return MemoryChange(ptr, 0, double_free=True)
            return None  # allocated before tracing started
        if ev.ret:
            return None
        del self.live[key]
        self.freed.add(key)
        self._add(ev.pid, -alloc.size)
        return MemoryChange(ptr, -alloc.size)

    def _add(self, pid: int, delta: int) -> None:
        now = self._bytes[pid] = self._bytes.get(pid, 0) + delta
        if now > self.peak.get(pid, 0):
            self.peak[pid] = now

    def leaks(self) -> List[Allocation]:
        """Allocations still live, oldest first."""
        return sorted(self.live.values(), key=lambda a: (a.ts_ns, a.pid, a.ptr))


def copy_direction(ev: Event) -> Optional[Tuple[str, int]]:
    """(direction, bytes) of a successful copy ("Host-to-Device", ...: the summary's names),
    else None (memsets are not copies)."""
    if ev.ret or ev.phase != EXIT:
        return None
    operation = copy_operation(ev)
    if operation is None or not operation.startswith(_MEMCPY):
        return None
    size = copy_bytes(ev)
    return None if size is None else (operation[len(_MEMCPY):-1], size)


_MEMCPY = "[CUDA memcpy "


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


class ChromeTraceWriter:
    """A sink writing the Chrome trace-event JSON array to `stream`.

    `namer(event, address)` gives kernel names of launches (optional)."""

    def __init__(self, stream: IO[str], namer: Optional[Namer] = None) -> None:
        self.stream = stream
        self.namer = namer
        self.memory = MemoryTracker()
        self._encode = json.JSONEncoder(separators=(",", ":")).encode
        self._first = True
        self._started = False
        self._pending: Optional[Event] = None  # an enter event whose exit may follow
        self._processes: Set[int] = set()
        self._threads: Set[Tuple[int, int]] = set()
        self._copied: Dict[int, Dict[str, int]] = {}
        self._last_ns: Dict[int, int] = {}

    def header(self) -> None:
        if not self._started:
            self._started = True
            self.stream.write("[\n")

    def write(self, events: Iterable[Event]) -> None:
        self.header()
        out: List[Dict[str, Any]] = []
        for ev in events:
            self._event(ev, out.append)
        self._flush(out)

    def close(self) -> None:
        """Write the pending marker and the leaks, end the array; close the stream unless
        it is stdout or stderr."""
        self.header()
        out: List[Dict[str, Any]] = []
        self._flush_pending(None, out.append)
        self._leaks(out.append)
        self._flush(out)
        self.stream.write("\n]\n")
        finish(self.stream)

    def _flush(self, out: List[Dict[str, Any]]) -> None:
        if not out:
            return
        text = ",\n".join(self._encode(obj) for obj in out)
        self.stream.write(text if self._first else ",\n" + text)
        self._first = False

    # -- one event -------------------------------------------------------------------------

    def _event(self, ev: Event, emit: Emit) -> None:
        self._flush_pending(ev, emit)
        self._track(ev, emit)
        self._last_ns[ev.pid] = ev.ts_ns
        if ev.phase == ENTER:
            self._pending = ev
        elif ev.phase == EXIT:
            self._call(ev, emit)

    def _flush_pending(self, ev: Optional[Event], emit: Emit) -> None:
        """An enter event is dropped when its own exit follows (a complete call is decoded as
        the pair); otherwise (return probes off, --entries) it becomes an instant marker."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if (ev is not None and ev.phase == EXIT and ev.tid == pending.tid
                and ev.api == pending.api and ev.ts_ns - (ev.duration_ns or 0) == pending.ts_ns):
            return
        emit({"name": pending.api, "cat": "enter", "ph": "i", "s": "t",
              "ts": _us(pending.ts_ns), "pid": pending.pid, "tid": pending.tid,
              "args": self._args(pending, api_info(pending.api).kinds, self._kernel(pending))})

    def _track(self, ev: Event, emit: Emit) -> None:
        if ev.pid not in self._processes:
            self._processes.add(ev.pid)
            emit({"name": "process_name", "ph": "M", "pid": ev.pid, "tid": ev.pid,
                  "args": {"name": "%s (%d)" % (ev.comm, ev.pid)}})
        if (ev.pid, ev.tid) not in self._threads:
            self._threads.add((ev.pid, ev.tid))
            emit({"name": "thread_name", "ph": "M", "pid": ev.pid, "tid": ev.tid,
                  "args": {"name": "%s %d" % (ev.comm, ev.tid)}})

    def _args(self, ev: Event, kinds: Dict[str, str], kernel: Optional[str]) -> Dict[str, Any]:
        args = {name: trace_value(kinds.get(name), v) for name, v in ev.args.items()}
        if kernel:
            args["kernel"] = kernel
        return args

    def _kernel(self, ev: Event) -> Optional[str]:
        """The kernel a launch runs, by the namer (its `func`)."""
        if self.namer is None or "func" not in ev.args:
            return None
        return self.namer(ev, ev.args["func"])

    def _call(self, ev: Event, emit: Emit) -> None:
        info = api_info(ev.api)
        kernel = self._kernel(ev)
        args = self._args(ev, info.kinds, kernel)
        args["return"] = ev.ret_name
        args.update((name, trace_value(info.kinds.get(name), v)) for name, v in ev.outs.items())
        if ev.faults:
            args["unreadable"] = list(ev.faults)
        duration = ev.duration_ns or 0
        emit({"name": self._title(ev, kernel), "cat": info.category, "ph": "X",
              "ts": _us(ev.ts_ns - duration), "dur": _us(duration), "pid": ev.pid,
              "tid": ev.tid, "args": args})
        if ev.ret:
            emit(self._instant(ev, ev.ret_name or "error %d" % ev.ret, "error",
                               {"api": ev.api, "ret": ev.ret}))
        self._memory(ev, emit)
        self._copies(ev, emit)

    @staticmethod
    def _title(ev: Event, kernel: Optional[str]) -> str:
        """A launch is titled by the kernel it runs, a call that taught a kernel's name
        (cuModuleGetFunction & co.) by that name, demangled as launches are; never by an
        argument that happens to be called `kernel` (cuLibraryGetKernel's out handle)."""
        if kernel:
            return kernel
        learned = ev.outs.get("kernel_name")
        return demangle(learned) if isinstance(learned, str) and learned else ev.api

    def _instant(self, ev: Event, name: str, cat: str, args: Dict[str, Any],
                 scope: str = "t") -> Dict[str, Any]:
        return {"name": name, "cat": cat, "ph": "i", "s": scope, "ts": _us(ev.ts_ns),
                "pid": ev.pid, "tid": ev.tid, "args": args}

    def _memory(self, ev: Event, emit: Emit) -> None:
        change = self.memory.update(ev)
        if change is None:
            return
        if change.double_free:
            emit(self._instant(ev, "double free", "memory",
                               {"api": ev.api, "ptr": "0x%x" % change.ptr}))
            return
        emit({"name": "live device memory", "ph": "C", "ts": _us(ev.ts_ns), "pid": ev.pid,
              "args": {"bytes": self.memory.live_bytes(ev.pid)}})

    def _copies(self, ev: Event, emit: Emit) -> None:
        copied = copy_direction(ev)
        if copied is None:
            return
        direction, size = copied
        totals = self._copied.setdefault(ev.pid, {})
        totals[direction] = totals.get(direction, 0) + size
        emit({"name": "bytes copied", "ph": "C", "ts": _us(ev.ts_ns), "pid": ev.pid,
              "args": dict(totals)})

    def _leaks(self, emit: Emit) -> None:
        for alloc in self.memory.leaks():
            ts = self._last_ns.get(alloc.pid, alloc.ts_ns)
            emit({"name": "leak", "cat": "memory", "ph": "i", "s": "p", "ts": _us(ts),
                  "pid": alloc.pid, "tid": alloc.tid,
                  "args": {"ptr": "0x%x" % alloc.ptr, "size": alloc.size, "api": alloc.api,
                           "allocated_at_us": _us(alloc.ts_ns)}})


def write_chrome_trace(events: Iterable[Event], stream: IO[str],
                       namer: Optional[Namer] = None, batch: int = 4096) -> None:
    """Write any iterable of events as a Chrome trace to `stream` (closed at the end unless
    it is stdout or stderr)."""
    writer = ChromeTraceWriter(stream, namer)
    writer.header()
    chunk: List[Event] = []
    for ev in events:
        chunk.append(ev)
        if len(chunk) >= batch:
            writer.write(chunk)
            chunk = []
    writer.write(chunk)
    writer.close()
