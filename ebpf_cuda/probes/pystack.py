"""The Python stack walk of an entry probe (--py-stacks), and its contract with pystacks.py.

At each traced call's entry, when the process is in `pyprocs` (its interpreter was read by
pystacks.py: where `_PyRuntime` lies, and the offsets of its version), the probe
- finds the thread's PyThreadState: cached in `pythreads` by pid_tgid, checked by its
  `thread_id` (pthread_self(): x86-64's fs base from task_struct; arm64's thread pointer
  less the process's `thread_below_tp`, from its C library), else found by
  walking the main interpreter's list of thread states;
- walks its frames innermost first, with one bpf_probe_read_user of each frame, keeping
  (code object, raw instruction value) pairs; frames that run no Python code (3.12+'s
  C-stack shims, anywhere C calls Python) are kept as code 0 (pystacks.py leaves them out);
- hashes the pairs with the tgid into the stack's key (the record's PY_STACK field);
- the first time a key is seen (`pyseen`) sends the stack to the `pystacks` ring, and
  for each code object not sent yet (`pycodes`) its file name, (qualified) name, first
  line and line table, read from the objects themselves.
Nothing here knows a Python version: the offsets come from the process's `pyprocs` value.
Fields are read at offsets from that value within one read window, masked so that the
verifier sees every access inside the scratch value.
"""
import struct
from typing import List

from .. import asm
from ..arch import current as current_arch
from ..asm import DW, FP, R0, R1, R2, R3, R4, R5, R7, R8, R9, B, Helper, W
from ..spec import layout, record

MAX_FRAMES = 64  # frames kept per stack, innermost first
MAX_THREADS = 32  # thread states looked at to find a thread's own
THREAD_SLOTS = 16384  # `pythreads`: (pid_tgid, thread state) by tid
SEEN_SLOTS = 65536  # `pyseen`: the keys of stacks sent, by key
MAX_FILENAME = 512  # bytes of a file name kept (a longer one is cut)
MAX_NAME = 256
MAX_LINETABLE = 8192  # bytes of a line table kept (lines of a longer one are unknown, not guessed)
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
NONE = 0xFFFFFFFF  # an offset that does not apply (cframe before 3.11 and from 3.13)

# The `pyprocs` value: the process's _PyRuntime address, the mask clearing frame_code's tag
# bits, then u32 offsets (names as in python_layouts.Layout), and the registration's
# number: in the keys of stacks and code objects, so that a pid used again (or a process
# after an exec) never reuses what was sent of another program.
PROC_FIELDS = (
    "runtime_interpreters_head", "interp_threads_head", "tstate_next", "tstate_thread_id",
    "tstate_frame", "cframe_current_frame", "frame_previous", "frame_code", "frame_instr",
    "frame_owner", "frame_owner_skip", "frame_window", "code_filename", "code_name",
    "code_linetable", "code_firstlineno", "code_window", "unicode_length", "unicode_state",
    "unicode_ascii_size", "unicode_compact_size", "bytes_size", "bytes_data", "generation",
    # One read of a thread state covers the fields a walk needs: from `tstate_window` on,
    # the thread id, the frame (or cframe) pointer and the data stack chunk (NONE before
    # 3.11) at these offsets in it.
    "tstate_window", "window_thread_id", "window_frame", "window_chunk",
    # How far pthread_self() lies below the thread pointer (arm64; 0 on x86-64).
    "thread_below_tp")
PROC = struct.Struct("<QQ%dI" % len(PROC_FIELDS))
PROC_RUNTIME, PROC_TAG_MASK = 0, 8
PROC_AT = {name: 16 + 4 * i for i, name in enumerate(PROC_FIELDS)}

# Records of the `pystacks` ring (u32 type first).
STACK_RECORD, CODE_RECORD = 1, 2
STACK_TRUNCATED = 1 << 31  # in the frame count: the walk stopped before the outermost frame
STACK_HEAD = struct.Struct("<IIQQ")  # type, frames, pid_tgid, key; then (code, instr) pairs
FRAME = struct.Struct("<QQ")
CODE_HEAD = struct.Struct("<IiQQIIIIII")  # type, first line, pid_tgid, code address, file
#   name's state and bytes, name's state and bytes, line table bytes read and its length;
#   then the data:
CODE_FILENAME_AT = CODE_HEAD.size
CODE_NAME_AT = CODE_FILENAME_AT + MAX_FILENAME
CODE_LINETABLE_AT = CODE_NAME_AT + MAX_NAME

