"""The state an entry program saves for its return program (entry time, argument cells,
out-parameter pointers, the entry stack pointer) and how the return finds it: a small
per-thread stack in task-local storage (`tasks`), or the `inflight` LRU hash keyed by
(pid_tgid, entry stack pointer) on kernels without it."""
from typing import List

from .. import asm
from ..arch import Arch
from ..asm import DW, FP, R0, R1, R2, R3, R4, R6, R7, R8, R9, RB_FORCE_WAKEUP, Helper
from ..spec import layout, record
from ..spec.apis import DRIVER, RUNTIME, Api, Role
from .arguments import load_args
from .options import ProbeOptions
from .records import count, entry_head, py_stack_into, reserve
from .scope import pid_tgid, pid_tgid_from_task, task_read

BPF_LOCAL_STORAGE_GET_F_CREATE = 1

Items = List[object]


def find_in_map() -> Items:
    """R7 = this call's entry in the inflight map (key at fp-16), else jump to no_entry."""
    return [
        asm.ld_map(R1, layout.INFLIGHT), asm.mov(R2, FP), asm.add(R2, layout.INFLIGHT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "no_entry"),
        asm.mov(R7, R0),
    ]


def task_storage(create: bool, keep_task: bool = False) -> Items:
    """R0 = this thread's `tasks` value (created when asked), or NULL; `keep_task`: fp-408 =
    the task."""
    return [
        asm.call(Helper.GET_CURRENT_TASK_BTF), asm.mov(R2, R0),
    ] + ([asm.stx(DW, FP, layout.TASK_AT, R0)] if keep_task else []) + [
        asm.ld_map(R1, layout.TASKS), asm.mov(R3, 0),
        asm.mov(R4, BPF_LOCAL_STORAGE_GET_F_CREATE if create else 0),
        asm.call(Helper.TASK_STORAGE_GET),
    ]


def launch_layer(api: Api) -> int:
    """A launch row's layer as its slot keeps it (record.SLOT_LAUNCH): 1 the driver's, 2 the
    runtime's; 0 for every other row. A launch entered inside a launch of its own layer on
    the same thread is that launch reaching a second probed entry point (`_ptsz` exports
    forwarding to the plain ones, interposers): it is recorded once, as the outer one. A
    driver launch inside a runtime launch stays a call of its own (analysis/layers.py)."""
    if api.role != Role.LAUNCH or api.library not in (DRIVER, RUNTIME):
        return 0
    return 1 if api.library == DRIVER else 2


def _top_slot(into, depth) -> Items:
    """into = the thread's innermost slot in flight (R9: its task storage; `depth` >= 1,
    bounded by TASK_DEPTH, so the verifier knows the offset)."""
    return [asm.mov(into, depth), asm.sub(into, 1), asm.mul(into, record.TASK_SLOT),
            asm.add(into, R9), asm.add(into, 8)]


def _twin_entry(layer: int) -> Items:
    """At entry with R1 = depth (< TASK_DEPTH): inside a launch of this layer, count a twin on
    its slot and stash nothing (the return below knows it by that count)."""
    return [asm.jle(R1, 0, "not_twin")] + _top_slot(R2, R1) + [
        asm.ldx(DW, R3, R2, record.SLOT_LAUNCH), asm.jne(R3, layer, "not_twin"),
        asm.ldx(DW, R3, R2, record.SLOT_TWINS), asm.add(R3, 1),
        asm.stx(DW, R2, record.SLOT_TWINS, R3),
        asm.ja("stashed"), asm.Label("not_twin"),
    ]


def twin_return() -> Items:
    """At no_entry (R9: task storage) of a launch row: a twin entered by a direct call (its
    stack pointer not the outer launch's) returns first; the innermost slot's twin count
    says so: one fewer, and nothing is recorded."""
    return [
        asm.ldx(DW, R1, R9, 0), asm.jle(R1, 0, "not_twin"),
        asm.jgt(R1, record.TASK_DEPTH, "not_twin"),
    ] + _top_slot(R2, R1) + [
        asm.ldx(DW, R3, R2, record.SLOT_TWINS), asm.jeq(R3, 0, "not_twin"),
        asm.sub(R3, 1), asm.stx(DW, R2, record.SLOT_TWINS, R3),
        asm.ja("done"), asm.Label("not_twin"),
    ]


