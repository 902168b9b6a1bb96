"""Writing records into the `events` ring buffer (reserve, head, submit and its wakeup) and
counting in the per-CPU `stats` array: the pieces every generated program shares."""
from typing import List

from .. import asm
from ..asm import DW, FP, R0, R1, R2, R3, R6, R8, RB_FORCE_WAKEUP, RB_NO_WAKEUP, Helper, W
from ..spec import layout, record
from .options import ProbeOptions
from .scope import pid_tgid_from_task, task_read

BPF_F_USER_STACK = 1 << 8
BPF_RB_AVAIL_DATA = 0  # ringbuf_query: bytes not yet consumed

Items = List[object]

FnId = layout.FnId
FROM_COOKIE = layout.FROM_COOKIE
fn_id_into = layout.fn_id_into


def store_fn_and_phase(fn_id: FnId, phase: int, flags: int = 0) -> Items:
    """The record's u16 function id, u8 phase and u8 flags, at R8."""
    if fn_id is FROM_COOKIE:
        return fn_id_into(R1, fn_id) + [asm.or_(R1, phase << 16 | flags << 24),
                                       asm.stx(W, R8, record.FN_ID, R1)]
    return [asm.st(W, R8, record.FN_ID, fn_id | phase << 16 | flags << 24)]


def entry_head(fn_id: FnId, phase: int, options: ProbeOptions, flags: int = 0,
               spilled: bool = False) -> Items:
    """The head of a record written at entry, at R8: the time now, no exit time, pid_tgid,
    function id, phase and flags, no stack, comm (`spilled`: the task is at fp-408 already)."""
    prog = spill_task() if task_read(options) and not spilled else []
    return prog + [
        asm.call(Helper.KTIME_GET_NS), asm.stx(DW, R8, record.TS_ENTER, R0),
        asm.st(DW, R8, record.TS_EXIT, 0),
    ] + pid_tgid_from_task(options) + [
        asm.stx(DW, R8, record.PID_TGID, R0),
    ] + store_fn_and_phase(fn_id, phase, flags) + [asm.st(W, R8, record.STACK_ID, 0)] + comm(
        options)


def spill_task() -> Items:
    """fp-408 = the current task (a trusted pointer: the verifier keeps its type spilled)."""
    return [asm.call(Helper.GET_CURRENT_TASK_BTF), asm.stx(DW, FP, layout.TASK_AT, R0)]


def py_stack_into(base, offset: int, options: ProbeOptions) -> Items:
    """base+offset = the key of the call's Python stack (pystack.walk left it), or 0."""
    if options.py_stacks is None:
        return [asm.st(DW, base, offset, 0)]
    return [asm.ldx(DW, R1, FP, layout.PY_STACK_AT), asm.stx(DW, base, offset, R1)]


def reserve(fail_label: str) -> Items:
    """R8 = a new record in the ring buffer, or jump to fail_label."""
    return [
        asm.ld_map(R1, layout.EVENTS), asm.mov(R2, record.SIZE), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE),
        asm.jeq(R0, 0, fail_label),
        asm.mov(R8, R0),
    ]


def stack_id() -> Items:
    """record.STACK_ID = 1 + get_stackid(user stack), or 0 (counted) when it fails."""
    return [
        asm.mov(R1, R6), asm.ld_map(R2, layout.STACKS), asm.mov(R3, BPF_F_USER_STACK),
        asm.call(Helper.GET_STACKID),
        asm.jsge(R0, 0, "stack_ok"),
    ] + count(record.STAT_STACK_LOST) + [
        asm.mov(R0, -1),
        asm.Label("stack_ok"),
        asm.add(R0, 1),
        asm.stx(W, R8, record.STACK_ID, R0),
    ]


def comm(options: ProbeOptions) -> Items:
    """The record's comm, at R8: the task's 16 bytes in two loads (task_read: the kernel
    keeps comm NUL-padded, as get_current_comm copies it), else by the helper."""
    if not task_read(options):
        return [asm.mov(R1, R8), asm.add(R1, record.COMM), asm.mov(R2, record.COMM_LEN),
                asm.call(Helper.GET_CURRENT_COMM)]
    at = options.task_fields[2]
    return [asm.ldx(DW, R1, FP, layout.TASK_AT),
            asm.ldx(DW, R2, R1, at), asm.stx(DW, R8, record.COMM, R2),
            asm.ldx(DW, R2, R1, at + 8), asm.stx(DW, R8, record.COMM + 8, R2)]


# A record wakes the reader when the bytes waiting in the ring (its own included) are in
# [wakeup_bytes, wakeup_bytes + WAKE_WINDOW), or are WAKE_URGENT times wakeup_bytes or more
# (a quarter of the ring). The reader sleeps only once it has read the ring empty (epoll
# says a ring with data is ready at once), so the fill crosses the first mark once a sleep.
# A window, not one record's width: producers on several CPUs query after reserving, so
# each sees a little more than its own share; 64 records make missing it need 64
# reservations between one record's reserve and query. Between the window and a quarter of
# the ring no record wakes it: a reader that is behind is awake, and each forced wakeup
# costs the traced thread an irq_work and an IPI (~0.5-1.5 µs here: the return programs
# cost 1.0-2.0 µs a call with the default ring when every record past wakeup_bytes woke
# it). Past a quarter every record does, as before: a loss is nearer, and the wakeups' cost
# slows a producer that outruns the reader (with no such zone below half the ring, a
# pinned reader on a busy CPU lost more launches than before).
WAKE_WINDOW = 64 * record.FRAME_SIZE
WAKE_URGENT = 2


def submit(options: ProbeOptions) -> Items:
    """Submit the record at R8, waking the reader as `wakeup_bytes` says (WAKE_WINDOW)."""
    if options.wake_now or not options.wakeup_bytes:
        flags = RB_FORCE_WAKEUP if options.wake_now else 0
        return [asm.mov(R1, R8), asm.mov(R2, flags), asm.call(Helper.RINGBUF_SUBMIT)]
    first = options.wakeup_bytes
    return [
        asm.ld_map(R1, layout.EVENTS), asm.mov(R2, BPF_RB_AVAIL_DATA),
        asm.call(Helper.RINGBUF_QUERY),
        asm.mov(R2, RB_NO_WAKEUP),
        asm.jlt(R0, first, "quiet"),
        asm.jlt(R0, first + WAKE_WINDOW, "wake"),
        asm.jlt(R0, WAKE_URGENT * first, "quiet"),
        asm.Label("wake"),
        asm.mov(R2, RB_FORCE_WAKEUP),
        asm.Label("quiet"),
        asm.mov(R1, R8), asm.call(Helper.RINGBUF_SUBMIT),
    ]


def count(stat: int, tag: str = "", amount: int = 1) -> Items:
    """stats[stat] += amount on this CPU (a per-CPU slot needs no atomic); `tag` tells apart
    two counts of one stat in a program."""
    label = "counted_%d%s" % (stat, tag)
    return [
        asm.st(W, FP, layout.STAT_KEY_AT, stat),
        asm.ld_map(R1, layout.STATS), asm.mov(R2, FP), asm.add(R2, layout.STAT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, label),
        asm.ldx(DW, R1, R0, 0), asm.add(R1, amount), asm.stx(DW, R0, 0, R1),
        asm.Label(label),
    ]
