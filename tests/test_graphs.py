"""CUDA graphs seen node by node (graphs.py): each graph built from the traced calls, each
graph launch expanded into what it ran, captured launches told apart from launches that ran.

First the pure logic on hand-made events; then real programs through real probes, on the
stand-in runtime (tests/native/fakecudart.c driven by cuda_driver_prog.c), the stand-in
driver (fakecuda_driver.c, cu_driver_prog.c) and both layers at once (the layered runtime
over the stand-in driver): the JSON `nodes` of every graph launch, the captured launches,
the kernel table's counts and the timeline are checked exactly, live (the spooled lines,
and the decoded events of the other outputs) and re-read from `--save`.
"""
import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from ebpf_cuda.analysis.summary import Summary
from ebpf_cuda.decode.events import ENTER, EXIT
from ebpf_cuda.decode.graphs import (BEFORE_TRACE, CAPTURE_BEFORE_TRACE, GRAPH_BEFORE_TRACE,
                                     UNSEEN_NODE, GraphTracker)
from ebpf_cuda.output.chrome_trace import write_chrome_trace
from ebpf_cuda.decode.values import nodes_text
from helpers import event, run_cli

S0, S1 = 0x5000, 0x5001
E0, E1 = 0xE000, 0xE001
F, G = 0x401000, 0x402000  # kernel stubs (hand-made events)


# ---- nodes as the JSON has them ------------------------------------------------------------

def K(func: int, grid, block, smem: int = 0, kernel: Optional[str] = None) -> dict:
    def dims(d):
        d = (d,) if isinstance(d, int) else tuple(d)
        return list(d + (1,) * (3 - len(d)))
    return {"type": "kernel", "kernel": kernel, "func": func, "grid": dims(grid),
            "block": dims(block), "smem": smem}


def M(size: int, kind: str) -> dict:
    return {"type": "memcpy", "size": size, "kind": kind}


def S(size: int) -> dict:
    return {"type": "memset", "size": size}


def C(nodes: Optional[list]) -> dict:
    return {"type": "graph", "nodes": nodes}


# ---- hand-made events ----------------------------------------------------------------------

class Calls:
    """Exit events of successful calls, a microsecond apart (a driver call made inside a
    runtime call: `inner`)."""

    def __init__(self) -> None:
        self.t = 10 ** 9
        self.events = []

    def __call__(self, api: str, args: dict = None, outs: dict = None, tid: int = 100,
                 ret: int = 0, inner: Optional[Tuple[str, dict, dict]] = None):
        self.t += 1000
        start = self.t
        if inner is not None:
            self.t += 100
            iapi, iargs, iouts = inner
            self.events.append(event(iapi, EXIT, iargs, ts_ns=self.t + 100, pid=1, tid=tid,
                                     ret=0, duration_ns=100, outs=dict(iouts or {})))
            self.t += 200
        self.t += 300
        made = event(api, EXIT, args, ts_ns=self.t, pid=1, tid=tid, ret=ret,
                     duration_ns=self.t - start, outs=dict(outs or {}))
        self.events.append(made)
        return made


def launch(calls: Calls, func: int, grid: int, stream: int, tid: int = 100):
    return calls("cudaLaunchKernel", {"func": func, "grid": (grid, 1, 1), "block": (32, 1, 1),
                                      "smem": 0, "stream": stream}, tid=tid)


def tracked(calls: Calls, namer=None) -> GraphTracker:
    tracker = GraphTracker(namer)
    tracker.annotate(calls.events)
    return tracker


def test_capture_records_work_on_its_stream_and_on_streams_joined_by_events():
    c = Calls()
    c("cudaStreamBeginCapture", {"stream": S0, "mode": 0})
    first = launch(c, F, 1, S0)
    other = launch(c, F, 9, S1)  # not joined yet: it runs
    c("cudaEventRecord", {"event": E0, "stream": S0})
    c("cudaStreamWaitEvent", {"stream": S1, "event": E0, "flags": 0})
    side = launch(c, G, 2, S1)
    copy = c("cudaMemcpyAsync", {"dst": 1, "src": 2, "size": 64, "kind": "DeviceToHost",
                                 "stream": S1})
    c("cudaEventRecord", {"event": E1, "stream": S1})
    c("cudaStreamWaitEvent", {"stream": S0, "event": E1, "flags": 0})
    end = c("cudaStreamEndCapture", {"stream": S0}, {"graph": 0x60})
    after = launch(c, G, 3, S1)  # the capture ended for every stream in it
    c("cudaGraphInstantiate", {"graph": 0x60, "flags": 0}, {"graphExec": 0x70})
    run = c("cudaGraphLaunch", {"graphExec": 0x70, "stream": S0})
    tracker = tracked(c)
    assert [e.outs.get("captured") for e in (first, other, side, copy, after)] == [
        True, None, True, True, None]
    nodes = [K(F, 1, 32), K(G, 2, 32), M(64, "DeviceToHost")]
    assert end.outs["nodes"] == nodes and run.outs["nodes"] == nodes
    assert not tracker.capturing and tracker.unknown_summary() is None


def test_an_event_recorded_again_outside_the_capture_joins_nothing():
    c = Calls()
    c("cudaStreamBeginCapture", {"stream": S0, "mode": 0})
    c("cudaEventRecord", {"event": E0, "stream": S0})
    c("cudaEventRecord", {"event": E0, "stream": S1})  # S1 is not capturing
    c("cudaStreamWaitEvent", {"stream": 0x5002, "event": E0, "flags": 0})
    free = launch(c, F, 1, 0x5002)
    tracked(c)
    assert "captured" not in free.outs


