"""In-kernel aggregation for `--summary`: the return probe adds each call to per-CPU
counters instead of (or besides) writing a record, so a summary costs no ring traffic.

Per function (and memcpy kind): count, total/min/max duration, errors, bytes of successful
calls (the row's `size` fields times its element size: apis.Api.size), the sum of squared
durations in ns² (for the standard deviation: see decode/aggregates.sum_of_squares) and a log2
histogram of durations (for approximate percentiles). Errors by (function, code) and successful
launches by (process, function, geometry) go to hash maps. decode/aggregates.py reads it all
back (the one reader of these sums).

CUDA graphs (graphs.py follows them from records): the kernel keeps which processes have a
stream capture in progress (`capture_count`, on the returns of successful capture begins
and ends). A launch, copy, memset or event call made while its process captures is written
as a record (the summary's GraphTracker tells captured work from eager work, and expands
the graph launches, whose records are always written) and still added to the per-function
aggregates (the API table counts every call once), but not to the `launches` map: the
launches of those records are counted from them, once (`capturing_gate`).

The monitor's sums by process (calls, errors, API time): in a slot a process of
`proc_sums`, cached in each thread's task storage (no hash on a call's path:
`_count_in_process_slot`), or in the `proc_calls` hash where the kernel has no task storage
and for the processes that found no free slot.
"""
import struct
from typing import Dict, List, Optional, Sequence, Tuple

from .. import asm
from ..arch import Arch
from ..asm import DW, FP, R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, Atomic, Helper, W
from ..spec import layout, record
from ..spec.apis import CAPTURED_ROLES, TABLE, Api, Kind, Role, arg_cells

AGG_MAP, ERRORS_MAP, LAUNCHES_MAP = layout.AGG, layout.ERRORS, layout.LAUNCHES
PROCESS_MAP = layout.PROCESS_CALLS
CAPTURING_MAP, CAPTURING_ANY_MAP = layout.CAPTURING, layout.CAPTURING_ANY
KIND_SLOTS, HIST_BUCKETS = layout.KIND_SLOTS, layout.HIST_BUCKETS
COUNT, TOTAL, MIN, MAX = layout.AGG_COUNT, layout.AGG_TOTAL, layout.AGG_MIN, layout.AGG_MAX
ERRORS, BYTES, SUMSQ, HIST = layout.AGG_ERRORS, layout.AGG_BYTES, layout.AGG_SUMSQ, layout.AGG_HIST
SUMSQ_EXP_AT = layout.SUMSQ_EXP_AT
_MANTISSA = layout.SUMSQ_MANTISSA
_ROOT_BITS = SUMSQ_EXP_AT // 2  # (d >> exponent) < 2^29: its square fits the mantissa
AGG_VALUE, ERROR_KEY = layout.AGG_VALUE, layout.ERROR_KEY
LAUNCH_KEY, LAUNCH_VALUE = layout.LAUNCH_KEY, layout.LAUNCH_VALUE
ERROR_ENTRIES, LAUNCH_ENTRIES = layout.ERROR_ENTRIES, layout.LAUNCH_ENTRIES

# The return program's stack below layout.NOW_AT.
_AGG_KEY = layout.AGG_KEY_AT
_LAUNCH_KEY = layout.LAUNCH_KEY_AT
_LAUNCH_VALUE = layout.LAUNCH_VALUE_AT
_ERROR_KEY = layout.ERROR_KEY_AT
_ERROR_VALUE = layout.ERROR_VALUE_AT
_CAPTURE_KEY = layout.CAPTURE_KEY_AT
_CAPTURE_VALUE = layout.CAPTURE_VALUE_AT
_CAPTURE_FLAG = layout.CAPTURE_FLAG_AT


def agg_entries(table: Sequence[Api] = TABLE) -> int:
    return len(table) * KIND_SLOTS


def _cell_of(api: Api, predicate) -> Optional[int]:
    for arg, cell in arg_cells(api):
        if predicate(arg):
            return cell
    return None


def _shown_cells(api: Api) -> Tuple[int, ...]:
    """The record cells of the arguments a launch shows (its key in the `launches` map)."""
    return tuple(sorted({cell + k for arg, cell in arg_cells(api) if arg.show
                         for k in range(arg.cells)}))