# The per-CPU scratch value: the stack record being built, variables, a read window, the
# code record being built.
S_FRAMES = STACK_HEAD.size
S_VARS = S_FRAMES + FRAME.size * MAX_FRAMES
(S_FRAME, S_HASH, S_FSBASE, S_TSTATE, S_TMP, S_TMP2, S_LINETABLE, S_FILENAME, S_NAME,
 S_BULK_BASE, S_BULK_SIZE) = (S_VARS + 8 * i for i in range(11))
S_WINDOW = S_VARS + 8 * 11
WINDOW = 264  # a 256-byte read, and room for an 8-byte load at any offset below 256
S_TWINDOW = S_WINDOW + WINDOW  # the thread state's window
# From 3.11 frames lie one after the other in the thread's data stack: one read of the
# BULK bytes below the innermost frame holds the frames of most stacks, each then copied
# from it (FRAME_COPY bytes) instead of read alone.
BULK = 8192
FRAME_COPY = 128
CHUNK_DATA = 24  # offsetof(_PyStackChunk, data): previous, size, top
S_BULK = S_TWINDOW + WINDOW
S_CODE = S_BULK + BULK + FRAME_COPY + 8
SCRATCH_SIZE = S_CODE + CODE_LINETABLE_AT + MAX_LINETABLE

Items = List[object]


def walk(fsbase_offset: int, pid_tgid: Items) -> Items:
    """Instructions (R6 = ctx, kept): fp[PY_STACK_AT] = the calling thread's Python stack
    key, or 0. `fsbase_offset`: where task_struct keeps the thread pointer; `pid_tgid`:
    instructions leaving the thread's pid_tgid in R0."""
    prog: Items = [asm.st(DW, FP, layout.PY_STACK_AT, 0)]
    prog += pid_tgid + [
        asm.stx(DW, FP, layout.PY_KEY_AT, R0), asm.rsh(R0, 32),
        asm.stx(DW, FP, layout.PY_KEY_AT + 8, R0),
        asm.ld_map(R1, layout.PY_PROCS), asm.mov(R2, FP), asm.add(R2, layout.PY_KEY_AT + 8),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "py_done"), asm.mov(R7, R0),
        # the process's key: tgid | generation << 32 (fp[PY_KEY_AT + 8], u64)
        asm.ldx(W, R1, R7, PROC_AT["generation"]), asm.lsh(R1, 32),
        asm.ldx(DW, R2, FP, layout.PY_KEY_AT), asm.rsh(R2, 32), asm.or_(R1, R2),
        asm.stx(DW, FP, layout.PY_KEY_AT + 8, R1),
        asm.st(W, FP, layout.PY_CODE_KEY_AT, 0),
        asm.ld_map(R1, layout.PY_SCRATCH), asm.mov(R2, FP), asm.add(R2, layout.PY_CODE_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "py_done"), asm.mov(R8, R0),
        asm.st(W, R8, 0, STACK_RECORD),
        asm.ldx(DW, R1, FP, layout.PY_KEY_AT), asm.stx(DW, R8, 8, R1),
        asm.call(Helper.GET_CURRENT_TASK), asm.mov(R3, R0), asm.add(R3, fsbase_offset),
        asm.mov(R1, R8), asm.add(R1, S_FSBASE), asm.mov(R2, 8),
        asm.call(Helper.PROBE_READ_KERNEL), asm.jne(R0, 0, "py_done"),
    ]
    if current_arch().thread_self_symbol is not None:  # (pthread_self() below the pointer)
        prog += [asm.ldx(DW, R1, R8, S_FSBASE), asm.ldx(W, R2, R7, PROC_AT["thread_below_tp"]),
                 asm.sub(R1, R2), asm.stx(DW, R8, S_FSBASE, R1)]
    # (the loop over code objects leaves by jumps only: py_lost follows it)
    return (prog + _thread_state() + _frames() + _send_stack() + _send_codes()
            + [asm.Label("py_lost")] + _count_lost("stack") + [asm.Label("py_done")])