def test_the_per_thread_default_stream_captures_in_its_own_thread_only():
    c = Calls()
    c("cudaStreamBeginCapture", {"stream": 2, "mode": 2}, tid=100)
    mine, theirs = launch(c, F, 1, 2, tid=100), launch(c, F, 1, 2, tid=101)
    tracked(c)
    assert (mine.outs.get("captured"), theirs.outs.get("captured")) == (True, None)


def test_one_operation_through_both_layers_is_one_node_the_runtime_calls():
    c = Calls()
    c("cudaStreamBeginCapture", {"stream": S0, "mode": 0},
      inner=("cuStreamBeginCapture_v2", {"stream": S0, "mode": 0}, {}))
    c("cudaMemcpyAsync", {"dst": 1, "src": 2, "size": 8, "kind": "HostToDevice", "stream": S0},
      inner=("cuMemcpyAsync", {"dst": 1, "src": 2, "size": 8, "stream": S0}, {}))
    c("cudaLaunchKernel", {"func": F, "grid": (2, 1, 1), "block": (4, 1, 1), "smem": 0,
                           "stream": S0},
      inner=("cuLaunchKernel", {"func": 0x10000, "grid": (2, 1, 1), "block": (4, 1, 1),
                                "smem": 0, "stream": S0}, {}))
    c("cuLaunchKernel", {"func": 0x10010, "grid": (3, 1, 1), "block": (4, 1, 1), "smem": 0,
                         "stream": S0})  # a direct driver launch (cuBLAS's)
    c("cudaStreamEndCapture", {"stream": S0}, {"graph": 0x60},
      inner=("cuStreamEndCapture", {"stream": S0}, {"graph": 0x60}))
    c("cudaGraphInstantiate", {"graph": 0x60, "flags": 0}, {"graphExec": 0x70})
    c("cudaGraphLaunch", {"graphExec": 0x70, "stream": S0},
      inner=("cuGraphLaunch", {"graphExec": 0x70, "stream": S0}, {}))
    c("cudaGraphLaunch", {"graphExec": 0x71, "stream": S0},
      inner=("cuGraphLaunch", {"graphExec": 0x71, "stream": S0}, {}))
    tracker = tracked(c)
    launches = [e for e in c.events if e.api.endswith("GraphLaunch")]
    nodes = [M(8, "HostToDevice"), K(F, 2, 4), K(0x10010, 3, 4)]
    assert [e.outs["nodes"] for e in launches[:2]] == [nodes, nodes]
    assert [e.outs["nodes_reason"] for e in launches[2:]] == [BEFORE_TRACE] * 2
    assert tracker.unknown == {(1, 0x71, BEFORE_TRACE): 1}  # one launch, not two
    summary = Summary()
    summary.add(c.events)  # each kernel a graph launch ran counts once
    assert summary.launches == {(1, F, (2, 1, 1), (4, 1, 1), 0): 1,
                                (1, 0x10010, (3, 1, 1), (4, 1, 1), 0): 1}
    assert summary.captured == {(1, 0x10000, (2, 1, 1), (4, 1, 1), 0): 1,
                                (1, 0x10010, (3, 1, 1), (4, 1, 1), 0): 1}


def kernel_node(c: Calls, graph: int, node: int, func: int, grid: int):
    c("cudaGraphAddKernelNode", {"graph": graph, "numDependencies": 0, "func": func,
                                 "grid": (grid, 1, 1), "block": (8, 1, 1), "smem": 0},
      {"node": node})


def test_instantiation_is_a_snapshot_a_child_graph_node_a_copy_and_updates_change_execs():
    c = Calls()
    c("cudaGraphCreate", {"flags": 0}, {"graph": 0x61})
    kernel_node(c, 0x61, 0x81, G, 1)
    c("cudaGraphCreate", {"flags": 0}, {"graph": 0x60})
    kernel_node(c, 0x60, 0x80, F, 1)
    c("cudaGraphAddChildGraphNode", {"graph": 0x60, "numDependencies": 1, "childGraph": 0x61},
      {"node": 0x82})
    c("cudaGraphAddEmptyNode", {"graph": 0x60, "numDependencies": 1}, {"node": 0x83})
    c("cudaGraphInstantiate", {"graph": 0x60, "flags": 0}, {"graphExec": 0x70})
    kernel_node(c, 0x61, 0x84, G, 5)  # the child node has the child as it was
    kernel_node(c, 0x60, 0x85, G, 6)  # the exec has the graph as it was
    c("cudaGraphInstantiateWithFlags", {"graph": 0x60, "flags": 0}, {"graphExec": 0x71})
    c("cudaGraphExecKernelNodeSetParams", {"graphExec": 0x70, "node": 0x80, "func": F,
                                           "grid": (7, 1, 1), "block": (8, 1, 1), "smem": 4})
    runs = [c("cudaGraphLaunch", {"graphExec": x, "stream": 0}) for x in (0x70, 0x71)]
    c("cudaGraphExecUpdate", {"graphExec": 0x70, "graph": 0x60})
    c("cudaGraphExecKernelNodeSetParams", {"graphExec": 0x71, "node": 0x99, "func": F,
                                           "grid": (7, 1, 1), "block": (8, 1, 1), "smem": 4})
    c("cudaGraphExecKernelNodeSetParams", {"graphExec": 0x70, "node": 0x80, "func": F,
                                           "grid": (9, 1, 1), "block": (8, 1, 1), "smem": 0},
      ret=1)  # a failed call changes nothing
    runs += [c("cudaGraphLaunch", {"graphExec": x, "stream": 0}) for x in (0x70, 0x71)]
    c("cudaGraphExecDestroy", {"graphExec": 0x70})
    runs.append(c("cudaGraphLaunch", {"graphExec": 0x70, "stream": 0}))
    tracked(c, namer=lambda ev, func: {F: "f", G: "g"}[func])
    child = C([K(G, 1, 8, kernel="g")])
    f1, f7 = K(F, 1, 8, kernel="f"), K(F, 7, 8, smem=4, kernel="f")
    now = [f1, child, K(G, 6, 8, kernel="g")]  # (the child node keeps its copy)
    assert [e.outs["nodes"] for e in runs[:3]] == [[f7, child], now, now]
    # (runs[2]: cudaGraphExecUpdate gave exec 0x70 the graph as it is now)
    assert (runs[3].outs["nodes"], runs[3].outs["nodes_reason"]) == (None, UNSEEN_NODE)
    assert runs[4].outs == {"nodes": None, "nodes_reason": BEFORE_TRACE}


