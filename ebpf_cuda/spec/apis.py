"""The one table of traced functions.

One row per CUDA (or NCCL) function: where its arguments are at entry (ABI integer slot: 0-5 are
registers, 6 and up are stack slots), what they are, which out-parameters to read at return,
and how to show them. The probe generator (probes.py) and the decoder (events.py) are both
driven by these rows: adding a function is adding a row.
"""
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

RUNTIME = "runtime"  # libcudart.so, or an executable that links cudart statically
DRIVER = "driver"  # libcuda.so.1
NCCL = "nccl"  # libnccl.so.2 (collectives), or an executable that links it statically
LIBRARIES = (RUNTIME, DRIVER, NCCL)  # the library kinds, as --api names them


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
    # The caller's return address, read at entry from the stack pointer (not an ABI slot).
    CALLER = "caller"
    NCCL_COMM = "nccl_comm"  # ncclComm_t: 0x...; its calls show the communicator (nccl.py)
    NCCL_DATATYPE = "nccl_datatype"  # ncclDataType_t, shown by name (ncclFloat32)
    NCCL_REDOP = "nccl_redop"  # ncclRedOp_t, shown by name (ncclSum)
    # ncclUniqueId (128 bytes, passed by value): its first UNIQUE_ID_CELLS cells, which hold
    # all NCCL puts there (its bootstrap handle: magic, root address, nranks; 40 bytes),
    # shown as a hash: the same on every rank of a communicator.
    UNIQUE_ID = "unique_id"
    # CUDA graph node parameters read through a pointer (graphs.py builds graphs from them):
    # cudaKernelNodeParams / CUDA_KERNEL_NODE_PARAMS (40 bytes: func, six u32 dimensions,
    # shared memory) decodes to func/grid/block/smem; cudaMemsetParams /
    # CUDA_MEMSET_NODE_PARAMS (40 bytes) to ptr/value/size; a cudaExtent (24 bytes: width,
    # height, depth) to size; a CUmemorytype (4 bytes) by name (Host, Device, ...).
    KERNEL_NODE = "kernel_node"
    MEMSET_NODE = "memset_node"
    EXTENT = "extent"
    MEMORY_TYPE = "memory_type"
    NODES = "nodes"  # what a graph launch ran (graphs.py adds it; never in the cells)


UNIQUE_ID_CELLS = 8


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
    # CUDA graphs (graphs.py): streams capture into graphs, nodes are added, graphs are
    # instantiated into execs (snapshots), execs are updated and launched. Fields by name:
    # `stream`, `graph` (out `graph` of a new one), out `node`, `graphExec`, `event`.
    CAPTURE_BEGIN = "capture-begin"  # `stream` starts capturing (into `graph` when given)
    CAPTURE_END = "capture-end"  # `stream`'s capture ends in out `graph`
    GRAPH_CREATE = "graph-create"  # out `graph`, empty
    KERNEL_NODE = "kernel-node"  # adds to `graph` a node launching func, grid, block, smem
    COPY_NODE = "copy-node"  # a copy of `size` bytes: `kind`, or src/dstMemoryType
    MEMSET_NODE = "memset-node"  # a memset of `size` bytes
    CHILD_NODE = "child-node"  # runs `childGraph` (a copy of it as it is now)
    EMPTY_NODE = "empty-node"  # runs nothing (empty, event record and event wait nodes)
    INSTANTIATE = "instantiate"  # out `graphExec`: a snapshot of `graph`
    EXEC_UPDATE = "exec-update"  # `graphExec` takes the parameters of `graph`'s nodes
    EXEC_KERNEL_UPDATE = "exec-kernel-update"  # `graphExec`'s kernel node `node` changes
    GRAPH_DESTROY = "graph-destroy"  # `graph`
    EXEC_DESTROY = "exec-destroy"  # `graphExec`
    GRAPH_LAUNCH = "graph-launch"  # runs `graphExec` on `stream`
    EVENT_RECORD = "event-record"  # `event` recorded on `stream` (captures join by events)
    STREAM_WAIT = "stream-wait"  # `stream` waits for `event`


