"""Every runtime row of the function table, traced for real on the stand-in libcudart.

The driver program (tests/native/cuda_driver_prog.c) prints what it passed and got back for
every call; the tracer's events must say exactly that: arguments (stack-passed ones too),
launch configurations read through a pointer, out-parameters, return names, and `_ptsz`/
`_ptds` symbols reported under their base row.
"""
from typing import Any, Callable, Dict, List

import pytest

from ebpf_cuda.spec import apis
from fakecuda import (ELAPSED_MS, EVENT_BASE, EXEC_BASE, GRAPH_BASE, MEM_FREE, MEM_TOTAL,
                      STREAM_BASE, Call, device_ptr, dims, host_ptr)
from fakecuda import numbers as _n
from fakecuda_driver import base_name, exits
from helpers import trace_command

pytestmark = pytest.mark.kernel

KINDS = {0: "HostToHost", 1: "HostToDevice", 2: "DeviceToHost", 3: "DeviceToDevice",
         4: "Default"}
RET_NAMES = {0: "cudaSuccess", 1: "cudaErrorInvalidValue", 9: "cudaErrorInvalidConfiguration",
             12: "cudaErrorInvalidPitchValue", 21: "cudaErrorInvalidMemcpyDirection",
             101: "cudaErrorInvalidDevice", 400: "cudaErrorInvalidResourceHandle",
             600: "cudaErrorNotReady"}

# Every runtime row, successes and documented failures, and every exported variant.
OPS = (
    "register:_Z14vec_add_kernelPKfS0_Pfi", "getkernel", "cudagetkernel",
    "malloc:4000", "mallocmanaged:8192:2", "mallocmanaged:64:3", "mallocasync:256:0x5005",
    "mallocpitch:1000:8", "mallochost:512", "hostalloc:1024:4", "hostalloc:8:16",
    "streamcreate", "streamcreateflags:1", "streamcreateprio:1:-3", "streamcreateprio:0:4",
    "eventcreate", "eventcreateflags:2", "eventrecord:@0:@1", "eventrecordptsz:@1:@2",
    "eventquery:@0", "eventquery:0xe001", "eventsync:@1", "elapsed:@0:@1", "elapsed:@0:0",
    "streamwait:@1:@0:0", "streamquery:@0", "streamquery:0x5001", "streamsync:@2",
    "streamsyncptsz:@1",
    "memcpy:4000:1", "memcpy:64:7", "memcpyptds:8:2", "memcpyasync:4000:3:@1",
    "memcpyasyncptsz:16:2:@2",
    "memcpy2d:100:8:1:512:256", "memcpy2d:600:1:1", "memcpy2dasync:100:8:3:@1:1024:512",
    "memcpypeer:64:1:0", "memcpypeer:64:0:5",
    "memset:7:4000", "memsetasync:1:64:@1", "memsetasyncptsz:255:32:@2",
    "devsync", "getdevicecount", "meminfo",
    "launch:4,1,1:256,1,1", "launch:2,3,4:8,8,2:1024:@0", "launchptsz:1:32:0:@1",
    "coop:4:32:64:@2", "launchex:2,2,1:64,2,1:128:@1", "launchex:3:2000",
    "capture:@0:1", "endcapture:@0", "instantiate", "graphlaunch:last:@1", "graphlaunch:0",
    # CUDA graphs (what graphs.py makes of them: tests/test_graphs.py)
    "graphcreate", "addkernel:2:32:8:@1", "addkernel:1:1:0:0", "addmemcpy:64:1:@1",
    "addmemcpy1d:32:2:@1", "addtosymbol:8:@1", "addfromsymbol:16:@1", "addmemset:7:4:16:2:@1",
    "graphcreate", "addchild:@1:@2", "addempty:@2:@0", "addeventrecord:@0:@2",
    "addeventwait:@0:@2", "instantiateflags:@2:1", "instantiateparams:@2",
    "execkernelupdate:4:64:0:last:@0", "execupdate:last:@2", "graphcreate",
    "capturetograph:@3:@0", "endcapture:@0", "exchangemode:1", "exchangemode:0",
    "graphdestroy:@2", "execdestroy:last",
    "setdevice:1", "getdevice", "setdevice:7", "getlasterror", "peeklasterror",
    "eventdestroy:@1", "streamdestroy:@0", "streamdestroy:0",
    "free", "freehost", "freeasync:last:@1", "hostregister:4096:1", "hostregister:0",
    "hostunregister", "devreset",
)