def _read(dst_at: int, size: int, src_var: int, field: str) -> Items:
    """scratch[dst_at] = size bytes read at scratch[src_var] + the process's `field` offset;
    jump to py_done when the read fails."""
    return [
        asm.mov(R1, R8), asm.add(R1, dst_at), asm.mov(R2, size),
        asm.ldx(DW, R3, R8, src_var), asm.ldx(W, R4, R7, PROC_AT[field]), asm.add(R3, R4),
        asm.call(Helper.PROBE_READ_USER), asm.jne(R0, 0, "py_done"),
    ]


def _thread_state() -> Items:
    """scratch[S_TSTATE] = this thread's PyThreadState and S_TWINDOW its window (one read),
    or jump to py_done. The cache `pythreads` is an array indexed by tid (a lookup the
    verifier inlines) of (pid_tgid, thread state); its thread state's thread_id is checked
    at every use (a thread state may be freed and another made for the thread)."""
    slot, spill = layout.PY_CODE_KEY_AT, layout.PY_CODE_KEY_AT + 8
    return [
        asm.ldx(DW, R1, FP, layout.PY_KEY_AT), asm.and_(R1, THREAD_SLOTS - 1),
        asm.stx(W, FP, slot, R1),
        asm.ld_map(R1, layout.PY_THREADS), asm.mov(R2, FP), asm.add(R2, slot),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "py_done"),
        asm.stx(DW, FP, spill, R0),
        asm.ldx(DW, R1, R0, 0), asm.ldx(DW, R2, FP, layout.PY_KEY_AT),
        asm.jne(R1, R2, "py_find"),
        asm.ldx(DW, R1, R0, 8), asm.stx(DW, R8, S_TSTATE, R1),
    ] + _tstate_window("py_find") + [
        asm.ja("py_have_tstate"),
        asm.Label("py_find"),
        asm.ldx(DW, R1, R7, PROC_RUNTIME), asm.stx(DW, R8, S_TMP, R1),
    ] + _read(S_TMP, 8, S_TMP, "runtime_interpreters_head") \
      + _read(S_TSTATE, 8, S_TMP, "interp_threads_head") + [
        asm.mov(R9, 0),
        asm.Label("py_thread_loop"),
        asm.jge(R9, MAX_THREADS, "py_done"),
        asm.ldx(DW, R1, R8, S_TSTATE), asm.jeq(R1, 0, "py_done"),
    ] + _read(S_TMP, 8, S_TSTATE, "tstate_thread_id") + [
        asm.ldx(DW, R1, R8, S_TMP), asm.ldx(DW, R2, R8, S_FSBASE),
        asm.jeq(R1, R2, "py_found"),
    ] + _read(S_TSTATE, 8, S_TSTATE, "tstate_next") + [
        asm.add(R9, 1), asm.ja("py_thread_loop"),
        asm.Label("py_found"),
        asm.ldx(DW, R1, FP, spill), asm.ldx(DW, R2, FP, layout.PY_KEY_AT),
        asm.stx(DW, R1, 0, R2), asm.ldx(DW, R2, R8, S_TSTATE), asm.stx(DW, R1, 8, R2),
        asm.st(DW, FP, spill, 0),
    ] + _tstate_window("py_done") + [
        asm.Label("py_have_tstate"),
        asm.st(DW, FP, spill, 0),  # (no map pointer left on the stack: fewer states to verify)
    ]


def _tstate_window(fail: str) -> Items:
    """S_TWINDOW = the window of the thread state at S_TSTATE, whose thread id must be this
    thread's pthread_self(); else jump to `fail`."""
    return [
        asm.mov(R1, R8), asm.add(R1, S_TWINDOW), asm.mov(R2, 256),
        asm.ldx(DW, R3, R8, S_TSTATE), asm.ldx(W, R4, R7, PROC_AT["tstate_window"]),
        asm.add(R3, R4), asm.call(Helper.PROBE_READ_USER), asm.jne(R0, 0, fail),
    ] + _twindow_field(R1, "window_thread_id") + [
        asm.ldx(DW, R2, R8, S_FSBASE), asm.jne(R1, R2, fail),
    ]


def _twindow_field(dst, field: str) -> Items:
    """dst = the u64 at the process's `field` offset in the thread state's window."""
    return [asm.ldx(W, dst, R7, PROC_AT[field]), asm.and_(dst, 0xF8), asm.add(dst, R8),
            asm.ldx(DW, dst, dst, S_TWINDOW)]


