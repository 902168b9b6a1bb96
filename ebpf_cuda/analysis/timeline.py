"""The calls `ebpf-cuda analyze` reasons about: each completed CUDA call once (with both
layers traced, as its runtime call: layers.py), reduced to what the steps, the wait bounds
and the rules read (`Call`), kept per thread in time order.

What a call is, is read from the function table (operations.py): its role (launch, copy,
memset, alloc, free, graph launch), whether it blocks its thread until the GPU is done, its
stream (0 and 1, the legacy default stream, are one), its bytes and direction, its kernel.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ..decode.events import EXIT, Event, PyFrame
from ..decode.operations import blocks, byte_count, direction_of, is_driver, row
from ..spec.apis import Role
from .layers import LayerFilter
from .python_lines import frame_text, user_frame

Namer = Callable[[Event, int], Optional[str]]
LEGACY_STREAM = 0  # the legacy default stream (handle 0, or cudaStreamLegacy: 1)
PER_THREAD_STREAM = 2  # cudaStreamPerThread
# Roles whose calls put work on a stream (the steps' tokens, the streams' submissions).
WORK_ROLES = (Role.LAUNCH, Role.COPY, Role.MEMSET, Role.GRAPH_LAUNCH)


@dataclass(eq=False)
class Call:
    """One completed call, as the analyses see it (compared by identity). Times are
    CLOCK_MONOTONIC ns."""

    pid: int
    tid: int
    api: str
    role: Optional[str]
    category: str
    start_ns: int
    end_ns: int
    ret: int
    ret_name: Optional[str]
    stream: Optional[int]  # the stream it works on or waits for (None: none named)
    blocking: bool  # it returns only once the GPU is done (sync rows, synchronous copies)
    asynchronous: bool
    args: Dict[str, Any]
    outs: Dict[str, Any]
    py_stack: Optional[Tuple[PyFrame, ...]] = None
    kernel: Optional[str] = None  # launches: the kernel's name (else its address in hex)
    func: Optional[int] = None  # launches: the kernel's address or handle (steps key on it)
    bytes: int = 0  # copies, memsets, allocations
    direction: Optional[str] = None  # copies: a Direction
    captured: bool = False  # recorded into a stream capture, not run
    kernels_run: int = 0  # graph launches: the kernels its nodes run
    index: int = 0  # position in its thread's list
    unnamed: Optional[Event] = None  # a launch not named yet: named again at the end

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def failed(self) -> bool:
        return self.ret != 0

    @property
    def is_work(self) -> bool:
        """It queues work on a stream (a launch, copy, memset or graph launch that ran)."""
        return self.role in WORK_ROLES and not self.captured and not self.failed

    @property
    def site(self) -> str:
        """Where it was called from: the innermost user Python frame (`FILE:LINE FUNCTION`),
        else the function's name and thread (no Python stack was recorded)."""
        frame = user_frame(self.py_stack)
        if frame is not None:
            return frame_text(frame)
        return "%s (thread %d, no Python stack)" % (self.api, self.tid)


def stream_of(value: Any) -> Optional[int]:
    """A stream handle as the analyses key it: the legacy default stream's two names as one."""
    if not isinstance(value, int):
        return None
    return LEGACY_STREAM if value in (0, 1) else value


def _kernels_run(nodes: Any) -> int:
    count = 0
    for node in nodes or ():
        if node.get("type") == "kernel":
            count += 1
        elif node.get("type") == "graph":
            count += _kernels_run(node.get("nodes"))
    return count


def make_call(event: Event, namer: Optional[Namer] = None) -> Optional[Call]:
    """The Call of an exit event (None for functions the table does not have)."""
    api = row(event.api)
    if api is None:
        return None
    values = {**event.outs, **event.args}
    stream = stream_of(event.args.get("stream"))
    if stream is None and api.role in WORK_ROLES + (Role.ALLOC, Role.FREE):
        stream = LEGACY_STREAM  # (the synchronous calls work on the legacy default stream)
    call = Call(event.pid, event.tid, event.api, api.role, api.category,
                event.ts_ns - (event.duration_ns or 0), event.ts_ns, event.ret or 0,
                event.ret_name, stream, blocks(api), api.asynchronous, event.args, event.outs,
                event.py_stack, captured=bool(event.outs.get("captured")))
    if api.role == Role.LAUNCH and "func" in event.args:
        call.func = event.args["func"]
        name = namer(event, call.func) if namer is not None else None
        call.kernel = name or "0x%x" % call.func
        if name is None and namer is not None:
            call.unnamed = event  # (a name learned later, live, names it at the end)
    elif api.role == Role.GRAPH_LAUNCH:
        call.kernels_run = _kernels_run(event.outs.get("nodes"))
    if api.role in (Role.COPY, Role.MEMSET, Role.ALLOC, Role.HOST_REGISTER):
        call.bytes = byte_count(api, values) or 0
    if api.role == Role.COPY:
        call.direction = direction_of(api, event.args.get("kind"))
    return call


@dataclass
class Timeline:
    """Every completed call, per (pid, tid) in time order (`threads`), and all of them in
    time order (`calls`). Feed exit events with `add`; `finish()` before reading."""

    namer: Optional[Namer] = None
    threads: Dict[Tuple[int, int], List[Call]] = field(default_factory=dict)
    calls: List[Call] = field(default_factory=list)
    _layers: LayerFilter = field(default_factory=LayerFilter)

    def add(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.phase != EXIT:
                continue
            if is_driver(event.api):
                for held in self._layers.driver(event):
                    self._keep(held)
                continue
            inner, earlier = self._layers.runtime(event)
            for held in earlier:
                self._keep(held)
            call = self._keep(event)
            if call is not None and call.kernel is not None and call.kernel.startswith("0x"):
                for driver in inner:  # the driver's handle names every kernel
                    named = make_call(driver, self.namer)
                    if named is not None and named.kernel and not named.kernel.startswith("0x"):
                        call.kernel = named.kernel

    def _keep(self, event: Event) -> Optional[Call]:
        call = make_call(event, self.namer)
        if call is not None:
            self.calls.append(call)
        return call

    def finish(self) -> None:
        for held in self._layers.flush():
            self._keep(held)
        for call in self.calls:
            if call.unnamed is not None:
                name = self.namer(call.unnamed, call.func)  # type: ignore[misc]
                call.kernel, call.unnamed = name or call.kernel, None
        self.calls.sort(key=lambda c: (c.start_ns, c.end_ns))
        self.threads = {}
        for call in self.calls:
            mine = self.threads.setdefault((call.pid, call.tid), [])
            call.index = len(mine)
            mine.append(call)