def test_graphs_made_before_the_trace_are_unknown_and_counted_in_one_line():
    c = Calls()
    c("cudaGraphInstantiate", {"graph": 0x66, "flags": 0}, {"graphExec": 0x70})
    end = c("cudaStreamEndCapture", {"stream": S0}, {"graph": 0x67})  # began before
    c("cudaGraphInstantiate", {"graph": 0x67, "flags": 0}, {"graphExec": 0x71})
    c("cudaGraphCreate", {"flags": 0}, {"graph": 0x68})
    c("cudaGraphAddChildGraphNode", {"graph": 0x68, "numDependencies": 0, "childGraph": 0x66},
      {"node": 0x80})
    c("cudaGraphInstantiate", {"graph": 0x68, "flags": 0}, {"graphExec": 0x72})
    runs = [c("cudaGraphLaunch", {"graphExec": x, "stream": 0})
            for x in (0x70, 0x70, 0x71, 0x72, 0x73)]
    tracker = tracked(c)
    assert end.outs["nodes_reason"] == CAPTURE_BEFORE_TRACE
    assert [e.outs.get("nodes_reason") for e in runs] == [
        GRAPH_BEFORE_TRACE, GRAPH_BEFORE_TRACE, CAPTURE_BEFORE_TRACE, None, BEFORE_TRACE]
    assert runs[3].outs["nodes"] == [C(None)]  # the child's graph was made before
    assert tracker.unknown_summary() == (
        "graph nodes not known: 1 launch of 1 graph instantiated before the trace began; "
        "1 launch of 1 graph its capture began before the trace; 2 launches of 1 graph its "
        "graph was made before the trace began (start the program under the tracer to see "
        "them)")


def test_capture_into_an_existing_graph_marks_its_work_with_the_graph():
    c = Calls()
    c("cudaGraphCreate", {"flags": 0}, {"graph": 0x60})
    kernel_node(c, 0x60, 0x80, F, 1)
    c("cudaStreamBeginCaptureToGraph", {"stream": S0, "graph": 0x60, "numDependencies": 1,
                                        "mode": 0})
    work = launch(c, G, 2, S0)
    c("cudaStreamEndCapture", {"stream": S0}, {"graph": 0x60})
    c("cudaGraphInstantiate", {"graph": 0x60, "flags": 0}, {"graphExec": 0x70})
    run = c("cudaGraphLaunch", {"graphExec": 0x70, "stream": 0})
    tracked(c)
    assert work.outs == {"captured": True, "graph": 0x60}
    assert run.outs["nodes"] == [K(F, 1, 8), K(G, 2, 32)]


def test_a_graph_launched_into_a_capture_is_a_child_graph_node():
    c = Calls()
    c("cudaGraphCreate", {"flags": 0}, {"graph": 0x60})
    kernel_node(c, 0x60, 0x80, F, 1)
    c("cudaGraphInstantiate", {"graph": 0x60, "flags": 0}, {"graphExec": 0x70})
    c("cudaStreamBeginCapture", {"stream": S0, "mode": 0})
    inside = c("cudaGraphLaunch", {"graphExec": 0x70, "stream": S0})
    c("cudaStreamEndCapture", {"stream": S0}, {"graph": 0x61})
    c("cudaGraphInstantiate", {"graph": 0x61, "flags": 0}, {"graphExec": 0x71})
    run = c("cudaGraphLaunch", {"graphExec": 0x71, "stream": 0})
    tracked(c)
    assert inside.outs == {"captured": True}
    assert run.outs["nodes"] == [C([K(F, 1, 8)])]


def test_enter_events_and_failed_calls_change_no_graph():
    c = Calls()
    c("cudaStreamBeginCapture", {"stream": S0, "mode": 9}, ret=1)
    c.events.append(event("cudaStreamBeginCapture", ENTER, {"stream": S0, "mode": 0}))
    work = launch(c, F, 1, S0)
    tracker = tracked(c)
    assert "captured" not in work.outs and not tracker.capturing


def test_nodes_as_text_lines_show_them():
    nodes = [K(F, (2, 2), 64, 16, kernel="vec_add"), K(G, 1, 1), M(4000, "HostToDevice"),
             S(800), C([K(F, 1, 1, kernel="f")]), C(None)]
    assert nodes_text(nodes) == (
        "[vec_add<<<(2,2,1),(64,1,1),16>>>, 0x402000<<<(1,1,1),(1,1,1),0>>>, memcpy 4000 "
        "bytes HostToDevice, memset 800 bytes, graph[f<<<(1,1,1),(1,1,1),0>>>], graphunknown]")
    assert nodes_text(None) == "unknown"