def stash_in_task(api: Api, arch: Arch, options: ProbeOptions) -> Items:
    """Push entry time, argument cells, out-parameter pointers and the entry stack pointer
    on this thread's stack of calls in flight (R0: its task storage, or NULL). A full stack
    is emptied and its entries kept count of (TASK_DROPPED): some may be of calls still in
    flight, counted lost when they return (`dropped_return`), others of calls left by longjmp
    or an exception, which never return and are no loss."""
    slot = record.TASK_SLOT
    prog = [
        asm.jeq(R0, 0, "stash_lost"),
        asm.mov(R9, R0),
        asm.ldx(DW, R1, R9, 0),
        asm.jlt(R1, record.TASK_DEPTH, "depth_ok"),
        asm.st(DW, R9, 0, 0),
        asm.ldx(DW, R2, R9, record.TASK_DROPPED), asm.add(R2, R1),
        asm.stx(DW, R9, record.TASK_DROPPED, R2),
        asm.mov(R1, 0),
        asm.Label("depth_ok"),
    ] + (_twin_entry(launch_layer(api)) if launch_layer(api) else []) + [
        asm.mov(R8, R1), asm.mul(R8, slot), asm.add(R8, R9), asm.add(R8, 8),
        asm.call(Helper.KTIME_GET_NS), asm.stx(DW, R8, record.INFLIGHT_TS, R0),
    ]
    prog += load_args(api, arch, R6, R8, record.INFLIGHT_ARGS)
    for j in range(record.OUT_CELLS):
        where = record.INFLIGHT_OUTPTRS + 8 * j
        if j < len(api.outs):
            prog += [asm.ldx(DW, R1, R6, arch.arg(api.outs[j].slot)), asm.stx(DW, R8, where, R1)]
        else:
            prog.append(asm.st(DW, R8, where, 0))
    prog += py_stack_into(R8, record.INFLIGHT_PY, options)
    return prog + [
        asm.ldx(DW, R1, R6, arch.sp), asm.stx(DW, R8, record.INFLIGHT_SP, R1),
        asm.st(DW, R8, record.SLOT_LAUNCH, launch_layer(api)), asm.st(DW, R8, record.SLOT_TWINS, 0),
        asm.ldx(DW, R1, R9, 0), asm.add(R1, 1), asm.stx(DW, R9, 0, R1),
    ] + _hello_once(options) + [
        asm.ja("stashed"), asm.Label("stash_lost"),
    ] + count(record.STAT_INFLIGHT_FULL, "lost") + [asm.Label("stashed")]


def _hello_once(options: ProbeOptions) -> Items:
    """A thread's first stash (R9: its task storage) sends a hello record, with its cgroup
    (record.HELLO_CGROUP), and wakes the reader (record.PHASE_HELLO). A full ring drops it: it is no event, so it is not counted."""
    prog = [
        asm.ldx(DW, R1, R9, record.TASK_GREETED),
        asm.jne(R1, 0, "greeted"),
        asm.st(DW, R9, record.TASK_GREETED, 1),
    ] + reserve("greeted") + entry_head(record.HELLO_FN, record.PHASE_HELLO, options)
    prog += [asm.st(DW, R8, offset, 0) for offset in range(record.ARGS, record.SIZE, 8)]
    prog += [asm.call(Helper.GET_CURRENT_CGROUP_ID), asm.stx(DW, R8, record.HELLO_CGROUP, R0)]
    return prog + [asm.mov(R1, R8), asm.mov(R2, RB_FORCE_WAKEUP),
                   asm.call(Helper.RINGBUF_SUBMIT), asm.Label("greeted")]


def dropped_return() -> Items:
    """At no_entry (R9: the thread's task storage): a return without its entry while entries
    let go from a full stack are left is a call lost to the depth (STAT_INFLIGHT_FULL), one
    of them fewer; else the entry was never seen (STAT_NO_ENTRY, counted by the caller)."""
    return [
        asm.ldx(DW, R1, R9, record.TASK_DROPPED),
        asm.jeq(R1, 0, "never_stashed"),
        asm.sub(R1, 1), asm.stx(DW, R9, record.TASK_DROPPED, R1),
    ] + count(record.STAT_INFLIGHT_FULL, "dropped") + [
        asm.ja("done"), asm.Label("never_stashed"),
    ]


