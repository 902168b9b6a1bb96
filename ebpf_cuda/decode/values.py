"""Each value kind's meaning, once: how it is read from a record's cells and how text lines,
JSON and the Chrome trace show it.

A kind (`apis.Kind`) is a `Shape`: Python expressions that take the value's parts out of an
unpacked record `f` (its first cell `{a}`, the next `{b}`), and %-templates of those parts for
text lines and JSON lines. The decoder (events.py) and the fast lines (output/lines.py) both
compile the same expressions, so an event's values and the lines written straight from frames
cannot disagree; text.py, jsonl.py and chrome_trace.py format decoded values with `text`,
`jsonable` and `trace_value` below.

A row's shown values are its `Field`s: one per shown argument, except that a launch
configuration (cudaLaunchKernelExC, cuLaunchKernelEx) becomes grid, block, smem and stream,
and cuLaunchKernel's six unsigned ints gridX..blockZ become the dim3 `grid` and `block`: every
launch event carries its geometry the same way. An NCCL call with a count and a datatype also
carries its `bytes` (count x the datatype's size). CUDA graph node parameters read through a
pointer become the fields graphs.py reads: a kernel node's func, grid, block and smem, a
memset node's ptr, value and size, a copy extent's size.
"""
from __future__ import annotations
import struct
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..spec import record
from ..spec.apis import NCCL, UNIQUE_ID_CELLS, Api, Kind, Role, arg_cells
from ..spec.cuda_enums import memcpy_kind_name, nccl_bytes, nccl_datatype_name, nccl_redop_name

# Indexes in a record unpacked with record.LAYOUT: ts_enter, ts_exit, tid, pid, fn_id, phase,
# flags, stack_id, comm, then the argument cells, the return value, the out-parameter cells.
ARGS_AT = 9
RET_AT = ARGS_AT + record.ARG_CELLS
OUTS_AT = RET_AT + 1

_U32 = "f[{a}] & 0xFFFFFFFF"


class Shape(NamedTuple):
    """How one kind is decoded and shown. `parts`: expressions of the value's parts over an
    unpacked record `f`; `text`, `json`: %-templates of the parts in text and JSON lines
    (`json` None: no JSON template, the value is left to the json module and its rows to the
    decoder); `hex`: an address or handle, hex text where people read it (text lines, the
    Chrome trace; JSON lines keep the number)."""

    parts: Tuple[str, ...]
    text: str
    json: Optional[str]
    hex: bool = False


SHAPES: Dict[str, Shape] = {
    Kind.SIZE: Shape(("f[{a}]",), "%d bytes", "%d"),
    Kind.PTR: Shape(("f[{a}]",), "0x%x", "%d", hex=True),
    Kind.HANDLE: Shape(("f[{a}]",), "0x%x", "%d", hex=True),
    Kind.U64: Shape(("f[{a}]",), "%d", "%d"),
    Kind.UINT: Shape((_U32,), "%d", "%d"),
    # the low half, minus 2**32 when its sign bit is set
    Kind.INT: Shape(("(f[{a}] & 0xFFFFFFFF) - ((f[{a}] & 0x80000000) << 1)",), "%d", "%d"),
    # json writes floats its own way (NaN, repr): records with one take the decoder's path
    Kind.FLOAT: Shape(("_float(f[{a}] & 0xFFFFFFFF)",), "%g", None),
    Kind.MEMCPY_KIND: Shape(("_kind(f[{a}] & 0xFFFFFFFF)",), "%s", '"%s"'),  # names need no escapes
    Kind.DIM3: Shape((_U32, "f[{a}] >> 32", "f[{b}] & 0xFFFFFFFF"), "(%d,%d,%d)", "[%d,%d,%d]"),
    Kind.STRING: Shape((), "%s", None),  # not in the cells: names the probes learned
    # No JSON template: NCCL calls take the decoder's path, where they get their
    # communicator's rank, size, id and sequence number (nccl.py).
    Kind.NCCL_COMM: Shape(("f[{a}]",), "0x%x", None, hex=True),
    Kind.NCCL_DATATYPE: Shape(("_nccl_type(f[{a}] & 0xFFFFFFFF)",), "%s", '"%s"'),
    Kind.NCCL_REDOP: Shape(("_nccl_op(f[{a}] & 0xFFFFFFFF)",), "%s", '"%s"'),
    Kind.UNIQUE_ID: Shape(("_uid(f[{a}:{a} + %d])" % UNIQUE_ID_CELLS,), "%s", None),
    Kind.MEMORY_TYPE: Shape(("_memtype(f[{a}] & 0xFFFFFFFF)",), "%s", '"%s"'),
    Kind.NODES: Shape((), "%s", None),  # not in the cells: graphs.py adds them (nodes_text)
}