# What a stream capture records instead of running (graphs.py follows them, and the
# in-kernel aggregates gate them on the capture state: probes/aggregates.capture_role).
CAPTURED_ROLES = frozenset((Role.LAUNCH, Role.COPY, Role.MEMSET, Role.EVENT_RECORD,
                            Role.STREAM_WAIT))


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
    deref_at: int = 0  # ... starting this many bytes into what it points to (a struct member)

    @property
    def cells(self) -> int:
        if self.deref:
            return (self.deref + 7) // 8
        if self.kind == Kind.UNIQUE_ID:
            return UNIQUE_ID_CELLS
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
    # NCCL: the argument holding the element count; with the `datatype` argument it gives
    # the call's `bytes` (count x the datatype's size).
    count: Optional[str] = None

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
        aggregates), and those that read a name wake the reader at once, while the process
        still lives (Session.probe_options)."""
        return self.category == "module"

    @property
    def captures_stack(self) -> bool:
        """With --stacks its records carry the caller's user stack (shown by --leaks)."""
        return self.category == "memory"


def _a(name: str, kind: str, slot: int, show: bool = True) -> Arg:
    return Arg(name, kind, slot, show)


def _hidden(name: str, slot: int) -> Arg:
    return Arg(name, Kind.PTR, slot, show=False)


R, D, N = RUNTIME, DRIVER, NCCL
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
    """cudaLaunchKernel-style arguments: func, grid, block, args, sharedMem, stream; and the
    caller (nvcc's `__device_stub__KERNEL`, which names a launch whose cudaKernel_t was
    made before the trace began)."""
    return (_a("func", K.PTR, 0), _a("grid", K.DIM3, 1), _a("block", K.DIM3, 3),
            _hidden("args", 5), _a("smem", K.U64, first_stack), _a("stream", K.HANDLE, 7),
            _CALLER)


def _cu_launch_args() -> Tuple[Arg, ...]:
    """cuLaunchKernel: f, grid x/y/z, block x/y (registers), block z, smem, stream (stack)."""
    return (_a("func", K.HANDLE, 0), _a("gridX", K.UINT, 1), _a("gridY", K.UINT, 2),
            _a("gridZ", K.UINT, 3), _a("blockX", K.UINT, 4), _a("blockY", K.UINT, 5),
            _a("blockZ", K.UINT, 6), _a("smem", K.UINT, 7), _a("stream", K.HANDLE, 8))


def _in_order(*named) -> Tuple[Arg, ...]:
    """Arguments in ABI slots 0, 1, 2, ... from (name, kind) pairs (or tuples of pairs)."""
    pairs = [p for item in named for p in (item if isinstance(item[0], tuple) else (item,))]
    return tuple(_a(name, kind, slot) for slot, (name, kind) in enumerate(pairs))


_BUFFERS = (("sendbuff", K.PTR), ("recvbuff", K.PTR))  # NCCL collectives' first two
_DATATYPE = ("datatype", K.NCCL_DATATYPE)
_OP = ("op", K.NCCL_REDOP)
_COMM = ("comm", K.NCCL_COMM)
_STREAM = ("stream", K.HANDLE)
_CONFIG = Arg("config", K.LAUNCH_CONFIG, 0, deref=40)
# The return address at entry (read from the stack pointer): the code that made the call.
_CALLER = Arg("caller", K.CALLER, -1, show=False)


def _node_args(*rest: Arg) -> Tuple[Arg, ...]:
    """cudaGraphAdd*Node and cuGraphAdd*Node: the new node (out), its graph, its
    dependencies (not read: nodes are kept in the order added, a topological one) and their
    count, then `rest` (from slot 4)."""
    return (_hidden("pGraphNode", 0), _a("graph", K.HANDLE, 1),
            _a("numDependencies", K.U64, 3)) + rest


