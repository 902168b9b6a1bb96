"""The one table of traced functions.

One row per CUDA function: where its arguments are at entry (ABI integer slot: 0-5 are
registers, 6 and up are stack slots), what they are, which out-parameters to read at return,
and how to show them. The probe generator (probes.py) and the decoder (events.py) are both
driven by these rows: adding a function is adding a row.
"""
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

RUNTIME = "runtime"  # libcudart.so, or an executable that links cudart statically
DRIVER = "driver"  # libcuda.so.1


class Kind:
    """How a value is decoded and shown."""

    SIZE = "size"  # bytes: size=4000 bytes
    PTR = "ptr"  # address: 0x7f...
    HANDLE = "handle"  # opaque handle (stream, event, graph): 0x...
    INT = "int"  # signed 32-bit (device number); upper bits masked
    UINT = "uint"  # unsigned 32-bit (flags, dimensions)
    U64 = "u64"  # unsigned 64-bit
    FLOAT = "float"  # 32-bit float (milliseconds)
    MEMCPY_KIND = "memcpy_kind"  # enum cudaMemcpyKind, shown by name
    DIM3 = "dim3"  # dim3 passed by value: two slots (x | y << 32, z)
    STRING = "str"  # text (kernel names learned by the probes)
    # cudaLaunchConfig_t / CUlaunchConfig read through a pointer (40 bytes, 5 cells): grid and
    # block as six u32, shared memory (low 32 bits), stream. Decodes to grid/block/smem/stream.
    LAUNCH_CONFIG = "launch_config"


# Naming conventions the outputs rely on (tests/test_apis.py checks them): an argument named
# `func` is the launched kernel, and only launch rows have one; `size` is the byte count of a
# memory call.


class Role:
    """What a call does, for the analyses (memory correlation, copy and launch tables)."""

    ALLOC = "alloc"  # returns new memory (out `ptr`), `size` bytes, of family `memory`
    FREE = "free"  # releases the memory at argument `ptr`
    COPY = "copy"  # moves `size` bytes to `ptr`, in `direction`
    MEMSET = "memset"  # sets `size` elements of `elem_size` bytes at `ptr`
    LAUNCH = "launch"  # launches kernel `func`


class Direction:
    """Where a copy goes: a cudaMemcpyKind name (cuda_enums.MEMCPY_KINDS), PeerToPeer, or
    FROM_KIND: the row's memcpy-kind argument says (cudaMemcpy's `kind`)."""

    HTOH = "HostToHost"
    HTOD = "HostToDevice"
    DTOH = "DeviceToHost"
    DTOD = "DeviceToDevice"
    DEFAULT = "Default"  # unified addressing: the pointers tell
    PEER = "PeerToPeer"
    FROM_KIND = "from-kind"


DEVICE = "device"  # memory families of allocators and frees (with the layer: see Api.family)
HOST = "host"


class Arg(NamedTuple):
    """An argument read at entry from ABI slot `slot` (a DIM3 takes slots slot and slot+1)."""

    name: str
    kind: str
    slot: int
    show: bool = True  # False for out-parameter pointers, shown at return instead
    deref: int = 0  # > 0: read this many bytes from the pointer in `slot` instead

    @property
    def cells(self) -> int:
        if self.deref:
            return (self.deref + 7) // 8
        return 2 if self.kind == Kind.DIM3 else 1


class Out(NamedTuple):
    """An out-parameter: the pointer in ABI slot `slot` is saved at entry and `size` bytes
    are read from it at return (only when the call succeeded)."""

    name: str
    kind: str
    slot: int
    size: int = 8


