"""CUDA graphs seen node by node: each graph built from the traced calls, each graph launch
expanded into what it runs.

All of it is on the host, in the calls the table traces (apis.py, the graph roles):

- **stream capture**: between `cudaStreamBeginCapture(s)` and `cudaStreamEndCapture(s, &g)`
  a launch, copy or memset on `s` is recorded into the graph, not run. Other streams join
  the capture when they wait for an event recorded on a capturing stream (PyTorch's side
  streams): `cudaEventRecord(e, s)` then `cudaStreamWaitEvent(s2, e)`. They leave it when it
  ends. `cudaStreamBeginCaptureToGraph` captures into a graph that exists already.
- **explicit construction**: `cudaGraphCreate`, then `cudaGraphAdd*Node` each return a node
  (a child graph node holds a copy of its child graph as it was then);
- **instantiation** takes a snapshot of the graph: the exec handle runs those nodes (each
  instantiation its own), and exec updates (`cudaGraphExecKernelNodeSetParams`,
  `cudaGraphExecUpdate`) change that snapshot only;
- a **graph launch** runs the exec's nodes.

Nodes are kept in the order they were added: a node's dependencies must exist when it is
added (and captured work is added in call order), so that order is a topological order of
the graph (dependencies added later with cudaGraphAddDependencies are not traced).

`GraphTracker.annotate(events)` takes the events in order and adds to them (as values the
outputs show like out-parameters, values.ANNOTATIONS):
- `captured: True` on a launch, copy or memset recorded into a graph (it did not run), and
  `graph` when the graph is known then (capture into an existing graph);
- `nodes` on the exit of a graph launch: what it ran, as JSON-ready dicts in topological
  order (`{"type": "kernel", "kernel": NAME, "func": F, "grid": [x,y,z], "block": [x,y,z],
  "smem": N}`, `{"type": "memcpy", "size": N, "kind": KIND}`, `{"type": "memset", "size":
  N}`, `{"type": "graph", "nodes": [...]}`; empty, event record and wait nodes run nothing
  and are left out), or None with `nodes_reason` when the graph was made before the trace
  began; `nodes` on the exit of an end of capture too: what the capture recorded.

With both layers traced a runtime call makes the driver call inside it (cudaGraphLaunch's
cuGraphLaunch, cudaMemcpyAsync's cuMemcpyAsync): both events are annotated, and one
operation is one node (the runtime call's, in the place of the driver call's).

Kernel names come from the one names store (names.py), asked by the call that made the
node, as eager launches are named. Pure user-space logic: no kernel objects.
"""
from __future__ import annotations
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple

from ..spec.apis import CAPTURED_ROLES, TABLE, Api, Role
from .events import EXIT, Event
from .operations import byte_count, direction_of

KERNEL, MEMCPY, MEMSET, GRAPH = "kernel", "memcpy", "memset", "graph"

# The roles whose records the tracker must always see, and those it needs while a stream is
# capturing (then a launch or copy may be recorded into a graph, and events join streams).
GRAPH_ROLES = frozenset((
    Role.CAPTURE_BEGIN, Role.CAPTURE_END, Role.GRAPH_CREATE, Role.KERNEL_NODE,
    Role.COPY_NODE, Role.MEMSET_NODE, Role.CHILD_NODE, Role.EMPTY_NODE, Role.INSTANTIATE,
    Role.EXEC_UPDATE, Role.EXEC_KERNEL_UPDATE, Role.GRAPH_DESTROY, Role.EXEC_DESTROY,
    Role.GRAPH_LAUNCH))
_WORK_ROLES = (Role.LAUNCH, Role.COPY, Role.MEMSET)  # what a capture records

# Why a graph launch's nodes are unknown (the `nodes_reason` of its events).
BEFORE_TRACE = "instantiated before the trace began"
GRAPH_BEFORE_TRACE = "its graph was made before the trace began"
CAPTURE_BEFORE_TRACE = "its capture began before the trace"
UNSEEN_NODE = "a node was updated that the trace did not see made"

# Per-thread default streams: the same handle is another stream in each thread.
_PER_THREAD_STREAMS = (0, 1, 2)  # (0: legacy, or per-thread in _ptsz calls), legacy, per-thread