# CUmemorytype (cuda.h) by value; another value shows as its number.
MEMORY_TYPES = {1: "Host", 2: "Device", 3: "Array", 4: "Unified"}


def _memtype(value: int) -> str:
    return MEMORY_TYPES.get(value) or str(value)

_F32 = struct.Struct("<f")
_U32_BYTES = struct.Struct("<I")


def _float(bits: int) -> float:
    return _F32.unpack(_U32_BYTES.pack(bits))[0]


def unique_id_hash(data: bytes) -> str:
    """A short name for bytes that identify something (an ncclUniqueId's): 12 hex digits."""
    import hashlib

    return hashlib.blake2b(data, digest_size=6).hexdigest()


def _uid(cells: Sequence[int]) -> str:
    return unique_id_hash(struct.pack("<%dQ" % len(cells), *cells))


NAMESPACE: Dict[str, Any] = {"_kind": memcpy_kind_name, "_float": _float,  # for the expressions
                             "_nccl_type": nccl_datatype_name, "_nccl_op": nccl_redop_name,
                             "_nccl_bytes": nccl_bytes, "_uid": _uid, "_memtype": _memtype}


class Field(NamedTuple):
    """A value an event of some row carries: its name, kind and the expressions of its parts
    over an unpacked record `f` (cells already placed)."""

    name: str
    kind: str
    parts: Tuple[str, ...]

    @property
    def value(self) -> str:
        """The expression of the Python value (a dim3 is a tuple)."""
        return "(%s)" % ", ".join(self.parts) if len(self.parts) > 1 else self.parts[0]


def _placed(kind: str, a: int) -> Tuple[str, ...]:
    return tuple(p.format(a=a, b=a + 1) for p in SHAPES[kind].parts)