def _size_cells(api: Api) -> Tuple[int, ...]:
    """The record cells of the row's `size` fields (none unless all are arguments)."""
    cells = {arg.name: cell for arg, cell in arg_cells(api)}
    return tuple(cells[n] for n in api.size) if all(n in cells for n in api.size) else ()


def shape_of(api: Api) -> tuple:
    """What `aggregate_call`, `capture_count` and `capturing_gate` read of `api` (see
    calls.shape_of)."""
    launch = _shown_cells(api) if api.role == Role.LAUNCH else None
    return (_size_cells(api), api.elem_size,
            _cell_of(api, lambda a: a.kind == Kind.MEMCPY_KIND), launch, capture_role(api))


def capture_role(api: Api) -> Optional[str]:
    """What the row does with the capture state: "begin"/"end" (a capture begins, ends:
    `capture_count`), "gated" (a call a capture may record: `capturing_gate`), or None."""
    if api.role == Role.CAPTURE_BEGIN:
        return "begin"
    if api.role == Role.CAPTURE_END:
        return "end"
    return "gated" if api.role in CAPTURED_ROLES else None


def aggregate_call(api: Api, fn_id, arch: Arch, gated: bool = False,
                   sampled: bool = False, per_process: int = 0) -> list:
    """Return-probe code adding one call to the aggregates (R6 ctx, R7 inflight value);
    `fn_id` a constant or layout.FROM_COOKIE. `gated`: after `capturing_gate`, a launch
    made while its process captures is not counted in the `launches` map (its record
    counts it). `sampled` (a gated launch row of calls.session_program): the entry counted
    the call and its launch (`count_call`) unless its process captures; the return adds
    its duration and outcome, and its count only while capturing. `per_process`: the call
    also goes to its process's sums (not a sampled row's: `count_call` counts its
    launches by process): with `per_process` > 0 in its slot of `proc_sums` (of that many;
    the thread's task storage spilled at fp-416), else (options.HASH_ONLY) in `proc_calls`."""
    prog = [asm.ldx(DW, R8, FP, layout.NOW_AT), asm.ldx(DW, R1, R7, record.INFLIGHT_TS),
            asm.sub(R8, R1)]
    prog += _agg_index(api, fn_id)
    if per_process and not sampled:  # (first: the reader, reading `agg` first, finds this
        prog += (_count_in_process_slot(api, fn_id, arch, per_process) if per_process > 0
                 else _count_per_process(api, arch))  # (map never behind it, but for losses)
    prog += [
        asm.ld_map(R1, AGG_MAP), asm.mov(R2, FP), asm.add(R2, _AGG_KEY),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "agg_done"),
        asm.mov(R9, R0),
    ]
    if sampled:
        prog += [asm.ldx(DW, R1, FP, _CAPTURE_FLAG), asm.jeq(R1, 0, "counted_at_entry")]
    prog += _add(COUNT, 1) + ([asm.Label("counted_at_entry")] if sampled else [])
    prog += _add_reg(TOTAL, R8)
    prog += [
        asm.ldx(DW, R1, R9, MIN), asm.jeq(R1, 0, "set_min"), asm.jle(R1, R8, "min_ok"),
        asm.Label("set_min"), asm.stx(DW, R9, MIN, R8), asm.Label("min_ok"),
        asm.ldx(DW, R1, R9, MAX), asm.jge(R1, R8, "max_ok"), asm.stx(DW, R9, MAX, R8),
        asm.Label("max_ok"),
    ] + layout.ret_into(R1, api.returns_value, arch.ret) + [asm.jne32(R1, 0, "failed")]
    prog += _bytes(api)
    prog += [asm.ja("outcome_done"), asm.Label("failed")] + _add(ERRORS, 1)
    prog += [asm.Label("outcome_done")] + _floor_log2() + [asm.mov(R0, R2)]
    prog += _sum_of_squares() + [asm.mov(R2, R0)] + _histogram() + [asm.Label("agg_done")]
    prog += _count_error(api, fn_id, arch)
    if api.role == Role.LAUNCH and not sampled:  # successful ones, as the event summary
        prog += layout.ret_into(R1, api.returns_value, arch.ret) + [
            asm.jne32(R1, 0, "launch_done")]
        if gated:
            prog += [asm.ldx(DW, R1, FP, _CAPTURE_FLAG), asm.jne(R1, 0, "launch_done")]
        prog += _count_launch(api, fn_id)
    return prog


