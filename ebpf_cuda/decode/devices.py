"""Which GPU each call targets: the device of its thread's current context, as the traced
calls set it. Pure logic fed with decoded events in trace order (the stream annotates them,
as it does names; saved traces get the same when read again).

Per thread: `cudaSetDevice(d)` makes d current (and, as the runtime does, the primary
context of d); `cuCtxCreate(.., d)` makes its new context current; `cuCtxSetCurrent(ctx)`
replaces the top of the thread's context stack, `cuCtxPushCurrent` / `cuCtxPopCurrent`
move it; a context's device comes from the call that made it (`cuCtxCreate`,
`cuDevicePrimaryCtxRetain`). A call that names its device (`cudaSetDevice`, `cuCtxCreate`,
`cuDevicePrimaryCtxRetain`) targets that one; an NCCL call, its communicator's (once
`ncclCommCuDevice` told it, or the device current when the communicator was made).

A thread that set nothing is on device 0 when its process was traced from its start (the
runtime's documented default); attached to a running process (`-d`, system-wide), such a
thread's device is unknown until it sets one, and its events carry none.
"""
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

from .events import EXIT, Event

_SETS_DEVICE = {"cudaSetDevice"}
_TELLS_DEVICE = {"cudaGetDevice"}  # (its out-parameter is the thread's device)
_MAKES_CONTEXT = {"cuCtxCreate_v2", "cuCtxCreate_v4", "cuDevicePrimaryCtxRetain"}
_CURRENT_CONTEXT = {"cuCtxCreate_v2", "cuCtxCreate_v4"}  # (a new context is pushed)
_NAMES_DEVICE = _SETS_DEVICE | _MAKES_CONTEXT
_NCCL_MAKES = {"ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable",
               "ncclCommSplit"}
_NCCL_OUT = {"ncclCommInitRank": "comm", "ncclCommInitRankConfig": "comm",
             "ncclCommInitRankScalable": "comm", "ncclCommSplit": "newcomm"}
_CHANGES = _NAMES_DEVICE | _TELLS_DEVICE | _NCCL_MAKES | {
    "cuCtxSetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"}
Thread = Tuple[int, int]


class _Context(NamedTuple):
    """A context made current before the call that tells its device was seen (CUDA's
    runtime sets its primary context current, then retains it where the probes see it):
    its device is looked up when asked, so the thread's later calls get it once known."""

    handle: int


Entry = Union[Optional[int], _Context]  # a device (None: unknown), or a context


class DeviceTracker:
    """Sets `event.device` on each event it is given (see the module's docstring)."""

    def __init__(self, from_start: bool = False) -> None:
        self.from_start = from_start  # processes traced from their start: device 0 first
        self._stacks: Dict[Thread, List[Entry]] = {}  # thread -> its contexts, innermost last
        self._contexts: Dict[Tuple[int, int], int] = {}  # (pid, context) -> device
        self._comms: Dict[Tuple[int, int], int] = {}  # (pid, ncclComm_t) -> device
        self.version = 0  # grows whenever a thread's device may have changed

    @staticmethod
    def changes(api) -> bool:
        """True for the rows whose calls can change (or tell) a thread's device, and those
        with a `device` out-parameter (it is the event's `device` key): the lines fast path
        decodes them, in order."""
        return (api.name in _CHANGES or api.library == "nccl"
                or any(out.name == "device" for out in api.outs))

    @staticmethod
    def only_tells(api) -> bool:
        """True for the rows whose only effect on devices is to tell the thread's device
        through their `device` out-parameter (cudaGetDevice): the lines fast path formats
        them and hands the value to `told`."""
        return (api.name in _TELLS_DEVICE and api.library != "nccl"
                and api.name not in _NAMES_DEVICE)

    def told(self, pid: int, tid: int, device: int) -> bool:
        """A successful call of an `only_tells` row said thread `tid` is on `device` (what
        `annotate` learns from its event); True when that was news (`version` grew)."""
        stack = self._stacks.get((pid, tid))
        if stack and stack[-1] == device:
            return False
        self._set_top((pid, tid), device)
        self.version += 1
        return True

    def current(self, pid: int, tid: int) -> Optional[int]:
        """The device thread `tid` of process `pid` is on now (None: not known)."""
        stack = self._stacks.get((pid, tid))
        if not stack:
            return 0 if self.from_start else None
        top = stack[-1]
        return self._contexts.get((pid, top.handle)) if isinstance(top, _Context) else top

    def annotate(self, events: Iterable[Event]) -> None:
        for event in events:
            event.device = self._target(event)
            if event.phase == EXIT and event.ret == 0 and event.api in _CHANGES:
                self._learn(event)
                self.version += 1

    def _target(self, event: Event) -> Optional[int]:
        api, args = event.api, event.args
        if api in _NAMES_DEVICE:
            return args.get("device")
        if api.startswith("nccl"):
            device = args.get("device")  # (the communicator's, nccl.py)
            if device is None:
                device = self._comms.get((event.pid, args.get("comm")))
            if device is not None:
                return device
        return self.current(event.pid, event.tid)

    def _learn(self, event: Event) -> None:
        api, args, outs, thread = event.api, event.args, event.outs, (event.pid, event.tid)
        if api in _SETS_DEVICE:
            self._set_top(thread, args.get("device"))
        elif api in _TELLS_DEVICE and outs.get("device") is not None:
            self._set_top(thread, outs["device"])
        elif api in _MAKES_CONTEXT:
            ctx = outs.get("ctx")
            if ctx:
                self._contexts[(event.pid, ctx)] = args.get("device")
            if api in _CURRENT_CONTEXT:
                self._stack(thread).append(args.get("device"))
        elif api == "cuCtxSetCurrent":
            self._set_top(thread, _context(args.get("ctx")))
        elif api == "cuCtxPushCurrent_v2":
            self._stack(thread).append(_context(args.get("ctx")))
        elif api == "cuCtxPopCurrent_v2":
            stack = self._stacks.get(thread)
            if stack:
                stack.pop()
        elif api in _NCCL_MAKES:
            comm = outs.get(_NCCL_OUT[api])
            device = self.current(event.pid, event.tid)
            if comm and device is not None:
                self._comms[(event.pid, comm)] = device

    def _stack(self, thread: Thread) -> List[Entry]:
        stack = self._stacks.get(thread)
        if stack is None:
            stack = self._stacks[thread] = [0] if self.from_start else []
        return stack

    def _set_top(self, thread: Thread, device: Entry) -> None:
        stack = self._stack(thread)
        if stack:
            stack[-1] = device
        else:
            stack.append(device)

    def forget(self, pid: int) -> None:
        """Drop what is kept of a process that exited."""
        for table in (self._stacks, self._contexts, self._comms):  # (list(): one copy)
            for key in [key for key in list(table) if key[0] == pid]:
                table.pop(key, None)


def _context(ctx: Optional[int]) -> Entry:
    """A stack entry for context `ctx` (NULL: none current, so no device)."""
    return _Context(ctx) if ctx else None
