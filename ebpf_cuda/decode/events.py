"""Record bytes → typed events.

A complete-call record becomes two events, `enter` and `exit`, so that consumers see the
seed tool's two lines per call; the exit event carries the return value, out-parameters and
duration. Enter records (return probes off, or --entries) become one `enter` event.
Field names are the JSON keys (see `Event.to_json`).
"""
import struct
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..errors import DecodeError
from ..spec import record
from ..spec.apis import TABLE, Api, Kind, arg_cells
from ..spec.cuda_enums import error_name
from ..value_class import ValueClass
# How values are decoded and shown lives in values.py; these names stay importable from here.
from .values import ARGS_AT as _ARGS_AT
from .values import LAUNCH_CONFIG_FIELDS
from .values import RET_AT as _RET_AT
from .values import (arg_fields, compile_dict, compile_tuple, decode_launch_config, decode_value,
                     field_kinds, jsonable, out_fields)

ENTER = "enter"
EXIT = "exit"

_FRAME = struct.Struct("=8x" + record.LAYOUT.format.lstrip("<=@!>"))  # header + payload
_OUT_FAULTS = record.FLAG_OUT0_FAULT | record.FLAG_OUT1_FAULT
_NS = 1_000_000_000  # ns a second (an int: see events_of)


class PyFrame(NamedTuple):
    """One Python frame of the thread that made a call (pystacks.py): the file, the line
    executing in it (None when the line table does not say) and the function's qualified
    name (its plain name before Python 3.11, whose code objects have no qualified name)."""

    file: str
    line: Optional[int]
    function: str

    def to_json(self) -> Dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}


class Event(ValueClass):
    """One CUDA call seen at entry or exit. `ts` is wall-clock seconds, `ts_ns` the kernel's
    CLOCK_MONOTONIC time, `wall_ns` the wall-clock time in ns when the decoder made it (JSON
    lines write `ts` from it, to the nanosecond); `args` are the entry arguments by name; at
    exit `ret`/`ret_name`, `duration_ns` and the out-parameters (`outs`) are set."""

    ts: float
    ts_ns: int
    pid: int
    tid: int
    comm: str
    api: str
    phase: str
    args: Dict[str, Any]
    ret: Optional[int]
    ret_name: Optional[str]
    duration_ns: Optional[int]
    outs: Dict[str, Any]
    faults: Tuple[str, ...]  # out-parameters whose read failed (bad or NULL pointer)
    stack_id: int  # with --stacks: 1 + the id of the caller's user stack, else 0
    container: Optional[str]  # the process's container id (containers.py), if any
    device: Optional[int]  # the GPU the call targets (devices.py), when known
    # With --py-stacks: the key of the thread's Python stack in the record (0: none) and the
    # stack itself, innermost frame first (pystacks.py sets it; None: no Python frames)
    py_stack_id: int
    py_stack: Optional[Tuple[PyFrame, ...]]
    wall_ns: Optional[int]

    def __init__(self, ts: float, ts_ns: int, pid: int, tid: int, comm: str, api: str,
                 phase: str, args: Dict[str, Any], ret: Optional[int] = None,
                 ret_name: Optional[str] = None, duration_ns: Optional[int] = None,
                 outs: Optional[Dict[str, Any]] = None, faults: Tuple[str, ...] = (),
                 stack_id: int = 0, container: Optional[str] = None,
                 device: Optional[int] = None, py_stack_id: int = 0,
                 py_stack: Optional[Tuple[PyFrame, ...]] = None,
                 wall_ns: Optional[int] = None) -> None:
        # (written out: one is made per event where events are decoded)
        self.ts, self.ts_ns, self.pid, self.tid, self.comm = ts, ts_ns, pid, tid, comm
        self.api, self.phase, self.args = api, phase, args
        self.ret, self.ret_name, self.duration_ns = ret, ret_name, duration_ns
        self.outs = {} if outs is None else outs
        self.faults, self.stack_id = faults, stack_id
        self.container, self.device = container, device
        self.py_stack_id, self.py_stack, self.wall_ns = py_stack_id, py_stack, wall_ns

    def to_json(self) -> Dict[str, Any]:
        """The JSON object of this event: out-parameters become top-level keys."""
        obj = {"ts": self.ts, "pid": self.pid, "tid": self.tid, "comm": self.comm}
        if self.container:
            obj["container"] = self.container
        if self.device is not None and "device" not in self.outs and "device" not in self.faults:
            obj["device"] = self.device  # (a `device` out-parameter is the key there)
        obj.update(api=self.api, phase=self.phase, args=jsonable(self.args))
        if self.phase == EXIT:
            obj.update(ret=self.ret, ret_name=self.ret_name, duration_ns=self.duration_ns)
            obj.update(jsonable(self.outs))
            if self.faults:
                obj["faults"] = list(self.faults)
        if self.py_stack is not None:
            obj["py_stack"] = [frame.to_json() for frame in self.py_stack]
        return obj