NOT_DEFAULT = {"cudaGetLastError", "cudaPeekAtLastError", "cudaGetDevice"}


def _copy(call: Call) -> Dict[str, Any]:
    args = {"dst": call.number("dst"), "src": call.number("src"), "size": call.number("count"),
            "kind": KINDS.get(call.number("kind"), "kind(%d)" % call.number("kind"))}
    if "stream" in call.fields:
        args["stream"] = call.number("stream")
    return args


def _copy_2d(call: Call) -> Dict[str, Any]:
    args = _n("dst", "dpitch", "src", "spitch", "width", "height")(call)
    args["kind"] = KINDS[call.number("kind")]
    if "stream" in call.fields:
        args["stream"] = call.number("stream")
    return args


def _launch(call: Call) -> Dict[str, Any]:
    return {"func": call.number("func"), "grid": dims(call.fields["grid"]),
            "block": dims(call.fields["block"]), "smem": call.number("smem"),
            "stream": call.number("stream")}


ARGS: Dict[str, Callable[[Call], Dict[str, Any]]] = {
    "cudaMalloc": _n("size"), "cudaMallocManaged": _n("size", "flags"),
    "cudaMallocAsync": _n("size", "stream"), "cudaMallocPitch": _n("width", "height"),
    "cudaMallocHost": _n("size"), "cudaHostAlloc": _n("size", "flags"),
    "cudaFree": _n("ptr"), "cudaFreeHost": _n("ptr"), "cudaFreeAsync": _n("ptr", "stream"),
    "cudaHostRegister": _n("ptr", "size", "flags"), "cudaHostUnregister": _n("ptr"),
    "cudaMemcpy": _copy, "cudaMemcpyAsync": _copy, "cudaMemcpy2D": _copy_2d,
    "cudaMemcpy2DAsync": _copy_2d,
    "cudaMemcpyPeer": _n("dst", "dstDevice", "src", "srcDevice", size="count"),
    "cudaMemset": _n("ptr", "value", size="count"),
    "cudaMemsetAsync": _n("ptr", "value", "stream", size="count"),
    "cudaStreamCreateWithFlags": _n("flags"),
    "cudaStreamCreateWithPriority": _n("flags", "priority"),
    "cudaStreamDestroy": _n("stream"), "cudaStreamSynchronize": _n("stream"),
    "cudaStreamQuery": _n("stream"), "cudaStreamWaitEvent": _n("stream", "event", "flags"),
    "cudaEventCreateWithFlags": _n("flags"), "cudaEventRecord": _n("event", "stream"),
    "cudaEventSynchronize": _n("event"), "cudaEventQuery": _n("event"),
    "cudaEventDestroy": _n("event"), "cudaEventElapsedTime": _n("start", "end"),
    "cudaLaunchKernel": _launch, "cudaLaunchCooperativeKernel": _launch,
    "cudaLaunchKernelExC": _launch,
    "cudaStreamBeginCapture": _n("stream", "mode"), "cudaStreamEndCapture": _n("stream"),
    "cudaGraphInstantiate": _n("graph", "flags"),
    "__cudaGetKernel": _n("entry"), "cudaGetKernel": _n("entry"), "cudaGraphLaunch": _n("stream",
                                                                        graphExec="exec"),
    "cudaSetDevice": _n("device"),
}


def _node(**more: Callable[[Call], Any]) -> Callable[[Call], Dict[str, Any]]:
    """A cudaGraphAdd*Node's arguments: graph, dependencies, and `more` by field."""
    return lambda c: dict({"graph": c.number("graph"), "numDependencies": c.number("deps")},
                          **{k: f(c) for k, f in more.items()})


def _kernel_params(call: Call) -> Dict[str, Any]:
    return {"func": call.number("func"), "grid": dims(call.fields["grid"]),
            "block": dims(call.fields["block"]), "smem": call.number("smem")}


def _kind(call: Call) -> str:
    return KINDS[call.number("kind")]


