"""Chrome trace-event format (JSON array), opened by Perfetto UI and chrome://tracing.

One track per process and thread (`process_name`/`thread_name` metadata), each call a complete
slice (`"ph":"X"`) with its arguments, return name and duration; counters (`"ph":"C"`) for
live device memory and bytes copied per direction, per process; instant markers (`"ph":"i"`)
for failed calls, double frees and, at the end, leaked allocations. A graph launch has the
nodes it ran (graphs.py) as its children, in the graph's order: slices of category
`graph node` that share the launch call's time span equally (a child graph's nodes share its
own), titled by the kernel, `memcpy KIND` or `memset`; with both layers traced, under the
driver's cuGraphLaunch inside cudaGraphLaunch. They show what the launch ran, not when it ran
on the GPU. Timestamps are the kernel's CLOCK_MONOTONIC in microseconds (`ts_ns / 1000`).

NCCL calls on a communicator (`comm_id` in their arguments, or else a non-NULL `comm` handle:
one made before the trace began, or -r) are also drawn on a track of their communicator: a
Chrome-trace process per communicator id ("NCCL comm ID"), a thread in it per rank ("NCCL
comm ID (rank R/N)", or "(pid P)" while its rank is unknown); a communicator whose id is
unknown is a process of its own per handle and pid. The ranks of one job traced together
thus lie one under the other, each collective titled with its sequence number
("ncclAllReduce #3"), category `nccl comm`. The calls stay on their thread's track too
(besides, not instead): there they nest what NCCL itself calls (its kernel launches) and the
thread's time shows where it waited.

With --py-stacks, each call's slice (and marker) has its Python stack in its arguments
(`py_args`: the innermost frame, the innermost user frame, every frame), and so has each
leaked allocation's marker.

The array is streamed: `[` at `header()`, each batch as it comes, `]` at `close()`; memory
stays constant whatever the number of events (only per-process state and live allocations
are kept).
"""
import json
from typing import IO, Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..analysis.gpu import GpuState
from ..analysis.layers import LayerFilter
from ..analysis.memory import ALLOCATORS, DOUBLE_FREE, FREES, LeakTracker, MemoryWarning
from ..analysis.python_lines import frame_text, user_line
from ..decode.events import ENTER, EXIT, Event, PyFrame
from ..decode.operations import copy_bytes, copy_label, copy_operation
from ..decode.values import field_kinds, trace_value
from ..spec.apis import BY_NAME, DEVICE, NCCL, Role
from ..targets.elf import demangle
from . import finish

Namer = Callable[[Event, int], Optional[str]]  # (event, function address) -> kernel name
# Communicator tracks get pids and tids above any real one (pid_max is at most 2^22), so
# they never share a track with a process or thread.
COMM_TRACK_BASE = 1 << 30
Emit = Callable[[Dict[str, Any]], None]


class ApiInfo:
    """What the writer needs to know of a function, computed once per name: its category
    and the kinds of its values."""

    def __init__(self, name: str) -> None:
        row = BY_NAME.get(name)
        self.category = row.category if row else "other"
        self.role = row.role if row else None
        self.nccl = row is not None and row.library == NCCL
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


def _device_only(table: Dict[str, Any]) -> Dict[str, Any]:
    """The entries of an allocator or free table (analysis.memory) for device memory: the
    timeline follows device memory only."""
    return {name: v for name, v in table.items() if BY_NAME[name].memory == DEVICE}


def copy_direction(ev: Event) -> Optional[Tuple[str, int]]:
    """(direction, bytes) of a successful copy ("Host-to-Device", ...: the summary's names),
    else None (memsets are not copies)."""
    if ev.ret or ev.phase != EXIT:
        return None
    label = copy_label(copy_operation(ev) or "")
    size = copy_bytes(ev)
    return None if label is None or size is None else (label, size)


def _node_slice(node: dict) -> Tuple[str, Dict[str, Any]]:
    """The title and arguments of a graph node's slice."""
    kind = node.get("type")
    if kind == "kernel":
        return (node.get("kernel") or "0x%x" % (node.get("func") or 0),
                {"func": "0x%x" % (node.get("func") or 0), "grid": node.get("grid"),
                 "block": node.get("block"), "smem": node.get("smem")})
    if kind == "memcpy":
        return "memcpy %s" % node.get("kind"), {"size": node.get("size"),
                                                "kind": node.get("kind")}
    if kind == "memset":
        return "memset", {"size": node.get("size")}
    inner = node.get("nodes")
    return "graph", {"nodes": len(inner) if inner is not None else None}


