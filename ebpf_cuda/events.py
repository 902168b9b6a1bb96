"""Record bytes → typed events.

A complete-call record becomes two events, `enter` and `exit`, so that consumers see the
seed tool's two lines per call; the exit event carries the return value, out-parameters and
duration. Enter records (return probes off, or --entries) become one `enter` event.
Field names are the JSON keys (see `Event.to_json`).
"""
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from . import record
from .apis import TABLE, Api, Kind, arg_cells
from .cuda_enums import error_name, memcpy_kind_name
from .errors import DecodeError

ENTER = "enter"
EXIT = "exit"

_FRAME = struct.Struct("=8x" + record.LAYOUT.format.lstrip("<=@!>"))  # header + payload
_FLOAT = struct.Struct("<f")


@dataclass
class Event:
    """One CUDA call seen at entry or exit. `ts` is wall-clock seconds, `ts_ns` the kernel's
    CLOCK_MONOTONIC time; `args` are the entry arguments by name; at exit `ret`/`ret_name`,
    `duration_ns` and the out-parameters (`outs`) are set."""

    ts: float
    ts_ns: int
    pid: int
    tid: int
    comm: str
    api: str
    phase: str
    args: Dict[str, Any]
    ret: Optional[int] = None
    ret_name: Optional[str] = None
    duration_ns: Optional[int] = None
    outs: Dict[str, Any] = field(default_factory=dict)
    faults: Tuple[str, ...] = ()  # out-parameters whose read failed (bad or NULL pointer)
    stack_id: int = 0  # with --stacks: 1 + the id of the caller's user stack, else 0

    def to_json(self) -> Dict[str, Any]:
        """The JSON object of this event: out-parameters become top-level keys."""
        obj = {"ts": self.ts, "pid": self.pid, "tid": self.tid, "comm": self.comm,
               "api": self.api, "phase": self.phase, "args": _jsonable(self.args)}
        if self.phase == EXIT:
            obj.update(ret=self.ret, ret_name=self.ret_name, duration_ns=self.duration_ns)
            obj.update(_jsonable(self.outs))
            if self.faults:
                obj["faults"] = list(self.faults)
        return obj


def _jsonable(values: Dict[str, Any]) -> Dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


LAUNCH_CONFIG_FIELDS = {"grid": Kind.DIM3, "block": Kind.DIM3, "smem": Kind.U64,
                        "stream": Kind.HANDLE}


def field_kinds(api: Api) -> Dict[str, str]:
    """Kind of every named value an event of `api` can carry (arguments, out-parameters)."""
    kinds: Dict[str, str] = {}
    for arg in api.args:
        if arg.kind == Kind.LAUNCH_CONFIG:
            kinds.update(LAUNCH_CONFIG_FIELDS)
        else:
            kinds[arg.name] = arg.kind
    kinds.update((out.name, out.kind) for out in api.outs)
    if api.learn_name is not None:
        kinds["kernel_name"] = Kind.STRING  # the name the probe learned (see Decoder._learn)
    return kinds