def test_the_timeline_shows_a_graph_launch_with_its_nodes_as_children():
    c = Calls()
    c("cudaGraphCreate", {"flags": 0}, {"graph": 0x61})
    kernel_node(c, 0x61, 0x81, G, 1)
    c("cudaGraphCreate", {"flags": 0}, {"graph": 0x60})
    kernel_node(c, 0x60, 0x80, F, 1)
    c("cudaGraphAddMemsetNode", {"graph": 0x60, "numDependencies": 0, "ptr": 1, "value": 0,
                                 "size": 64}, {"node": 0x82})
    c("cudaGraphAddChildGraphNode", {"graph": 0x60, "numDependencies": 0, "childGraph": 0x61},
      {"node": 0x83})
    c("cudaGraphInstantiate", {"graph": 0x60, "flags": 0}, {"graphExec": 0x70})
    c("cudaGraphLaunch", {"graphExec": 0x70, "stream": 0},
      inner=("cuGraphLaunch", {"graphExec": 0x70, "stream": 0}, {}))
    names = {F: "f", G: "g"}
    tracked(c, namer=lambda ev, func: names[func])
    import io

    out = io.StringIO()
    out.close = lambda: None
    write_chrome_trace(c.events, out, namer=lambda ev, func: names.get(func))
    trace = json.loads(out.getvalue())
    inner = next(e for e in trace if e["name"] == "cuGraphLaunch")
    assert next(e for e in trace if e["name"] == "cudaGraphLaunch")["args"]["nodes"] == 3
    assert inner["dur"] == 0.1  # its 100 ns, shared by its 3 nodes: 33, 33 and 34 ns
    assert [(e["name"], round(e["ts"] - inner["ts"], 3), e["dur"], e["args"]) for e in trace
            if e.get("cat") == "graph node"] == [
        ("f", 0, 0.033, {"func": hex(F), "grid": [1, 1, 1], "block": [8, 1, 1], "smem": 0}),
        ("memset", 0.033, 0.033, {"size": 64}),
        ("graph", 0.066, 0.034, {"nodes": 1}),  # its one node shares its span
        ("g", 0.066, 0.034, {"func": hex(G), "grid": [1, 1, 1], "block": [8, 1, 1],
                             "smem": 0})]


# ---- real programs through real probes -----------------------------------------------------

# The stand-in runtime program: a capture on one stream (4 kernels) replayed 50 times, a
# capture across two streams joined by events, an explicit graph with kernel, memcpy, memset
# and child nodes instantiated twice and updated between launches, a capture into an
# existing graph, a graph of the other copy nodes, and a launch of an exec made before.
RUNTIME_OPS = """
streamcreate streamcreate eventcreate eventcreate malloc:4000
capture:@0 launch:4:256:0:@0 launch:8:128:0:@0 launch:2,2:32:64:@0 launch:1:32:0:@0
endcapture:@0 instantiate:@0 loop:50:graphlaunch:@0:@0
capture:@0 launch:4:256:0:@0 eventrecord:@0:@0 streamwait:@1:@0 launch:16:64:0:@1
memcpyasync:4000:1:@1 eventrecord:@1:@1 streamwait:@0:@1 launch:2:32:0:@0 endcapture:@0
launch:3:32:0:@1 instantiate:@1 graphlaunch:@1:@0
graphcreate addkernel:6:64:0:@2 graphcreate addkernel:4:256:0:@3 addmemcpy:4000:1:@3
addmemset:0:4:1000:2:@3 addchild:@2:@3 addempty:@3 instantiateflags:@3 instantiateparams:@3
graphlaunch:@2:@0 execkernelupdate:8:128:32:@2:@1 graphlaunch:@2:@0 graphlaunch:@3:@0
graphcreate capturetograph:@4:@0 launch:5:32:0:@0 endcapture:@0 instantiate:@4
graphlaunch:@4:@0
graphcreate addmemcpy1d:100:2:@6 addtosymbol:8:@6 addfromsymbol:16:@6 addeventrecord:@0:@6
addeventwait:@1:@6 addempty:@6 instantiate:@6 graphlaunch:@5:@0
exchangemode:1 exchangemode:0 graphdestroy:@6 execdestroy:@5
graphlaunch:0x7777 launch:1:1 sleep:300
""".split()  # (the sleep: kernels are named from the live process's symbols)

UNKNOWN_LINE = ("ebpf-cuda: graph nodes not known: 1 launch of 1 graph instantiated before the "
                "trace began (start the program under the tracer to see them)")


def runtime_launches(f: int) -> List[Optional[list]]:
    """The nodes of every cudaGraphLaunch of RUNTIME_OPS, in order (kernel stub `f`)."""
    k = lambda *a: K(f, *a, kernel="vec_add_kernel")  # noqa: E731
    first = [k(4, 256), k(8, 128), k((2, 2), 32, 64), k(1, 32)]
    second = [k(4, 256), k(16, 64), M(4000, "HostToDevice"), k(2, 32)]
    rest = [M(4000, "HostToDevice"), S(8000), C([k(6, 64)])]
    return ([first] * 50 + [second, [k(4, 256)] + rest, [k(8, 128, 32)] + rest,
                            [k(4, 256)] + rest, [k(5, 32)],
                            [M(100, "DeviceToHost"), M(8, "HostToDevice"),
                             M(16, "DeviceToHost")], None])