class Api(NamedTuple):
    """One traced function."""

    name: str
    library: str
    args: Tuple[Arg, ...] = ()
    outs: Tuple[Out, ...] = ()
    category: str = "other"  # memory, memcpy, launch, stream, event, device, ...
    aliases: Tuple[str, ...] = ()  # other exported symbols traced as this row (_ptsz, _ptds)
    default: bool = True  # False: called very often and says little; only on request
    # (handle field, string-pointer field): on success the probe stores the string under
    # (pid, handle) in the `names` map, e.g. cuModuleGetFunction's function name.
    learn_name: Optional[Tuple[str, str]] = None
    # (handle field, address field): the handle stands for the host function at that address
    # (CUDA 13 launches pass a cudaKernel_t obtained from __cudaGetKernel for the stub).
    learn_func: Optional[Tuple[str, str]] = None
    # (new handle field, known handle field): the new handle runs the same kernel as the known
    # one (cuKernelGetFunction: a CUfunction for a CUkernel).
    learn_alias: Optional[Tuple[str, str]] = None
    # What the analyses read (see Role). `ptr`: the out-parameter of an allocator, else the
    # argument (the memory freed, copied to, set); `size`: the fields (arguments, or
    # out-parameters) whose product times `elem_size` is the byte count.
    role: Optional[str] = None
    ptr: Optional[str] = None
    size: Tuple[str, ...] = ()
    elem_size: int = 1
    direction: Optional[str] = None  # copies: a Direction
    memory: Optional[str] = None  # allocators and frees: DEVICE or HOST
    asynchronous: bool = False  # stream-ordered: returns before the work is done
    returns_value: bool = True  # False: a void function (its calls are recorded as returning 0)

    @property
    def symbols(self) -> Tuple[str, ...]:
        return (self.name,) + self.aliases

    @property
    def driver(self) -> bool:
        return self.library == DRIVER

    @property
    def family(self) -> Optional[Tuple[str, str]]:
        """(layer, DEVICE or HOST) of an allocator or free: memory is released only by a
        free of its own family (cudaMallocHost's by cudaFreeHost, cuMemAlloc's by
        cuMemFree_v2 or cuMemFreeAsync)."""
        return (self.library, self.memory) if self.memory else None

    @property
    def teaches_names(self) -> bool:
        """Its calls teach kernel names: they always emit a record (also with in-kernel
        aggregates) and wake the reader at once, while the process still lives."""
        return self.category == "module"

    @property
    def captures_stack(self) -> bool:
        """With --stacks its records carry the caller's user stack (shown by --leaks)."""
        return self.category == "memory"


def _a(name: str, kind: str, slot: int, show: bool = True) -> Arg:
    return Arg(name, kind, slot, show)


def _hidden(name: str, slot: int) -> Arg:
    return Arg(name, Kind.PTR, slot, show=False)


R, D = RUNTIME, DRIVER
K = Kind
A = Direction


def _alloc(memory: str, size: Tuple[str, ...] = ("size",), asynchronous: bool = False) -> dict:
    return dict(role=Role.ALLOC, ptr="ptr", size=size, memory=memory, asynchronous=asynchronous)


def _free(memory: str, asynchronous: bool = False) -> dict:
    return dict(role=Role.FREE, ptr="ptr", memory=memory, asynchronous=asynchronous)


def _copy(direction: str, asynchronous: bool = False,
          size: Tuple[str, ...] = ("size",)) -> dict:
    return dict(role=Role.COPY, ptr="dst", size=size, direction=direction,
                asynchronous=asynchronous)


def _memset(asynchronous: bool = False, size: str = "size", elem_size: int = 1) -> dict:
    return dict(role=Role.MEMSET, ptr="ptr", size=(size,), elem_size=elem_size,
                asynchronous=asynchronous)


_LAUNCH = dict(role=Role.LAUNCH, asynchronous=True)
_SIZED = dict(size=("size",))  # no role, but a byte count (the vmm rows)


def _launch_args(first_stack: int) -> Tuple[Arg, ...]:
    """cudaLaunchKernel-style arguments: func, grid, block, args, sharedMem, stream."""
    return (_a("func", K.PTR, 0), _a("grid", K.DIM3, 1), _a("block", K.DIM3, 3),
            _hidden("args", 5), _a("smem", K.U64, first_stack), _a("stream", K.HANDLE, 7))


def _cu_launch_args() -> Tuple[Arg, ...]:
    """cuLaunchKernel: f, grid x/y/z, block x/y (registers), block z, smem, stream (stack)."""
    return (_a("func", K.HANDLE, 0), _a("gridX", K.UINT, 1), _a("gridY", K.UINT, 2),
            _a("gridZ", K.UINT, 3), _a("blockX", K.UINT, 4), _a("blockY", K.UINT, 5),
            _a("blockZ", K.UINT, 6), _a("smem", K.UINT, 7), _a("stream", K.HANDLE, 8))


_CONFIG = Arg("config", K.LAUNCH_CONFIG, 0, deref=40)
_MEMCPY = (_a("dst", K.PTR, 0), _a("src", K.PTR, 1), _a("size", K.SIZE, 2))