def count_call(api: Api, fn_id, arch: Arch) -> list:
    """Entry code of a call whose return is not taken (calls.session_program; R6 ctx,
    fp-16 pid_tgid): its count, and for a launch its count by process and kernel (func)
    alone (the monitor's series have no geometry: no stack argument is read), counting
    the attempt (whether it succeeded is not known here): in its `launch_slots` slot
    (`_count_in_slot`), else in `launches` with the other cells 0. Durations, errors and
    bytes are the sampled returns'."""
    prog = _agg_index(api, fn_id) + [
        asm.ld_map(R1, AGG_MAP), asm.mov(R2, FP), asm.add(R2, _AGG_KEY),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "counted"),
    ] + [asm.ldx(DW, R1, R0, COUNT), asm.add(R1, 1), asm.stx(DW, R0, COUNT, R1),
         asm.Label("counted")]
    if api.role != Role.LAUNCH:
        return prog
    func, cell = next((arg, cell) for arg, cell in arg_cells(api) if arg.name == "func")
    prog += [
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT), asm.rsh(R1, 32),  # pid, from the key
    ] + layout.fn_id_into(R2, fn_id) + [
        asm.lsh(R2, 32), asm.or_(R1, R2), asm.stx(DW, FP, _LAUNCH_KEY, R1),
        asm.ldx(DW, R2, R6, arch.arg(func.slot)), asm.stx(DW, FP, _SLOT_FUNC, R2),
    ] + _count_in_slot() + [asm.ldx(DW, R1, FP, _SLOT_FUNC)]
    for c in range(record.ARG_CELLS):
        where = _LAUNCH_KEY + 8 + 8 * c
        prog.append(asm.stx(DW, FP, where, R1) if c == cell else asm.st(DW, FP, where, 0))
    prog += [asm.st(DW, FP, _LAUNCH_VALUE, 1), asm.st(DW, FP, _LAUNCH_VALUE + 8, 0)]
    return prog + _hash_add(LAUNCHES_MAP, _LAUNCH_KEY, _LAUNCH_VALUE, [(0, None)], "launch") + [
        asm.Label("slot_counted")]


# Where count_call keeps the launch's kernel and slot index (the value's room of
# `launches`, written only on the way to it).
_SLOT_FUNC = _LAUNCH_VALUE + 8
_SLOT_INDEX = _LAUNCH_VALUE
_SLOT_HASH = 0x9E3779B97F4A7C15  # (2^64 / the golden ratio: Fibonacci hashing)
_OWNER, _FUNC, _SLOT_COUNT = 0, 8, 16  # layout.LAUNCH_SLOT


SLOT_PROBES = 4  # slots looked at from a launch's own (linear probing) before `launches`