# (grid, block, smem): (launches run, of those in graphs, captured)
RUNTIME_KERNELS = {
    ("(4,1,1)", "(256,1,1)", "0"): (53, 53, 2), ("(8,1,1)", "(128,1,1)", "0"): (50, 50, 1),
    ("(2,2,1)", "(32,1,1)", "64"): (50, 50, 1), ("(1,1,1)", "(32,1,1)", "0"): (50, 50, 1),
    ("(16,1,1)", "(64,1,1)", "0"): (1, 1, 1), ("(2,1,1)", "(32,1,1)", "0"): (1, 1, 1),
    ("(5,1,1)", "(32,1,1)", "0"): (1, 1, 1), ("(6,1,1)", "(64,1,1)", "0"): (3, 3, 0),
    ("(8,1,1)", "(128,1,1)", "32"): (1, 1, 0), ("(3,1,1)", "(32,1,1)", "0"): (1, 0, 0),
    ("(1,1,1)", "(1,1,1)", "0"): (1, 0, 0)}


def _cli(*args):
    done = run_cli(*args, timeout=120)
    assert done.returncode == 0, (args, done.stderr[-2000:])
    return done


@pytest.fixture(scope="module")
def runtime(fake, tmp_path_factory):
    """RUNTIME_OPS traced four ways: JSON alone (lines from frames, behind a spool), text
    alone (likewise), JSON with the summary, the timeline and --save (decoded events), and
    the saved trace reported as JSON and as the summary."""
    lib, prog = fake
    out = tmp_path_factory.mktemp("graphs")
    command = ["-p", lib, "--", prog, *RUNTIME_OPS]
    got = {"dir": out}
    got["spooled"] = _cli("--json", "-o", out / "spooled.jsonl", *command)
    got["text"] = _cli("-t", "-o", out / "lines.txt", *command)
    got["decoded"] = _cli("--json", "-o", out / "decoded.jsonl", "--summary", "--trace-out",
                          out / "trace.json", "--report", out / "report.html", "--save",
                          out / "run.bin", *command)
    got["report"] = _cli("report", out / "run.bin", "--json", "-o", out / "report.jsonl")
    got["report_summary"] = _cli("report", out / "run.bin", "--summary", "--report",
                                 out / "replayed.html")
    got["alone"] = _cli("--summary", *command)  # in-kernel aggregates
    return got


def _exits(path: Path, api_suffix: str = "") -> List[dict]:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in events if e["phase"] == "exit" and e["api"].endswith(api_suffix)]


def _stub(path: Path) -> int:
    return next(e["args"]["func"] for e in _exits(path, "LaunchKernel"))


def _kernel_table(text: str) -> Dict[Tuple[str, ...], Tuple[int, ...]]:
    """(grid, block, smem, kernel) -> (launches, in graphs, captured) of the kernel table."""
    part = text.split(" ** Kernel Launches:", 1)[1].split("\n\n")[1]
    return {tuple(line.split()[3:]): tuple(int(c) for c in line.split()[:3])
            for line in part.splitlines()[2:]}


@pytest.mark.kernel
@pytest.mark.parametrize("name", ["spooled.jsonl", "decoded.jsonl", "report.jsonl"])
def test_every_graph_launch_carries_the_nodes_it_ran(runtime, name):
    path = runtime["dir"] / name
    launches = _exits(path, "cudaGraphLaunch")
    assert [e.get("nodes", "missing") for e in launches] == runtime_launches(_stub(path))
    assert launches[-1]["nodes_reason"] == "instantiated before the trace began"
    assert [e.get("nodes_reason") for e in launches[:-1]] == [None] * (len(launches) - 1)


@pytest.mark.kernel
@pytest.mark.parametrize("name", ["spooled.jsonl", "decoded.jsonl", "report.jsonl"])
def test_captured_work_is_marked_and_the_end_of_a_capture_shows_it(runtime, name):
    path = runtime["dir"] / name
    events = [e for e in _exits(path) if e.get("captured")]
    assert [(e["api"], e["args"].get("grid"), e.get("graph")) for e in events] == [
        ("cudaLaunchKernel", [4, 1, 1], None), ("cudaLaunchKernel", [8, 1, 1], None),
        ("cudaLaunchKernel", [2, 2, 1], None), ("cudaLaunchKernel", [1, 1, 1], None),
        ("cudaLaunchKernel", [4, 1, 1], None), ("cudaLaunchKernel", [16, 1, 1], None),
        ("cudaMemcpyAsync", None, None), ("cudaLaunchKernel", [2, 1, 1], None),
        ("cudaLaunchKernel", [5, 1, 1], 0x6004)]  # captured into graph 0x6004
    expected = runtime_launches(_stub(path))
    ends = _exits(path, "cudaStreamEndCapture")
    assert [(e["graph"], e["nodes"]) for e in ends] == [
        (0x6000, expected[0]), (0x6001, expected[50]), (0x6005, expected[54])]
    modes = [(e["args"]["mode"], e["previous"])
             for e in _exits(path, "cudaThreadExchangeStreamCaptureMode")]
    assert modes == [(1, 0), (0, 1)]


@pytest.mark.kernel
def test_runs_agree_and_the_unknown_graph_is_said_once(runtime):
    def comparable(name):
        return [{k: v for k, v in e.items() if k not in ("ts", "pid", "tid", "duration_ns")}
                for e in _exits(runtime["dir"] / name)]
    assert comparable("decoded.jsonl") == comparable("report.jsonl")
    for run in ("spooled", "text", "decoded", "report"):
        assert runtime[run].stderr.count(UNKNOWN_LINE) == 1, runtime[run].stderr