TABLE: Tuple[Api, ...] = (
    # The seed tool's eleven, first (SEED_FUNCTIONS below relies on the order).
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
        "event", ("cudaEventRecord_ptsz",)),
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
        ("cudaStreamWaitEvent_ptsz",)),
    Api("cudaStreamQuery", R, (_a("stream", K.HANDLE, 0),), (), "stream",
        ("cudaStreamQuery_ptsz",)),
    Api("cudaEventCreateWithFlags", R, (_hidden("pEvent", 0), _a("flags", K.UINT, 1)),
        (Out("event", K.HANDLE, 0),), "event"),
    Api("cudaEventDestroy", R, (_a("event", K.HANDLE, 0),), (), "event"),
    Api("cudaEventQuery", R, (_a("event", K.HANDLE, 0),), (), "event"),
    Api("cudaEventElapsedTime", R, (_hidden("pMs", 0), _a("start", K.HANDLE, 1),
                                    _a("end", K.HANDLE, 2)),
        (Out("ms", K.FLOAT, 0, size=4),), "event"),
    Api("cudaLaunchKernelExC", R, (_CONFIG, _a("func", K.PTR, 1), _hidden("args", 2)), (),
        "launch", ("cudaLaunchKernelExC_ptsz",), **_LAUNCH),
    Api("cudaLaunchCooperativeKernel", R, _launch_args(6), (), "launch",
        ("cudaLaunchCooperativeKernel_ptsz",), **_LAUNCH),
    Api("cudaGraphLaunch", R, (_a("graphExec", K.HANDLE, 0), _a("stream", K.HANDLE, 1)), (),
        "graph", ("cudaGraphLaunch_ptsz",)),
    Api("cudaGraphInstantiate", R, (_hidden("pGraphExec", 0), _a("graph", K.HANDLE, 1),
                                    _a("flags", K.U64, 2)),
        (Out("graphExec", K.HANDLE, 0),), "graph"),
    Api("cudaStreamBeginCapture", R, (_a("stream", K.HANDLE, 0), _a("mode", K.INT, 1)), (),
        "graph", ("cudaStreamBeginCapture_ptsz",)),
    Api("cudaStreamEndCapture", R, (_a("stream", K.HANDLE, 0), _hidden("pGraph", 1)),
        (Out("graph", K.HANDLE, 1),), "graph", ("cudaStreamEndCapture_ptsz",)),
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
    # The driver API (libcuda.so.1). cuda.h maps most names to versioned symbols.
    Api("cuInit", D, (_a("flags", K.UINT, 0),), (), "device"),
    Api("cuCtxCreate_v2", D, (_hidden("pCtx", 0), _a("flags", K.UINT, 1),
                              _a("device", K.INT, 2)), (Out("ctx", K.HANDLE, 0),), "context"),
    Api("cuCtxCreate_v4", D, (_hidden("pCtx", 0), _a("params", K.PTR, 1),
                              _a("flags", K.UINT, 2), _a("device", K.INT, 3)),
        (Out("ctx", K.HANDLE, 0),), "context"),
    Api("cuCtxDestroy_v2", D, (_a("ctx", K.HANDLE, 0),), (), "context"),
    Api("cuCtxSynchronize", D, (), (), "sync"),
    Api("cuDevicePrimaryCtxRetain", D, (_hidden("pCtx", 0), _a("device", K.INT, 1)),
        (Out("ctx", K.HANDLE, 0),), "context"),
    Api("cuMemAlloc_v2", D, (_hidden("pPtr", 0), _a("size", K.SIZE, 1)),
        (Out("ptr", K.PTR, 0),), "memory", **_alloc(DEVICE)),
    Api("cuMemFree_v2", D, (_a("ptr", K.PTR, 0),), (), "memory", **_free(DEVICE)),
    Api("cuMemAllocAsync", D, (_hidden("pPtr", 0), _a("size", K.SIZE, 1),
                               _a("stream", K.HANDLE, 2)), (Out("ptr", K.PTR, 0),), "memory",
        ("cuMemAllocAsync_ptsz",), **_alloc(DEVICE, asynchronous=True)),
    Api("cuMemFreeAsync", D, (_a("ptr", K.PTR, 0), _a("stream", K.HANDLE, 1)), (), "memory",
        ("cuMemFreeAsync_ptsz",), **_free(DEVICE, asynchronous=True)),
    Api("cuMemAllocManaged", D, (_hidden("pPtr", 0), _a("size", K.SIZE, 1),
                                 _a("flags", K.UINT, 2)), (Out("ptr", K.PTR, 0),), "memory",
        **_alloc(DEVICE)),
    Api("cuMemAllocHost_v2", D, (_hidden("pHost", 0), _a("size", K.SIZE, 1)),
        (Out("ptr", K.PTR, 0),), "memory", **_alloc(HOST)),
    Api("cuMemFreeHost", D, (_a("ptr", K.PTR, 0),), (), "memory", **_free(HOST)),
    Api("cuMemAllocPitch_v2", D, (_hidden("pPtr", 0), _hidden("pPitch", 1),
                                  _a("width", K.SIZE, 2), _a("height", K.U64, 3),
                                  _a("elementSize", K.UINT, 4)),
        (Out("ptr", K.PTR, 0), Out("pitch", K.U64, 1)), "memory",
        **_alloc(DEVICE, size=("pitch", "height"))),
    Api("cuMemHostAlloc", D, (_hidden("pHost", 0), _a("size", K.SIZE, 1),
                              _a("flags", K.UINT, 2)), (Out("ptr", K.PTR, 0),), "memory",
        **_alloc(HOST)),
    Api("cuMemcpy", D, _MEMCPY, (), "memcpy", ("cuMemcpy_ptds",), **_copy(A.DEFAULT)),
    Api("cuMemcpyHtoD_v2", D, _MEMCPY, (), "memcpy", ("cuMemcpyHtoD_v2_ptds",),
        **_copy(A.HTOD)),
    Api("cuMemcpyDtoH_v2", D, _MEMCPY, (), "memcpy", ("cuMemcpyDtoH_v2_ptds",),
        **_copy(A.DTOH)),
    Api("cuMemcpyDtoD_v2", D, _MEMCPY, (), "memcpy", ("cuMemcpyDtoD_v2_ptds",),
        **_copy(A.DTOD)),
    Api("cuMemcpyAsync", D, _MEMCPY + (_a("stream", K.HANDLE, 3),), (), "memcpy",
        ("cuMemcpyAsync_ptsz",), **_copy(A.DEFAULT, asynchronous=True)),
    Api("cuMemcpyHtoDAsync_v2", D, _MEMCPY + (_a("stream", K.HANDLE, 3),), (), "memcpy",
        ("cuMemcpyHtoDAsync_v2_ptsz",), **_copy(A.HTOD, asynchronous=True)),
    Api("cuMemcpyDtoHAsync_v2", D, _MEMCPY + (_a("stream", K.HANDLE, 3),), (), "memcpy",
        ("cuMemcpyDtoHAsync_v2_ptsz",), **_copy(A.DTOH, asynchronous=True)),
    Api("cuMemcpyDtoDAsync_v2", D, _MEMCPY + (_a("stream", K.HANDLE, 3),), (), "memcpy",
        ("cuMemcpyDtoDAsync_v2_ptsz",), **_copy(A.DTOD, asynchronous=True)),
    Api("cuMemsetD8_v2", D, (_a("ptr", K.PTR, 0), _a("value", K.UINT, 1),
                             _a("count", K.U64, 2)), (), "memset", ("cuMemsetD8_v2_ptds",),
        **_memset(size="count")),
    Api("cuMemsetD32_v2", D, (_a("ptr", K.PTR, 0), _a("value", K.UINT, 1),
                              _a("count", K.U64, 2)), (), "memset", ("cuMemsetD32_v2_ptds",),
        **_memset(size="count", elem_size=4)),
    Api("cuMemsetD8Async", D, (_a("ptr", K.PTR, 0), _a("value", K.UINT, 1),
                               _a("count", K.U64, 2), _a("stream", K.HANDLE, 3)), (), "memset",
        ("cuMemsetD8Async_ptsz",), **_memset(asynchronous=True, size="count")),
    Api("cuMemsetD32Async", D, (_a("ptr", K.PTR, 0), _a("value", K.UINT, 1),
                                _a("count", K.U64, 2), _a("stream", K.HANDLE, 3)), (),
        "memset", ("cuMemsetD32Async_ptsz",),
        **_memset(asynchronous=True, size="count", elem_size=4)),
    Api("cuMemCreate", D, (_hidden("pHandle", 0), _a("size", K.SIZE, 1), _a("prop", K.PTR, 2),
                           _a("flags", K.U64, 3)), (Out("handle", K.HANDLE, 0),), "vmm",
        **_SIZED),
    Api("cuMemMap", D, (_a("ptr", K.PTR, 0), _a("size", K.SIZE, 1), _a("offset", K.U64, 2),
                        _a("handle", K.HANDLE, 3), _a("flags", K.U64, 4)), (), "vmm", **_SIZED),
    Api("cuMemUnmap", D, (_a("ptr", K.PTR, 0), _a("size", K.SIZE, 1)), (), "vmm", **_SIZED),
    Api("cuMemRelease", D, (_a("handle", K.HANDLE, 0),), (), "vmm"),
    Api("cuMemAddressReserve", D, (_hidden("pPtr", 0), _a("size", K.SIZE, 1),
                                   _a("alignment", K.U64, 2), _a("addr", K.PTR, 3),
                                   _a("flags", K.U64, 4)), (Out("ptr", K.PTR, 0),), "vmm",
        **_SIZED),
    Api("cuLaunchKernel", D, _cu_launch_args(), (), "launch", ("cuLaunchKernel_ptsz",),
        **_LAUNCH),
    Api("cuLaunchKernelEx", D, (_CONFIG, _a("func", K.HANDLE, 1), _hidden("params", 2)), (),
        "launch", ("cuLaunchKernelEx_ptsz",), **_LAUNCH),
    Api("cuLaunchCooperativeKernel", D, _cu_launch_args(), (), "launch",
        ("cuLaunchCooperativeKernel_ptsz",), **_LAUNCH),
    Api("cuGraphLaunch", D, (_a("graphExec", K.HANDLE, 0), _a("stream", K.HANDLE, 1)), (),
        "graph", ("cuGraphLaunch_ptsz",)),
    Api("cuStreamSynchronize", D, (_a("stream", K.HANDLE, 0),), (), "sync",
        ("cuStreamSynchronize_ptsz",)),
    Api("cuEventSynchronize", D, (_a("event", K.HANDLE, 0),), (), "sync"),
    Api("cuModuleLoadData", D, (_hidden("pModule", 0), _a("image", K.PTR, 1)),
        (Out("module", K.HANDLE, 0),), "module"),
    Api("cuModuleLoadDataEx", D, (_hidden("pModule", 0), _a("image", K.PTR, 1),
                                  _a("numOptions", K.UINT, 2)),
        (Out("module", K.HANDLE, 0),), "module"),
    Api("cuModuleGetFunction", D, (_hidden("pFunc", 0), _a("module", K.HANDLE, 1),
                                   _a("name", K.PTR, 2, show=False)),
        (Out("function", K.HANDLE, 0),), "module", learn_name=("function", "name")),
    Api("cuLibraryLoadData", D, (_hidden("pLibrary", 0), _a("code", K.PTR, 1)),
        (Out("library", K.HANDLE, 0),), "module"),
    Api("cuLibraryGetKernel", D, (_hidden("pKernel", 0), _a("library", K.HANDLE, 1),
                                  _a("name", K.PTR, 2, show=False)),
        (Out("kernel", K.HANDLE, 0),), "module", learn_name=("kernel", "name")),
    Api("cuKernelGetFunction", D, (_hidden("pFunc", 0), _a("kernel", K.HANDLE, 1)),
        (Out("function", K.HANDLE, 0),), "module", learn_alias=("function", "kernel")),
    Api("cuFuncGetName", D, (_hidden("pName", 0), _a("function", K.HANDLE, 1)),
        (Out("name_ptr", K.PTR, 0),), "module", learn_name=("function", "name_ptr")),
)