def py_args(stack: Optional[Sequence[PyFrame]]) -> Dict[str, Any]:
    """The arguments a call with a Python stack gains (none without one): `py_frame`, its
    innermost frame, `py_line`, its innermost user frame (the summary's row by Python line),
    and `py_stack`, every frame innermost first; each frame as `FILE:LINE FUNCTION`."""
    if not stack:
        return {}
    key = tuple(stack)
    args = _PY_ARGS.get(key)
    if args is None:  # (kept: a loop makes the same stacks again and again)
        if len(_PY_ARGS) > 16384:
            _PY_ARGS.clear()
        args = _PY_ARGS[key] = {"py_frame": frame_text(stack[0]), "py_line": user_line(stack),
                                "py_stack": [frame_text(frame) for frame in stack]}
    return args


_PY_ARGS: Dict[Tuple[PyFrame, ...], Dict[str, Any]] = {}


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


class ChromeTraceWriter:
    """A sink writing the Chrome trace-event JSON array to `stream`.

    `namer(event, address)` gives kernel names of launches (optional)."""

    def __init__(self, stream: IO[str], namer: Optional[Namer] = None) -> None:
        self.stream = stream
        self.namer = namer
        # Device memory as --leaks tracks it: each operation once across the layers.
        self.memory = LeakTracker(allocators=_device_only(ALLOCATORS), frees=_device_only(FREES),
                                  keep_timeline=False, on_change=self._live_changed,
                                  on_warning=self._warned)
        self._copy_layers = LayerFilter()  # a copy counts as its runtime call
        self._graph_layers = LayerFilter()  # a graph launch's nodes go under its driver call
        self._emit: Emit = lambda obj: None  # where the memory callbacks write (this batch)
        self._encode = json.JSONEncoder(separators=(",", ":")).encode
        self._first = True
        self._started = False
        self._pending: Optional[Event] = None  # an enter event whose exit may follow
        self._processes: Set[int] = set()
        self._threads: Set[Tuple[int, int]] = set()
        self._copied: Dict[int, Dict[str, int]] = {}
        self._last_ns: Dict[int, int] = {}
        self._comms = CommTracks()
        self.gpu = GpuState(tracker=self.memory)  # the GPU's records (note_gpu), at the end

    def header(self) -> None:
        if not self._started:
            self._started = True
            self.stream.write("[\n")

    def write(self, events: Iterable[Event]) -> None:
        self.header()
        out: List[Dict[str, Any]] = []
        self._emit = out.append
        events = events if isinstance(events, list) else list(events)
        self.gpu.write(events)
        for ev in events:
            self._event(ev, out.append)
        self._flush(out)

    def close(self) -> None:
        """Write the pending marker and the leaks, end the array; close the stream unless
        it is stdout or stderr."""
        self.header()
        out: List[Dict[str, Any]] = []
        self._emit = out.append
        self._flush_pending(None, out.append)
        for copy in self._copy_layers.flush():  # direct driver copies still held back
            self._copied_bytes(copy, out.append)
        self.memory.flush()
        self._leaks(out.append)
        gpu_tracks(self.gpu, out.append)
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
        marker = {"name": pending.api, "cat": "enter", "ph": "i", "s": "t",
                  "ts": _us(pending.ts_ns), "pid": pending.pid, "tid": pending.tid,
                  "args": self._args(pending, api_info(pending.api).kinds,
                                     self._kernel(pending))}
        emit(marker)
        if api_info(pending.api).nccl:
            self._comms.copy(pending, marker, emit)

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
        if ev.py_stack:
            args.update(py_args(ev.py_stack))
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
        nodes = ev.outs.get("nodes")
        if isinstance(nodes, list):
            args["nodes"] = len(nodes)  # (each is a child slice of a graph launch)
        if ev.faults:
            args["unreadable"] = list(ev.faults)
        duration = ev.duration_ns or 0
        slice_ = {"name": self._title(ev, kernel if info.category == "launch" else None),
                  "cat": info.category, "ph": "X",
                  "ts": _us(ev.ts_ns - duration), "dur": _us(duration), "pid": ev.pid,
                  "tid": ev.tid, "args": args}
        emit(slice_)
        if info.nccl:
            self._comms.copy(ev, slice_, emit)
        if isinstance(nodes, list) and info.role == Role.GRAPH_LAUNCH \
                and self._graph_layers.inner(ev):
            self._nodes(ev, nodes, ev.ts_ns - duration, duration, emit)
        if ev.ret:
            emit(self._instant(ev, ev.ret_name or "error %d" % ev.ret, "error",
                               {"api": ev.api, "ret": ev.ret}))
        if ev.api in self.memory.allocators or ev.api in self.memory.frees:
            self.memory.feed(ev)  # (its changes and warnings come through the callbacks)
        if copy_direction(ev) is not None:
            for copy in self._copy_layers.outer(ev):
                self._copied_bytes(copy, emit)

    @staticmethod
    def _title(ev: Event, kernel: Optional[str]) -> str:
        """A launch is titled by the kernel it runs, a call that taught a kernel's name
        (cuModuleGetFunction & co.) by that name, demangled as launches are; never by an
        argument that happens to be called `kernel` (cuLibraryGetKernel's out handle)."""
        if kernel:
            return kernel
        learned = ev.outs.get("kernel_name")
        return demangle(learned) if isinstance(learned, str) and learned else ev.api

    def _nodes(self, ev: Event, nodes: List[dict], start_ns: int, span_ns: int,
               emit: Emit) -> None:
        """A graph launch's nodes as child slices sharing [start, start + span] equally."""
        for i, node in enumerate(nodes):
            begin = start_ns + span_ns * i // len(nodes)
            end = start_ns + span_ns * (i + 1) // len(nodes)
            title, args = _node_slice(node)
            emit({"name": title, "cat": "graph node", "ph": "X", "ts": _us(begin),
                  "dur": _us(end - begin), "pid": ev.pid, "tid": ev.tid, "args": args})
            if node.get("type") == "graph" and node.get("nodes"):
                self._nodes(ev, node["nodes"], begin, end - begin, emit)

    def _instant(self, ev: Event, name: str, cat: str, args: Dict[str, Any],
                 scope: str = "t") -> Dict[str, Any]:
        return {"name": name, "cat": cat, "ph": "i", "s": scope, "ts": _us(ev.ts_ns),
                "pid": ev.pid, "tid": ev.tid, "args": args}

    def note_gpu(self, records: List) -> None:
        """The GPU's samples and events (gpu/records.py): drawn at `close`."""
        self.gpu.note_gpu(records)

    def _live_changed(self, ev: Event, live: int) -> None:
        self.gpu.live.change(ev, live)
        self._emit({"name": "live device memory", "ph": "C", "ts": _us(ev.ts_ns),
                    "pid": ev.pid, "args": {"bytes": live}})

    def _warned(self, warning: MemoryWarning) -> None:
        """A double free is marked (the other warnings are --leaks' business)."""
        if warning.kind != DOUBLE_FREE:
            return
        ev = warning.event
        ptr = ev.args[self.memory.frees[ev.api]]
        self._emit(self._instant(ev, "double free", "memory", {"api": ev.api, "ptr": "0x%x" % ptr}))

    def _copied_bytes(self, ev: Event, emit: Emit) -> None:
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
                  "args": dict({"ptr": "0x%x" % alloc.ptr, "size": alloc.size,
                                "api": alloc.api, "allocated_at_us": _us(alloc.ts_ns)},
                               **py_args(alloc.py_stack))})