ARGS.update({
    "cudaStreamBeginCaptureToGraph": lambda c: dict(_n("stream", "graph", "mode")(c),
                                                    numDependencies=0),
    "cudaThreadExchangeStreamCaptureMode": _n("mode"), "cudaGraphCreate": lambda c: {"flags": 0},
    "cudaGraphAddKernelNode": lambda c: dict(_node()(c), **_kernel_params(c)),
    "cudaGraphAddMemcpyNode": _node(size=lambda c: c.number("count"), kind=_kind),
    "cudaGraphAddMemcpyNode1D": _node(dst=lambda c: c.number("dst"),
                                      src=lambda c: c.number("src"),
                                      size=lambda c: c.number("count"), kind=_kind),
    "cudaGraphAddMemcpyNodeToSymbol": _node(symbol=lambda c: c.number("symbol"),
                                            src=lambda c: c.number("host"),
                                            size=lambda c: c.number("count"),
                                            offset=lambda c: 0, kind=lambda c: "HostToDevice"),
    "cudaGraphAddMemcpyNodeFromSymbol": _node(dst=lambda c: c.number("host"),
                                              symbol=lambda c: c.number("symbol"),
                                              size=lambda c: c.number("count"),
                                              offset=lambda c: 0, kind=lambda c: "DeviceToHost"),
    "cudaGraphAddMemsetNode": _node(ptr=lambda c: c.number("ptr"),
                                    value=lambda c: c.number("value"),
                                    size=lambda c: c.number("elem") * c.number("width")
                                    * c.number("height")),
    "cudaGraphAddChildGraphNode": _node(childGraph=lambda c: c.number("child")),
    "cudaGraphAddEmptyNode": _node(),
    "cudaGraphAddEventRecordNode": _node(event=lambda c: c.number("event")),
    "cudaGraphAddEventWaitNode": _node(event=lambda c: c.number("event")),
    "cudaGraphInstantiateWithFlags": _n("graph", "flags"),
    "cudaGraphInstantiateWithParams": lambda c: dict(_n("graph")(c), params=0),
    "cudaGraphExecKernelNodeSetParams": lambda c: dict(_kernel_params(c),
                                                       **_n("node", graphExec="exec")(c)),
    "cudaGraphExecUpdate": _n("graph", graphExec="exec"), "cudaGraphDestroy": _n("graph"),
    "cudaGraphExecDestroy": _n(graphExec="exec"),
    "__cudaRegisterFunction": _n("stub"),
})

OUT_NAMES = {"cudaMalloc": "ptr", "cudaMallocManaged": "ptr", "cudaMallocAsync": "ptr",
             "cudaMallocPitch": "ptr", "cudaMallocHost": "ptr", "cudaHostAlloc": "ptr",
             "cudaStreamCreate": "stream", "cudaStreamCreateWithFlags": "stream",
             "cudaStreamCreateWithPriority": "stream", "cudaEventCreate": "event",
             "cudaEventCreateWithFlags": "event", "cudaGetDeviceCount": "count",
             "cudaGetDevice": "device", "cudaMemGetInfo": "free",
             "cudaStreamEndCapture": "graph", "cudaGraphInstantiate": "graphExec",
             "__cudaGetKernel": "kernel", "cudaGetKernel": "kernel",
             "cudaGraphCreate": "graph", "cudaGraphInstantiateWithFlags": "graphExec",
             "cudaGraphInstantiateWithParams": "graphExec",
             "cudaThreadExchangeStreamCaptureMode": "previous",
             **{name: "node" for name in apis.BY_NAME if name.startswith("cudaGraphAdd")}}
# What graphs.py adds to events beside their out-parameters (checked in test_graphs.py).
GRAPH_ADDED = ("nodes", "nodes_reason", "captured")


def expected_args(call: Call) -> Dict[str, Any]:
    rule = ARGS.get(base_name(call.fn))
    return rule(call) if rule else {}


def expected_outs(call: Call) -> Dict[str, Any]:
    """Out-parameters, as the program saw them; none when the call failed."""
    fn = base_name(call.fn)
    if call.ret != 0:
        return {}
    if fn == "cudaEventElapsedTime":
        return {"ms": float(call.fields["ms"])}
    outs = {OUT_NAMES[fn]: call.out} if fn in OUT_NAMES else {}
    if fn == "cudaMallocPitch":
        outs["pitch"] = call.number("pitch")
    if fn == "cudaMemGetInfo":
        outs["total"] = call.number("total")
    if fn == "__cudaRegisterFunction":  # what the probe read of the name it registers
        outs["kernel_name"] = call.fields["name"]
    return outs