def _count_in_slot() -> list:
    """R1 = the owner (fn_id << 32 | pid, never 0), R2 = func: add 1 to the slot of
    (owner, func) in `launch_slots` and jump to "slot_counted", claiming a free slot (an
    atomic compare-and-exchange of its owner; the winner then writes func). The slot
    (owner, func) hashes to is looked at first, then the next ones, SLOT_PROBES in all: a
    slot another (owner, func) holds is passed by. A lost claim, a slot whose func is not
    yet written, SLOT_PROBES slots held by others or a null func (a launch that will fail)
    fall through to `launches`: every launch is counted once, in one or the other, which
    the readers add up (owned_slots)."""
    prog = [
        asm.jeq(R2, 0, "slot_missed"),
        asm.xor(R1, R2), asm.ld_imm64(R3, _SLOT_HASH), asm.mul(R1, R3),
        asm.rsh(R1, 64 - layout.LAUNCH_SLOT_BITS), asm.stx(W, FP, _SLOT_INDEX, R1),
    ]
    for probe in range(SLOT_PROBES):
        passed, owned = "slot_passed_%d" % probe, "slot_owned_%d" % probe
        if probe:  # (the next slot, wrapping around)
            prog += [asm.ldx(W, R1, FP, _SLOT_INDEX), asm.add(R1, 1),
                     asm.and_(R1, layout.LAUNCH_SLOT_ENTRIES - 1),
                     asm.stx(W, FP, _SLOT_INDEX, R1)]
        prog += [
            asm.ld_map(R1, layout.LAUNCH_SLOTS), asm.mov(R2, FP), asm.add(R2, _SLOT_INDEX),
            asm.call(Helper.MAP_LOOKUP_ELEM),  # (an array: the verifier inlines it)
            asm.jeq(R0, 0, "slot_missed"),
            asm.ldx(DW, R1, R0, _OWNER), asm.ldx(DW, R2, FP, _LAUNCH_KEY),
            asm.jeq(R1, R2, owned), asm.jne(R1, 0, passed),
            asm.mov(R3, R0), asm.mov(R0, 0), asm.atomic(Atomic.CMPXCHG, DW, R3, _OWNER, R2),
            asm.jne(R0, 0, "slot_missed"),  # (taken meanwhile)
            asm.ldx(DW, R1, FP, _SLOT_FUNC), asm.stx(DW, R3, _FUNC, R1),
            asm.mov(R1, 1), asm.atomic_add(DW, R3, _SLOT_COUNT, R1), asm.ja("slot_counted"),
            asm.Label(owned),
            asm.ldx(DW, R1, R0, _FUNC), asm.jeq(R1, 0, "slot_missed"),  # (being claimed)
            asm.ldx(DW, R2, FP, _SLOT_FUNC), asm.jne(R1, R2, passed),  # (another kernel's)
            asm.mov(R1, 1), asm.atomic_add(DW, R0, _SLOT_COUNT, R1), asm.ja("slot_counted"),
            asm.Label(passed),
        ]
    return prog + [asm.Label("slot_missed")]


# -- stream captures in progress -----------------------------------------------------------

def capture_count(api: Api, arch: Arch) -> list:
    """Return-probe code of a capture begin or end row (else nothing): a successful begin
    adds 1 to its process's `capturing` entry and to `capturing_any`; a successful end
    takes 1 from both, not below 0 (an end whose begin came before the trace: no entry,
    or 0). A failed call changes nothing, as graphs.GraphTracker ignores it. Two ends in
    one process racing over one counted capture could take its count below 0 (a huge
    u64): then that process's calls are all written as records, which is correct, only
    dearer. Entries stay (at 0) when their count returns to 0, or when a process dies
    mid-capture: a later process of that pid writes its launches as records, counted
    right, and the eager launches of every process pay one hash lookup."""
    role = capture_role(api)
    if role not in ("begin", "end"):
        return []
    prog = layout.ret_into(R1, api.returns_value, arch.ret) + [
        asm.jne32(R1, 0, "capture_counted"),
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT), asm.rsh(R1, 32),  # the tgid
        asm.stx(W, FP, _CAPTURE_KEY, R1),
    ]
    if role == "begin":
        prog += [asm.st(DW, FP, _CAPTURE_VALUE, 1)]
        prog += _hash_add(CAPTURING_MAP, _CAPTURE_KEY, _CAPTURE_VALUE, [(0, None)], "capture")
        return prog + _capturing_any(1) + [asm.Label("capture_counted")]
    prog += [
        asm.ld_map(R1, CAPTURING_MAP), asm.mov(R2, FP), asm.add(R2, _CAPTURE_KEY),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "capture_counted"),
        asm.ldx(DW, R1, R0, 0), asm.jeq(R1, 0, "capture_counted"),
        asm.mov(R1, -1), asm.atomic_add(DW, R0, 0, R1),
    ]
    return prog + _capturing_any(-1) + [asm.Label("capture_counted")]