class Node(NamedTuple):
    """One node of a graph, as made: what runs, and the call that made it (`api`: kernel
    names are asked by it). `handle`: the node's handle (0 for captured work); `child`: a
    child graph node's nodes (None when its graph is unknown)."""

    type: str
    api: str
    handle: int = 0
    func: int = 0
    grid: Optional[tuple] = None
    block: Optional[tuple] = None
    smem: Optional[int] = None
    size: Optional[int] = None
    kind: Optional[str] = None
    child: Optional[Tuple["Node", ...]] = None


class Graph:
    """The nodes of a graph being built (in the order added), or why they are unknown."""

    def __init__(self, reason: Optional[str] = None) -> None:
        self.nodes: List[Node] = []
        self.reason = reason
        self._at: Dict[int, int] = {}  # node handle -> index

    def add(self, node: Node) -> int:
        """Add a node (a node of a handle already there replaces it: the runtime call
        returns after the driver call inside it, with the same handle); its index."""
        index = self._at.get(node.handle) if node.handle else None
        if index is None:
            index = len(self.nodes)
            self.nodes.append(node)
            if node.handle:
                self._at[node.handle] = index
        else:
            self.nodes[index] = node
        return index

    def replace(self, index: int, node: Node) -> None:
        self.nodes[index] = node

    def copy(self) -> "Graph":
        """A snapshot: what an instantiation (or an exec update) runs from then on."""
        other = Graph(self.reason)
        other.nodes, other._at = list(self.nodes), dict(self._at)
        return other

    def update(self, handle: int, node: Node) -> bool:
        """Replace the node of `handle`; False when there is none."""
        index = self._at.get(handle)
        if index is None:
            return False
        self.nodes[index] = node._replace(handle=handle)
        return True


class _Capture:
    """A stream capture in progress: the graph it records into (`handle` when it existed
    before: capture to a graph)."""

    def __init__(self, graph: Graph, handle: Optional[int]) -> None:
        self.graph = graph
        self.handle = handle
        self.streams: List[tuple] = []


class _Caller(NamedTuple):
    """Who made a node, for a namer(event, func) that reads `pid` and `api` of an event."""

    pid: int
    api: str