@pytest.fixture(scope="module")
def everything(fake):
    lib, prog = fake
    return trace_command([prog, *OPS], library=[str(lib)], everything=True)


def test_every_runtime_row_is_exercised(root, everything):
    _, calls, tracer = everything
    assert tracer.exit_status == 0
    runtime_rows = {a.name for a in apis.TABLE if a.library == apis.RUNTIME}
    assert {base_name(c.fn) for c in calls} == runtime_rows
    variants = {c.fn for c in calls if c.fn != base_name(c.fn)}
    assert variants == {"cudaMemcpy_ptds", "cudaMemcpyAsync_ptsz", "cudaMemsetAsync_ptsz",
                        "cudaStreamSynchronize_ptsz", "cudaEventRecord_ptsz",
                        "cudaLaunchKernel_ptsz"}


def test_one_exit_per_call_in_program_order_under_the_base_name(everything):
    events, calls, tracer = everything
    assert [e.api for e in exits(events)] == [base_name(c.fn) for c in calls]
    assert tracer.stats_at_end == {"lost": 0, "unpaired": 0, "too_deep": 0, "entries_lost": 0}


def test_arguments_are_exactly_what_the_program_passed(everything):
    events, calls, _ = everything
    for event, call in zip(exits(events), calls):
        assert event.args == expected_args(call), call


def test_return_values_names_and_out_parameters(everything):
    events, calls, _ = everything
    for event, call in zip(exits(events), calls):
        assert (event.ret, event.ret_name) == (call.ret, RET_NAMES[call.ret]), call
        outs = {k: v for k, v in event.outs.items() if k not in GRAPH_ADDED}
        assert outs == expected_outs(call), call
        assert event.faults == ()


def _by_api(events) -> Dict[str, List]:
    found: Dict[str, List] = {}
    for event in exits(events):
        found.setdefault(event.api, []).append(event)
    return found


def test_known_values_of_the_stand_in(everything):
    """The stand-in's documented values, independently of what the program printed."""
    by = _by_api(everything[0])
    assert [e.outs for e in by["cudaMalloc"]] == [{"ptr": device_ptr(0)}]
    assert [(e.ret_name, e.outs) for e in by["cudaMallocManaged"]] == [
        ("cudaSuccess", {"ptr": device_ptr(1)}), ("cudaErrorInvalidValue", {})]
    assert by["cudaMallocAsync"][0].args == {"size": 256, "stream": 0x5005}
    assert by["cudaMallocPitch"][0].outs == {"ptr": device_ptr(3), "pitch": 1024}
    assert by["cudaMallocHost"][0].outs == {"ptr": host_ptr(0)}
    assert [e.outs for e in by["cudaHostAlloc"]] == [{"ptr": host_ptr(1)}, {}]
    assert [e.outs for e in by["cudaStreamCreateWithPriority"]] == [
        {"stream": STREAM_BASE + 2}, {}]
    assert by["cudaStreamCreateWithPriority"][0].args == {"flags": 1, "priority": -3}
    assert [e.outs for e in by["cudaEventCreateWithFlags"]] == [{"event": EVENT_BASE + 1}]
    assert [(e.outs, e.ret_name) for e in by["cudaEventElapsedTime"]] == [
        ({"ms": ELAPSED_MS}, "cudaSuccess"), ({}, "cudaErrorInvalidResourceHandle")]
    assert by["cudaMemGetInfo"][0].outs == {"free": MEM_FREE, "total": MEM_TOTAL}
    assert by["cudaGetDeviceCount"][0].outs == {"count": 2}
    assert by["cudaStreamEndCapture"][0].outs == {"graph": GRAPH_BASE, "nodes": []}  # nothing
    assert [e.outs.get("nodes") for e in by["cudaGraphLaunch"]] == [[], None]  # captured
    assert by["cudaGraphInstantiate"][0].args == {"graph": GRAPH_BASE, "flags": 0}
    assert by["cudaGraphInstantiate"][0].outs == {"graphExec": EXEC_BASE}
    assert [(e.args, e.ret_name) for e in by["cudaGraphLaunch"]] == [
        ({"graphExec": EXEC_BASE, "stream": STREAM_BASE + 1}, "cudaSuccess"),
        ({"graphExec": 0, "stream": 0}, "cudaErrorInvalidResourceHandle")]
    assert [e.ret_name for e in by["cudaStreamQuery"]] == ["cudaSuccess", "cudaErrorNotReady"]