# The seed tool's eleven functions: `--functions` with these reproduces it exactly.
SEED_FUNCTIONS = tuple(api.name for api in TABLE[:11])

BY_NAME: Dict[str, Api] = {api.name: api for api in TABLE}
FN_ID: Dict[str, int] = {api.name: i for i, api in enumerate(TABLE)}


def select(patterns: Optional[Iterable[str]] = None, library: Optional[str] = None,
           everything: bool = False) -> List[Api]:
    """Rows whose name matches any glob pattern, optionally of one library ("runtime",
    "driver"; None or "all" for both). Without patterns: the default set (rows marked
    default), or every row with `everything`. Raises KeyError naming a pattern that matches
    nothing."""
    import fnmatch

    rows = [api for api in TABLE if library in (None, "all", api.library)]
    if not patterns:
        return [api for api in rows if everything or api.default]
    chosen = []
    for pattern in patterns:
        matched = [api for api in rows if fnmatch.fnmatchcase(api.name, pattern)]
        if not matched:
            raise KeyError(pattern)
        chosen.extend(api for api in matched if api not in chosen)
    return [api for api in TABLE if api in chosen]


def driver_replaces(api: Api) -> bool:
    """A runtime launch function: the default set leaves it out when the driver's launch
    functions are probed (the driver sees every launch and names it)."""
    return api.library == RUNTIME and api.role == Role.LAUNCH


def arg_cells(api: Api) -> List[Tuple[Arg, int]]:
    """Each argument with the index of its first record cell, in order."""
    cells, cell = [], 0
    for arg in api.args:
        cells.append((arg, cell))
        cell += arg.cells
    return cells
