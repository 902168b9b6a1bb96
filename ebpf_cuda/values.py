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
launch event carries its geometry the same way.
"""
import struct
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import record
from .apis import Api, Kind, arg_cells
from .cuda_enums import memcpy_kind_name

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
}

_F32 = struct.Struct("<f")
_U32_BYTES = struct.Struct("<I")


def _float(bits: int) -> float:
    return _F32.unpack(_U32_BYTES.pack(bits))[0]


NAMESPACE: Dict[str, Any] = {"_kind": memcpy_kind_name, "_float": _float}  # for the expressions


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
        if arg.kind == Kind.LAUNCH_CONFIG:
            fields += _config_fields(a)
        elif name in merged:
            dim3, *others = merged[name]
            parts = _placed(Kind.UINT, a) + tuple(_placed(Kind.UINT, shown[n][1])[0]
                                                  for n in others)
            fields.append(Field(dim3, Kind.DIM3, parts))
        elif name not in inside:
            fields.append(Field(name, arg.kind, _placed(arg.kind, a)))
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
    return kinds


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
    try:
        return shape.text % (tuple(value) if len(shape.parts) > 1 else (value,))
    except TypeError:
        return str(value)


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
