"""Each value kind means the same in every output: every row of the table, decoded from a
record, shown in text lines (decoded and fast), JSON lines (decoded and fast) and the Chrome
trace, checked against one written-out meaning per kind (independent of values.py)."""
import io
import json
import random
import struct
from typing import Any, Dict, List, Tuple

import pytest

from ebpf_cuda.decode import events, values
from ebpf_cuda.spec import record
from ebpf_cuda.spec.apis import BY_NAME, NCCL, TABLE, Api, Kind, arg_cells
from ebpf_cuda.spec.cuda_enums import memcpy_kind_name
from ebpf_cuda.decode.events import Decoder, Event
from ebpf_cuda.output.chrome_trace import write_chrome_trace
from ebpf_cuda.output.jsonl import JsonWriter
from ebpf_cuda.output.lines import JsonLines, TextLines
from ebpf_cuda.output.text import TextWriter
from records import pack_frame

MANGLED = "_Z6vecAddPKfS0_Pfi"
ONE_AND_A_HALF = 0x3FC00000  # 1.5f


def _u32(x: int) -> int:
    return x & 0xFFFFFFFF


NCCL_TYPES = ["ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
              "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
              "ncclFloat8e5m2"]
NCCL_SIZES = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1]
NCCL_OPS = ["ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"]


def _meaning(kind: str, cells: List[int]) -> Any:
    """What a value of `kind` is, from its cells."""
    if kind == Kind.NCCL_DATATYPE:
        t = _u32(cells[0])
        return NCCL_TYPES[t] if t < len(NCCL_TYPES) else "ncclDataType(%d)" % t
    if kind == Kind.NCCL_REDOP:
        op = _u32(cells[0])
        return NCCL_OPS[op] if op < len(NCCL_OPS) else "ncclRedOp(%d)" % op
    if kind == Kind.UNIQUE_ID:  # its first 64 bytes, hashed
        import hashlib

        return hashlib.blake2b(struct.pack("<8Q", *cells[:8]), digest_size=6).hexdigest()
    if kind == Kind.DIM3:
        return (_u32(cells[0]), cells[0] >> 32, _u32(cells[1]))
    if kind == Kind.UINT:
        return _u32(cells[0])
    if kind == Kind.INT:
        return struct.unpack("<i", struct.pack("<I", _u32(cells[0])))[0]
    if kind == Kind.FLOAT:
        return struct.unpack("<f", struct.pack("<I", _u32(cells[0])))[0]
    if kind == Kind.MEMCPY_KIND:
        return memcpy_kind_name(_u32(cells[0]))
    if kind == Kind.MEMORY_TYPE:  # CUmemorytype
        return {1: "Host", 2: "Device", 3: "Array", 4: "Unified"}.get(_u32(cells[0]),
                                                                      str(_u32(cells[0])))
    return cells[0]  # SIZE, PTR, HANDLE, U64


def _text(kind: str, value: Any) -> str:
    """How text lines show a value."""
    if kind == Kind.SIZE:
        return "%d bytes" % value
    if kind in (Kind.PTR, Kind.HANDLE, Kind.NCCL_COMM):
        return hex(value)
    if kind == Kind.DIM3:
        return "(%d,%d,%d)" % value
    return "%g" % value if kind == Kind.FLOAT else str(value)


def _json(kind: str, value: Any) -> Any:
    """How JSON lines carry a value: numbers, names as strings, dim3 as [x,y,z]."""
    return list(value) if kind == Kind.DIM3 else value


def _trace(kind: str, value: Any) -> Any:
    """How the Chrome trace shows a value: addresses and handles as the text lines' hex."""
    return (_text(kind, value) if kind in (Kind.PTR, Kind.HANDLE, Kind.NCCL_COMM)
            else _json(kind, value))


_SPLIT = {"gridX": "grid", "gridY": "grid", "gridZ": "grid",
          "blockX": "block", "blockY": "block", "blockZ": "block"}