class GraphTracker:
    """Builds the graphs of a trace from its events and annotates them (see the module's
    docstring). `namer`: the names store (`name_for(pid, api, func)`, or a
    namer(event, func)). Also the lines' detour (output/lines.py): `always_needs(api)`,
    `needs_while_capturing(api)` and `capturing` say which records must come through
    `annotate`."""

    def __init__(self, namer=None) -> None:
        self.namer = namer
        self._graphs: Dict[Tuple[int, int], Graph] = {}
        self._execs: Dict[Tuple[int, int], Graph] = {}
        self._captures: Dict[tuple, _Capture] = {}  # stream key -> its capture
        self._events: Dict[Tuple[int, int], _Capture] = {}  # event recorded while capturing
        self._inner: Dict[int, Tuple[_Capture, int, int, int]] = {}  # tid -> driver node
        self._expanded: Dict[Tuple[int, int], List[dict]] = {}  # exec -> its nodes, named
        self._launch_spans: Dict[int, Tuple[int, int]] = {}  # tid -> last driver launch
        self.unknown: Dict[Tuple[int, int, str], int] = {}  # (pid, exec, reason) -> launches
        by_role = {
            Role.CAPTURE_BEGIN: self._begin, Role.CAPTURE_END: self._end,
            Role.GRAPH_CREATE: self._create, Role.KERNEL_NODE: self._add_node,
            Role.COPY_NODE: self._add_node, Role.MEMSET_NODE: self._add_node,
            Role.CHILD_NODE: self._add_node, Role.EMPTY_NODE: self._add_node,
            Role.INSTANTIATE: self._instantiate, Role.EXEC_UPDATE: self._exec_update,
            Role.EXEC_KERNEL_UPDATE: self._exec_kernel_update,
            Role.GRAPH_DESTROY: self._destroy_graph, Role.EXEC_DESTROY: self._destroy_exec,
            Role.GRAPH_LAUNCH: self._launch, Role.EVENT_RECORD: self._record,
            Role.STREAM_WAIT: self._wait,
            Role.LAUNCH: self._work, Role.COPY: self._work, Role.MEMSET: self._work,
        }
        # function name -> (its row, its handler, needed only while a stream captures)
        self._handlers = {api.name: (api, by_role[api.role], api.role in CAPTURED_ROLES)
                          for api in TABLE if api.role in by_role}

    # -- what the lines must detour through annotate ----------------------------------------

    @staticmethod
    def always_needs(api: Api) -> bool:
        return api.role in GRAPH_ROLES

    @staticmethod
    def needs_while_capturing(api: Api) -> bool:
        return api.role in CAPTURED_ROLES

    @property
    def capturing(self) -> bool:
        """Whether any stream is capturing now."""
        return bool(self._captures)

    # -- taking events in ------------------------------------------------------------------

    def annotate(self, events: Iterable[Event]) -> None:
        """Take in a batch of events, in order, and annotate them (module docstring)."""
        handlers = self._handlers
        for event in events:
            if event.phase != EXIT or event.ret:  # (a failed call changed nothing)
                continue
            found = handlers.get(event.api)
            if found is None:
                continue
            api, handler, while_capturing = found
            if while_capturing and not self._captures and not self._events:
                continue  # the usual launch or copy: no stream captures (no cost but this)
            handler(event, api)

    def _stream(self, event: Event, stream: Any) -> tuple:
        if stream in _PER_THREAD_STREAMS:
            return (event.pid, stream, event.tid)
        return (event.pid, stream)

    def _capture_of(self, event: Event) -> Optional[_Capture]:
        if not self._captures or "stream" not in event.args:
            return None
        return self._captures.get(self._stream(event, event.args["stream"]))

    # -- capture ---------------------------------------------------------------------------

    def _begin(self, event: Event, api: Api) -> None:
        key = self._stream(event, event.args.get("stream"))
        if key in self._captures:
            return  # the runtime call around the driver's that began it
        handle = event.args.get("graph")
        graph = self._graphs.get((event.pid, handle)) if handle else None
        if handle and graph is None:
            graph = self._graphs[(event.pid, handle)] = Graph(GRAPH_BEFORE_TRACE)
        capture = _Capture(graph if graph is not None else Graph(), handle)
        self._join(capture, key)

    def _join(self, capture: _Capture, key: tuple) -> None:
        if key not in self._captures:
            self._captures[key] = capture
            capture.streams.append(key)

    def _end(self, event: Event, api: Api) -> None:
        pid, handle = event.pid, event.outs.get("graph")
        capture = self._captures.get(self._stream(event, event.args.get("stream")))
        if capture is not None:
            for key in capture.streams:
                del self._captures[key]
            self._events = {k: c for k, c in self._events.items() if c is not capture}
            if handle:
                self._graphs[(pid, handle)] = capture.graph
        elif handle and (pid, handle) not in self._graphs:
            self._graphs[(pid, handle)] = Graph(CAPTURE_BEFORE_TRACE)
        graph = self._graphs.get((pid, handle)) if handle else None
        if graph is not None:
            self._show_nodes(event, graph)

    def _record(self, event: Event, api: Api) -> None:
        key = (event.pid, event.args.get("event"))
        capture = self._capture_of(event)
        if capture is not None:
            self._events[key] = capture
        elif self._events:
            self._events.pop(key, None)  # recorded again, outside any capture

    def _wait(self, event: Event, api: Api) -> None:
        capture = self._events.get((event.pid, event.args.get("event")))
        if capture is not None:
            self._join(capture, self._stream(event, event.args.get("stream")))

    def _work(self, event: Event, api: Api) -> None:
        """A launch, copy or memset: recorded into the graph when its stream captures."""
        capture = self._capture_of(event)
        if capture is None:
            return
        event.outs["captured"] = True
        if capture.handle:
            event.outs["graph"] = capture.handle
        node = self._work_node(event, api)
        if node is not None:
            self._record_node(event, api, capture, node)

    def _record_node(self, event: Event, api: Api, capture: _Capture, node: Node) -> None:
        """One operation, one node: a runtime call replaces the driver call made inside it
        (which returned first, on the same thread)."""
        start, end = event.ts_ns - (event.duration_ns or 0), event.ts_ns
        inner = self._inner.pop(event.tid, None)
        if not api.driver and inner is not None and inner[0] is capture \
                and start <= inner[2] and inner[3] <= end:
            capture.graph.replace(inner[1], node)
            return
        index = capture.graph.add(node)
        if api.driver:
            self._inner[event.tid] = (capture, index, start, end)

    @staticmethod
    def _work_node(event: Event, api: Api) -> Optional[Node]:
        args = event.args
        if api.role == Role.LAUNCH:
            return Node(KERNEL, api.name, func=args.get("func", 0), grid=args.get("grid"),
                        block=args.get("block"), smem=args.get("smem"))
        size = byte_count(api, args)
        if api.role == Role.MEMSET:
            return Node(MEMSET, api.name, size=size)
        return Node(MEMCPY, api.name, size=size, kind=direction_of(api, args.get("kind")))

    # -- explicit construction -------------------------------------------------------------

    def _create(self, event: Event, api: Api) -> None:
        handle = event.outs.get("graph")
        if handle:
            self._graphs[(event.pid, handle)] = Graph()

    def _graph(self, pid: int, handle: Any) -> Optional[Graph]:
        """The graph of a handle; one not seen made is unknown from now on."""
        if not handle:
            return None
        graph = self._graphs.get((pid, handle))
        if graph is None:
            graph = self._graphs[(pid, handle)] = Graph(GRAPH_BEFORE_TRACE)
        return graph

    def _add_node(self, event: Event, api: Api) -> None:
        graph = self._graph(event.pid, event.args.get("graph"))
        node = self._explicit_node(event, api)
        if graph is not None and node is not None:
            graph.add(node)

    def _explicit_node(self, event: Event, api: Api) -> Optional[Node]:
        args, handle = event.args, event.outs.get("node", 0)
        if api.role == Role.KERNEL_NODE:
            return Node(KERNEL, api.name, handle, args.get("func", 0), args.get("grid"),
                        args.get("block"), args.get("smem"))
        if api.role == Role.MEMSET_NODE:
            return Node(MEMSET, api.name, handle, size=args.get("size"))
        if api.role == Role.COPY_NODE:
            return Node(MEMCPY, api.name, handle, size=args.get("size"), kind=_copy_kind(args))
        if api.role == Role.CHILD_NODE:
            child = self._graph(event.pid, args.get("childGraph"))
            nodes = None if child is None or child.reason else tuple(child.nodes)
            return Node(GRAPH, api.name, handle, child=nodes)
        return None  # empty, event record and wait nodes run nothing

    # -- instantiation, updates, destruction -----------------------------------------------

    def _instantiate(self, event: Event, api: Api) -> None:
        handle = event.outs.get("graphExec")
        graph = self._graph(event.pid, event.args.get("graph"))
        if handle and graph is not None:
            self._set_exec((event.pid, handle), graph.copy())

    def _set_exec(self, key: Tuple[int, int], graph: Graph) -> None:
        self._execs[key] = graph
        self._expanded.pop(key, None)

    def _exec_update(self, event: Event, api: Api) -> None:
        key = (event.pid, event.args.get("graphExec"))
        graph = self._graph(event.pid, event.args.get("graph"))
        if graph is not None:
            self._set_exec(key, graph.copy())

    def _exec_kernel_update(self, event: Event, api: Api) -> None:
        key = (event.pid, event.args.get("graphExec"))
        graph = self._execs.get(key)
        if graph is None or graph.reason:
            return
        args = event.args
        node = Node(KERNEL, api.name, 0, args.get("func", 0), args.get("grid"),
                    args.get("block"), args.get("smem"))
        if not graph.update(args.get("node", 0), node):
            graph = Graph(UNSEEN_NODE)
        self._set_exec(key, graph)

    def _destroy_graph(self, event: Event, api: Api) -> None:
        self._graphs.pop((event.pid, event.args.get("graph")), None)

    def _destroy_exec(self, event: Event, api: Api) -> None:
        key = (event.pid, event.args.get("graphExec"))
        self._execs.pop(key, None)
        self._expanded.pop(key, None)

    # -- launches --------------------------------------------------------------------------

    def _launch(self, event: Event, api: Api) -> None:
        key = (event.pid, event.args.get("graphExec"))
        graph = self._execs.get(key)
        capture = self._capture_of(event)
        if capture is not None:  # a graph launched into a capture: a child graph node
            event.outs["captured"] = True
            nodes = None if graph is None or graph.reason else tuple(graph.nodes)
            self._record_node(event, api, capture, Node(GRAPH, api.name, child=nodes))
            return
        if graph is None or graph.reason:
            reason = graph.reason if graph is not None else BEFORE_TRACE
            event.outs["nodes"], event.outs["nodes_reason"] = None, reason
            if self._outermost(event, api):
                unknown = (key[0], key[1], reason)
                self.unknown[unknown] = self.unknown.get(unknown, 0) + 1
            return
        expanded = self._expanded.get(key)
        if expanded is None:
            expanded, named = self._expand(event.pid, graph.nodes, event.ts_ns)
            if named:  # (names found later are asked again)
                self._expanded[key] = expanded
        event.outs["nodes"] = expanded

    def _outermost(self, event: Event, api: Api) -> bool:
        """Whether a graph launch is not the driver call inside a runtime one (each launch
        whose nodes are unknown counts once)."""
        start, end = event.ts_ns - (event.duration_ns or 0), event.ts_ns
        if api.driver:
            self._launch_spans[event.tid] = (start, end)
            return True
        inner = self._launch_spans.pop(event.tid, None)
        return inner is None or not (start <= inner[0] and inner[1] <= end)

    def _show_nodes(self, event: Event, graph: Graph) -> None:
        if graph.reason:
            event.outs["nodes"], event.outs["nodes_reason"] = None, graph.reason
        else:
            event.outs["nodes"] = self._expand(event.pid, graph.nodes, event.ts_ns)[0]

    def _expand(self, pid: int, nodes: Iterable[Node],
                when: Optional[int] = None) -> Tuple[List[dict], bool]:
        """The JSON-ready dicts of nodes, kernels named (as process `pid`'s program at
        kernel time `when` names them); and whether every kernel was."""
        out: List[dict] = []
        named = True
        for node in nodes:
            if node.type == KERNEL:
                name = self._name(pid, node.api, node.func, when)
                named = named and name is not None
                out.append({"type": KERNEL, "kernel": name, "func": node.func,
                            "grid": _dims(node.grid), "block": _dims(node.block),
                            "smem": node.smem})
            elif node.type == MEMCPY:
                out.append({"type": MEMCPY, "size": node.size, "kind": node.kind})
            elif node.type == MEMSET:
                out.append({"type": MEMSET, "size": node.size})
            elif node.child is None:
                out.append({"type": GRAPH, "nodes": None})
            else:
                inner, inner_named = self._expand(pid, node.child, when)
                named = named and inner_named
                out.append({"type": GRAPH, "nodes": inner})
        return out, named

    def _name(self, pid: int, api: str, func: int, when: Optional[int]) -> Optional[str]:
        namer = self.namer
        if namer is None or not func:
            return None
        name_for = getattr(namer, "name_for", None)
        if name_for is not None:
            return name_for(pid, api, func, when)
        return namer(_Caller(pid, api), func)

    # -- the end ---------------------------------------------------------------------------

    def unknown_summary(self) -> Optional[str]:
        """One sentence counting the graph launches whose nodes are unknown, and why; None
        when every graph launch was expanded."""
        if not self.unknown:
            return None
        by_reason: Dict[str, List[int]] = {}
        for (_, _, reason), launches in self.unknown.items():
            counts = by_reason.setdefault(reason, [0, 0])
            counts[0] += launches
            counts[1] += 1
        parts = ["%d launch%s of %d graph%s %s" % (n, "" if n == 1 else "es", g,
                                                   "" if g == 1 else "s", reason)
                 for reason, (n, g) in sorted(by_reason.items())]
        return "graph nodes not known: " + "; ".join(parts) + (
            " (start the program under the tracer to see them)")


def _dims(value: Optional[tuple]) -> Optional[List[int]]:
    return list(value) if value is not None else None


_MEMORY_TYPES = {("Host", "Device"): "HostToDevice", ("Device", "Host"): "DeviceToHost",
                 ("Device", "Device"): "DeviceToDevice", ("Host", "Host"): "HostToHost"}


def _copy_kind(args: Dict[str, Any]) -> Optional[str]:
    """A memcpy node's direction: its cudaMemcpyKind, or (driver) from the memory types of
    its ends (an array is device memory; unified memory: Default)."""
    if "kind" in args:
        return args["kind"]
    src, dst = args.get("srcMemoryType"), args.get("dstMemoryType")
    if src is None or dst is None:
        return None
    as_device = {"Array": "Device"}
    return _MEMORY_TYPES.get((as_device.get(src, src), as_device.get(dst, dst)), "Default")