def decode_launch_config(cells: Sequence[int]) -> Dict[str, Any]:
    """grid, block, smem and stream from a launch configuration's five cells (six u32
    dimensions, shared memory bytes, stream), as cudaLaunchKernelExC/cuLaunchKernelEx get it."""
    dims = [cells[i // 2] >> (32 * (i % 2)) & 0xFFFFFFFF for i in range(6)]
    return {"grid": tuple(dims[:3]), "block": tuple(dims[3:]), "smem": cells[3] & 0xFFFFFFFF,
            "stream": cells[4]}


def decode_value(kind: str, cells: Sequence[int]) -> Any:
    """The Python value of an argument or out-parameter from its u64 cell(s)."""
    raw = cells[0]
    if kind == Kind.DIM3:
        return (raw & 0xFFFFFFFF, raw >> 32, cells[1] & 0xFFFFFFFF)
    if kind == Kind.INT:
        low = raw & 0xFFFFFFFF
        return low - (1 << 32) if low >= 1 << 31 else low
    if kind == Kind.UINT:
        return raw & 0xFFFFFFFF
    if kind == Kind.MEMCPY_KIND:
        return memcpy_kind_name(raw & 0xFFFFFFFF)
    if kind == Kind.FLOAT:
        return _FLOAT.unpack(struct.pack("<I", raw & 0xFFFFFFFF))[0]
    return raw


class _RowDecoder:
    """Precomputed per-row decoding: (name, kind, first cell) of each shown argument."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.args = [(arg.name, arg.kind, cell) for arg, cell in arg_cells(api) if arg.show]
        self.outs = [(out.name, out.kind) for out in api.outs]
        self.learns = api.learn_name is not None

    def decode_args(self, cells: Sequence[int]) -> Dict[str, Any]:
        args: Dict[str, Any] = {}
        for name, kind, cell in self.args:
            if kind == Kind.LAUNCH_CONFIG:
                args.update(decode_launch_config(cells[cell:cell + 5]))
            else:
                args[name] = decode_value(kind, cells[cell:cell + 2])
        return args

    def decode_outs(self, cells: Sequence[int], ret: int, flags: int) -> Tuple[dict, tuple]:
        if ret != 0 or not self.outs:
            return {}, ()
        outs, faults = {}, []
        for j, (name, kind) in enumerate(self.outs):
            if flags & (record.FLAG_OUT0_FAULT << j):
                faults.append(name)
            else:
                outs[name] = decode_value(kind, cells[j:j + 1])
        return outs, tuple(faults)


class Decoder:
    """Turns ring-buffer records into events. `clock_offset_ns` is wall-clock minus
    CLOCK_MONOTONIC, measured once when tracing starts."""

    def __init__(self, table: Sequence[Api] = TABLE,
                 clock_offset_ns: Optional[int] = None,
                 names: Optional[Callable[[int, int], Optional[str]]] = None) -> None:
        if clock_offset_ns is None:
            clock_offset_ns = time.time_ns() - time.monotonic_ns()
        self.clock_offset_ns = clock_offset_ns
        self.rows = [_RowDecoder(api) for api in table]
        self.names = names  # (pid, handle) -> name the probes learned (the `names` map)
        # (pid, function or kernel handle) -> kernel name, from cuModuleGetFunction,
        # cuLibraryGetKernel, cuKernelGetFunction and cuFuncGetName events.
        self.handle_names: Dict[Tuple[int, int], str] = {}
        self._comms: Dict[bytes, str] = {}

    def _comm(self, raw: bytes) -> str:
        name = self._comms.get(raw)
        if name is None:
            name = self._comms[raw] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        return name

    def decode_frames(self, frames: bytes) -> Iterator[Event]:
        """Events of a batch of ring frames (8-byte header + record, back to back)."""
        if len(frames) % _FRAME.size:
            raise DecodeError("a batch of %d bytes is not a whole number of %d-byte frames"
                              % (len(frames), _FRAME.size))
        for fields in _FRAME.iter_unpack(frames):
            yield from self._events(fields)

    def decode_record(self, payload: bytes) -> List[Event]:
        """Events of one record (payload only)."""
        if len(payload) != record.SIZE:
            raise DecodeError("a record has %d bytes, expected %d" % (len(payload), record.SIZE))
        return list(self._events(record.LAYOUT.unpack(payload)))

    def _events(self, fields: tuple) -> Iterator[Event]:
        ts_enter, ts_exit, tid, pid, fn_id, phase, flags, stack_id, comm = fields[:9]
        if fn_id >= len(self.rows) or phase not in (record.PHASE_ENTER, record.PHASE_CALL):
            raise DecodeError("record with unknown function id %d or phase %d" % (fn_id, phase))
        cells = fields[9:9 + record.ARG_CELLS]
        row = self.rows[fn_id]
        name, comm_s, args = row.api.name, self._comm(comm), row.decode_args(cells)
        offset = self.clock_offset_ns
        yield Event((ts_enter + offset) / 1e9, ts_enter, pid, tid, comm_s, name, ENTER, args)
        if phase == record.PHASE_CALL:
            ret = fields[9 + record.ARG_CELLS] & 0xFFFFFFFF
            outs, faults = row.decode_outs(fields[10 + record.ARG_CELLS:], ret, flags)
            if ret == 0 and (row.learns or name == "cuKernelGetFunction"):
                self._learn(row.api, pid, args, outs)
            yield Event((ts_exit + offset) / 1e9, ts_exit, pid, tid, comm_s, name, EXIT, args,
                        ret, error_name(ret, row.api.driver), ts_exit - ts_enter, outs, faults,
                        stack_id)

    def _learn(self, api: Api, pid: int, args: Dict[str, Any], outs: Dict[str, Any]) -> None:
        """Remember which kernel name a handle stands for (and show it as out `kernel_name`)."""
        if api.learn_name is not None:
            handle = outs.get(api.learn_name[0], args.get(api.learn_name[0]))
            name = self.names(pid, handle) if self.names and handle is not None else None
            if name:
                outs["kernel_name"] = name
                self.handle_names[(pid, handle)] = name
        elif "function" in outs:  # cuKernelGetFunction: the function runs that kernel
            name = self.handle_names.get((pid, args["kernel"]))
            if name:
                self.handle_names[(pid, outs["function"])] = name

    def handle_name(self, pid: int, handle: int) -> Optional[str]:
        """The kernel name of a CUfunction/CUkernel handle of process `pid`, if learned."""
        return self.handle_names.get((pid, handle))
