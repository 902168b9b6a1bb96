"""Event records and ring frames made by hand, for the tests that feed the decoder, the
writers, the savefile, the flight recorder... without probes. Built from the layout in
ebpf_cuda/spec/record.py (the one the probes and the decoder share), never a copy of it.

- `pack_record`: one record, by field (defaults: a complete call of process 42, "app");
- `pack_frame`: the same record as the ring hands it over (header + record);
- `frame_of`: any record bytes (a damaged or older one too) behind a ring header;
- `with_fields`: record bytes with some fields overwritten and every other byte kept (noise
  for the fuzz tests).
"""
import struct
from typing import Optional, Sequence, Tuple, Union

from ebpf_cuda.spec import apis, record

TOOK_NS = 700  # a call's default duration: its exit time is its entry time plus this


def pack_record(fn: Union[str, int], ts: int = 0, args: Sequence[int] = (), ret: int = 0,
                outs: Sequence[int] = (), *, exit_ts: Optional[int] = None,
                phase: int = record.PHASE_CALL, flags: int = 0, pid: int = 42,
                tid: Optional[int] = None, comm: bytes = b"app", stack_id: int = 0,
                py_stack: int = 0) -> bytes:
    """One record of function `fn` (its name in apis.TABLE, or any function id: HELLO_FN, one
    past the table...) entered at `ts`; argument and out-parameter cells not given are 0, the
    exit time is `ts + TOOK_NS` unless given, the thread is the process's main one (tid = pid)
    unless given."""
    fn_id = apis.FN_ID[fn] if isinstance(fn, str) else fn
    cells = list(args) + [0] * (record.ARG_CELLS - len(args))
    out_cells = list(outs) + [0] * (record.OUT_CELLS - len(outs))
    return record.LAYOUT.pack(ts, ts + TOOK_NS if exit_ts is None else exit_ts,
                              pid if tid is None else tid, pid, fn_id, phase, flags, stack_id,
                              comm, *cells, ret, *out_cells, py_stack)


def frame_of(payload: bytes) -> bytes:
    """`payload` as one ring frame: the ring's 8-byte header (length, page offset) before it."""
    return struct.pack("<II", len(payload), 0) + payload


def pack_frame(fn: Union[str, int], ts: int = 0, args: Sequence[int] = (), ret: int = 0,
               outs: Sequence[int] = (), **fields) -> bytes:
    """One ring frame of `pack_record(fn, ts, args, ret, outs, **fields)`."""
    return frame_of(pack_record(fn, ts, args, ret, outs, **fields))


def with_fields(raw: bytes, fn_id: Optional[int] = None, phase: Optional[int] = None,
                ret: Optional[int] = None, flags: Optional[int] = None,
                comm: Optional[bytes] = None, ts: Optional[Tuple[int, int]] = None) -> bytes:
    """`raw` (a record's bytes) with the fields given overwritten at their offsets and every
    other byte as it was; `ts` is (entry, exit), `comm` may be shorter than the field."""
    out = bytearray(raw)
    if fn_id is not None:
        struct.pack_into("<H", out, record.FN_ID, fn_id)
    if phase is not None:
        out[record.PHASE] = phase
    if ret is not None:
        struct.pack_into("<Q", out, record.RET, ret)
    if flags is not None:
        out[record.FLAGS] = flags
    if comm is not None:
        out[record.COMM:record.COMM + len(comm)] = comm
    if ts is not None:
        struct.pack_into("<QQ", out, record.TS_ENTER, *ts)
    return bytes(out)