def _window_field(dst, field: str, mask: int, size=DW) -> Items:
    """dst = the field at the process's `field` offset in the read window."""
    return [asm.ldx(W, R1, R7, PROC_AT[field]), asm.and_(R1, mask), asm.add(R1, R8),
            asm.ldx(size, dst, R1, S_WINDOW)]


def _frames() -> Items:
    """The walk: (code, instr) pairs at S_FRAMES, their count at 4, their hash at S_HASH."""
    prog: Items = _twindow_field(R1, "window_frame") + [
        asm.stx(DW, R8, S_FRAME, R1),
        asm.ldx(W, R4, R7, PROC_AT["cframe_current_frame"]),
        asm.jeq32(R4, -1, "py_walk"),  # (NONE: the thread state points at the frame)
        asm.ldx(DW, R3, R8, S_FRAME), asm.jeq(R3, 0, "py_done"), asm.add(R3, R4),
        asm.mov(R1, R8), asm.add(R1, S_FRAME), asm.mov(R2, 8),
        asm.call(Helper.PROBE_READ_USER), asm.jne(R0, 0, "py_done"),
        asm.Label("py_walk"),
    ] + _bulk() + [
        asm.ld_imm64(R1, FNV_OFFSET), asm.stx(DW, R8, S_HASH, R1),
        asm.mov(R9, 0),
        asm.Label("py_frame_loop"),
        asm.jge(R9, MAX_FRAMES, "py_walked"),
        asm.ldx(DW, R3, R8, S_FRAME), asm.jeq(R3, 0, "py_walked"),
    ] + _frame_window() + _window_field(R2, "frame_code", 0xF8) + [
        asm.ldx(DW, R3, R7, PROC_TAG_MASK), asm.and_(R2, R3)]
    prog += _window_field(R4, "frame_owner", 0xFF, B) + [
        asm.ldx(W, R5, R7, PROC_AT["frame_owner_skip"]),
        # (owners from frame_owner_skip up run no Python code: 3.12's C-stack shims, 3.14's
        # interpreter and C-stack frames)
        asm.jlt(R4, R5, "py_code_kept"), asm.mov(R2, 0), asm.Label("py_code_kept")]
    prog += _window_field(R3, "frame_instr", 0xFC)
    prog += [
        asm.mov(R1, R9), asm.lsh(R1, 4), asm.add(R1, R8),
        asm.stx(DW, R1, S_FRAMES, R2), asm.stx(DW, R1, S_FRAMES + 8, R3),
        asm.ldx(DW, R4, R8, S_HASH), asm.xor(R4, R2), asm.ld_imm64(R5, FNV_PRIME),
        asm.mul(R4, R5), asm.xor(R4, R3), asm.mul(R4, R5), asm.stx(DW, R8, S_HASH, R4),
    ]
    prog += _window_field(R2, "frame_previous", 0xF8) + [
        asm.stx(DW, R8, S_FRAME, R2),
        asm.add(R9, 1), asm.ja("py_frame_loop"),
        asm.Label("py_walked"),
        asm.jeq(R9, 0, "py_done"),
        asm.ldx(DW, R1, R8, S_FRAME), asm.jeq(R1, 0, "py_whole"),
        asm.or_(R9, STACK_TRUNCATED),
        asm.Label("py_whole"),
        asm.stx(W, R8, 4, R9),
    ]
    return prog


def _bulk() -> Items:
    """From 3.11: S_BULK = the bytes of the data stack chunk below the innermost frame, up
    to BULK of them, in one read (S_BULK_BASE, S_BULK_SIZE say where; size 0: none)."""
    return [
        asm.st(DW, R8, S_BULK_SIZE, 0),
        asm.ldx(W, R1, R7, PROC_AT["window_chunk"]), asm.jeq32(R1, -1, "py_bulk_done"),
    ] + _twindow_field(R1, "window_chunk") + [
        asm.jeq(R1, 0, "py_bulk_done"), asm.add(R1, CHUNK_DATA),  # the chunk's first frame
        asm.ldx(DW, R3, R8, S_FRAME), asm.add(R3, FRAME_COPY),  # the end of the read
        asm.mov(R2, R3), asm.sub(R2, BULK),
        asm.jge(R2, R1, "py_bulk_base"), asm.mov(R2, R1),  # (no lower than the chunk's data)
        asm.Label("py_bulk_base"),
        asm.stx(DW, R8, S_BULK_BASE, R2),
        asm.sub(R3, R2),  # the size: at most BULK (unsigned: an innermost frame below the
        asm.jgt(R3, BULK, "py_bulk_done"),  # chunk's data reads nothing)
        asm.stx(DW, R8, S_BULK_SIZE, R3),
        asm.mov(R1, R8), asm.add(R1, S_BULK), asm.mov(R2, R3), asm.ldx(DW, R3, R8, S_BULK_BASE),
        asm.call(Helper.PROBE_READ_USER), asm.jeq(R0, 0, "py_bulk_done"),
        asm.st(DW, R8, S_BULK_SIZE, 0),
        asm.Label("py_bulk_done"),
    ]