def _capturing_any(amount: int) -> list:
    """capturing_any[0] += amount (atomically; not below 0)."""
    prog = [asm.st(W, FP, _CAPTURE_KEY, 0),
            asm.ld_map(R1, CAPTURING_ANY_MAP), asm.mov(R2, FP), asm.add(R2, _CAPTURE_KEY),
            asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "capture_counted")]
    if amount < 0:
        prog += [asm.ldx(DW, R1, R0, 0), asm.jeq(R1, 0, "capture_counted")]
    return prog + [asm.mov(R1, amount), asm.atomic_add(DW, R0, 0, R1)]


def capturing_gate(emit: list) -> list:
    """Return-probe code of a gated row (`capture_role`) with aggregates and no records:
    when some process captures (`capturing_any`, an array lookup the verifier inlines: all
    an eager call pays while none does) and this one does (`capturing`), fp-360 = 1 and
    `emit` (the code writing the call's record) runs; else fp-360 = 0. The aggregates
    follow (aggregate_call with `gated`)."""
    return [
        asm.st(DW, FP, _CAPTURE_FLAG, 0), asm.st(W, FP, _CAPTURE_KEY, 0),
        asm.ld_map(R1, CAPTURING_ANY_MAP), asm.mov(R2, FP), asm.add(R2, _CAPTURE_KEY),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "not_capturing"),
        asm.ldx(DW, R1, R0, 0), asm.jeq(R1, 0, "not_capturing"),
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT), asm.rsh(R1, 32),  # the tgid
        asm.stx(W, FP, _CAPTURE_KEY, R1),
        asm.ld_map(R1, CAPTURING_MAP), asm.mov(R2, FP), asm.add(R2, _CAPTURE_KEY),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "not_capturing"),
        asm.ldx(DW, R1, R0, 0), asm.jeq(R1, 0, "not_capturing"),
        asm.st(DW, FP, _CAPTURE_FLAG, 1),
    ] + list(emit) + [asm.Label("not_capturing")]


def _bytes(api: Api) -> list:
    """bytes += the product of the size cells times the element size (rows with a size)."""
    cells = _size_cells(api)
    if not cells:
        return []
    prog = [asm.ldx(DW, R1, R7, record.INFLIGHT_ARGS + 8 * cells[0])]
    for cell in cells[1:]:
        prog += [asm.ldx(DW, R3, R7, record.INFLIGHT_ARGS + 8 * cell), asm.mul(R1, R3)]
    if api.elem_size != 1:
        prog.append(asm.mul(R1, api.elem_size))
    return prog + _add_reg(BYTES, R1)


def _sum_of_squares() -> list:
    """SUMSQ += duration² (R8), kept as mantissa * 4**exponent (see SUMSQ_EXP_AT); R2 holds
    floor(log2(duration)). R1 mantissa, R2 exponent, R3 the square, R4/R5 scratch."""
    return [
        asm.mov(R4, R2), asm.sub(R4, _ROOT_BITS - 1),  # the least exponent for this duration
        asm.ldx(DW, R1, R9, SUMSQ), asm.mov(R2, R1), asm.rsh(R2, SUMSQ_EXP_AT),
        asm.lsh(R1, 64 - SUMSQ_EXP_AT), asm.rsh(R1, 64 - SUMSQ_EXP_AT),
        asm.jsle(R4, R2, "sq_exp_ok"),  # raise the exponent: mantissa / 4**(new - old)
        asm.mov(R5, R4), asm.sub(R5, R2), asm.lsh(R5, 1), asm.mov(R2, R4),
        asm.jlt(R5, SUMSQ_EXP_AT, "sq_shift"), asm.mov(R1, 0), asm.ja("sq_exp_ok"),
        asm.Label("sq_shift"), asm.rsh(R1, R5),
        asm.Label("sq_exp_ok"),
        asm.mov(R3, R8), asm.rsh(R3, R2), asm.mul(R3, R3), asm.add(R1, R3),
        asm.mov(R5, R1), asm.rsh(R5, SUMSQ_EXP_AT), asm.jeq(R5, 0, "sq_fits"),
        # the sum reached 2^58: one step up (both halves then stay below 2^56)
        asm.sub(R1, R3), asm.rsh(R1, 2), asm.add(R2, 1),
        asm.mov(R3, R8), asm.rsh(R3, R2), asm.mul(R3, R3), asm.add(R1, R3),
        asm.Label("sq_fits"),
        asm.lsh(R2, SUMSQ_EXP_AT), asm.or_(R1, R2), asm.stx(DW, R9, SUMSQ, R1),
    ]


