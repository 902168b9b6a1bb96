"""The calls `ebpf-cuda analyze` reasons about: each completed CUDA call once (with both
layers traced, as its runtime call: layers.py), reduced to what the steps, the wait bounds
and the rules read (`Call`), kept per thread in time order.

What a call is, is read from the function table (operations.py): its role (launch, copy,
memset, alloc, free, graph launch), whether it blocks its thread until the GPU is done, its
stream (0 and 1, the legacy default stream, are one), its bytes and direction, its kernel.
"""
from dataclasses import dataclass, field
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..decode.events import EXIT, Event, PyFrame
from ..decode.operations import blocks, byte_count, direction_of, is_driver, row
from ..spec.apis import Role
from ..targets.symbols import Frame
from .layers import LayerFilter
from .python_lines import frame_text, user_frame

Namer = Callable[[Event, int], Optional[str]]
# With --stacks: (pid, stack_id) → the frames of that user stack, innermost first (None for
# an address in no file); live, read from the stack map, offline from the saved trace.
StackFrames = Callable[[int, int], Sequence[Optional[Frame]]]
# The files whose frames are CUDA's, not the caller's (the tests' stand-ins take the real
# names): a call's native site is the innermost frame outside them.
CUDA_LIBRARIES = ("libcudart.", "libcuda.", "libnccl.", "libcublas", "libcudnn", "libcufft.",
                  "libcurand.", "libcusparse.", "libcusolver.", "libnvrtc.", "libnvJitLink.")
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
    native: Optional[str] = None  # with --stacks: the native caller (`native_caller`)
    # with --stacks: its user stack's named frames outside the CUDA libraries, innermost
    # first (`user_frames`; one tuple per (pid, stack_id), shared by its calls); None: no
    # stack recorded (a launch, a call with a Python stack)
    native_frames: Optional[Tuple[Frame, ...]] = None

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
        else the native caller (--stacks: `FUNCTION+0xOFF (FILE)`), else the function's name
        and thread (neither stack was recorded)."""
        frame = user_frame(self.py_stack)
        if frame is not None:
            return frame_text(frame)
        if self.native is not None:
            return self.native
        return "%s (thread %d, no Python stack)" % (self.api, self.tid)

    @property
    def python(self) -> Optional[str]:
        """Its site when that is a Python line (a finding's `where.python`)."""
        return self.site if self.py_stack else None

    @property
    def native_site(self) -> Optional[str]:
        """Its site when that is its native caller (a finding's `where.native`)."""
        return self.native if self.native is not None and not self.py_stack else None


def is_cuda_file(path: str) -> bool:
    """A CUDA library's file (see CUDA_LIBRARIES)."""
    return os.path.basename(path).startswith(CUDA_LIBRARIES)


def native_caller(frames: Sequence[Optional[Frame]]) -> Optional[str]:
    """The innermost frame outside the CUDA libraries, as `FUNCTION+0xOFF (FILE)` (or
    `FILE+0xOFF` where no symbol holds it); None when every frame is CUDA's or unknown."""
    for frame in frames:
        if frame is not None and not is_cuda_file(frame.path):
            return str(frame)
    return None


def user_frames(frames: Sequence[Optional[Frame]]) -> Tuple[Frame, ...]:
    """The frames of a stack in a named function outside the CUDA libraries (`--step-at`
    and the native regions read them)."""
    return tuple(f for f in frames if f is not None and f.function is not None
                 and not is_cuda_file(f.path))


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
    stacks: Optional[StackFrames] = None  # with --stacks: each call's native caller
    threads: Dict[Tuple[int, int], List[Call]] = field(default_factory=dict)
    calls: List[Call] = field(default_factory=list)
    _layers: LayerFilter = field(default_factory=LayerFilter)
    _native: Dict[Tuple[int, int], Tuple[Optional[str], Tuple[Frame, ...]]] = field(
        default_factory=dict)

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
            if event.stack_id and self.stacks is not None and not call.py_stack:
                key = (event.pid, event.stack_id)  # (symbolised once, while the process lives)
                if key not in self._native:
                    frames = self.stacks(*key)
                    self._native[key] = native_caller(frames), user_frames(frames)
                call.native, call.native_frames = self._native[key]
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