def find_in_task(twins: bool = False, keep_task: bool = False) -> Items:
    """R7 = this call's slot on the thread's stack (the topmost whose entry stack pointer is
    the one at fp-8), popping it and anything above; else jump to no_entry (or, for a thread
    without storage, one whose entries were never stashed, to done). `twins` (launch rows):
    a slot with twins is kept, one twin fewer, and the return ends (a twin entered by a
    jump, whose stack pointer is the outer launch's, returns first). `keep_task`: the task's
    pointer is also spilled at fp-408 (scope.task_read)."""
    return list(_FIND_IN_TASK[twins, keep_task])


def _twin_found(level: int) -> Items:
    return [
        asm.ldx(DW, R4, R7, record.SLOT_TWINS), asm.jeq(R4, 0, "pop_%d" % level),
        asm.sub(R4, 1), asm.stx(DW, R7, record.SLOT_TWINS, R4),
        asm.st(DW, R9, 0, level + 1), asm.ja("done"),
        asm.Label("pop_%d" % level),
    ]


def _build_find_in_task(twins: bool, keep_task: bool) -> Items:
    prog = task_storage(create=False, keep_task=keep_task) + [
        asm.jeq(R0, 0, "done"),
        asm.mov(R9, R0),
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT + 8), asm.ldx(DW, R2, R9, 0),
    ]
    for level in reversed(range(record.TASK_DEPTH)):
        at = 8 + level * record.TASK_SLOT
        prog += [
            asm.jle(R2, level, "below_%d" % level),
            asm.ldx(DW, R3, R9, at + record.INFLIGHT_SP),
            asm.jne(R3, R1, "below_%d" % level),
            asm.mov(R7, R9), asm.add(R7, at),
        ] + (_twin_found(level) if twins else []) + [
            asm.st(DW, R9, 0, level),
            asm.ja("found"),
            asm.Label("below_%d" % level),
        ]
    return prog + [asm.ja("no_entry"), asm.Label("found")]


# The same in every return program (instructions are immutable values): built once.
_FIND_IN_TASK = {(twins, keep): tuple(_build_find_in_task(twins, keep))
                 for twins in (False, True) for keep in (False, True)}


def key_from_task(options: ProbeOptions) -> Items:
    """fp-16 = pid_tgid, from the task that find_in_task spilled (task_read; else
    inflight_key wrote it already)."""
    if not (options.task_storage and task_read(options)):
        return []
    return pid_tgid_from_task(options) + [asm.stx(DW, FP, layout.INFLIGHT_KEY_AT, R0)]


def inflight_key(arch: Arch, sp_adjust: int, options: ProbeOptions) -> Items:
    """fp-16 = pid_tgid (with task storage and task_read: after find_in_task, by
    key_from_task), fp-8 = the stack pointer as it was at function entry."""
    later = options.task_storage and task_read(options)
    prog: Items = [] if later else pid_tgid(options) + [
        asm.stx(DW, FP, layout.INFLIGHT_KEY_AT, R0)]
    prog += [asm.ldx(DW, R1, R6, arch.sp)]
    if sp_adjust:
        prog.append(asm.sub(R1, sp_adjust))
    return prog + [asm.stx(DW, FP, layout.INFLIGHT_KEY_AT + 8, R1)]


def stash_entry(api: Api, arch: Arch, options: ProbeOptions) -> Items:
    """Save entry time, argument cells and out-parameter pointers in the inflight map."""
    prog: Items = [asm.call(Helper.KTIME_GET_NS), asm.stx(DW, FP, layout.INFLIGHT_VALUE_AT, R0)]
    prog += load_args(api, arch, R6, FP, layout.INFLIGHT_VALUE_AT + record.INFLIGHT_ARGS)
    for j in range(record.OUT_CELLS):
        where = layout.INFLIGHT_VALUE_AT + record.INFLIGHT_OUTPTRS + 8 * j
        if j < len(api.outs):
            prog += [asm.ldx(DW, R1, R6, arch.arg(api.outs[j].slot)), asm.stx(DW, FP, where, R1)]
        else:
            prog.append(asm.st(DW, FP, where, 0))
    prog += py_stack_into(FP, layout.INFLIGHT_VALUE_AT + record.INFLIGHT_PY, options)
    prog += inflight_key(arch, 0, options)
    return prog + [
        asm.ld_map(R1, layout.INFLIGHT), asm.mov(R2, FP), asm.add(R2, layout.INFLIGHT_KEY_AT),
        asm.mov(R3, FP), asm.add(R3, layout.INFLIGHT_VALUE_AT), asm.mov(R4, 0),
        asm.call(Helper.MAP_UPDATE_ELEM),
    ]