def _agg_index(api: Api, fn_id) -> list:
    """fp-152 = fn_id * KIND_SLOTS + the call's memcpy kind (0 when none or out of range)."""
    kind_cell = _cell_of(api, lambda a: a.kind == Kind.MEMCPY_KIND)
    if kind_cell is None and fn_id is not layout.FROM_COOKIE:
        return [asm.st(W, FP, _AGG_KEY, fn_id * KIND_SLOTS)]
    prog = layout.fn_id_into(R2, fn_id) + [asm.mul(R2, KIND_SLOTS)]
    if kind_cell is None:
        return prog + [asm.stx(W, FP, _AGG_KEY, R2)]
    return prog + [
        asm.ldx(DW, R1, R7, record.INFLIGHT_ARGS + 8 * kind_cell), asm.mov32(R1, R1),
        asm.jlt(R1, KIND_SLOTS, "kind_ok"), asm.mov(R1, 0), asm.Label("kind_ok"),
        asm.add(R1, R2), asm.stx(W, FP, _AGG_KEY, R1),
    ]


def _add(offset: int, amount: int) -> list:
    return [asm.ldx(DW, R1, R9, offset), asm.add(R1, amount), asm.stx(DW, R9, offset, R1)]


def _add_reg(offset: int, reg) -> list:
    return [asm.ldx(DW, R2, R9, offset), asm.add(R2, reg), asm.stx(DW, R9, offset, R2)]


def _floor_log2() -> list:
    """R2 = floor(log2(R8)) (0 for 0), by binary search on its bits; R1, R3 clobbered."""
    prog = [asm.mov(R1, R8), asm.mov(R2, 0)]
    for shift in (32, 16, 8, 4, 2, 1):
        label = "log2_%d" % shift
        prog += [asm.mov(R3, R1), asm.rsh(R3, shift), asm.jeq(R3, 0, label),
                 asm.mov(R1, R3), asm.add(R2, shift), asm.Label(label)]
    return prog


def _histogram() -> list:
    """hist[R2] += 1 (R2: floor(log2(duration)), capped at the last bucket)."""
    return [
        asm.jle(R2, HIST_BUCKETS - 1, "bucket_ok"), asm.mov(R2, HIST_BUCKETS - 1),
        asm.Label("bucket_ok"),
        asm.lsh(R2, 3), asm.add(R2, R9),
        asm.ldx(DW, R1, R2, HIST), asm.add(R1, 1), asm.stx(DW, R2, HIST, R1),
    ]


def _count_per_process(api: Api, arch: Arch) -> list:
    """proc_calls[(tgid, agg index)] += (1, failed, duration R8); R9 clobbered."""
    key, value = layout.PROCESS_KEY_AT, layout.PROCESS_VALUE_AT
    prog = [
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT), asm.rsh(R1, 32),  # the tgid
        asm.stx(W, FP, key, R1), asm.ldx(W, R1, FP, _AGG_KEY), asm.stx(W, FP, key + 4, R1),
        asm.mov(R9, 0),
    ] + layout.ret_into(R1, api.returns_value, arch.ret) + [
        asm.jeq32(R1, 0, "proc_ok"), asm.mov(R9, 1), asm.Label("proc_ok"),
        asm.st(DW, FP, value, 1), asm.stx(DW, FP, value + 8, R9),
        asm.stx(DW, FP, value + 16, R8),
    ]
    return prog + _hash_add(PROCESS_MAP, key, value, [(0, None), (8, R9), (16, R8)], "proc")


_PSLOT_KEY = layout.PROCESS_KEY_AT  # u32: the slot (an index of `proc_owners`)
_PSUM_KEY = layout.PROCESS_KEY_AT + 4  # u32: slot * table size + fn_id (of `proc_sums`)