_NODE = (Out("node", K.HANDLE, 0),)
_KERNEL_PARAMS = Arg("params", K.KERNEL_NODE, 4, deref=40)  # func .. sharedMemBytes
_MEMSET_PARAMS = Arg("params", K.MEMSET_NODE, 4, deref=40)  # dst .. height
_EXEC = (Out("graphExec", K.HANDLE, 0),)
_CAPTURE_TO_GRAPH = (_a("stream", K.HANDLE, 0), _a("graph", K.HANDLE, 1),
                     _a("numDependencies", K.U64, 4), _a("mode", K.INT, 5))
_CAPTURE_MODE = (Arg("mode", K.INT, 0, deref=4),)  # in and out: the previous mode at return
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
    # The thread's current context (each event's device: devices.py).
    Api("cuCtxSetCurrent", D, (_a("ctx", K.HANDLE, 0),), (), "context"),
    Api("cuCtxPushCurrent_v2", D, (_a("ctx", K.HANDLE, 0),), (), "context"),
    Api("cuCtxPopCurrent_v2", D, (_hidden("pCtx", 0),), (Out("ctx", K.HANDLE, 0),), "context"),
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
        "graph", ("cuGraphLaunch_ptsz",), role=Role.GRAPH_LAUNCH),
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
    # NCCL (libnccl.so.2, nccl.h of 2.32). The ncclUniqueId of ncclCommInitRank(Config) is
    # passed by value: 128 bytes in memory, so on the stack (its first 64 read), taking no
    # register: `rank`, after it, is in the third. Each *Config collective (2.32) takes the
    # arguments of its plain form plus a config, so it is traced as that row. ncclBcast is
    # not a row: it calls ncclBroadcast, which is traced. What the communicator calls make
    # (rank, size and id of a communicator; sequence numbers): nccl.py.
    Api("ncclGetUniqueId", N, (_hidden("uniqueId", 0),), (), "communicator"),
    Api("ncclCommInitRank", N, (_a("nranks", K.INT, 1), _a("commId", K.UNIQUE_ID, 6),
                                _a("rank", K.INT, 2)), (Out("comm", K.NCCL_COMM, 0),),
        "communicator"),
    Api("ncclCommInitRankConfig", N, (_a("nranks", K.INT, 1), _a("commId", K.UNIQUE_ID, 6),
                                      _a("rank", K.INT, 2)), (Out("comm", K.NCCL_COMM, 0),),
        "communicator"),
    Api("ncclCommInitRankScalable", N, (_a("nranks", K.INT, 1), _a("rank", K.INT, 2),
                                        Arg("commId", K.UNIQUE_ID, 4, deref=64)),
        (Out("comm", K.NCCL_COMM, 0),), "communicator"),
    Api("ncclCommInitAll", N, (_hidden("comms", 0), _a("ndev", K.INT, 1),
                               _a("devlist", K.PTR, 2)), (Out("comm", K.NCCL_COMM, 0),),
        "communicator"),
    Api("ncclCommSplit", N, (_a("comm", K.NCCL_COMM, 0), _a("color", K.INT, 1),
                             _a("key", K.INT, 2), _hidden("pNewcomm", 3), _a("config", K.PTR, 4)),
        (Out("newcomm", K.NCCL_COMM, 3),), "communicator"),
    Api("ncclCommFinalize", N, (_a("comm", K.NCCL_COMM, 0),), (), "communicator"),
    Api("ncclCommDestroy", N, (_a("comm", K.NCCL_COMM, 0),), (), "communicator"),
    Api("ncclCommAbort", N, (_a("comm", K.NCCL_COMM, 0),), (), "communicator"),
    Api("ncclCommCount", N, (_a("comm", K.NCCL_COMM, 0), _hidden("pCount", 1)),
        (Out("count", K.INT, 1, size=4),), "communicator"),
    Api("ncclCommUserRank", N, (_a("comm", K.NCCL_COMM, 0), _hidden("pRank", 1)),
        (Out("rank", K.INT, 1, size=4),), "communicator"),
    Api("ncclCommCuDevice", N, (_a("comm", K.NCCL_COMM, 0), _hidden("pDevice", 1)),
        (Out("device", K.INT, 1, size=4),), "communicator"),
    Api("ncclAllReduce", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, _OP, _COMM,
                                      _STREAM), (), "collective", ("ncclAllReduceConfig",),
        count="count"),
    Api("ncclBroadcast", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, ("root", K.INT),
                                      _COMM, _STREAM), (), "collective",
        ("ncclBroadcastConfig",), count="count"),
    Api("ncclReduce", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, _OP,
                                   ("root", K.INT), _COMM, _STREAM), (), "collective",
        ("ncclReduceConfig",), count="count"),
    Api("ncclAllGather", N, _in_order(_BUFFERS, ("sendcount", K.U64), _DATATYPE, _COMM,
                                      _STREAM), (), "collective", ("ncclAllGatherConfig",),
        count="sendcount"),
    Api("ncclReduceScatter", N, _in_order(_BUFFERS, ("recvcount", K.U64), _DATATYPE, _OP,
                                          _COMM, _STREAM), (), "collective",
        ("ncclReduceScatterConfig",), count="recvcount"),
    # ncclAlltoAll, ncclGather, ncclScatter: NCCL 2.28 and later.
    Api("ncclAlltoAll", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, _COMM, _STREAM),
        (), "collective", ("ncclAlltoAllConfig",), count="count"),
    Api("ncclGather", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, ("root", K.INT),
                                   _COMM, _STREAM), (), "collective", ("ncclGatherConfig",),
        count="count"),
    Api("ncclScatter", N, _in_order(_BUFFERS, ("count", K.U64), _DATATYPE, ("root", K.INT),
                                    _COMM, _STREAM), (), "collective", ("ncclScatterConfig",),
        count="count"),
    Api("ncclSend", N, _in_order(("sendbuff", K.PTR), ("count", K.U64), _DATATYPE,
                                 ("peer", K.INT), _COMM, _STREAM), (), "p2p", count="count"),
    Api("ncclRecv", N, _in_order(("recvbuff", K.PTR), ("count", K.U64), _DATATYPE,
                                 ("peer", K.INT), _COMM, _STREAM), (), "p2p", count="count"),
    Api("ncclGroupStart", N, (), (), "group"),
    Api("ncclGroupEnd", N, (), (), "group"),
    # CUDA graphs (graphs.py), after the rest so that earlier rows keep their ids. The
    # runtime's rows (libcudart 12 and 13 export them all)...
    Api("cudaStreamBeginCaptureToGraph", R, _CAPTURE_TO_GRAPH, (), "graph",
        ("cudaStreamBeginCaptureToGraph_ptsz",), role=Role.CAPTURE_BEGIN),
    Api("cudaThreadExchangeStreamCaptureMode", R, _CAPTURE_MODE,
        (Out("previous", K.INT, 0, size=4),), "graph"),
    Api("cudaGraphCreate", R, (_hidden("pGraph", 0), _a("flags", K.UINT, 1)),
        (Out("graph", K.HANDLE, 0),), "graph", role=Role.GRAPH_CREATE),
    Api("cudaGraphAddKernelNode", R, _node_args(_KERNEL_PARAMS), _NODE, "graph",
        role=Role.KERNEL_NODE),
    # cudaMemcpy3DParms: extent at 128 (width in bytes for linear memory), kind at 152.
    Api("cudaGraphAddMemcpyNode", R, _node_args(
        Arg("extent", K.EXTENT, 4, deref=24, deref_at=128),
        Arg("kind", K.MEMCPY_KIND, 4, deref=4, deref_at=152)), _NODE, "graph",
        role=Role.COPY_NODE),
    Api("cudaGraphAddMemcpyNode1D", R, _node_args(
        _a("dst", K.PTR, 4), _a("src", K.PTR, 5), _a("size", K.SIZE, 6),
        _a("kind", K.MEMCPY_KIND, 7)), _NODE, "graph", role=Role.COPY_NODE),
    Api("cudaGraphAddMemcpyNodeToSymbol", R, _node_args(
        _a("symbol", K.PTR, 4), _a("src", K.PTR, 5), _a("size", K.SIZE, 6),
        _a("offset", K.U64, 7), _a("kind", K.MEMCPY_KIND, 8)), _NODE, "graph",
        role=Role.COPY_NODE),
    Api("cudaGraphAddMemcpyNodeFromSymbol", R, _node_args(
        _a("dst", K.PTR, 4), _a("symbol", K.PTR, 5), _a("size", K.SIZE, 6),
        _a("offset", K.U64, 7), _a("kind", K.MEMCPY_KIND, 8)), _NODE, "graph",
        role=Role.COPY_NODE),
    Api("cudaGraphAddMemsetNode", R, _node_args(_MEMSET_PARAMS), _NODE, "graph",
        role=Role.MEMSET_NODE),
    Api("cudaGraphAddChildGraphNode", R, _node_args(_a("childGraph", K.HANDLE, 4)), _NODE,
        "graph", role=Role.CHILD_NODE),
    Api("cudaGraphAddEmptyNode", R, _node_args(), _NODE, "graph", role=Role.EMPTY_NODE),
    Api("cudaGraphAddEventRecordNode", R, _node_args(_a("event", K.HANDLE, 4)), _NODE,
        "graph", role=Role.EMPTY_NODE),
    Api("cudaGraphAddEventWaitNode", R, _node_args(_a("event", K.HANDLE, 4)), _NODE,
        "graph", role=Role.EMPTY_NODE),
    Api("cudaGraphInstantiateWithFlags", R, (_hidden("pGraphExec", 0),
                                             _a("graph", K.HANDLE, 1), _a("flags", K.U64, 2)),
        _EXEC, "graph", role=Role.INSTANTIATE),
    Api("cudaGraphInstantiateWithParams", R, (_hidden("pGraphExec", 0),
                                              _a("graph", K.HANDLE, 1), _a("params", K.PTR, 2)),
        _EXEC, "graph", ("cudaGraphInstantiateWithParams_ptsz",), role=Role.INSTANTIATE),
    Api("cudaGraphExecKernelNodeSetParams", R, (_a("graphExec", K.HANDLE, 0),
                                                _a("node", K.HANDLE, 1),
                                                Arg("params", K.KERNEL_NODE, 2, deref=40)),
        (), "graph", role=Role.EXEC_KERNEL_UPDATE),
    Api("cudaGraphExecUpdate", R, (_a("graphExec", K.HANDLE, 0), _a("graph", K.HANDLE, 1)),
        (), "graph", role=Role.EXEC_UPDATE),
    Api("cudaGraphDestroy", R, (_a("graph", K.HANDLE, 0),), (), "graph",
        role=Role.GRAPH_DESTROY),
    Api("cudaGraphExecDestroy", R, (_a("graphExec", K.HANDLE, 0),), (), "graph",
        role=Role.EXEC_DESTROY),
    # ... and the driver's (the names cuda.h maps to in CUDA 12 and 13).
    Api("cuStreamBeginCapture_v2", D, (_a("stream", K.HANDLE, 0), _a("mode", K.INT, 1)), (),
        "graph", ("cuStreamBeginCapture_v2_ptsz",), role=Role.CAPTURE_BEGIN),
    Api("cuStreamBeginCaptureToGraph", D, _CAPTURE_TO_GRAPH, (), "graph",
        ("cuStreamBeginCaptureToGraph_ptsz",), role=Role.CAPTURE_BEGIN),
    Api("cuStreamEndCapture", D, (_a("stream", K.HANDLE, 0), _hidden("phGraph", 1)),
        (Out("graph", K.HANDLE, 1),), "graph", ("cuStreamEndCapture_ptsz",),
        role=Role.CAPTURE_END),
    Api("cuThreadExchangeStreamCaptureMode", D, _CAPTURE_MODE,
        (Out("previous", K.INT, 0, size=4),), "graph"),
    Api("cuGraphCreate", D, (_hidden("phGraph", 0), _a("flags", K.UINT, 1)),
        (Out("graph", K.HANDLE, 0),), "graph", role=Role.GRAPH_CREATE),
    Api("cuGraphAddKernelNode_v2", D, _node_args(_KERNEL_PARAMS), _NODE, "graph",
        role=Role.KERNEL_NODE),
    # CUDA_MEMCPY3D: srcMemoryType at 32, dstMemoryType at 120, WidthInBytes/Height/Depth
    # at 176.
    Api("cuGraphAddMemcpyNode", D, _node_args(
        Arg("srcMemoryType", K.MEMORY_TYPE, 4, deref=4, deref_at=32),
        Arg("dstMemoryType", K.MEMORY_TYPE, 4, deref=4, deref_at=120),
        Arg("extent", K.EXTENT, 4, deref=24, deref_at=176)), _NODE, "graph",
        role=Role.COPY_NODE),
    Api("cuGraphAddMemsetNode", D, _node_args(_MEMSET_PARAMS), _NODE, "graph",
        role=Role.MEMSET_NODE),
    Api("cuGraphAddChildGraphNode", D, _node_args(_a("childGraph", K.HANDLE, 4)), _NODE,
        "graph", role=Role.CHILD_NODE),
    Api("cuGraphAddEmptyNode", D, _node_args(), _NODE, "graph", role=Role.EMPTY_NODE),
    Api("cuGraphAddEventRecordNode", D, _node_args(_a("event", K.HANDLE, 4)), _NODE,
        "graph", role=Role.EMPTY_NODE),
    Api("cuGraphAddEventWaitNode", D, _node_args(_a("event", K.HANDLE, 4)), _NODE,
        "graph", role=Role.EMPTY_NODE),
    Api("cuGraphInstantiateWithFlags", D, (_hidden("phGraphExec", 0),
                                           _a("graph", K.HANDLE, 1), _a("flags", K.U64, 2)),
        _EXEC, "graph", role=Role.INSTANTIATE),
    # (CUDA 11's form: its error node, log buffer and size are not read)
    Api("cuGraphInstantiate_v2", D, (_hidden("phGraphExec", 0), _a("graph", K.HANDLE, 1)),
        _EXEC, "graph", role=Role.INSTANTIATE),
    Api("cuGraphInstantiateWithParams", D, (_hidden("phGraphExec", 0),
                                            _a("graph", K.HANDLE, 1), _a("params", K.PTR, 2)),
        _EXEC, "graph", ("cuGraphInstantiateWithParams_ptsz",), role=Role.INSTANTIATE),
    Api("cuGraphExecKernelNodeSetParams_v2", D, (_a("graphExec", K.HANDLE, 0),
                                                 _a("node", K.HANDLE, 1),
                                                 Arg("params", K.KERNEL_NODE, 2, deref=40)),
        (), "graph", role=Role.EXEC_KERNEL_UPDATE),
    Api("cuGraphExecUpdate_v2", D, (_a("graphExec", K.HANDLE, 0), _a("graph", K.HANDLE, 1)),
        (), "graph", role=Role.EXEC_UPDATE),
    Api("cuGraphDestroy", D, (_a("graph", K.HANDLE, 0),), (), "graph",
        role=Role.GRAPH_DESTROY),
    Api("cuGraphExecDestroy", D, (_a("graphExec", K.HANDLE, 0),), (), "graph",
        role=Role.EXEC_DESTROY),
)

# The seed tool's eleven functions: `--functions` with these reproduces it exactly.
SEED_FUNCTIONS = tuple(api.name for api in TABLE[:11])

BY_NAME: Dict[str, Api] = {api.name: api for api in TABLE}
FN_ID: Dict[str, int] = {api.name: i for i, api in enumerate(TABLE)}


def select(patterns: Optional[Iterable[str]] = None, library: Optional[str] = None,
           everything: bool = False) -> List[Api]:
    """Rows whose name matches any glob pattern, optionally of one library ("runtime",
    "driver", "nccl"; None or "all" for every one). Without patterns: the default set (rows marked
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