def _frame_window() -> Items:
    """S_WINDOW = the frame at R3: copied from S_BULK when it lies there, else read; a
    failed read ends the walk (py_walked)."""
    prog: Items = [
        asm.mov(R1, R3), asm.ldx(DW, R2, R8, S_BULK_BASE), asm.sub(R1, R2),
        asm.ldx(DW, R2, R8, S_BULK_SIZE), asm.sub(R2, FRAME_COPY),
        asm.jsgt(R1, R2, "py_read_frame"), asm.jslt(R1, 0, "py_read_frame"),
        asm.and_(R1, BULK - 1), asm.add(R1, R8),
    ]
    for k in range(0, FRAME_COPY, 8):
        prog += [asm.ldx(DW, R2, R1, S_BULK + k), asm.stx(DW, R8, S_WINDOW + k, R2)]
    return prog + [
        asm.ja("py_have_frame"),
        asm.Label("py_read_frame"),
        asm.mov(R1, R8), asm.add(R1, S_WINDOW),
        asm.ldx(W, R2, R7, PROC_AT["frame_window"]), asm.and_(R2, 0xFF),
        asm.call(Helper.PROBE_READ_USER), asm.jne(R0, 0, "py_walked"),
        asm.Label("py_have_frame"),
    ]


def _send_stack() -> Items:
    """The key (hash with the process's key, never 0) to fp[PY_STACK_AT] and the record; a
    stack not seen before goes to the ring. `pyseen` is an array of keys indexed by key (a
    collision only sends a stack again)."""
    slot, spill = layout.PY_CODE_KEY_AT, layout.PY_CODE_KEY_AT + 8
    return [
        asm.ldx(DW, R4, R8, S_HASH), asm.ldx(DW, R1, FP, layout.PY_KEY_AT + 8),
        asm.xor(R4, R1), asm.ld_imm64(R5, FNV_PRIME), asm.mul(R4, R5), asm.or_(R4, 1),
        asm.stx(DW, R8, 16, R4), asm.stx(DW, FP, layout.PY_STACK_AT, R4),
        asm.rsh(R4, 1), asm.and_(R4, SEEN_SLOTS - 1), asm.stx(W, FP, slot, R4),
        asm.ld_map(R1, layout.PY_SEEN), asm.mov(R2, FP), asm.add(R2, slot),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "py_done"),
        asm.stx(DW, FP, spill, R0),
        asm.ldx(DW, R1, R0, 0), asm.ldx(DW, R2, R8, 16), asm.jeq(R1, R2, "py_done"),
        asm.ldx(W, R3, R8, 4), asm.and_(R3, 0x7F), asm.jgt(R3, MAX_FRAMES, "py_done"),
        asm.lsh(R3, 4), asm.add(R3, S_FRAMES),
        asm.ld_map(R1, layout.PY_RING), asm.mov(R2, R8), asm.mov(R4, 0),
        asm.call(Helper.RINGBUF_OUTPUT), asm.jne(R0, 0, "py_lost"),
        asm.ldx(DW, R1, FP, spill), asm.ldx(DW, R2, R8, 16), asm.stx(DW, R1, 0, R2),
    ]


def seen_slot(key: int) -> int:
    """The `pyseen` slot of a stack key."""
    return (key >> 1) & (SEEN_SLOTS - 1)