def _count_in_process_slot(api: Api, fn_id, arch: Arch, slots: int) -> list:
    """proc_sums[slot * table size + fn_id] += (1, failed, duration R8), atomically (the
    threads of a process share its slot), the slot cached in the thread's task storage
    (fp-416): no hash on the path. A thread without one, or whose slot is no longer its
    process's (freed by the reader, taken by another), claims one (`_claim_process_slot`);
    when none is free its calls go to `proc_calls`, for good (record.TASK_IN_HASH).
    R9 clobbered."""
    prog = [
        asm.ldx(DW, R1, FP, layout.TASK_STORAGE_AT), asm.ldx(DW, R2, R1, record.TASK_PROC_SLOT),
        asm.jeq(R2, 0, "pslot_claim"), asm.jeq(R2, -1, "pslot_hash"),  # (TASK_IN_HASH)
        asm.sub(R2, 1), asm.stx(W, FP, _PSLOT_KEY, R2),
        asm.ld_map(R1, layout.PROCESS_OWNERS), asm.mov(R2, FP), asm.add(R2, _PSLOT_KEY),
        asm.call(Helper.MAP_LOOKUP_ELEM),  # (an array: the verifier inlines it)
        asm.jeq(R0, 0, "pslot_claim"),
        asm.ldx(DW, R1, R0, 0), asm.ldx(DW, R2, FP, layout.INFLIGHT_KEY_AT), asm.rsh(R2, 32),
        asm.jne(R1, R2, "pslot_claim"),
        asm.Label("pslot_add"),
        asm.ldx(W, R1, FP, _PSLOT_KEY), asm.mul(R1, len(TABLE)),
    ] + layout.fn_id_into(R2, fn_id) + [
        asm.add(R1, R2), asm.stx(W, FP, _PSUM_KEY, R1),
        asm.ld_map(R1, layout.PROCESS_SUMS), asm.mov(R2, FP), asm.add(R2, _PSUM_KEY),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "pslot_done"),
        asm.mov(R1, 1), asm.atomic_add(DW, R0, 0, R1), asm.atomic_add(DW, R0, 16, R8),
    ] + layout.ret_into(R1, api.returns_value, arch.ret) + [
        asm.jeq32(R1, 0, "pslot_done"), asm.mov(R1, 1), asm.atomic_add(DW, R0, 8, R1),
        asm.ja("pslot_done"),
    ]
    prog += _claim_process_slot(slots)
    return prog + [asm.Label("pslot_hash")] + _count_per_process(api, arch) + [
        asm.Label("pslot_done")]


def _claim_process_slot(slots: int) -> list:
    """At "pslot_claim": find the slot of this process (tgid) or claim a free one (an
    atomic compare-and-exchange of its owner), probing PROCESS_SLOT_PROBES slots from the
    one the tgid hashes to; cache it in the thread's task storage and go to "pslot_add".
    None: TASK_IN_HASH is cached and the call goes on to "pslot_hash" (the claim is made
    once a thread; a slot being freed, RETIRING | tgid, is passed by)."""
    prog = [
        asm.Label("pslot_claim"),
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT), asm.rsh(R1, 32),
        asm.ld_imm64(R3, _SLOT_HASH), asm.mul(R1, R3),
        asm.rsh(R1, 64 - (slots.bit_length() - 1)) if slots > 1 else asm.mov(R1, 0),
        asm.stx(W, FP, _PSLOT_KEY, R1),
    ]
    for probe in range(min(layout.PROCESS_SLOT_PROBES, slots)):
        passed = "pslot_passed_%d" % probe
        if probe:  # (the next slot, wrapping around)
            prog += [asm.ldx(W, R1, FP, _PSLOT_KEY), asm.add(R1, 1), asm.and_(R1, slots - 1),
                     asm.stx(W, FP, _PSLOT_KEY, R1)]
        prog += [
            asm.ld_map(R1, layout.PROCESS_OWNERS), asm.mov(R2, FP), asm.add(R2, _PSLOT_KEY),
            asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "pslot_full"),
            asm.ldx(DW, R2, FP, layout.INFLIGHT_KEY_AT), asm.rsh(R2, 32),
            asm.ldx(DW, R1, R0, 0), asm.jeq(R1, R2, "pslot_claimed"), asm.jne(R1, 0, passed),
            asm.mov(R3, R0), asm.mov(R0, 0), asm.atomic(Atomic.CMPXCHG, DW, R3, 0, R2),
            asm.jeq(R0, 0, "pslot_claimed"),
            asm.jeq(R0, R2, "pslot_claimed"),  # (another thread of this process took it)
            asm.Label(passed),
        ]
    return prog + [
        asm.Label("pslot_full"),
        asm.ldx(DW, R1, FP, layout.TASK_STORAGE_AT), asm.st(DW, R1, record.TASK_PROC_SLOT, -1),
        asm.ja("pslot_hash"),
        asm.Label("pslot_claimed"),
        asm.ldx(W, R2, FP, _PSLOT_KEY), asm.add(R2, 1),
        asm.ldx(DW, R1, FP, layout.TASK_STORAGE_AT), asm.stx(DW, R1, record.TASK_PROC_SLOT, R2),
        asm.ja("pslot_add"),
    ]