@pytest.mark.kernel
def test_text_lines_show_nodes_and_captured_work(runtime):
    lines = (runtime["dir"] / "lines.txt").read_text().splitlines()
    launches = [line for line in lines if "cudaGraphLaunch" in line and "[EXIT]" in line]
    assert len(launches) == 57
    assert re.search(r" returned=cudaSuccess nodes=\[vec_add_kernel<<<\(4,1,1\),\(256,1,1\),0>>>, "
                     r"memcpy 4000 bytes HostToDevice, memset 8000 bytes, graph\[vec_add_kernel"
                     r"<<<\(6,1,1\),\(64,1,1\),0>>>\]\] \(\d+\.\d us\)$", launches[51])
    assert "nodes=unknown nodes_reason=instantiated before the trace began" in launches[-1]
    captured = [line for line in lines if "captured=True" in line]
    assert len(captured) == 9 and all("[EXIT]" in line for line in captured)


@pytest.mark.kernel
@pytest.mark.parametrize("run", ["decoded", "report_summary"])
def test_the_kernel_table_counts_graph_kernels_and_captured_launches_apart(runtime, run):
    table = _kernel_table(runtime[run].stdout)
    assert table == {key + ("vec_add_kernel",): value for key, value in RUNTIME_KERNELS.items()}
    # in graphs: the 4-kernel graph replayed 50 times, the 3 kernels of the second capture,
    # 2 of the explicit graph in each of its 3 launches, 1 captured into a graph; run: those
    # and the 2 eager launches; captured (not run then): the captures' 4 + 3 + 1 launches
    assert [sum(counts[i] for counts in table.values()) for i in range(3)] == [
        50 * 4 + 3 + 2 * 3 + 1 + 2, 50 * 4 + 3 + 2 * 3 + 1, 4 + 3 + 1]


def _api_calls(text: str) -> Dict[str, int]:
    """Function -> Num Calls of the summary's API table (event-based or in-kernel)."""
    return {row[-1]: int(row[2].replace(",", ""))
            for row in _rows(text.split(" ** CUDA API Summary", 1)[1])}


def _rows(part: str) -> List[List[str]]:
    """The cells of a table's rows: the lines after its dashes, to the blank line after."""
    lines = part.split(" ** ", 1)[0].splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("---"))
    return [line.split() for line in lines[first + 1:] if line.strip()]


def _memory_totals(text: str) -> Dict[str, Tuple[str, int]]:
    """Operation -> (Total (MB), Count) of the summary's memory table (either kind)."""
    return {" ".join(row[row.index(next(c for c in row if c.startswith("["))):]):
            (row[0], int(row[1].replace(",", "")))
            for row in _rows(text.split(" ** CUDA Memory Operation Summary", 1)[1])}


@pytest.mark.kernel
def test_the_summary_alone_follows_graphs_as_the_decoded_summary_does(runtime):
    """--summary alone (in-kernel aggregates; the graph calls, and the calls a process makes
    while it captures, written as records): its kernel table is the decoded run's, row by
    row (the 8 launches captures recorded as captured, the 210 kernels graph launches ran
    in graphs), its API and memory tables count each call once, as the decoded run's do,
    and the graph made before the trace is said once."""
    alone, decoded = runtime["alone"].stdout, runtime["decoded"].stdout
    assert "in-kernel aggregates" in alone
    assert _kernel_table(alone) == _kernel_table(decoded) == {
        key + ("vec_add_kernel",): value for key, value in RUNTIME_KERNELS.items()}
    calls = _api_calls(alone)
    assert calls == _api_calls(decoded)
    assert (calls["cudaGraphLaunch"], calls["cudaLaunchKernel"]) == (57, 10)
    assert _memory_totals(alone) == _memory_totals(decoded)
    assert runtime["alone"].stderr.count(UNKNOWN_LINE) == 1, runtime["alone"].stderr


@pytest.mark.kernel
@pytest.mark.parametrize("run,page", [("decoded", "report.html"),
                                      ("report_summary", "replayed.html")])
def test_the_html_report_counts_kernels_as_the_kernel_table_does(runtime, run, page):
    """--report, live and of the saved trace: the kernels graph launches ran count as
    launches (and in graphs), those a capture recorded as captured, not as run: the kernel
    table's sums, kernel by kernel."""
    from test_html_report import Page

    table = _kernel_table(runtime[run].stdout)
    sums = [sum(counts[i] for counts in table.values()) for i in range(3)]
    text = (runtime["dir"] / page).read_text()
    kernels = Page(text.split("<h2>Top kernels</h2>", 1)[1].split("</table>", 1)[0]).rows
    assert kernels == [["kernel", "launches", "in graphs", "captured", "launch calls total (ms)"],
                       ["vec_add_kernel"] + [str(n) for n in sums] + kernels[1][4:]]
    assert sums == [212, 210, 8]


@pytest.mark.kernel
def test_the_timeline_has_every_graph_launch_with_its_nodes(runtime):
    trace = json.loads((runtime["dir"] / "trace.json").read_text())
    slices = sorted((e for e in trace if e["ph"] == "X"), key=lambda e: e["ts"])
    launches = [e for e in slices if e["name"] == "cudaGraphLaunch"]
    nodes = [e for e in slices if e["cat"] == "graph node"]
    expected = runtime_launches(0)  # (the kernels' titles are their names)
    assert [e["args"].get("nodes") for e in launches] == [
        len(n) if n is not None else None for n in expected]

    def flat(ns):
        out = []
        for n in ns:
            out.append(n)
            out += flat(n["nodes"]) if n["type"] == "graph" else []
        return out
    assert len(nodes) == sum(len(flat(n)) for n in expected if n)  # 220
    for launch in launches:  # each node inside its launch's span, in the graph's order
        inside = [e["name"] for e in nodes
                  if launch["ts"] <= e["ts"] < launch["ts"] + launch["dur"]]
        ran = [n.get("kernel") or ("memcpy %s" % n["kind"] if n["type"] == "memcpy"
                                   else n["type"])
               for n in flat(expected[launches.index(launch)] or [])]
        assert inside == ran, launch