def test_stack_passed_arguments(everything):
    """cudaMemcpy2D's kind is stack slot 0, cudaMemcpy2DAsync's stream stack slot 1."""
    by = _by_api(everything[0])
    ok, bad_pitch, async_ = by["cudaMemcpy2D"] + by["cudaMemcpy2DAsync"]
    assert (ok.args["kind"], ok.args["width"], ok.args["height"], ok.args["dpitch"],
            ok.args["spitch"], ok.ret_name) == ("HostToDevice", 100, 8, 512, 256, "cudaSuccess")
    assert bad_pitch.ret_name == "cudaErrorInvalidPitchValue"
    assert (async_.args["kind"], async_.args["stream"], async_.args["dpitch"]) == (
        "DeviceToDevice", STREAM_BASE + 1, 1024)
    plain, full = by["cudaLaunchKernel"][:2]
    assert (plain.args["smem"], plain.args["stream"]) == (0, 0)
    assert (full.args["grid"], full.args["block"], full.args["smem"], full.args["stream"]) == (
        (2, 3, 4), (8, 8, 2), 1024, STREAM_BASE)


def test_launch_config_is_read_through_the_pointer(everything):
    by = _by_api(everything[0])
    ok, too_big = by["cudaLaunchKernelExC"]
    assert {k: ok.args[k] for k in ("grid", "block", "smem", "stream")} == {
        "grid": (2, 2, 1), "block": (64, 2, 1), "smem": 128, "stream": STREAM_BASE + 1}
    assert ok.args["func"] != 0 and ok.ret_name == "cudaSuccess"
    assert too_big.args["block"] == (2000, 1, 1)
    assert too_big.ret == 9


def test_variants_are_reported_under_their_base_row(everything):
    by = _by_api(everything[0])
    assert len(by["cudaLaunchKernel"]) == 3 and by["cudaLaunchKernel"][2].args["stream"] == \
        STREAM_BASE + 1
    assert [e.args["kind"] for e in by["cudaMemcpy"]] == ["HostToDevice", "kind(7)",
                                                          "DeviceToHost"]
    assert [e.args["stream"] for e in by["cudaEventRecord"]] == [STREAM_BASE + 1,
                                                                 STREAM_BASE + 2]
    assert [e.args["value"] for e in by["cudaMemsetAsync"]] == [1, 255]
    assert not any(name.endswith(("_ptsz", "_ptds")) for name in by)


def test_error_functions_and_get_device_only_on_request(root, fake):
    lib, prog = fake
    ops = ("setdevice:7", "getlasterror", "peeklasterror", "getdevice", "malloc:64")
    events, calls, tracer = trace_command([prog, *ops], library=[str(lib)])
    assert [e.api for e in exits(events)] == ["cudaSetDevice", "cudaMalloc"]
    assert not NOT_DEFAULT & {a.api for a in tracer.attachments}
    events, _, _ = trace_command([prog, *ops], library=[str(lib)],
                                 functions=["cudaGetLastError", "cudaPeekAtLastError"])
    assert [(e.api, e.ret_name) for e in exits(events)] == [
        ("cudaGetLastError", "cudaErrorInvalidDevice"), ("cudaPeekAtLastError", "cudaSuccess")]
    events, _, _ = trace_command([prog, *ops], library=[str(lib)], everything=True)
    assert [e.api for e in exits(events)] == ["cudaSetDevice", "cudaGetLastError",
                                               "cudaPeekAtLastError", "cudaGetDevice",
                                               "cudaMalloc"]
    assert [(c.fn, c.ret) for c in calls[1:3]] == [("cudaGetLastError", 101),
                                                   ("cudaPeekAtLastError", 0)]