GPU_PID = 1 << 24  # the tracks of device N are process GPU_PID + N (above Linux's pid_max)
# The counter tracks of a device: (track, {series: the sample's key})
GPU_COUNTERS = (
    ("GPU utilisation (%)", {"gpu": "gpu_util", "memory": "mem_util"}),
    ("GPU activity (GPM, %)", {"gr_engine_active": "gr_engine_active",
                               "sm_active": "sm_active", "sm_occupancy": "sm_occupancy",
                               "tensor_active": "tensor_active", "dram_active": "dram_active"}),
    ("GPU memory used (bytes)", {"used": "mem_used"}),
    ("GPU power (W)", {"power": "power_w"}),
    ("GPU temperature (C)", {"temperature": "temperature_c"}),
    ("GPU clocks (MHz)", {"sm": "sm_clock_mhz", "memory": "mem_clock_mhz"}),
    ("GPU clock-event reasons (mask)", {"reasons": "clock_reasons"}),
    ("GPU PCIe (KB/s)", {"tx": "pcie_tx_kbs", "rx": "pcie_rx_kbs"}),
    ("GPU NVLink (KB/s)", {"tx": "nvlink_tx_kbs", "rx": "nvlink_rx_kbs"}),
)


def gpu_tracks(gpu: GpuState, emit: Emit) -> None:
    """Counter tracks per device (a process of its own), per traced process (on its own
    track: NVML's memory, the gap to its live allocations, its SM utilisation), and each
    device event an instant marker on its device, with the launches before it."""
    named: Set[int] = set()
    for sample in gpu.samples:
        pid = GPU_PID + sample.device
        if sample.device not in named:
            named.add(sample.device)
            emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                  "args": {"name": "GPU %d: %s" % (sample.device, sample.name)}})
        for track, series in GPU_COUNTERS:
            args = {name: sample.values[key] for name, key in series.items()
                    if key in sample.values}
            if args:
                emit({"name": track, "ph": "C", "ts": _us(sample.ts_ns), "pid": pid,
                      "args": args})
        for state in sample.processes:
            if state.pid in gpu.pids and state.sm_util is not None:
                emit({"name": "GPU %d SM utilisation (%%)" % sample.device, "ph": "C",
                      "ts": _us(sample.ts_ns), "pid": state.pid,
                      "args": {"sm": state.sm_util, "memory": state.mem_util}})
    for gap in gpu.gaps():
        emit({"name": "GPU %d memory (NVML, bytes)" % gap.device, "ph": "C", "ts": _us(gap.ts_ns),
              "pid": gap.pid, "args": {"nvml": gap.nvml, "gap": gap.gap}})
    for event in gpu.events:
        emit({"name": "Xid %d" % event.code if event.kind == "xid" else event.kind,
              "cat": "gpu event", "ph": "i", "s": "p", "ts": _us(event.ts_ns),
              "pid": GPU_PID + (event.device or 0), "tid": 0, "args": event.to_json()})


