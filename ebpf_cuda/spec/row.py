"""What one row of the function table is (`Api`, its `Arg`s and `Out`s) and the vocabularies
its fields use: the libraries, `Kind` (how a value is decoded and shown), `Role` (what a call
does, for the analyses) and `Direction` (where a copy goes).

The rows themselves are in the rows_*.py modules; `apis.py` assembles them into the one
table and re-exports every name here.
"""
from typing import NamedTuple, Optional, Tuple

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
    # Host memory at argument `ptr`, `size` bytes, page-locked for the GPU (or no more).
    HOST_REGISTER = "host-register"
    HOST_UNREGISTER = "host-unregister"


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


# With --stacks, the rows whose records carry the caller's user stack (Api.captures_stack):
# memory calls (--leaks), and the copies, memsets, synchronising calls, stream captures and
# graph launches the analysis's rules name (their native callers). Other rows cost nothing more.
STACK_CATEGORIES = ("memory", "memcpy", "memset", "sync")
STACK_ROLES = (Role.CAPTURE_BEGIN, Role.CAPTURE_END, Role.GRAPH_LAUNCH, Role.HOST_REGISTER)


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
        """With --stacks its records carry the caller's user stack: the memory calls (shown
        by --leaks) and the calls the analysis's rules name (each finding's native caller)."""
        return self.category in STACK_CATEGORIES or self.role in STACK_ROLES
