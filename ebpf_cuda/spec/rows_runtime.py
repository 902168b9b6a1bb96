"""The CUDA runtime's rows (libcudart.so, or an executable that links cudart statically),
but for its graph rows (rows_graphs.py). Their order is their function ids: append only.
"""
from typing import Tuple

from .row import DEVICE, HOST, Api, Arg, Out, Role
from .row_parts import (_CONFIG, _LAUNCH, _MEMCPY, A, K, R, _a, _alloc, _copy, _free, _hidden,
                        _memset)

# The return address at entry (read from the stack pointer): the code that made the call.
_CALLER = Arg("caller", K.CALLER, -1, show=False)


def _launch_args(first_stack: int) -> Tuple[Arg, ...]:
    """cudaLaunchKernel-style arguments: func, grid, block, args, sharedMem, stream; and the
    caller (nvcc's `__device_stub__KERNEL`, which names a launch whose cudaKernel_t was
    made before the trace began)."""
    return (_a("func", K.PTR, 0), _a("grid", K.DIM3, 1), _a("block", K.DIM3, 3),
            _hidden("args", 5), _a("smem", K.U64, first_stack), _a("stream", K.HANDLE, 7),
            _CALLER)


ROWS: Tuple[Api, ...] = (
    # The seed tool's eleven, first (apis.SEED_FUNCTIONS relies on the order).
    Api("cudaMalloc", R, (_hidden("devPtr", 0), _a("size", K.SIZE, 1)),
        (Out("ptr", K.PTR, 0),), "memory", **_alloc(DEVICE)),
    Api("cudaFree", R, (_a("ptr", K.PTR, 0),), (), "memory", **_free(DEVICE)),
    Api("cudaMemcpy", R, _MEMCPY + (_a("kind", K.MEMCPY_KIND, 3),), (), "memcpy",
        ("cudaMemcpy_ptds",), **_copy(A.FROM_KIND)),
    Api("cudaLaunchKernel", R, _launch_args(6), (), "launch", ("cudaLaunchKernel_ptsz",),
        **_LAUNCH),
    Api("cudaStreamCreate", R, (_hidden("pStream", 0),), (Out("stream", K.HANDLE, 0),),
        "stream"),
    Api("cudaStreamSynchronize", R, (_a("stream", K.HANDLE, 0),), (), "sync",
        ("cudaStreamSynchronize_ptsz",)),
    Api("cudaEventCreate", R, (_hidden("pEvent", 0),), (Out("event", K.HANDLE, 0),), "event"),
    Api("cudaEventRecord", R, (_a("event", K.HANDLE, 0), _a("stream", K.HANDLE, 1)), (),
        "event", ("cudaEventRecord_ptsz",), role=Role.EVENT_RECORD),
    Api("cudaEventSynchronize", R, (_a("event", K.HANDLE, 0),), (), "sync"),
    Api("cudaGetDevice", R, (_hidden("pDevice", 0),), (Out("device", K.INT, 0, size=4),),
        "device", default=False),
    Api("cudaSetDevice", R, (_a("device", K.INT, 0),), (), "device"),
    # The rest of the runtime API.
    Api("cudaMallocManaged", R, (_hidden("devPtr", 0), _a("size", K.SIZE, 1),
                                 _a("flags", K.UINT, 2)), (Out("ptr", K.PTR, 0),), "memory",
        **_alloc(DEVICE)),
    Api("cudaMallocHost", R, (_hidden("pHost", 0), _a("size", K.SIZE, 1)),
        (Out("ptr", K.PTR, 0),), "memory", **_alloc(HOST)),
    Api("cudaHostAlloc", R, (_hidden("pHost", 0), _a("size", K.SIZE, 1), _a("flags", K.UINT, 2)),
        (Out("ptr", K.PTR, 0),), "memory", **_alloc(HOST)),
    Api("cudaFreeHost", R, (_a("ptr", K.PTR, 0),), (), "memory", **_free(HOST)),
    Api("cudaMallocAsync", R, (_hidden("devPtr", 0), _a("size", K.SIZE, 1),
                               _a("stream", K.HANDLE, 2)), (Out("ptr", K.PTR, 0),), "memory",
        ("cudaMallocAsync_ptsz",), **_alloc(DEVICE, asynchronous=True)),
    Api("cudaFreeAsync", R, (_a("ptr", K.PTR, 0), _a("stream", K.HANDLE, 1)), (), "memory",
        ("cudaFreeAsync_ptsz",), **_free(DEVICE, asynchronous=True)),
    Api("cudaMallocPitch", R, (_hidden("devPtr", 0), _hidden("pPitch", 1),
                               _a("width", K.SIZE, 2), _a("height", K.U64, 3)),
        (Out("ptr", K.PTR, 0), Out("pitch", K.U64, 1)), "memory",
        **_alloc(DEVICE, size=("pitch", "height"))),
    Api("cudaMemcpyAsync", R, _MEMCPY + (_a("kind", K.MEMCPY_KIND, 3),
                                         _a("stream", K.HANDLE, 4)), (), "memcpy",
        ("cudaMemcpyAsync_ptsz",), **_copy(A.FROM_KIND, asynchronous=True)),
    Api("cudaMemcpy2D", R, (_a("dst", K.PTR, 0), _a("dpitch", K.U64, 1), _a("src", K.PTR, 2),
                            _a("spitch", K.U64, 3), _a("width", K.SIZE, 4),
                            _a("height", K.U64, 5), _a("kind", K.MEMCPY_KIND, 6)), (),
        "memcpy", ("cudaMemcpy2D_ptds",), **_copy(A.FROM_KIND, size=("width", "height"))),
    Api("cudaMemcpy2DAsync", R, (_a("dst", K.PTR, 0), _a("dpitch", K.U64, 1),
                                 _a("src", K.PTR, 2), _a("spitch", K.U64, 3),
                                 _a("width", K.SIZE, 4), _a("height", K.U64, 5),
                                 _a("kind", K.MEMCPY_KIND, 6), _a("stream", K.HANDLE, 7)), (),
        "memcpy", ("cudaMemcpy2DAsync_ptsz",),
        **_copy(A.FROM_KIND, asynchronous=True, size=("width", "height"))),
    Api("cudaMemcpyPeer", R, (_a("dst", K.PTR, 0), _a("dstDevice", K.INT, 1),
                              _a("src", K.PTR, 2), _a("srcDevice", K.INT, 3),
                              _a("size", K.SIZE, 4)), (), "memcpy", **_copy(A.PEER)),
    Api("cudaMemset", R, (_a("ptr", K.PTR, 0), _a("value", K.INT, 1), _a("size", K.SIZE, 2)),
        (), "memset", ("cudaMemset_ptds",), **_memset()),
    Api("cudaMemsetAsync", R, (_a("ptr", K.PTR, 0), _a("value", K.INT, 1),
                               _a("size", K.SIZE, 2), _a("stream", K.HANDLE, 3)), (), "memset",
        ("cudaMemsetAsync_ptsz",), **_memset(asynchronous=True)),
    Api("cudaDeviceSynchronize", R, (), (), "sync"),
    Api("cudaDeviceReset", R, (), (), "device"),
    Api("cudaGetDeviceCount", R, (_hidden("pCount", 0),), (Out("count", K.INT, 0, size=4),),
        "device"),
    Api("cudaMemGetInfo", R, (_hidden("pFree", 0), _hidden("pTotal", 1)),
        (Out("free", K.SIZE, 0), Out("total", K.SIZE, 1)), "device"),
    Api("cudaStreamCreateWithFlags", R, (_hidden("pStream", 0), _a("flags", K.UINT, 1)),
        (Out("stream", K.HANDLE, 0),), "stream"),
    Api("cudaStreamCreateWithPriority", R, (_hidden("pStream", 0), _a("flags", K.UINT, 1),
                                            _a("priority", K.INT, 2)),
        (Out("stream", K.HANDLE, 0),), "stream"),
    Api("cudaStreamDestroy", R, (_a("stream", K.HANDLE, 0),), (), "stream"),
    Api("cudaStreamWaitEvent", R, (_a("stream", K.HANDLE, 0), _a("event", K.HANDLE, 1),
                                   _a("flags", K.UINT, 2)), (), "stream",
        ("cudaStreamWaitEvent_ptsz",), role=Role.STREAM_WAIT),
    Api("cudaStreamQuery", R, (_a("stream", K.HANDLE, 0),), (), "stream",
        ("cudaStreamQuery_ptsz",)),
    Api("cudaEventCreateWithFlags", R, (_hidden("pEvent", 0), _a("flags", K.UINT, 1)),
        (Out("event", K.HANDLE, 0),), "event"),
    Api("cudaEventDestroy", R, (_a("event", K.HANDLE, 0),), (), "event"),
    Api("cudaEventQuery", R, (_a("event", K.HANDLE, 0),), (), "event"),
    Api("cudaEventElapsedTime", R, (_hidden("pMs", 0), _a("start", K.HANDLE, 1),
                                    _a("end", K.HANDLE, 2)),
        (Out("ms", K.FLOAT, 0, size=4),), "event"),
    Api("cudaLaunchKernelExC", R, (_CONFIG, _a("func", K.PTR, 1), _hidden("args", 2), _CALLER),
        (),
        "launch", ("cudaLaunchKernelExC_ptsz",), **_LAUNCH),
    Api("cudaLaunchCooperativeKernel", R, _launch_args(6), (), "launch",
        ("cudaLaunchCooperativeKernel_ptsz",), **_LAUNCH),
    Api("cudaGraphLaunch", R, (_a("graphExec", K.HANDLE, 0), _a("stream", K.HANDLE, 1)), (),
        "graph", ("cudaGraphLaunch_ptsz",), role=Role.GRAPH_LAUNCH),
    Api("cudaGraphInstantiate", R, (_hidden("pGraphExec", 0), _a("graph", K.HANDLE, 1),
                                    _a("flags", K.U64, 2)),
        (Out("graphExec", K.HANDLE, 0),), "graph", role=Role.INSTANTIATE),
    Api("cudaStreamBeginCapture", R, (_a("stream", K.HANDLE, 0), _a("mode", K.INT, 1)), (),
        "graph", ("cudaStreamBeginCapture_ptsz",), role=Role.CAPTURE_BEGIN),
    Api("cudaStreamEndCapture", R, (_a("stream", K.HANDLE, 0), _hidden("pGraph", 1)),
        (Out("graph", K.HANDLE, 1),), "graph", ("cudaStreamEndCapture_ptsz",),
        role=Role.CAPTURE_END),
    Api("__cudaGetKernel", R, (_hidden("pKernel", 0), _a("entry", K.PTR, 1)),
        (Out("kernel", K.HANDLE, 0),), "module", learn_func=("kernel", "entry")),
    Api("cudaGetKernel", R, (_hidden("pKernel", 0), _a("entry", K.PTR, 1)),
        (Out("kernel", K.HANDLE, 0),), "module", learn_func=("kernel", "entry")),
    # nvcc's start-up code registers each kernel of a module: its host stub and device name.
    # The probe stores the name under (pid, stub): launches are named from it however short
    # the process lives, and in stripped binaries. Called once per kernel, at start-up.
    Api("__cudaRegisterFunction", R, (_hidden("fatCubinHandle", 0), _a("stub", K.PTR, 1),
                                      _a("deviceName", K.PTR, 3, show=False)), (), "module",
        learn_name=("stub", "deviceName"), returns_value=False),
    Api("cudaGetLastError", R, (), (), "error", default=False),
    Api("cudaPeekAtLastError", R, (), (), "error", default=False),
)

# Rows added after the graph rows (their function ids follow every earlier row's: apis.TABLE).
# Host memory page-locked for the GPU after its allocation (analyze's pageable-copy rule).
LATER_ROWS: Tuple[Api, ...] = (
    Api("cudaHostRegister", R, (_a("ptr", K.PTR, 0), _a("size", K.SIZE, 1),
                                _a("flags", K.UINT, 2)), (), "memory",
        role=Role.HOST_REGISTER, ptr="ptr", size=("size",)),
    Api("cudaHostUnregister", R, (_a("ptr", K.PTR, 0),), (), "memory",
        role=Role.HOST_UNREGISTER, ptr="ptr"),
)