def _count_error(api: Api, fn_id, arch: Arch) -> list:
    """errors[(fn_id, code)] += 1 for a failed call."""
    prog = layout.ret_into(R1, api.returns_value, arch.ret) + [asm.jeq32(R1, 0, "error_done")]
    prog += layout.fn_id_into(R2, fn_id) + [
        asm.stx(W, FP, _ERROR_KEY, R2), asm.stx(W, FP, _ERROR_KEY + 4, R1),
        asm.st(DW, FP, _ERROR_VALUE, 1),
    ]
    return prog + _hash_add(ERRORS_MAP, _ERROR_KEY, _ERROR_VALUE, [(0, None)], "error")


def _count_launch(api: Api, fn_id) -> list:
    """launches[(pid, fn_id, shown argument cells)] += (1, duration)."""
    shown = _shown_cells(api)
    prog = [
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT), asm.rsh(R1, 32),  # pid, from the key
    ] + layout.fn_id_into(R2, fn_id) + [
        asm.lsh(R2, 32), asm.or_(R1, R2),
        asm.stx(DW, FP, _LAUNCH_KEY, R1),
    ]
    for cell in range(record.ARG_CELLS):
        where = _LAUNCH_KEY + 8 + 8 * cell
        if cell in shown:
            prog += [asm.ldx(DW, R1, R7, record.INFLIGHT_ARGS + 8 * cell),
                     asm.stx(DW, FP, where, R1)]
        else:
            prog.append(asm.st(DW, FP, where, 0))
    prog += [asm.st(DW, FP, _LAUNCH_VALUE, 1), asm.stx(DW, FP, _LAUNCH_VALUE + 8, R8)]
    return prog + _hash_add(LAUNCHES_MAP, _LAUNCH_KEY, _LAUNCH_VALUE, [(0, None), (8, R8)],
                            "launch")


def _hash_add(map_name: str, key: int, value: int, adds, tag: str) -> list:
    """Add to a shared hash map entry atomically, creating it (with the value on the stack
    at `value`) when missing; a lost creation race falls back to adding."""
    def add_all(base) -> list:
        out = []
        for offset, reg in adds:
            if reg is None:
                out += [asm.mov(R1, 1), asm.atomic_add(DW, base, offset, R1)]
            else:
                out += [asm.atomic_add(DW, base, offset, reg)]
        return out

    lookup = [asm.ld_map(R1, map_name), asm.mov(R2, FP), asm.add(R2, key),
              asm.call(Helper.MAP_LOOKUP_ELEM)]
    return (lookup + [asm.jeq(R0, 0, tag + "_create")] + add_all(R0)
            + [asm.ja(tag + "_done"), asm.Label(tag + "_create"),
               asm.ld_map(R1, map_name), asm.mov(R2, FP), asm.add(R2, key),
               asm.mov(R3, FP), asm.add(R3, value), asm.mov(R4, 1),  # BPF_NOEXIST
               asm.call(Helper.MAP_UPDATE_ELEM), asm.jeq(R0, 0, tag + "_done")]
            + lookup + [asm.jeq(R0, 0, tag + "_done")] + add_all(R0)
            + [asm.Label(tag + "_done")])


def func_cell(api: Api) -> int:
    """The record cell of a launch row's `func` argument."""
    return next(cell for arg, cell in arg_cells(api) if arg.name == "func")