def _send_codes() -> Items:
    """Each code object of the stack not sent before: its record to the ring."""
    prog: Items = [
        asm.ldx(DW, R1, FP, layout.PY_KEY_AT + 8), asm.stx(DW, FP, layout.PY_CODE_KEY_AT, R1),
        asm.mov(R9, 0),
        asm.Label("py_code_loop"),
        asm.jge(R9, MAX_FRAMES, "py_done"),
        asm.ldx(W, R1, R8, 4), asm.and_(R1, 0x7F), asm.jge(R9, R1, "py_done"),
        asm.mov(R1, R9), asm.lsh(R1, 4), asm.add(R1, R8), asm.ldx(DW, R2, R1, S_FRAMES),
        asm.jeq(R2, 0, "py_code_next"),
        asm.stx(DW, FP, layout.PY_CODE_KEY_AT + 8, R2),
        asm.ld_map(R1, layout.PY_CODES), asm.mov(R2, FP), asm.add(R2, layout.PY_CODE_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jne(R0, 0, "py_code_next"),
    ]
    prog += _code_record() + [
        asm.ld_map(R1, layout.PY_RING), asm.mov(R2, R8), asm.add(R2, S_CODE),
        asm.ldx(W, R3, R8, S_CODE + 32 + 8), asm.jgt(R3, MAX_LINETABLE, "py_code_next"),
        asm.add(R3, CODE_LINETABLE_AT), asm.mov(R4, 0),
        asm.call(Helper.RINGBUF_OUTPUT), asm.jeq(R0, 0, "py_code_sent"),
    ] + _count_lost("code") + [
        asm.ja("py_code_next"),
        asm.Label("py_code_sent"),
        asm.ld_map(R1, layout.PY_CODES), asm.mov(R2, FP), asm.add(R2, layout.PY_CODE_KEY_AT),
        asm.mov(R3, R2), asm.mov(R4, 0), asm.call(Helper.MAP_UPDATE_ELEM),
        asm.Label("py_code_next"),
        asm.add(R9, 1), asm.ja("py_code_loop"),
    ]
    return prog


def _code_record() -> Items:
    """The code record of the code object at fp[PY_CODE_KEY_AT + 8], at S_CODE; a failed
    read of the object itself skips it (to py_code_next: tried again at its next stack)."""
    code = S_CODE
    prog: Items = [
        asm.st(W, R8, code, CODE_RECORD),
        asm.ldx(DW, R1, FP, layout.PY_KEY_AT), asm.stx(DW, R8, code + 8, R1),
        asm.ldx(DW, R3, FP, layout.PY_CODE_KEY_AT + 8), asm.stx(DW, R8, code + 16, R3),
        asm.mov(R1, R8), asm.add(R1, S_WINDOW),
        asm.ldx(W, R2, R7, PROC_AT["code_window"]), asm.and_(R2, 0xFF),
        asm.call(Helper.PROBE_READ_USER), asm.jne(R0, 0, "py_code_next"),
    ]
    prog += _window_field(R2, "code_firstlineno", 0xFC, W) + [asm.stx(W, R8, code + 4, R2)]
    for field, var in (("code_linetable", S_LINETABLE), ("code_filename", S_FILENAME),
                       ("code_name", S_NAME)):
        prog += _window_field(R2, field, 0xF8) + [asm.stx(DW, R8, var, R2)]
    prog += _string(S_FILENAME, code + 24, code + CODE_FILENAME_AT, MAX_FILENAME, "file")
    prog += _string(S_NAME, code + 32, code + CODE_NAME_AT, MAX_NAME, "name")
    return prog + _linetable(code)


def _string(var: int, head_at: int, data_at: int, limit: int, tag: str) -> Items:
    """(state, bytes) at head_at and the data of the compact str object at scratch[var].
    Branch-free but for the bound (few paths for the verifier, which walks this once per
    frame slot): a failed read leaves zeros (probe_read_user clears its buffer on a fault),
    so a string that cannot be read has state 0 and 0 bytes, and pystacks.py counts its
    code object unnamed."""
    return [
        asm.mov(R1, R8), asm.add(R1, S_TMP), asm.mov(R2, 8),
        asm.ldx(DW, R3, R8, var), asm.ldx(W, R4, R7, PROC_AT["unicode_length"]),
        asm.add(R3, R4), asm.call(Helper.PROBE_READ_USER),
        asm.mov(R1, R8), asm.add(R1, S_TMP2), asm.mov(R2, 4),
        asm.ldx(DW, R3, R8, var), asm.ldx(W, R4, R7, PROC_AT["unicode_state"]),
        asm.add(R3, R4), asm.call(Helper.PROBE_READ_USER),
        asm.ldx(W, R1, R8, S_TMP2), asm.stx(W, R8, head_at, R1),
        # data at the compact size, or the ASCII size when the ascii bit (6) is set
        asm.ldx(W, R4, R7, PROC_AT["unicode_compact_size"]),
        asm.ldx(W, R3, R7, PROC_AT["unicode_ascii_size"]), asm.sub(R3, R4),
        asm.mov(R2, R1), asm.rsh(R2, 6), asm.and_(R2, 1), asm.mul(R3, R2), asm.add(R4, R3),
        asm.stx(DW, R8, S_TMP2, R4),
        # bytes = length * kind (bits 2-4) if compact (bit 5), at most `limit`
        asm.mov(R5, R1), asm.rsh(R5, 2), asm.and_(R5, 7),
        asm.mov(R2, R1), asm.rsh(R2, 5), asm.and_(R2, 1), asm.mul(R5, R2),
        asm.ldx(DW, R2, R8, S_TMP), asm.mul(R2, R5),
        asm.jle(R2, limit, "py_%s_fits" % tag), asm.mov(R2, limit),
        asm.Label("py_%s_fits" % tag),
        asm.stx(W, R8, head_at + 4, R2),
        asm.ldx(DW, R3, R8, var), asm.ldx(DW, R4, R8, S_TMP2), asm.add(R3, R4),
        asm.mov(R1, R8), asm.add(R1, data_at),
        asm.call(Helper.PROBE_READ_USER),
    ] + _zero_on_error(head_at + 4)


def _zero_on_error(at: int) -> Items:
    """The u32 at scratch[at] *= (R0 == 0): a failed read keeps no length (R0 is 0 or a
    negative errno)."""
    return [asm.rsh(R0, 63), asm.xor(R0, 1), asm.ldx(W, R1, R8, at), asm.mul(R1, R0),
            asm.stx(W, R8, at, R1)]


def _linetable(code: int) -> Items:
    """The line table's bytes read at code+40, its whole length at code+44, and its bytes
    (MAX_LINETABLE at most; branch-free as _string)."""
    at = code + 40
    return [
        asm.mov(R1, R8), asm.add(R1, S_TMP), asm.mov(R2, 8),
        asm.ldx(DW, R3, R8, S_LINETABLE), asm.ldx(W, R4, R7, PROC_AT["bytes_size"]),
        asm.add(R3, R4), asm.call(Helper.PROBE_READ_USER),
        asm.ldx(DW, R3, R8, S_LINETABLE), asm.ldx(W, R4, R7, PROC_AT["bytes_data"]),
        asm.add(R3, R4),
        asm.ldx(DW, R2, R8, S_TMP),
        asm.jle(R2, MAX_LINETABLE, "py_lines_fit"), asm.mov(R2, MAX_LINETABLE),
        asm.Label("py_lines_fit"),
        asm.stx(W, R8, at, R2),
        asm.mov(R1, R8), asm.add(R1, code + CODE_LINETABLE_AT),
        asm.call(Helper.PROBE_READ_USER),
        asm.ldx(DW, R1, R8, S_TMP), asm.stx(W, R8, at + 4, R1),  # (its whole length)
    ] + _zero_on_error(at)


def _count_lost(tag: str) -> Items:
    label = "py_counted_%s" % tag
    return [
        asm.st(W, FP, layout.STAT_KEY_AT, record.STAT_PY_LOST),
        asm.ld_map(R1, layout.STATS), asm.mov(R2, FP), asm.add(R2, layout.STAT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, label),
        asm.ldx(DW, R1, R0, 0), asm.add(R1, 1), asm.stx(DW, R0, 0, R1),
        asm.Label(label),
    ]


def map_specs(ring_size: int) -> List[layout.MapSpec]:
    """The maps of the walk."""
    return [
        layout.MapSpec(layout.PY_PROCS, "Hash", 4, PROC.size, layout.MAX_PROCESSES,
                       key_struct=layout.PID),
        layout.MapSpec(layout.PY_THREADS, "Array", 4, 16, THREAD_SLOTS),
        layout.MapSpec(layout.PY_SEEN, "Array", 4, 8, SEEN_SLOTS, key_struct=layout.PID,
                       value_struct=layout.U64),
        layout.MapSpec(layout.PY_CODES, "LruHash", 16, 16, 65536),
        layout.MapSpec(layout.PY_SCRATCH, "PerCpuArray", 4, SCRATCH_SIZE, 1),
        layout.MapSpec(layout.PY_RING, "RingBuf", 0, 0, ring_size),
    ]