def _config_fields(a: int) -> List[Field]:
    """A launch configuration read into cells a..a+4: grid and block as six u32 (two to a
    cell, low half first), shared memory bytes (low half of a+3), stream (a+4)."""
    dims = tuple("f[%d] >> 32" % (a + i // 2) if i % 2 else "f[%d] & 0xFFFFFFFF" % (a + i // 2)
                 for i in range(6))
    return [Field("grid", Kind.DIM3, dims[:3]), Field("block", Kind.DIM3, dims[3:]),
            Field("smem", Kind.U64, ("f[%d] & 0xFFFFFFFF" % (a + 3),)),
            Field("stream", Kind.HANDLE, ("f[%d]" % (a + 4),))]


LAUNCH_CONFIG_FIELDS: Dict[str, str] = {f.name: f.kind for f in _config_fields(0)}

_LOW, _HIGH = "f[%d] & 0xFFFFFFFF", "f[%d] >> 32"


def _kernel_node_fields(a: int) -> List[Field]:
    """cudaKernelNodeParams / CUDA_KERNEL_NODE_PARAMS read into cells a..a+4: func, then six
    u32 dimensions from byte 8 (two to a cell, low half first), shared memory bytes."""
    dims = tuple((_HIGH if i % 2 else _LOW) % (a + 1 + i // 2) for i in range(6))
    return [Field("func", Kind.PTR, ("f[%d]" % a,)), Field("grid", Kind.DIM3, dims[:3]),
            Field("block", Kind.DIM3, dims[3:]), Field("smem", Kind.U64, (_LOW % (a + 4),))]


def _memset_node_fields(a: int) -> List[Field]:
    """cudaMemsetParams / CUDA_MEMSET_NODE_PARAMS in cells a..a+4: dst, pitch, value and
    elementSize (u32 each), width (elements), height: the bytes are their product."""
    return [Field("ptr", Kind.PTR, ("f[%d]" % a,)), Field("value", Kind.UINT, (_LOW % (a + 2),)),
            Field("size", Kind.SIZE, ("(%s) * f[%d] * f[%d]" % (_HIGH % (a + 2), a + 3, a + 4),))]


def _extent_fields(a: int) -> List[Field]:
    """A copy's extent (width in bytes, height, depth) in cells a..a+2: its bytes."""
    return [Field("size", Kind.SIZE, ("f[%d] * f[%d] * f[%d]" % (a, a + 1, a + 2),))]


# Kinds read through a pointer that become several fields (or one of another kind).
_EXPANDED: Dict[str, Callable[[int], List[Field]]] = {
    Kind.LAUNCH_CONFIG: _config_fields, Kind.KERNEL_NODE: _kernel_node_fields,
    Kind.MEMSET_NODE: _memset_node_fields, Kind.EXTENT: _extent_fields}

# cuLaunchKernel passes its geometry as six unsigned ints; its events carry them as dim3 like
# every other launch. First scalar -> (the dim3's name, the other two scalars).
_SPLIT_DIM3 = {"gridX": ("grid", "gridY", "gridZ"), "blockX": ("block", "blockY", "blockZ")}


def arg_fields(api: Api) -> List[Field]:
    """The fields of a row's shown arguments, in declaration order."""
    shown = {arg.name: (arg, ARGS_AT + cell) for arg, cell in arg_cells(api) if arg.show}
    merged = {first: rest for first, rest in _SPLIT_DIM3.items()
              if all(n in shown and shown[n][0].kind == Kind.UINT for n in (first,) + rest[1:])}
    inside = {n for rest in merged.values() for n in rest[1:]}
    fields: List[Field] = []
    for name, (arg, a) in shown.items():
        if arg.kind in _EXPANDED:
            fields += _EXPANDED[arg.kind](a)
        elif name in merged:
            dim3, *others = merged[name]
            parts = _placed(Kind.UINT, a) + tuple(_placed(Kind.UINT, shown[n][1])[0]
                                                  for n in others)
            fields.append(Field(dim3, Kind.DIM3, parts))
        elif name not in inside:
            fields.append(Field(name, arg.kind, _placed(arg.kind, a)))
        if name == "datatype" and api.count in shown:
            fields.append(Field("bytes", Kind.U64, ("_nccl_bytes(f[%d], f[%d] & 0xFFFFFFFF)"
                                                    % (shown[api.count][1], a),)))
    return fields


def out_fields(api: Api) -> List[Field]:
    """The fields of a row's out-parameters (one cell each), in order."""
    return [Field(out.name, out.kind, _placed(out.kind, OUTS_AT + j))
            for j, out in enumerate(api.outs)]


def field_kinds(api: Api) -> Dict[str, str]:
    """Kind of every named value an event of `api` can carry (arguments, out-parameters)."""
    kinds = {f.name: f.kind for f in arg_fields(api)}
    kinds.update((f.name, f.kind) for f in out_fields(api))
    if api.learn_name is not None:
        kinds["kernel_name"] = Kind.STRING  # the name its handle stands for, once learned
    if api.library == NCCL:  # what its communicator adds (nccl.py)
        kinds.update(NCCL_ADDED)
    for name, kind in GRAPH_ADDED.get(api.role, {}).items():
        kinds.setdefault(name, kind)
    return kinds


# What graphs.GraphTracker adds to events, by the row's role: a graph launch's (or a
# capture's) nodes, and `captured` (with the graph, when known) on work recorded into one.
_CAPTURED = {"captured": Kind.STRING, "graph": Kind.HANDLE}
_NODES = {"nodes": Kind.NODES, "nodes_reason": Kind.STRING}
GRAPH_ADDED: Dict[Optional[str], Dict[str, str]] = {
    Role.GRAPH_LAUNCH: dict(_NODES, **_CAPTURED), Role.CAPTURE_END: _NODES,
    Role.LAUNCH: _CAPTURED, Role.COPY: _CAPTURED, Role.MEMSET: _CAPTURED}


# What nccl.Communicators adds to an NCCL call's arguments, when known.
NCCL_ADDED: Dict[str, str] = {"comm_id": Kind.STRING, "rank": Kind.INT, "nranks": Kind.INT,
                              "device": Kind.INT, "seq": Kind.U64}


# -- decoding ---------------------------------------------------------------------------------

def compile_dict(fields: Sequence[Field]) -> Callable[[Sequence[int]], Dict[str, Any]]:
    """A function of an unpacked record giving the fields' values by name (one dict display:
    the decoder's hot path)."""
    body = ", ".join("%r: %s" % (f.name, f.value) for f in fields)
    return eval("lambda f: {%s}" % body, NAMESPACE)


def compile_tuple(fields: Sequence[Field]) -> Callable[[Sequence[int]], Tuple[Any, ...]]:
    """A function of an unpacked record giving the fields' values, in order."""
    return eval("lambda f: (%s,)" % ", ".join(f.value for f in fields) if fields
                else "lambda f: ()", NAMESPACE)


_VALUES: Dict[str, Callable[[Sequence[int]], Any]] = {
    kind: eval("lambda f: " + Field("", kind, _placed(kind, 0)).value, NAMESPACE)
    for kind, shape in SHAPES.items() if shape.parts}


def decode_value(kind: str, cells: Sequence[int]) -> Any:
    """The Python value of an argument or out-parameter from its u64 cell(s) (a kind not
    decoded from cells gives the first cell as it is)."""
    decode = _VALUES.get(kind)
    return cells[0] if decode is None else decode(cells)


_CONFIG = compile_dict(_config_fields(0))


def decode_launch_config(cells: Sequence[int]) -> Dict[str, Any]:
    """grid, block, smem and stream from a launch configuration's five cells (six u32
    dimensions, shared memory bytes, stream), as cudaLaunchKernelExC/cuLaunchKernelEx get it."""
    return _CONFIG(cells)


# -- showing ----------------------------------------------------------------------------------

def text(kind: str, value: Any) -> str:
    """A value as text lines show it (`4000 bytes`, `0x7f...`, `(4,1,1)`, `HostToDevice`);
    a value that does not fit its kind's template, or of no known kind, as str()."""
    shape = SHAPES.get(kind)
    if shape is None:
        return str(value)
    if kind == Kind.NODES:
        return nodes_text(value)
    try:
        return shape.text % (tuple(value) if len(shape.parts) > 1 else (value,))
    except TypeError:
        return str(value)


def nodes_text(nodes: Optional[List[dict]]) -> str:
    """A graph launch's nodes (graphs.py) as text lines show them: kernels in launch syntax
    (`name<<<(4,1,1),(256,1,1),0>>>`), copies and memsets with their bytes, child graphs in
    brackets; `unknown` when they are."""
    if nodes is None:
        return "unknown"
    return "[%s]" % ", ".join(_node_text(node) for node in nodes)


def _node_text(node: dict) -> str:
    kind = node.get("type")
    if kind == "kernel":
        grid, block = node.get("grid") or (0, 0, 0), node.get("block") or (0, 0, 0)
        return "%s<<<(%d,%d,%d),(%d,%d,%d),%d>>>" % (
            node.get("kernel") or "0x%x" % (node.get("func") or 0), *grid, *block,
            node.get("smem") or 0)
    if kind == "memcpy":
        return "memcpy %s bytes %s" % (node.get("size"), node.get("kind"))
    if kind == "memset":
        return "memset %s bytes" % node.get("size")
    return "graph" + nodes_text(node.get("nodes"))


def jsonable(values: Dict[str, Any]) -> Dict[str, Any]:
    """Decoded values as JSON lines write them: numbers, names as strings, a dim3 (the only
    tuple) as an array."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def trace_value(kind: Optional[str], value: Any) -> Any:
    """A value as the Chrome trace shows it: addresses and handles as hex text, as text lines
    show them (JSON numbers lose precision above 2**53 in the viewers), a dim3 as an array,
    the rest as JSON lines have it."""
    shape = SHAPES.get(kind) if kind else None
    if shape is not None and shape.hex and isinstance(value, int):
        return shape.text % value
    return list(value) if isinstance(value, tuple) else value