class _RowDecoder:
    """Precomputed decoding of one row: its values' expressions (values.py) compiled into
    one function for the arguments and one for the out-parameters."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.name = api.name
        self.decode_args: Callable[[Sequence[int]], Dict[str, Any]] = compile_dict(
            arg_fields(api))  # in declaration order
        outs = out_fields(api)
        self._outs = compile_dict(outs)
        self._out_values = compile_tuple(outs)
        self._out_names = [f.name for f in outs]
        self.learns = any((api.learn_name, api.learn_func, api.learn_alias))
        self._ret_names: Dict[int, str] = {}

    def decode_outs(self, fields: Sequence[int], flags: int) -> Tuple[dict, tuple]:
        """Out-parameters of a successful call; those whose read faulted are named apart."""
        if not flags & _OUT_FAULTS:
            return self._outs(fields), ()
        outs, faults = {}, []
        for j, (name, value) in enumerate(zip(self._out_names, self._out_values(fields))):
            if flags & (record.FLAG_OUT0_FAULT << j):
                faults.append(name)
            else:
                outs[name] = value
        return outs, tuple(faults)

    def ret_name(self, ret: int) -> str:
        name = self._ret_names.get(ret)
        if name is None:
            name = self._ret_names[ret] = error_name(ret, self.api.library)
        return name


def wall_minus_monotonic_ns(samples: int = 8) -> int:
    """Wall-clock minus CLOCK_MONOTONIC (the probes' clock), from the tightest of a few
    monotonic-wall-monotonic brackets: a single pair of reads is off by as long as the
    thread was preempted between them (10 ms seen on a loaded emulated machine)."""
    best = None
    for _ in range(samples):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    return best[1]


_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


def _name_offset(api: Api) -> int:
    """Offset in the record of the cell that points at a learn_name row's name."""
    assert api.learn_name is not None
    field = api.learn_name[1]
    for j, out in enumerate(api.outs):
        if out.name == field:
            return record.OUTS + 8 * j
    return next(record.ARGS + 8 * cell for arg, cell in arg_cells(api) if arg.name == field)


class Decoder:
    """Turns ring-buffer records into events. `clock_offset_ns` is wall-clock minus
    CLOCK_MONOTONIC, measured once when tracing starts."""

    def __init__(self, table: Sequence[Api] = TABLE,
                 clock_offset_ns: Optional[int] = None) -> None:
        if clock_offset_ns is None:
            clock_offset_ns = wall_minus_monotonic_ns()
        self.clock_offset_ns = clock_offset_ns
        self.table = list(table)
        # Each row's decoder compiled at its first record (all 158 rows: ~55 ms of start-up)
        self.rows: List[Optional[_RowDecoder]] = [None] * len(self.table)
        self._func_cells: Dict[int, Set[int]] = {}  # cell of `func` → launch rows with it
        for fn_id, api in enumerate(table):
            for arg, cell in arg_cells(api):
                # (a graph's kernel node is a launch to be: named the same way; its `func`
                # is the first cell of its parameters)
                if (arg.name == "func" and api.category == "launch") \
                        or arg.kind == Kind.KERNEL_NODE:
                    self._func_cells.setdefault(cell, set()).add(fn_id)
        self._launch_ids = set().union(*self._func_cells.values())
        self._caller_cells = {fn_id: cell for fn_id, api in enumerate(table)
                              for arg, cell in arg_cells(api) if arg.kind == Kind.CALLER}
        self._name_at = {fn_id: _name_offset(api) for fn_id, api in enumerate(table)
                         if api.learn_name is not None}  # fn_id -> record offset of its name
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
        if only.isdisjoint(record.frame_ids(frames)):  # the usual batch: nothing to decode
            return events
        ids = record.frame_column(frames, record.FN_ID, "H")
        for i, fn_id in enumerate(ids):
            if fn_id in only:
                add(self.events_of(_FRAME.unpack_from(frames, i * _FRAME.size)))
        return events

    def launch_keys(self, frames: bytes) -> Set[Tuple[int, int, int]]:
        """(fn_id, pid, func) of every launch record in a batch of frames."""
        return {(launch[0], launch[1], launch[5]) for launch in self.launches(frames)}

    def launches(self, frames: bytes) -> List[Tuple[int, int, int, int, int, int, int]]:
        """(fn_id, pid, tid, entry time, exit time, func, caller or 0) of every launch record
        in a batch of frames, in order, read in bulk without decoding the records (for naming
        kernels when nothing else is decoded)."""
        if self._launch_ids.isdisjoint(record.frame_ids(frames)):
            return []
        ids = record.frame_column(frames, record.FN_ID, "H")
        tids = record.frame_column(frames, record.PID_TGID, "I")
        pids = record.frame_column(frames, record.PID_TGID + 4, "I")  # the tgid half
        enters = record.frame_column(frames, record.TS_ENTER, "Q")
        exits = record.frame_column(frames, record.TS_EXIT, "Q")
        callers = {cell: record.frame_column(frames, record.ARGS + 8 * cell, "Q")
                   for cell in set(self._caller_cells.values())}
        found = []
        for cell, fn_ids in self._func_cells.items():
            funcs = record.frame_column(frames, record.ARGS + 8 * cell, "Q")
            for i, fn_id in enumerate(ids):
                if fn_id in fn_ids:
                    caller = self._caller_cells.get(fn_id)
                    found.append((i, fn_id, pids[i], tids[i], enters[i], exits[i], funcs[i],
                                  callers[caller][i] if caller is not None else 0))
        return [launch[1:] for launch in sorted(found)]

    def name_pointers(self, frames: bytes) -> Dict[Tuple[int, int], Tuple[int, bool]]:
        """(tid, exit time) -> (where the name was, whether the probe could not read it) of
        each teaching call of a batch that gives a name (learn_name rows): the record keeps
        the pointer, for names.py to read the name where it lies when the probe could not."""
        ids = record.frame_column(frames, record.FN_ID, "H")
        found: Dict[Tuple[int, int], Tuple[int, bool]] = {}
        for i, fn_id in enumerate(ids):
            offset = self._name_at.get(fn_id)
            if offset is not None:
                at = i * record.FRAME_SIZE + record.FRAME_HEADER
                tid, exit_, pointer = (_U32.unpack_from(frames, at + record.PID_TGID)[0],
                                       _U64.unpack_from(frames, at + record.TS_EXIT)[0],
                                       _U64.unpack_from(frames, at + offset)[0])
                found[(tid, exit_)] = (pointer,
                                       bool(frames[at + record.FLAGS] & record.FLAG_NAME_UNREAD))
        return found

    def decode_record(self, payload: bytes) -> List[Event]:
        """Events of one record (payload only)."""
        if len(payload) != record.SIZE:
            raise DecodeError("a record has %d bytes, expected %d" % (len(payload), record.SIZE))
        return self.events_of(record.LAYOUT.unpack(payload))

    def _row(self, fn_id: int) -> _RowDecoder:
        row = self.rows[fn_id] = _RowDecoder(self.table[fn_id])
        return row

    def events_of(self, fields: tuple) -> List[Event]:
        """Events of one unpacked record (fields as `record.LAYOUT` gives them)."""
        ts_enter, ts_exit, tid, pid, fn_id, phase, flags, stack_id, comm = fields[:9]
        py_stack_id = fields[-1]
        if phase == record.PHASE_HELLO:
            return []  # a thread's first traced call began: nothing to show
        try:
            row = self.rows[fn_id] or self._row(fn_id)
        except IndexError:
            raise DecodeError("record with unknown function id %d" % fn_id) from None
        args, comm_s, offset = row.decode_args(fields), self.comm(comm), self.clock_offset_ns
        # (ts: the int divided, the float nearest the exact time, as JSON's digits read)
        enter = Event((ts_enter + offset) / _NS, ts_enter, pid, tid, comm_s, row.name, ENTER,
                      args, py_stack_id=py_stack_id, wall_ns=ts_enter + offset)
        if phase == record.PHASE_ENTER:
            return [enter]
        if phase != record.PHASE_CALL:
            raise DecodeError("record with unknown phase %d" % phase)
        ret = fields[_RET_AT] & 0xFFFFFFFF
        outs, faults = row.decode_outs(fields, flags) if ret == 0 else ({}, ())
        done = Event((ts_exit + offset) / _NS, ts_exit, pid, tid, comm_s, row.name, EXIT,
                     args, ret, row.ret_name(ret), ts_exit - ts_enter, outs, faults, stack_id,
                     py_stack_id=py_stack_id, wall_ns=ts_exit + offset)
        # With --entries the enter event already came from its own record.
        return [done] if flags & record.FLAG_ENTRY_SENT else [enter, done]
