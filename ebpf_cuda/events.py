"""Record bytes → typed events.

A complete-call record becomes two events, `enter` and `exit`, so that consumers see the
seed tool's two lines per call; the exit event carries the return value, out-parameters and
duration. Enter records (return probes off, or --entries) become one `enter` event.
Field names are the JSON keys (see `Event.to_json`).
"""
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

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


_RAW_KINDS = (Kind.PTR, Kind.HANDLE, Kind.SIZE, Kind.U64)  # the cell is the value
_ARGS_AT = 9  # index of the first argument cell in an unpacked record
_RET_AT = _ARGS_AT + record.ARG_CELLS
_OUTS_AT = _RET_AT + 1


class _RowDecoder:
    """Precomputed decoding of one row: where each shown value sits in an unpacked record
    (plain 64-bit values are taken as they are; the rest go through `decode_value`)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.name = api.name
        shown = [(arg.name, arg.kind, _ARGS_AT + cell) for arg, cell in arg_cells(api)
                 if arg.show]
        self.args = [(name, kind, at, kind in _RAW_KINDS) for name, kind, at in shown]
        self.outs = [(out.name, out.kind, _OUTS_AT + j) for j, out in enumerate(api.outs)]
        self.learns = any((api.learn_name, api.learn_func, api.learn_alias))
        self._ret_names: Dict[int, str] = {}

    def decode_args(self, fields: Sequence[int]) -> Dict[str, Any]:
        args: Dict[str, Any] = {}
        for name, kind, at, raw in self.args:  # in declaration order
            if raw:
                args[name] = fields[at]
            elif kind == Kind.LAUNCH_CONFIG:
                args.update(decode_launch_config(fields[at:at + 5]))
            else:
                args[name] = decode_value(kind, fields[at:at + 2])
        return args

    def decode_outs(self, fields: Sequence[int], flags: int) -> Tuple[dict, tuple]:
        """Out-parameters of a successful call; those whose read faulted are named apart."""
        outs, faults = {}, []
        for j, (name, kind, at) in enumerate(self.outs):
            if flags & (record.FLAG_OUT0_FAULT << j):
                faults.append(name)
            else:
                outs[name] = fields[at] if kind in _RAW_KINDS else decode_value(kind, (fields[at],))
        return outs, tuple(faults)

    def ret_name(self, ret: int) -> str:
        name = self._ret_names.get(ret)
        if name is None:
            name = self._ret_names[ret] = error_name(ret, self.api.driver)
        return name


class Decoder:
    """Turns ring-buffer records into events. `clock_offset_ns` is wall-clock minus
    CLOCK_MONOTONIC, measured once when tracing starts."""

    def __init__(self, table: Sequence[Api] = TABLE,
                 clock_offset_ns: Optional[int] = None,
                 names: Optional[Callable[[int, int], Optional[str]]] = None) -> None:
        if clock_offset_ns is None:
            clock_offset_ns = time.time_ns() - time.monotonic_ns()
        self.clock_offset_ns = clock_offset_ns
        self.table = list(table)
        self.rows = [_RowDecoder(api) for api in table]
        self.names = names  # (pid, handle) -> name the probes learned (the `names` map)
        # (pid, function or kernel handle) -> kernel name, from cuModuleGetFunction,
        # cuLibraryGetKernel, cuKernelGetFunction and cuFuncGetName events.
        self.handle_names: Dict[Tuple[int, int], str] = {}
        # (pid, cudaKernel_t) -> the host stub's address, from __cudaGetKernel.
        self.handle_funcs: Dict[Tuple[int, int], int] = {}
        self._func_cells: Dict[int, Set[int]] = {}  # cell of `func` → launch rows with it
        for fn_id, api in enumerate(table):
            for arg, cell in arg_cells(api):
                if arg.name == "func" and api.category == "launch":
                    self._func_cells.setdefault(cell, set()).add(fn_id)
        self._launch_ids = set().union(*self._func_cells.values())
        self._comms: Dict[bytes, str] = {}

    def comm(self, raw: bytes) -> str:
        """The process name of a record's comm field (kept per raw value)."""
        name = self._comms.get(raw)
        if name is None:
            name = self._comms[raw] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        return name

    def decode_frames(self, frames: bytes) -> Iterator[Event]:
        """Events of a batch of ring frames (8-byte header + record, back to back)."""
        return iter(self.decode_batch(frames))

    def decode_batch(self, frames: bytes, only: Optional[Set[int]] = None) -> List[Event]:
        """The events of a batch of ring frames, as a list (the fast path); with `only`,
        just the records of those function ids (the others are not decoded at all)."""
        if len(frames) % _FRAME.size:
            raise DecodeError("a batch of %d bytes is not a whole number of %d-byte frames"
                              % (len(frames), _FRAME.size))
        events: List[Event] = []
        add = events.extend
        if only is None:
            for fields in _FRAME.iter_unpack(frames):
                add(self.events_of(fields))
            return events
        ids = record.frame_column(frames, record.FN_ID, "H")
        if only.isdisjoint(ids):  # the usual batch: nothing to decode (one pass in C)
            return events
        for i, fn_id in enumerate(ids):
            if fn_id in only:
                add(self.events_of(_FRAME.unpack_from(frames, i * _FRAME.size)))
        return events

    def launch_keys(self, frames: bytes) -> Set[Tuple[int, int, int]]:
        """(fn_id, pid, func) of every launch record in a batch of frames, read in bulk
        without decoding the records (for naming kernels when nothing else is decoded)."""
        ids = record.frame_column(frames, record.FN_ID, "H")
        keys: Set[Tuple[int, int, int]] = set()
        if self._launch_ids.isdisjoint(ids):
            return keys
        pids = record.frame_column(frames, record.PID_TGID + 4, "I")  # the tgid half
        for cell, fn_ids in self._func_cells.items():
            funcs = record.frame_column(frames, record.ARGS + 8 * cell, "Q")
            keys.update((i, p, f) for i, p, f in zip(ids, pids, funcs) if i in fn_ids)
        return keys

    def decode_record(self, payload: bytes) -> List[Event]:
        """Events of one record (payload only)."""
        if len(payload) != record.SIZE:
            raise DecodeError("a record has %d bytes, expected %d" % (len(payload), record.SIZE))
        return self.events_of(record.LAYOUT.unpack(payload))

    def events_of(self, fields: tuple) -> List[Event]:
        """Events of one unpacked record (fields as `record.LAYOUT` gives them)."""
        ts_enter, ts_exit, tid, pid, fn_id, phase, flags, stack_id, comm = fields[:9]
        if phase == record.PHASE_HELLO:
            return []  # a thread's first traced call began: nothing to show
        try:
            row = self.rows[fn_id]
        except IndexError:
            raise DecodeError("record with unknown function id %d" % fn_id) from None
        args, comm_s, offset = row.decode_args(fields), self.comm(comm), self.clock_offset_ns
        enter = Event((ts_enter + offset) / 1e9, ts_enter, pid, tid, comm_s, row.name, ENTER,
                      args)
        if phase == record.PHASE_ENTER:
            return [enter]
        if phase != record.PHASE_CALL:
            raise DecodeError("record with unknown phase %d" % phase)
        ret = fields[_RET_AT] & 0xFFFFFFFF
        outs, faults = row.decode_outs(fields, flags) if ret == 0 else ({}, ())
        if ret == 0 and row.learns:
            self._learn(row.api, pid, args, outs)
        done = Event((ts_exit + offset) / 1e9, ts_exit, pid, tid, comm_s, row.name, EXIT,
                     args, ret, row.ret_name(ret), ts_exit - ts_enter, outs, faults, stack_id)
        # With --entries the enter event already came from its own record.
        return [done] if flags & record.FLAG_ENTRY_SENT else [enter, done]

    def _learn(self, api: Api, pid: int, args: Dict[str, Any], outs: Dict[str, Any]) -> None:
        """Remember which kernel name a handle stands for (and show it as out `kernel_name`)."""
        if api.learn_func is not None:
            handle, address = outs.get(api.learn_func[0]), args.get(api.learn_func[1])
            if handle and address:
                self.handle_funcs[(pid, handle)] = address
        elif api.learn_name is not None:
            handle = outs.get(api.learn_name[0], args.get(api.learn_name[0]))
            name = self.names(pid, handle) if self.names and handle is not None else None
            if name:
                outs["kernel_name"] = name
                self.handle_names[(pid, handle)] = name
        elif api.learn_alias is not None:
            new, known = api.learn_alias
            name = self.handle_names.get((pid, args.get(known, outs.get(known))))
            if name and outs.get(new):
                self.handle_names[(pid, outs[new])] = name

    def handle_func(self, pid: int, handle: int) -> Optional[int]:
        """The host stub address a cudaKernel_t of process `pid` stands for, if learned."""
        return self.handle_funcs.get((pid, handle))

    def handle_name(self, pid: int, handle: int) -> Optional[str]:
        """The kernel name of a CUfunction/CUkernel handle of process `pid`, if learned."""
        return self.handle_names.get((pid, handle))