class CommTracks:
    """The communicator tracks of one timeline (see the module's docstring): which
    Chrome-trace pid and tid each communicator and rank got, and their names as last told."""

    def __init__(self) -> None:
        self._pids: Dict[Any, int] = {}  # communicator key -> track pid
        self._tids: Dict[Tuple[int, int], int] = {}  # (process, handle) -> track tid
        self._names: Dict[Tuple[int, int], str] = {}  # (track pid, tid) -> its name

    def copy(self, ev: Event, shown: Dict[str, Any], emit: Emit) -> None:
        """`shown` (the thread track's slice or marker of an NCCL call) again on its
        communicator's track; nothing for a call on no communicator (groups, NULL)."""
        comm_id = ev.args.get("comm_id")
        handle = ev.args.get("comm")
        if handle is None and comm_id is not None:  # ncclCommInitRank*: the one it made
            handle = ev.outs.get("comm")
        if not handle or not isinstance(handle, int):
            return
        key = comm_id if comm_id is not None else (ev.pid, handle)
        label = comm_id if comm_id is not None else "0x%x (pid %d)" % (handle, ev.pid)
        pid = self._pids.get(key)
        if pid is None:
            pid = self._pids[key] = COMM_TRACK_BASE + len(self._pids)
            emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                  "args": {"name": "NCCL comm %s" % label}})
        tid = self._tids.get((ev.pid, handle))
        if tid is None:
            tid = self._tids[(ev.pid, handle)] = COMM_TRACK_BASE + len(self._tids)
        name = "NCCL comm %s" % label
        rank, nranks = ev.args.get("rank"), ev.args.get("nranks")
        if comm_id is not None:
            name += " (rank %s/%s)" % (rank, "?" if nranks is None else nranks) \
                if rank is not None else " (pid %d)" % ev.pid
        if self._names.get((pid, tid)) != name:  # (a rank learned later renames its track)
            self._names[(pid, tid)] = name
            emit({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                  "args": {"name": name}})
        seq = ev.args.get("seq")
        copied = dict(shown, pid=pid, tid=tid, cat="nccl comm")
        if seq is not None:
            copied["name"] = "%s #%d" % (shown["name"], seq)
        emit(copied)


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
