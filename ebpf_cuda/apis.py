"""The one table of traced functions.

One row per CUDA function: where its arguments are at entry (ABI integer slot: 0-5 are
registers, 6 and up are stack slots), what they are, which out-parameters to read at return,
and how to show them. The probe generator (probes.py) and the decoder (events.py) are both
driven by these rows: adding a function is adding a row.
"""
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

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


@dataclass(frozen=True)
class Arg:
    """An argument read at entry from ABI slot `slot` (a DIM3 takes slots slot and slot+1)."""

    name: str
    kind: str
    slot: int
    show: bool = True  # False for out-parameter pointers, shown at return instead

    @property
    def cells(self) -> int:
        return 2 if self.kind == Kind.DIM3 else 1


@dataclass(frozen=True)
class Out:
    """An out-parameter: the pointer in ABI slot `slot` is saved at entry and `size` bytes
    are read from it at return (only when the call succeeded)."""

    name: str
    kind: str
    slot: int
    size: int = 8


@dataclass(frozen=True)
class Api:
    """One traced function."""

    name: str
    library: str
    args: Tuple[Arg, ...] = ()
    outs: Tuple[Out, ...] = ()
    category: str = "other"  # memory, memcpy, launch, stream, event, device, ...
    aliases: Tuple[str, ...] = ()  # other exported symbols traced as this row (_ptsz, _ptds)

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


TABLE: Tuple[Api, ...] = (
    Api("cudaMalloc", RUNTIME, (_hidden("devPtr", 0), _a("size", Kind.SIZE, 1)),
        (Out("ptr", Kind.PTR, 0),), "memory"),
    Api("cudaFree", RUNTIME, (_a("ptr", Kind.PTR, 0),), (), "memory"),
    Api("cudaMemcpy", RUNTIME,
        (_a("dst", Kind.PTR, 0), _a("src", Kind.PTR, 1), _a("size", Kind.SIZE, 2),
         _a("kind", Kind.MEMCPY_KIND, 3)), (), "memcpy", ("cudaMemcpy_ptds",)),
    Api("cudaLaunchKernel", RUNTIME,
        (_a("func", Kind.PTR, 0), _a("grid", Kind.DIM3, 1), _a("block", Kind.DIM3, 3),
         _hidden("args", 5), _a("smem", Kind.U64, 6), _a("stream", Kind.HANDLE, 7)),
        (), "launch", ("cudaLaunchKernel_ptsz",)),
    Api("cudaStreamCreate", RUNTIME, (_hidden("pStream", 0),),
        (Out("stream", Kind.HANDLE, 0),), "stream"),
    Api("cudaStreamSynchronize", RUNTIME, (_a("stream", Kind.HANDLE, 0),), (), "stream",
        ("cudaStreamSynchronize_ptsz",)),
    Api("cudaEventCreate", RUNTIME, (_hidden("event_ptr", 0),),
        (Out("event", Kind.HANDLE, 0),), "event"),
    Api("cudaEventRecord", RUNTIME, (_a("event", Kind.HANDLE, 0), _a("stream", Kind.HANDLE, 1)),
        (), "event", ("cudaEventRecord_ptsz",)),
    Api("cudaEventSynchronize", RUNTIME, (_a("event", Kind.HANDLE, 0),), (), "event"),
    Api("cudaGetDevice", RUNTIME, (_hidden("device_ptr", 0),),
        (Out("device", Kind.INT, 0, size=4),), "device"),
    Api("cudaSetDevice", RUNTIME, (_a("device", Kind.INT, 0),), (), "device"),
)

# The seed tool's eleven functions: `--functions` with these reproduces it exactly.
SEED_FUNCTIONS = tuple(api.name for api in TABLE[:11])

BY_NAME: Dict[str, Api] = {api.name: api for api in TABLE}
FN_ID: Dict[str, int] = {api.name: i for i, api in enumerate(TABLE)}


def select(patterns: Optional[Iterable[str]] = None, library: Optional[str] = None) -> List[Api]:
    """Rows whose name matches any glob pattern (all rows when None), optionally one library.

    Raises KeyError naming a pattern that matches nothing."""
    import fnmatch

    rows = [api for api in TABLE if library in (None, "all", api.library)]
    if not patterns:
        return rows
    chosen = []
    for pattern in patterns:
        matched = [api for api in rows if fnmatch.fnmatchcase(api.name, pattern)]
        if not matched:
            raise KeyError(pattern)
        chosen.extend(api for api in matched if api not in chosen)
    return [api for api in TABLE if api in chosen]


def arg_cells(api: Api) -> List[Tuple[Arg, int]]:
    """Each argument with the index of its first record cell, in order."""
    cells, cell = [], 0
    for arg in api.args:
        cells.append((arg, cell))
        cell += arg.cells
    return cells
