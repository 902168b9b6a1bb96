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

    @property
    def symbols(self) -> Tuple[str, ...]:
        return (self.name,) + self.aliases

    @property
    def driver(self) -> bool:
        return self.library == DRIVER


def _a(name: str, kind: str, slot: int, show: bool = True) -> Arg:
    return Arg(name, kind, slot, show)


def _hidden(name: str, slot: int) -> Arg:
    return Arg(name, Kind.PTR, slot, show=False)


R, D = RUNTIME, DRIVER
K = Kind


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
        (Out("ptr", K.PTR, 0),), "memory"),
    Api("cudaFree", R, (_a("ptr", K.PTR, 0),), (), "memory"),
    Api("cudaMemcpy", R, _MEMCPY + (_a("kind", K.MEMCPY_KIND, 3),), (), "memcpy",
        ("cudaMemcpy_ptds",)),
    Api("cudaLaunchKernel", R, _launch_args(6), (), "launch", ("cudaLaunchKernel_ptsz",)),
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
                                 _a("flags", K.UINT, 2)), (Out("ptr", K.PTR, 0),), "memory"),
    Api("cudaMallocHost", R, (_hidden("pHost", 0), _a("size", K.SIZE, 1)),
        (Out("ptr", K.PTR, 0),), "memory"),
    Api("cudaHostAlloc", R, (_hidden("pHost", 0), _a("size", K.SIZE, 1), _a("flags", K.UINT, 2)),
        (Out("ptr", K.PTR, 0),), "memory"),
    Api("cudaFreeHost", R, (_a("ptr", K.PTR, 0),), (), "memory"),
    Api("cudaMallocAsync", R, (_hidden("devPtr", 0), _a("size", K.SIZE, 1),
                               _a("stream", K.HANDLE, 2)), (Out("ptr", K.PTR, 0),), "memory",
        ("cudaMallocAsync_ptsz",)),
    Api("cudaFreeAsync", R, (_a("ptr", K.PTR, 0), _a("stream", K.HANDLE, 1)), (), "memory",
        ("cudaFreeAsync_ptsz",)),
    Api("cudaMallocPitch", R, (_hidden("devPtr", 0), _hidden("pPitch", 1),
                               _a("width", K.SIZE, 2), _a("height", K.U64, 3)),
        (Out("ptr", K.PTR, 0), Out("pitch", K.U64, 1)), "memory"),
    Api("cudaMemcpyAsync", R, _MEMCPY + (_a("kind", K.MEMCPY_KIND, 3),
                                         _a("stream", K.HANDLE, 4)), (), "memcpy",
        ("cudaMemcpyAsync_ptsz",)),
    Api("cudaMemcpy2D", R, (_a("dst", K.PTR, 0), _a("dpitch", K.U64, 1), _a("src", K.PTR, 2),
                            _a("spitch", K.U64, 3), _a("width", K.SIZE, 4),
                            _a("height", K.U64, 5), _a("kind", K.MEMCPY_KIND, 6)), (),
        "memcpy", ("cudaMemcpy2D_ptds",)),
    Api("cudaMemcpy2DAsync", R, (_a("dst", K.PTR, 0), _a("dpitch", K.U64, 1),
                                 _a("src", K.PTR, 2), _a("spitch", K.U64, 3),
                                 _a("width", K.SIZE, 4), _a("height", K.U64, 5),
                                 _a("kind", K.MEMCPY_KIND, 6), _a("stream", K.HANDLE, 7)), (),
        "memcpy", ("cudaMemcpy2DAsync_ptsz",)),
    Api("cudaMemcpyPeer", R, (_a("dst", K.PTR, 0), _a("dstDevice", K.INT, 1),
                              _a("src", K.PTR, 2), _a("srcDevice", K.INT, 3),
                              _a("size", K.SIZE, 4)), (), "memcpy"),
    Api("cudaMemset", R, (_a("ptr", K.PTR, 0), _a("value", K.INT, 1), _a("size", K.SIZE, 2)),
        (), "memset", ("cudaMemset_ptds",)),
    Api("cudaMemsetAsync", R, (_a("ptr", K.PTR, 0), _a("value", K.INT, 1),
                               _a("size", K.SIZE, 2), _a("stream", K.HANDLE, 3)), (), "memset",
        ("cudaMemsetAsync_ptsz",)),
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
        "launch", ("cudaLaunchKernelExC_ptsz",)),
    Api("cudaLaunchCooperativeKernel", R, _launch_args(6), (), "launch",
        ("cudaLaunchCooperativeKernel_ptsz",)),
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
        (Out("ptr", K.PTR, 0),), "memory"),
    Api("cuMemFree_v2", D, (_a("ptr", K.PTR, 0),), (), "memory"),
    Api("cuMemAllocAsync", D, (_hidden("pPtr", 0), _a("size", K.SIZE, 1),
                               _a("stream", K.HANDLE, 2)), (Out("ptr", K.PTR, 0),), "memory",
        ("cuMemAllocAsync_ptsz",)),
    Api("cuMemFreeAsync", D, (_a("ptr", K.PTR, 0), _a("stream", K.HANDLE, 1)), (), "memory",
        ("cuMemFreeAsync_ptsz",)),
    Api("cuMemAllocManaged", D, (_hidden("pPtr", 0), _a("size", K.SIZE, 1),
                                 _a("flags", K.UINT, 2)), (Out("ptr", K.PTR, 0),), "memory"),
    Api("cuMemAllocHost_v2", D, (_hidden("pHost", 0), _a("size", K.SIZE, 1)),
        (Out("ptr", K.PTR, 0),), "memory"),
    Api("cuMemFreeHost", D, (_a("ptr", K.PTR, 0),), (), "memory"),
    Api("cuMemAllocPitch_v2", D, (_hidden("pPtr", 0), _hidden("pPitch", 1),
                                  _a("width", K.SIZE, 2), _a("height", K.U64, 3),
                                  _a("elementSize", K.UINT, 4)),
        (Out("ptr", K.PTR, 0), Out("pitch", K.U64, 1)), "memory"),
    Api("cuMemHostAlloc", D, (_hidden("pHost", 0), _a("size", K.SIZE, 1),
                              _a("flags", K.UINT, 2)), (Out("ptr", K.PTR, 0),), "memory"),
    Api("cuMemcpy", D, _MEMCPY, (), "memcpy", ("cuMemcpy_ptds",)),
    Api("cuMemcpyHtoD_v2", D, _MEMCPY, (), "memcpy", ("cuMemcpyHtoD_v2_ptds",)),
    Api("cuMemcpyDtoH_v2", D, _MEMCPY, (), "memcpy", ("cuMemcpyDtoH_v2_ptds",)),
    Api("cuMemcpyDtoD_v2", D, _MEMCPY, (), "memcpy", ("cuMemcpyDtoD_v2_ptds",)),
    Api("cuMemcpyAsync", D, _MEMCPY + (_a("stream", K.HANDLE, 3),), (), "memcpy",
        ("cuMemcpyAsync_ptsz",)),
    Api("cuMemcpyHtoDAsync_v2", D, _MEMCPY + (_a("stream", K.HANDLE, 3),), (), "memcpy",
        ("cuMemcpyHtoDAsync_v2_ptsz",)),
    Api("cuMemcpyDtoHAsync_v2", D, _MEMCPY + (_a("stream", K.HANDLE, 3),), (), "memcpy",
        ("cuMemcpyDtoHAsync_v2_ptsz",)),
    Api("cuMemcpyDtoDAsync_v2", D, _MEMCPY + (_a("stream", K.HANDLE, 3),), (), "memcpy",
        ("cuMemcpyDtoDAsync_v2_ptsz",)),
    Api("cuMemsetD8_v2", D, (_a("ptr", K.PTR, 0), _a("value", K.UINT, 1),
                             _a("count", K.U64, 2)), (), "memset", ("cuMemsetD8_v2_ptds",)),
    Api("cuMemsetD32_v2", D, (_a("ptr", K.PTR, 0), _a("value", K.UINT, 1),
                              _a("count", K.U64, 2)), (), "memset", ("cuMemsetD32_v2_ptds",)),
    Api("cuMemsetD8Async", D, (_a("ptr", K.PTR, 0), _a("value", K.UINT, 1),
                               _a("count", K.U64, 2), _a("stream", K.HANDLE, 3)), (), "memset",
        ("cuMemsetD8Async_ptsz",)),
    Api("cuMemsetD32Async", D, (_a("ptr", K.PTR, 0), _a("value", K.UINT, 1),
                                _a("count", K.U64, 2), _a("stream", K.HANDLE, 3)), (),
        "memset", ("cuMemsetD32Async_ptsz",)),
    Api("cuMemCreate", D, (_hidden("pHandle", 0), _a("size", K.SIZE, 1), _a("prop", K.PTR, 2),
                           _a("flags", K.U64, 3)), (Out("handle", K.HANDLE, 0),), "vmm"),
    Api("cuMemMap", D, (_a("ptr", K.PTR, 0), _a("size", K.SIZE, 1), _a("offset", K.U64, 2),
                        _a("handle", K.HANDLE, 3), _a("flags", K.U64, 4)), (), "vmm"),
    Api("cuMemUnmap", D, (_a("ptr", K.PTR, 0), _a("size", K.SIZE, 1)), (), "vmm"),
    Api("cuMemRelease", D, (_a("handle", K.HANDLE, 0),), (), "vmm"),
    Api("cuMemAddressReserve", D, (_hidden("pPtr", 0), _a("size", K.SIZE, 1),
                                   _a("alignment", K.U64, 2), _a("addr", K.PTR, 3),
                                   _a("flags", K.U64, 4)), (Out("ptr", K.PTR, 0),), "vmm"),
    Api("cuLaunchKernel", D, _cu_launch_args(), (), "launch", ("cuLaunchKernel_ptsz",)),
    Api("cuLaunchKernelEx", D, (_CONFIG, _a("func", K.HANDLE, 1), _hidden("params", 2)), (),
        "launch", ("cuLaunchKernelEx_ptsz",)),
    Api("cuLaunchCooperativeKernel", D, _cu_launch_args(), (), "launch",
        ("cuLaunchCooperativeKernel_ptsz",)),
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
    return api.library == RUNTIME and api.category == "launch"


def arg_cells(api: Api) -> List[Tuple[Arg, int]]:
    """Each argument with the index of its first record cell, in order."""
    cells, cell = [], 0
    for arg in api.args:
        cells.append((arg, cell))
        cell += arg.cells
    return cells
