"""Every driver row of the function table, traced for real on the stand-in libcuda.so.1.

The driver-API program (tests/native/cu_driver_prog.c) prints what it passed and got back;
the events must say exactly that: cuLaunchKernel's stack-passed blockZ/smem/stream,
cuLaunchKernelEx's config read through its pointer, out handles, CUresult names, `_v2`
names, and the kernel names learned from cuModuleGetFunction, cuLibraryGetKernel +
cuKernelGetFunction and cuFuncGetName.
"""
from typing import Any, Callable, Dict, List

import pytest

from ebpf_cuda.spec import apis
from fakecuda import Call, dims
from fakecuda import numbers as _n
from fakecuda_driver import (CTX_BASE, LIBRARY_BASE, MEMHANDLE_BASE, MODULE_BASE, VA_BASE,
                             base_name, build_fake_driver, device_ptr, exits, function_handle,
                             generated_name, host_ptr, kernel_handle)
from helpers import trace_command

pytestmark = pytest.mark.kernel

RET_NAMES = {0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
             3: "CUDA_ERROR_NOT_INITIALIZED", 101: "CUDA_ERROR_INVALID_DEVICE",
             200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT",
             400: "CUDA_ERROR_INVALID_HANDLE", 500: "CUDA_ERROR_NOT_FOUND",
             701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"}
HUGE = 2 << 40
LONG = 180  # a C++-mangled kernel name longer than 100 characters

OPS = (
    "malloc:64", "init:1", "init", "ctxsync", "ctxcreate:0:0", "ctxcreate:0:5", "ctxcreate4:4:1",
    "primaryctx:1", "ctxsync", "setctx:@0", "pushctx:@1", "pushctx:0", "popctx", "popctx",
    "popctx", "setctx:0",
    "malloc:4096", "malloc:%d" % HUGE, "malloc:0", "mallocasync:256:0x51",
    "mallocasyncptsz:128:0x52", "mallocmanaged:8192:1", "mallocmanaged:8:3", "hostalloc:1024:2",
    "allochost:256", "mallocpitch:100:4", "mallocpitch:100:4:3", "freehost",
    "hostregister:4096:1", "hostunregister",
    "memcpy:64", "memcpyptds:32", "htod:4096", "htodptds:16", "dtoh:4096", "dtohptds:8",
    "dtod:100", "dtodptds:4", "memcpy:8:0:0", "memcpyasync:64:0x51", "memcpyasyncptsz:8:0x52",
    "htodasync:512:0x51", "htodasyncptsz:64:0x53", "dtohasync:512:0x51", "dtohasyncptsz:8:0x52",
    "dtodasync:256:0x51", "dtodasyncptsz:2:0x52",
    "memsetd8:171:100", "memsetd8ptds:1:10", "memsetd32:3735928559:25", "memsetd32ptds:2:5",
    "memsetd8async:7:64:0x51", "memsetd8asyncptsz:9:64:0x52", "memsetd32async:5:16:0x51",
    "memsetd32asyncptsz:6:16:0x53", "memsetd8:1:1:0",
    "memcreate:2097152", "memcreate:0", "reserve:4194304:2097152", "reserve:65536:0:0x7a0000000000",
    "memmap:2097152:@0:@0:0", "memmap:0", "memunmap:2097152:@0", "memrelease:@0", "memrelease:0",
    "moduleload", "moduleload:empty", "moduleloadex:3", "getfunction:vec_add",
    "getfunction:=%d" % LONG, "getfunction:missing_kernel", "getfunction:x:0",
    "libraryload", "getkernel:lib_kernel", "kernelfunction", "kernelfunction:0x99",
    "funcname:@0", "funcname:@1", "funcname:@2", "funcname:0x12345",
    "launch:2,3,4:8,8,2:1024:0x51:@0", "launchptsz:1:32:0:0x52:@1",
    "launch:65535,65535,65535:1,1,1024:49152:0x53:@2", "launch:1:2000", "launch:1:32:65536",
    "launch:1:1:0:0:0",
    "coop:4:32:16:0x51:@0", "coopptsz:2:64:0:0x52:@1",
    "launchex:5,6,7:32,4,2:4096:0x51:@1", "launchexptsz:1:1:0:0x53:@2", "launchex:1:0",
    "graphlaunch:0x7001:0x51", "graphlaunchptsz:0x7002", "graphlaunch:0",
    # CUDA graphs (what graphs.py makes of them: tests/test_graphs.py)
    "graphcreate", "addkernel:2:32:16:@0:@0", "addkernel:1:1:0:0:@0", "addmemcpy:64:1:2:@0",
    "addmemset:9:4:8:2:@0", "graphcreate", "addchild:@0:@1", "addempty:@1",
    "addeventrecord:0xe1:@1", "addeventwait:0xe2:@1", "instantiate:@1:1", "instantiate2:@1",
    "instantiateparams:@1", "instantiateparamsptsz:@1", "execkernelupdate:4:64:0:@0:@0:@0",
    "execupdate:@0:@1", "capture:0x51", "endcapture:0x51", "captureptsz:0x52:1",
    "endcaptureptsz:0x52", "graphcreate", "capturetograph:@4:0x53", "endcapture:0x53",
    "capturetographptsz:@4:0x54:2", "endcaptureptsz:0x54", "exchangemode:1", "graphdestroy:@0",
    "execdestroy:@0",
    "streamsync:0x51", "streamsyncptsz:0x52", "eventsync:0xe001", "eventsync:0",
    "free", "free:@0", "freeasync:@1:0x51", "freeasyncptsz:@2:0x52", "ctxdestroy:@0",
    "ctxdestroy:0",
)


def _cu_launch(call: Call) -> Dict[str, Any]:
    """cuLaunchKernel's six scalars arrive as the dim3 grid and block of every launch."""
    return {"func": call.number("func"), "grid": dims(call.fields["grid"]),
            "block": dims(call.fields["block"]), "smem": call.number("smem"),
            "stream": call.number("stream")}


_COPY = _n("dst", "src", size="count")
_COPY_ASYNC = _n("dst", "src", "stream", size="count")
ARGS: Dict[str, Callable[[Call], Dict[str, Any]]] = {
    "cuInit": _n("flags"), "cuCtxCreate_v2": _n("flags", "device"),
    "cuCtxCreate_v4": lambda c: dict(_n("flags", "device")(c), params=0),
    "cuDevicePrimaryCtxRetain": _n("device"), "cuCtxDestroy_v2": _n("ctx"),
    "cuCtxSetCurrent": _n("ctx"), "cuCtxPushCurrent_v2": _n("ctx"), "cuCtxPopCurrent_v2": _n(),
    "cuMemAlloc_v2": _n("size"), "cuMemAllocAsync": _n("size", "stream"),
    "cuMemAllocManaged": _n("size", "flags"), "cuMemHostAlloc": _n("size", "flags"),
    "cuMemFree_v2": _n("ptr"), "cuMemFreeAsync": _n("ptr", "stream"),
    "cuMemAllocHost_v2": _n("size"), "cuMemFreeHost": _n("ptr"),
    "cuMemHostRegister_v2": _n("ptr", "size", "flags"), "cuMemHostUnregister": _n("ptr"),
    "cuMemAllocPitch_v2": _n("width", "height", "elementSize"),
    "cuMemcpy": _COPY, "cuMemcpyHtoD_v2": _COPY, "cuMemcpyDtoH_v2": _COPY,
    "cuMemcpyDtoD_v2": _COPY, "cuMemcpyAsync": _COPY_ASYNC, "cuMemcpyHtoDAsync_v2": _COPY_ASYNC,
    "cuMemcpyDtoHAsync_v2": _COPY_ASYNC, "cuMemcpyDtoDAsync_v2": _COPY_ASYNC,
    "cuMemsetD8_v2": _n("ptr", "value", "count"), "cuMemsetD32_v2": _n("ptr", "value", "count"),
    "cuMemsetD8Async": _n("ptr", "value", "count", "stream"),
    "cuMemsetD32Async": _n("ptr", "value", "count", "stream"),
    "cuMemCreate": _n("size", "prop", "flags"),
    "cuMemAddressReserve": _n("size", "alignment", "addr", "flags"),
    "cuMemMap": _n("ptr", "size", "offset", "handle", "flags"), "cuMemUnmap": _n("ptr", "size"),
    "cuMemRelease": _n("handle"),
    "cuModuleLoadData": _n("image"), "cuModuleLoadDataEx": _n("image", "numOptions"),
    "cuLibraryLoadData": _n("code"), "cuModuleGetFunction": _n("module"),
    "cuLibraryGetKernel": _n("library"), "cuKernelGetFunction": _n("kernel"),
    "cuFuncGetName": _n("function"),
    "cuLaunchKernel": _cu_launch, "cuLaunchCooperativeKernel": _cu_launch,
    "cuLaunchKernelEx": _cu_launch,
    "cuGraphLaunch": _n("stream", graphExec="exec"), "cuStreamSynchronize": _n("stream"),
    "cuEventSynchronize": _n("event"),
}
_MEMORY_TYPES = {1: "Host", 2: "Device", 3: "Array", 4: "Unified"}


def _kernel_params(call: Call) -> Dict[str, Any]:
    """A graph kernel node's parameters, read through their pointer."""
    return {"func": call.number("func"), "grid": dims(call.fields["grid"]),
            "block": dims(call.fields["block"]), "smem": call.number("smem")}


_NODE = {"numDependencies": 0}  # (the program's nodes have no dependencies)
ARGS.update({
    "cuStreamBeginCapture_v2": _n("stream", "mode"),
    "cuStreamBeginCaptureToGraph": lambda c: dict(_n("stream", "graph", "mode")(c), **_NODE),
    "cuStreamEndCapture": _n("stream"), "cuThreadExchangeStreamCaptureMode": _n("mode"),
    "cuGraphCreate": lambda c: {"flags": 0},
    "cuGraphAddKernelNode_v2": lambda c: dict(_kernel_params(c), graph=c.number("graph"),
                                              **_NODE),
    "cuGraphAddMemcpyNode": lambda c: dict(
        _n("graph")(c), srcMemoryType=_MEMORY_TYPES[c.number("srctype")],
        dstMemoryType=_MEMORY_TYPES[c.number("dsttype")], size=c.number("count"), **_NODE),
    "cuGraphAddMemsetNode": lambda c: dict(
        _n("graph", "ptr", "value")(c),
        size=c.number("elem") * c.number("width") * c.number("height"), **_NODE),
    "cuGraphAddChildGraphNode": lambda c: dict(_n("graph", childGraph="child")(c), **_NODE),
    "cuGraphAddEmptyNode": lambda c: dict(_n("graph")(c), **_NODE),
    "cuGraphAddEventRecordNode": lambda c: dict(_n("graph", "event")(c), **_NODE),
    "cuGraphAddEventWaitNode": lambda c: dict(_n("graph", "event")(c), **_NODE),
    "cuGraphInstantiateWithFlags": _n("graph", "flags"), "cuGraphInstantiate_v2": _n("graph"),
    "cuGraphInstantiateWithParams": lambda c: dict(_n("graph")(c), params=0),
    "cuGraphExecKernelNodeSetParams_v2": lambda c: dict(_kernel_params(c),
                                                        **_n("node", graphExec="exec")(c)),
    "cuGraphExecUpdate_v2": _n("graph", graphExec="exec"), "cuGraphDestroy": _n("graph"),
    "cuGraphExecDestroy": _n(graphExec="exec"),
})

OUT_NAMES = {"cuCtxCreate_v2": "ctx", "cuCtxCreate_v4": "ctx", "cuDevicePrimaryCtxRetain": "ctx",
             "cuCtxPopCurrent_v2": "ctx",
             "cuMemAlloc_v2": "ptr", "cuMemAllocAsync": "ptr", "cuMemAllocManaged": "ptr",
             "cuMemHostAlloc": "ptr", "cuMemCreate": "handle", "cuMemAddressReserve": "ptr",
             "cuMemAllocHost_v2": "ptr", "cuMemAllocPitch_v2": "ptr",
             "cuModuleLoadData": "module", "cuModuleLoadDataEx": "module",
             "cuLibraryLoadData": "library", "cuModuleGetFunction": "function",
             "cuLibraryGetKernel": "kernel", "cuKernelGetFunction": "function",
             "cuFuncGetName": "name_ptr", "cuStreamEndCapture": "graph", "cuGraphCreate": "graph",
             "cuGraphAddKernelNode_v2": "node", "cuGraphAddMemcpyNode": "node",
             "cuGraphAddMemsetNode": "node", "cuGraphAddChildGraphNode": "node",
             "cuGraphAddEmptyNode": "node", "cuGraphAddEventRecordNode": "node",
             "cuGraphAddEventWaitNode": "node", "cuGraphInstantiateWithFlags": "graphExec",
             "cuGraphInstantiate_v2": "graphExec", "cuGraphInstantiateWithParams": "graphExec",
             "cuThreadExchangeStreamCaptureMode": "previous"}
# What graphs.py adds to events beside their out-parameters (checked in test_graphs.py).
GRAPH_ADDED = ("nodes", "nodes_reason", "captured")
NAMED = {"cuModuleGetFunction", "cuLibraryGetKernel", "cuFuncGetName"}


def expected_args(call: Call) -> Dict[str, Any]:
    rule = ARGS.get(base_name(call.fn))
    return rule(call) if rule else {}


def expected_outs(call: Call) -> Dict[str, Any]:
    fn = base_name(call.fn)
    if call.ret != 0 or fn not in OUT_NAMES:
        return {}
    outs = {OUT_NAMES[fn]: call.out}
    if fn == "cuMemAllocPitch_v2":
        outs["pitch"] = call.number("pitch")
    if fn in NAMED:
        outs["kernel_name"] = call.fields["name"]
    return outs


@pytest.fixture(scope="module")
def fake(cc):
    return build_fake_driver(cc)


@pytest.fixture(scope="module")
def traced(fake):
    lib, prog = fake
    return trace_command([prog, *OPS], library=[str(lib)], everything=True)


def _by_api(events) -> Dict[str, List]:
    found: Dict[str, List] = {}
    for event in exits(events):
        found.setdefault(event.api, []).append(event)
    return found


def test_every_driver_row_and_variant_is_exercised(root, traced):
    _, calls, tracer = traced
    assert tracer.exit_status == 0
    assert {base_name(c.fn) for c in calls} == {a.name for a in apis.TABLE if a.driver}
    aliases = {s for a in apis.TABLE if a.driver for s in a.aliases}
    assert {c.fn for c in calls if c.fn != base_name(c.fn)} == aliases


def test_one_exit_per_call_in_program_order(root, traced):
    events, calls, tracer = traced
    assert [e.api for e in exits(events)] == [base_name(c.fn) for c in calls]
    assert tracer.stats_at_end == {"lost": 0, "unpaired": 0, "too_deep": 0, "entries_lost": 0}
    child = tracer.child_pid
    assert all(e.pid == e.tid == child for e in events)


def test_arguments_are_exactly_what_the_program_passed(root, traced):
    events, calls, _ = traced
    for event, call in zip(exits(events), calls):
        assert event.args == expected_args(call), call


def test_cuda_results_by_name_and_out_handles(root, traced):
    events, calls, _ = traced
    for event, call in zip(exits(events), calls):
        assert (event.ret, event.ret_name) == (call.ret, RET_NAMES[call.ret]), call
        outs = {k: v for k, v in event.outs.items() if k not in GRAPH_ADDED}
        assert outs == expected_outs(call), call
        assert event.faults == ()


def test_known_values_of_the_stand_in(root, traced):
    by = _by_api(traced[0])
    assert [e.ret_name for e in by["cuMemAlloc_v2"]] == [
        "CUDA_ERROR_NOT_INITIALIZED", "CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY",
        "CUDA_ERROR_INVALID_VALUE"]
    assert by["cuMemAlloc_v2"][1].outs == {"ptr": device_ptr(0)}
    assert by["cuMemAlloc_v2"][2].args == {"size": HUGE}
    assert [e.outs.get("ptr") for e in by["cuMemAllocAsync"]] == [device_ptr(1), device_ptr(2)]
    assert by["cuMemHostAlloc"][0].outs == {"ptr": host_ptr(0)}
    assert [e.outs for e in by["cuCtxCreate_v2"]] == [{"ctx": CTX_BASE}, {}]
    assert by["cuCtxCreate_v2"][1].ret_name == "CUDA_ERROR_INVALID_DEVICE"
    assert by["cuCtxCreate_v4"][0].outs == {"ctx": CTX_BASE + 1}
    assert by["cuDevicePrimaryCtxRetain"][0].outs == {"ctx": CTX_BASE + 2}
    assert [e.ret_name for e in by["cuCtxSynchronize"]] == ["CUDA_ERROR_INVALID_CONTEXT",
                                                             "CUDA_SUCCESS"]
    assert by["cuMemCreate"][0].outs == {"handle": MEMHANDLE_BASE}
    assert [e.outs for e in by["cuMemAddressReserve"]] == [{"ptr": VA_BASE},
                                                           {"ptr": 0x7A0000000000}]
    assert by["cuMemMap"][0].args == {"ptr": VA_BASE, "size": 2 << 20, "offset": 0,
                                      "handle": MEMHANDLE_BASE, "flags": 0}
    assert [e.outs.get("module") for e in by["cuModuleLoadData"]] == [MODULE_BASE, None]
    assert by["cuModuleLoadData"][1].ret_name == "CUDA_ERROR_INVALID_IMAGE"
    assert by["cuModuleLoadDataEx"][0].outs == {"module": MODULE_BASE + 1}
    assert by["cuLibraryLoadData"][0].outs == {"library": LIBRARY_BASE}
    assert [(e.ret_name, e.outs.get("function")) for e in by["cuModuleGetFunction"]] == [
        ("CUDA_SUCCESS", function_handle(0)), ("CUDA_SUCCESS", function_handle(1)),
        ("CUDA_ERROR_NOT_FOUND", None), ("CUDA_ERROR_INVALID_HANDLE", None)]
    assert by["cuLibraryGetKernel"][0].outs["kernel"] == kernel_handle(0)
    assert by["cuMemsetD32_v2"][0].args["value"] == 0xDEADBEEF
    assert by["cuMemsetD8_v2"][0].args["value"] == 0xAB


def test_cu_launch_kernel_stack_arguments(root, traced):
    """blockZ, sharedMemBytes and hStream are cuLaunchKernel's stack slots 0, 1, 2."""
    by = _by_api(traced[0])
    first, ptsz, biggest, too_many, smem, null_f = by["cuLaunchKernel"]
    assert first.args == {"func": function_handle(0), "grid": (2, 3, 4), "block": (8, 8, 2),
                          "smem": 1024, "stream": 0x51}
    assert (ptsz.args["func"], ptsz.args["stream"], ptsz.args["block"][2]) == (
        function_handle(1), 0x52, 1)
    assert (biggest.args["grid"], biggest.args["block"][2], biggest.args["smem"],
            biggest.args["stream"]) == ((65535, 65535, 65535), 1024, 49152, 0x53)
    assert biggest.ret_name == "CUDA_SUCCESS"
    assert too_many.ret_name == "CUDA_ERROR_INVALID_VALUE" and too_many.args["block"][0] == 2000
    assert smem.ret_name == "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" and smem.args["smem"] == 65536
    assert null_f.ret_name == "CUDA_ERROR_INVALID_HANDLE"
    coop, coop_ptsz = by["cuLaunchCooperativeKernel"]
    assert (coop.args["smem"], coop.args["stream"], coop_ptsz.args["stream"]) == (16, 0x51, 0x52)


def test_cu_launch_kernel_ex_config(root, traced):
    by = _by_api(traced[0])
    ok, ptsz, zero = by["cuLaunchKernelEx"]
    assert ok.args == {"grid": (5, 6, 7), "block": (32, 4, 2), "smem": 4096, "stream": 0x51,
                       "func": function_handle(1)}
    assert (ptsz.args["stream"], ptsz.args["func"]) == (0x53, function_handle(2))
    assert zero.args["block"] == (0, 1, 1) and zero.ret_name == "CUDA_ERROR_INVALID_VALUE"


def test_kernel_names_are_learned_from_handles(root, traced):
    events, calls, tracer = traced
    pid = tracer.child_pid
    names = tracer.names
    long_name = generated_name(LONG)
    assert len(long_name) == LONG > 100
    assert names.learned(pid, function_handle(0)) == "vec_add"
    assert names.learned(pid, function_handle(1)) == long_name
    assert names.learned(pid, kernel_handle(0)) == "lib_kernel"
    assert names.learned(pid, function_handle(2)) == "lib_kernel"  # cuKernelGetFunction
    by = _by_api(events)
    assert [e.outs.get("kernel_name") for e in by["cuModuleGetFunction"]] == [
        "vec_add", long_name, None, None]
    assert by["cuLibraryGetKernel"][0].outs["kernel_name"] == "lib_kernel"
    assert [e.outs.get("kernel_name") for e in by["cuFuncGetName"]] == [
        "vec_add", long_name, "lib_kernel", None]
    launches = by["cuLaunchKernel"][:3] + by["cuLaunchKernelEx"][:2]
    assert [names.learned(pid, e.args["func"]) for e in launches] == [
        "vec_add", long_name, "lib_kernel", long_name, "lib_kernel"]
    assert names.learned(pid + 1, function_handle(0)) is None  # names are per process


@pytest.mark.parametrize("length", [254, 255, 256, 510, 600, 5050])
def test_names_of_any_length_are_kept_whole(root, fake, length):
    lib, prog = fake
    events, calls, tracer = trace_command(
        [prog, "init", "moduleload", "getfunction:=%d" % length, "funcname",
         "launch:1:32"], library=[str(lib)],
        functions=["cuModuleGetFunction", "cuFuncGetName", "cuLaunchKernel"])
    full = generated_name(length)
    assert calls[2].fields["name"] == full
    got = exits(events)
    assert [e.api for e in got] == ["cuModuleGetFunction", "cuFuncGetName", "cuLaunchKernel"]
    assert got[0].outs["kernel_name"] == got[1].outs["kernel_name"] == full
    assert tracer.names.learned(tracer.child_pid, got[2].args["func"]) == full


def test_two_kernels_alike_in_their_first_255_characters_stay_two(root, fake):
    lib, prog = fake
    events, _, tracer = trace_command(
        [prog, "init", "moduleload", "getfunction:=300", "getfunction:=400",
         "launch:1:32:0:0:%#x" % function_handle(0), "launch:1:32:0:0:%#x" % function_handle(1)],
        library=[str(lib)],
        functions=["cuModuleGetFunction", "cuLaunchKernel"])
    launches = [e for e in exits(events) if e.api == "cuLaunchKernel"]
    names = [tracer.names.learned(tracer.child_pid, e.args["func"]) for e in launches]
    assert names == [generated_name(300), generated_name(400)]
    assert names[0][:255] == names[1][:255]


def test_names_are_learned_without_tracing_the_launches(root, fake):
    """The names map is filled by the probe of cuModuleGetFunction alone."""
    lib, prog = fake
    events, _, tracer = trace_command([prog, "init", "moduleload", "getfunction:only_this"],
                                      library=[str(lib)], functions=["cuModuleGetFunction"])
    (event,) = exits(events)
    assert event.outs == {"function": function_handle(0), "kernel_name": "only_this"}
    assert tracer.names.learned(tracer.child_pid, function_handle(0)) == "only_this"