def _expected_args(api: Api, cells: List[int]) -> Dict[str, Tuple[str, Any]]:
    """name -> (kind, value) of every shown argument; launch configurations and
    cuLaunchKernel's six scalars become grid/block/smem/stream as on every launch."""
    out: Dict[str, Tuple[str, Any]] = {}
    for arg, at in arg_cells(api):
        mine = cells[at:]
        if not arg.show:
            continue
        if arg.kind == Kind.LAUNCH_CONFIG:
            dims = [_u32(mine[i // 2] >> (32 * (i % 2))) for i in range(6)]
            out.update(grid=(Kind.DIM3, tuple(dims[:3])), block=(Kind.DIM3, tuple(dims[3:])),
                       smem=(Kind.U64, _u32(mine[3])), stream=(Kind.HANDLE, mine[4]))
        elif arg.kind == Kind.KERNEL_NODE:  # func, then six u32 from byte 8, shared memory
            dims = [_u32(mine[1 + i // 2] >> (32 * (i % 2))) for i in range(6)]
            out.update(func=(Kind.PTR, mine[0]), grid=(Kind.DIM3, tuple(dims[:3])),
                       block=(Kind.DIM3, tuple(dims[3:])), smem=(Kind.U64, _u32(mine[4])))
        elif arg.kind == Kind.MEMSET_NODE:  # dst, pitch, value | elementSize, width, height
            out.update(ptr=(Kind.PTR, mine[0]), value=(Kind.UINT, _u32(mine[2])),
                       size=(Kind.SIZE, (mine[2] >> 32) * mine[3] * mine[4]))
        elif arg.kind == Kind.EXTENT:  # width, height, depth
            out["size"] = (Kind.SIZE, mine[0] * mine[1] * mine[2])
        elif arg.name in _SPLIT:
            name = _SPLIT[arg.name]
            old = out.get(name, (Kind.DIM3, ()))[1]
            out[name] = (Kind.DIM3, old + (_u32(mine[0]),))
        else:
            out[arg.name] = (arg.kind, _meaning(arg.kind, mine))
        if arg.name == "datatype" and api.count:  # an NCCL call's bytes: count x type size
            t = _u32(mine[0])
            count = cells[next(c for a, c in arg_cells(api) if a.name == api.count)]
            out["bytes"] = (Kind.U64, count * NCCL_SIZES[t] if t < len(NCCL_SIZES) else None)
    return out


def _expected_outs(api: Api, outs: List[int]) -> Dict[str, Tuple[str, Any]]:
    found = {o.name: (o.kind, _meaning(o.kind, [outs[j]])) for j, o in enumerate(api.outs)}
    if api.learn_name is not None:
        found["kernel_name"] = (Kind.STRING, MANGLED)
    return found


def _cells(rng: random.Random, n: int) -> List[int]:
    """Cells with both halves set, sign bits now and then, memcpy kinds in range."""
    pick = [0, 1, 2, 3, 2**31 + 7, 2**32 - 1, 0x7F0012345678, 2**63 + 5]
    return [rng.choice(pick) if rng.random() < 0.4 else rng.randrange(1 << 64)
            for _ in range(n)]


def _frame(fn_id: int, cells: List[int], outs: List[int]) -> bytes:
    return pack_frame(fn_id, 10**12, cells, 0, outs, exit_ts=10**12 + 2500, pid=7)


def _decoder() -> Decoder:
    return Decoder(TABLE, clock_offset_ns=0)


def _learned(evs: List[Event]) -> List[Event]:
    """The events with the name a teaching call's handle stands for, as the kernel namer
    shows it (out `kernel_name`)."""
    for ev in evs:
        api = BY_NAME[ev.api]
        if api.learn_name is not None and ev.phase == events.EXIT and ev.ret == 0:
            ev.outs["kernel_name"] = MANGLED
    return evs


def _decode(decoder: Decoder, frames: bytes) -> List[Event]:
    return _learned(decoder.decode_batch(frames))


def _records(seed: int):
    """(api, its frame, expected args, expected outs) for every row."""
    rng = random.Random(seed)
    for fn_id, api in enumerate(TABLE):
        cells, outs = _cells(rng, record.ARG_CELLS), _cells(rng, record.OUT_CELLS)
        for j, out in enumerate(api.outs):
            if out.kind == Kind.FLOAT:  # a number, not a NaN that equals nothing
                outs[j] = (outs[j] & ~0xFFFFFFFF) | ONE_AND_A_HALF
        for arg, at in arg_cells(api):
            if arg.kind == Kind.MEMCPY_KIND and seed % 2:
                cells[at] = (cells[at] & ~0xFFFFFFFF) | rng.randrange(5)
        yield api, _frame(fn_id, cells, outs), _expected_args(api, cells), \
            _expected_outs(api, outs)


def _slices(evs: List[Event]) -> List[dict]:
    stream = io.StringIO()
    stream.close = lambda: None
    write_chrome_trace(evs, stream)
    return [e for e in json.loads(stream.getvalue())  # (not an NCCL call's communicator copy)
            if e["ph"] == "X" and e.get("cat") != "nccl comm"]


SEEDS = [1, 2, 3, 4]


@pytest.mark.parametrize("seed", SEEDS)
def test_decoded_values_mean_what_their_kind_says(seed):
    decoder = _decoder()
    for api, frame, args, outs in _records(seed):
        enter, done = _decode(decoder, frame)
        shown = enter.args
        if api.library == NCCL:  # (they also show their communicator: test_nccl.py)
            assert set(shown) - set(args) <= set(values.NCCL_ADDED), api.name
            shown = {name: value for name, value in shown.items() if name in args}
        assert shown == {name: value for name, (_, value) in args.items()}, api.name
        assert list(shown) == list(args)  # declaration order
        assert done.outs == {name: value for name, (_, value) in outs.items()}, api.name
        kinds = values.field_kinds(api)
        assert {n: kinds[n] for n in args} == {n: k for n, (k, _) in args.items()}
        assert {n: kinds[n] for n in outs} == {n: k for n, (k, _) in outs.items()}


def _has(line: str, name: str, shown: str) -> bool:
    return (" %s=%s " % (name, shown)) in " %s " % line


@pytest.mark.parametrize("seed", SEEDS)
def test_every_output_shows_every_kind_the_same(seed):
    for api, frame, args, outs in _records(seed):
        evs = _decode(_decoder(), frame)  # (each output decodes it afresh, NCCL's numbers too)
        text = TextWriter(io.StringIO(), timestamps=False).lines(evs)
        slow_text = TextWriter(io.StringIO(), timestamps=False).lines
        fast_text = TextLines(TABLE, _decoder(), lambda e: slow_text(_learned(e)), None,
                              timestamps=False).lines(frame)
        slow_json = JsonWriter(io.StringIO()).lines
        fast_json = JsonLines(TABLE, _decoder(), lambda e: slow_json(_learned(e))).lines(frame)
        slow_json = slow_json(evs)
        # (the fast path writes a call's two lines as one string)
        assert "\n".join(fast_text) == "\n".join(text), api.name
        assert "\n".join(fast_json) == "\n".join(slow_json), api.name
        enter_json, exit_json = [json.loads(line) for line in slow_json]
        (chrome,) = _slices(evs)
        for name, (kind, value) in args.items():
            assert _has(text[0], name, _text(kind, value)), (api.name, name, text[0])
            assert enter_json["args"][name] == _json(kind, value), (api.name, name)
            assert chrome["args"][name] == _trace(kind, value), (api.name, name)
        for name, (kind, value) in outs.items():
            if kind != Kind.STRING:
                assert _has(text[1], name, _text(kind, value)), (api.name, name, text[1])
                assert chrome["args"][name] == _trace(kind, value), (api.name, name)
            assert exit_json[name] == _json(kind, value), (api.name, name)


def test_every_launch_carries_grid_and_block_as_dim3():
    decoder = _decoder()
    launches = [r for r in _records(5) if r[0].category == "launch" and "func" in r[2]]
    assert {api.name for api, *_ in launches} >= {"cuLaunchKernel", "cuLaunchKernelEx",
                                                   "cudaLaunchKernel", "cudaLaunchKernelExC"}
    for api, frame, _, _ in launches:
        enter, _ = _decode(decoder, frame)
        assert {"func", "grid", "block", "smem", "stream"} <= set(enter.args), api.name
        assert not {"gridX", "blockX"} & set(enter.args)
        for name in ("grid", "block"):
            dims = enter.args[name]
            assert isinstance(dims, tuple) and len(dims) == 3
            assert json.loads(json.dumps(enter.to_json()))["args"][name] == list(dims)


def test_cu_launch_kernel_geometry_in_every_output():
    api = next(a for a in TABLE if a.name == "cuLaunchKernel")
    cells = [0x10000, 2, 3, 4, 8, 8, 2, 1024, 0x51, 0]
    frame = _frame(TABLE.index(api), cells, [0, 0])
    evs = _decode(_decoder(), frame)
    assert evs[0].args == {"func": 0x10000, "grid": (2, 3, 4), "block": (8, 8, 2),
                           "smem": 1024, "stream": 0x51}
    text = TextWriter(io.StringIO(), timestamps=False).lines(evs)[0]
    assert text.endswith("func=0x10000 grid=(2,3,4) block=(8,8,2) smem=1024 stream=0x51")
    assert json.loads(JsonWriter(io.StringIO()).lines(evs)[0])["args"] == {
        "func": 0x10000, "grid": [2, 3, 4], "block": [8, 8, 2], "smem": 1024, "stream": 0x51}
    args = _slices(evs)[0]["args"]
    assert (args["grid"], args["block"], args["stream"]) == ([2, 3, 4], [8, 8, 2], "0x51")


def test_launch_config_stream_is_hex_in_the_chrome_trace():
    for name in ("cuLaunchKernelEx", "cudaLaunchKernelExC"):
        api = next(a for a in TABLE if a.name == name)
        cells = [5 | 6 << 32, 7 | 32 << 32, 4 | 2 << 32, 4096, 0x51] + [0x10010] * 5
        evs = _decode(_decoder(), _frame(TABLE.index(api), cells, [0, 0]))
        args = _slices(evs)[0]["args"]
        assert args["stream"] == "0x51" and args["func"] == "0x10010", name
        assert (args["grid"], args["block"], args["smem"]) == ([5, 6, 7], [32, 4, 2], 4096)


def test_module_slices_are_titled_by_the_name_they_taught():
    decoder = _decoder()
    titles = {}
    for api, frame, _, _ in _records(6):
        if api.category == "module":
            titles[api.name] = _slices(_decode(decoder, frame))[0]["name"]
    demangled = "vecAdd(float const*, float const*, float*, int)"
    for name in ("cuModuleGetFunction", "cuLibraryGetKernel", "cuFuncGetName"):
        assert titles[name] in (demangled, MANGLED), name  # demangled where a C++ runtime is
    # no title is a handle: cuLibraryGetKernel's out and cuKernelGetFunction's argument are
    # both called `kernel`
    assert titles["cuKernelGetFunction"] == "cuKernelGetFunction"
    assert not any(t.startswith("0x") for t in titles.values())
    unnamed = Decoder(TABLE, clock_offset_ns=0)  # nothing learned: the function's name
    api = next(a for a in TABLE if a.name == "cuLibraryGetKernel")
    evs = unnamed.decode_batch(_frame(TABLE.index(api), [0x4000] * 10, [0x20000, 0]))
    assert _slices(evs)[0]["name"] == "cuLibraryGetKernel"


def test_text_of_values_that_do_not_fit_their_kind():
    assert values.text(Kind.PTR, "0x10") == "0x10"
    assert values.text(Kind.SIZE, None) == "None"
    assert values.text("no such kind", 7) == "7"
    assert values.text(Kind.DIM3, [1, 2, 3]) == "(1,2,3)"
    assert values.trace_value(Kind.HANDLE, 0x51) == "0x51"
    assert values.trace_value(Kind.HANDLE, None) is None
    assert values.trace_value(None, (1, 2, 3)) == [1, 2, 3]


def test_every_kind_has_one_shape_and_events_reexports_it():
    kinds = {v for k, v in vars(Kind).items() if k.isupper()}
    # they expand into other fields (a launch configuration into four)
    # (and the caller's return address is never shown: it names kernels)
    assert kinds - set(values.SHAPES) == {Kind.LAUNCH_CONFIG, Kind.KERNEL_NODE,
                                          Kind.MEMSET_NODE, Kind.EXTENT, Kind.CALLER}
    used = {a.kind for api in TABLE for a in api.args} | {o.kind for api in TABLE for o in api.outs}
    assert used <= kinds
    for name in ("decode_value", "decode_launch_config", "LAUNCH_CONFIG_FIELDS", "field_kinds"):
        assert getattr(events, name) is getattr(values, name)
    assert values.decode_value(Kind.DIM3, [4 | 2 << 32, 3]) == (4, 2, 3)
    assert values.decode_value(Kind.INT, [0xFFFFFFFF]) == -1
    assert values.decode_launch_config([1 | 2 << 32, 3 | 4 << 32, 5 | 6 << 32, 7, 8]) == {
        "grid": (1, 2, 3), "block": (4, 5, 6), "smem": 7, "stream": 8}