DRIVER_OPS = """
init moduleload getfunction:vecAdd getfunction:scale malloc:8000
capture:0x5000 launch:4:256:0:0x5000:@0 htodasync:4000:0x5000 memsetd32async:0:500:0x5000
launch:2:64:8:0x5000:@1 endcapture:0x5000
instantiate:@0 instantiate2:@0 loop:3:graphlaunch:0x70000:0x5000 graphlaunch:0x70001:0x5000
graphcreate addkernel:8:32:0:@1:@1 addmemcpy:100:2:1:@1 addmemset:0:4:10:3:@1 graphcreate
addchild:@1:@2 addkernel:1:1:0:@2:@0 addempty:@2 addeventrecord:0xe1:@2 addeventwait:0xe2:@2
instantiateparams:@2 graphlaunch:0x70002 execkernelupdate:9:33:4:@2:@4:@0 graphlaunch:0x70002
execupdate:@2:@2 graphlaunch:0x70002
graphcreate capturetograph:@3:0x5001 launch:3:3:0:0x5001:@0 endcapture:0x5001 instantiate:@3
graphlaunch:0x70003 exchangemode:2 graphdestroy:@3 execdestroy:@3
graphlaunch:0x7abc launch:1:1:0:0:@0
""".split()

V, SC = 0x10000, 0x10010  # the stand-in driver's first two CUfunctions: vecAdd, scale


@pytest.mark.kernel
def test_the_driver_api_graph_calls(cc, tmp_path):
    from fakecuda_driver import build_fake_driver

    lib, prog = build_fake_driver(cc)
    out = tmp_path / "driver.jsonl"
    done = _cli("-p", lib, "--json", "-o", out, "--summary", "--", prog, *DRIVER_OPS)
    v = lambda *a: K(V, *a, kernel="vecAdd")  # noqa: E731
    s = lambda *a: K(SC, *a, kernel="scale")  # noqa: E731
    captured = [v(4, 256), M(4000, "HostToDevice"), S(2000), s(2, 64, 8)]
    child = C([s(8, 32), M(100, "DeviceToHost"), S(120)])
    assert [e.get("nodes") for e in _exits(out, "cuGraphLaunch")] == [captured] * 4 + [
        [child, v(1, 1)], [child, v(9, 33, 4)], [child, v(1, 1)], [v(3, 3)], None]
    assert [(e["api"], e.get("graph")) for e in _exits(out) if e.get("captured")] == [
        ("cuLaunchKernel", None), ("cuMemcpyHtoDAsync_v2", None), ("cuMemsetD32Async", None),
        ("cuLaunchKernel", None), ("cuLaunchKernel", 0x60003)]
    assert [e["nodes"] for e in _exits(out, "cuStreamEndCapture")] == [captured, [v(3, 3)]]
    assert _kernel_table(done.stdout) == {
        ("(4,1,1)", "(256,1,1)", "0", "vecAdd"): (4, 4, 1),
        ("(2,1,1)", "(64,1,1)", "8", "scale"): (4, 4, 1),
        ("(8,1,1)", "(32,1,1)", "0", "scale"): (3, 3, 0),
        ("(1,1,1)", "(1,1,1)", "0", "vecAdd"): (3, 2, 0),
        ("(9,1,1)", "(33,1,1)", "4", "vecAdd"): (1, 1, 0),
        ("(3,1,1)", "(3,1,1)", "0", "vecAdd"): (1, 1, 1)}
    assert done.stderr.count(UNKNOWN_LINE) == 1
    alone = _cli("-p", lib, "--summary", "--", prog, *DRIVER_OPS)  # in-kernel aggregates
    assert _kernel_table(alone.stdout) == _kernel_table(done.stdout)
    assert _api_calls(alone.stdout) == _api_calls(done.stdout)
    assert _memory_totals(alone.stdout) == _memory_totals(done.stdout)
    assert alone.stderr.count(UNKNOWN_LINE) == 1
    made = {e["api"] for e in _exits(out)}
    assert {"cuGraphInstantiateWithFlags", "cuGraphInstantiate_v2",
            "cuGraphInstantiateWithParams", "cuGraphExecUpdate_v2", "cuGraphDestroy",
            "cuGraphExecDestroy", "cuThreadExchangeStreamCaptureMode",
            "cuStreamBeginCaptureToGraph", "cuGraphAddEventRecordNode",
            "cuGraphAddEventWaitNode", "cuGraphAddEmptyNode"} <= made


LAYERED_OPS = ("streamcreate malloc:4000 capture:@0 launch:4:256:0:@0 memcpyasync:4000:1:@0 "
               "launch:2:64:0:@0 endcapture:@0 instantiate:@0 loop:5:graphlaunch:@0:@0 "
               "graphlaunch:0x7777:@0 launch:1:1 sleep:300").split()


@pytest.mark.kernel
@pytest.mark.parametrize("functions", [(), ("--all",)], ids=["default", "all"])
def test_both_layers_one_node_per_operation_counted_once(cc, tmp_path, functions):
    """The layered runtime makes cuLaunchKernel, cuMemcpyAsync and cuGraphLaunch inside its
    calls: a graph launch is both events, each with the nodes; its kernels count once, in
    the table and under the driver's call in the timeline. By default the runtime's launch
    functions are not probed (the driver's are); with --all both are."""
    from fakecuda_driver import build_layered_runtime

    runtime_lib, driver_lib, prog = build_layered_runtime(cc)
    out = tmp_path / "layers.jsonl"
    done = _cli("-p", runtime_lib, "-p", driver_lib, *functions, "--json", "-o", out,
                "--summary", "--trace-out", tmp_path / "t.json", "--", prog, *LAYERED_OPS)
    stub = next(e["args"]["func"] for e in _exits(out, "cuLaunchKernel"))
    name = "vec_add_kernel" if functions else None  # (the driver knows no name for it)
    nodes = [K(stub, 4, 256, kernel=name), M(4000, "HostToDevice"),
             K(stub, 2, 64, kernel=name)]
    launches = _exits(out, "GraphLaunch")
    assert [(e["api"], e.get("nodes")) for e in launches] == [
        ("cuGraphLaunch", nodes), ("cudaGraphLaunch", nodes)] * 5 + [
        ("cuGraphLaunch", None), ("cudaGraphLaunch", None)]
    captured = sorted(e["api"] for e in _exits(out) if e.get("captured"))
    assert captured == sorted(["cuLaunchKernel", "cuLaunchKernel", "cudaMemcpyAsync",
                               "cuMemcpyAsync"] + ["cudaLaunchKernel"] * 2 * bool(functions))
    table = done.stdout.split(" ** Kernel Launches:", 1)[1]
    rows = {tuple(line.split()[3:5]): tuple(int(c) for c in line.split()[:3])
            for line in table.split("\n\n")[1].splitlines()[2:]}
    assert rows == {("(4,1,1)", "(256,1,1)"): (5, 5, 1), ("(2,1,1)", "(64,1,1)"): (5, 5, 1),
                    ("(1,1,1)", "(1,1,1)"): (1, 0, 0)}
    assert done.stderr.count(UNKNOWN_LINE) == 1
    alone = _cli("-p", runtime_lib, "-p", driver_lib, *functions, "--summary", "--", prog,
                 *LAYERED_OPS)  # in-kernel aggregates: the same counts
    geometry = lambda text: {k[:3]: v for k, v in _kernel_table(text).items()}  # noqa: E731
    assert geometry(alone.stdout) == geometry(done.stdout)  # (unnamed: at another address)
    assert _api_calls(alone.stdout) == _api_calls(done.stdout)
    assert _memory_totals(alone.stdout) == _memory_totals(done.stdout)
    trace = json.loads((tmp_path / "t.json").read_text())
    driver = [e for e in trace if e["name"] == "cuGraphLaunch"]
    children = [e for e in trace if e.get("cat") == "graph node"]
    assert len(children) == 15 and all(
        any(d["ts"] <= e["ts"] < d["ts"] + d["dur"] for d in driver) for e in children)


CAPTURE_STATE_OPS = ("streamcreate endcapture:@0 launch:1:32:0:@0 capture:@0:3 "
                     "launch:2:32:0:@0 capture:@0 launch:3:32:0:@0 threads:2:1:launch:7:32:0:0 "
                     "endcapture:@0 launch:4:32:0:@0 capture:@0 launch:5:32:0:@0 sleep:200").split()


@pytest.mark.kernel
def test_the_kernel_keeps_each_process_capture_state(fake):
    """--summary alone's capture state in the kernel (aggregates.capture_count): an end
    whose begin came before the trace takes nothing below 0, a failed begin adds nothing,
    and while the process captures its launches, also those on other streams and threads,
    are records (the tracker tells them apart), not counted in the kernel's launches map;
    every launch is counted once, one way or the other, and every call in the API table.
    A capture still in progress at the end stays counted."""
    from ebpf_cuda.spec import layout
    from ebpf_cuda.tracer import Tracer

    lib, prog = fake
    with Tracer(command=[str(prog), *CAPTURE_STATE_OPS], library=[str(lib)], aggregate=True,
                emit=False) as tracer:
        events = [e for e in tracer.events() if e.phase == EXIT]
        aggregates = tracer.aggregates()
        maps = tracer.session.maps
        capturing = {pid: n for pid, n in maps[layout.CAPTURING].items()}
        anywhere = maps[layout.CAPTURING_ANY][0]
    recorded = [(e.args["grid"][0], bool(e.outs.get("captured"))) for e in events
                if e.api == "cudaLaunchKernel"]
    assert recorded == [(3, True), (7, False), (7, False), (5, True)]
    from ebpf_cuda.analysis.kernel_summary import launches

    counted = sorted(launch.geometry[0][0] for launch in launches(aggregates)
                     for _ in range(launch.count))  # (their grids' x)
    assert counted == [1, 2, 4]  # (2: launched after the failed begin: eager)
    calls = {f.api: f.count for f in aggregates.functions}
    assert calls["cudaLaunchKernel"] == 7 and calls["cudaStreamEndCapture"] == 2
    assert [(e.api, e.ret) for e in events if "Capture" in e.api] == [
        ("cudaStreamEndCapture", 0), ("cudaStreamBeginCapture", 1),
        ("cudaStreamBeginCapture", 0), ("cudaStreamEndCapture", 0),
        ("cudaStreamBeginCapture", 0)]  # (graph calls: always records)
    assert list(capturing.values()) == [1] and anywhere == 1  # the last capture never ended
