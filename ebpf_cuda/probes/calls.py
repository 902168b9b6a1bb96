"""Generate the eBPF programs for a row of the function table.

For each traced function, with return probes on (the default):
- the entry program saves the entry time, the argument cells, the out-parameter pointers and
  the entry stack pointer: on a small per-thread stack in task-local storage (`tasks`), or,
  on kernels without it, in the `inflight` LRU hash keyed by (pid_tgid, entry stack pointer);
- the return program finds that entry, reserves one record in the `events` ring buffer,
  fills it (times, ids, comm, arguments, return value, out-parameters read with
  probe_read_user when the call succeeded) and submits it, and/or adds the call to the
  in-kernel aggregates (probes/aggregates.py).
With return probes off, or `emit_entry=True`, the entry program writes a record itself.
Lost records and unpaired returns are counted in the per-CPU `stats` array.

The pieces are in their own modules: options.py (ProbeOptions), scope.py (which threads are
traced), inflight.py (the state saved between entry and return), arguments.py (reading
arguments, out-parameters and names), records.py (the ring buffer and the stats); every name
callers used from here is importable from here still.
"""
from typing import Hashable, List

from .. import asm
from ..arch import Arch
from ..asm import DW, FP, R0, R1, R2, R3, R6, R7, R8, R9, Helper, W
from ..spec import layout, record
from ..spec.apis import Api
from . import aggregates, pystack
from .arguments import field_offset, in_registers, learn_name, load_args, read_outs
from .inflight import (dropped_return, find_in_map, find_in_task, inflight_key, key_from_task,
                       launch_layer, stash_entry, stash_in_task, task_storage, twin_return)
from .options import ProbeOptions
from .records import (comm, count, entry_head, py_stack_into, reserve, spill_task, stack_id,
                      store_fn_and_phase, submit)
from .scope import in_namespace, only_followed, pid_tgid, task_read

Items = List[object]

FnId = layout.FnId
FROM_COOKIE = layout.FROM_COOKIE


def shape_of(api: Api, retprobe: bool, arch: Arch, aggregate: bool = False) -> Hashable:
    """Everything the generated entry (or return) code of `api` for `arch` depends on besides
    its function id (`aggregate`: with in-kernel aggregates): rows of equal shape share that
    program when the id comes from the attach cookie (tests/test_probes_calls.py checks
    that equal shapes mean equal code)."""
    layer = launch_layer(api)  # (launch rows merge nested twins: probes/inflight.py)
    if not retprobe:
        args = "registers" if in_registers(api, arch) else tuple(
            (arg.slot, arg.cells, arg.deref, arg.deref_at) for arg in api.args)
        return args, tuple(out.slot for out in api.outs), layer
    learn = tuple(field_offset(api, f) for f in api.learn_name) if api.learn_name else ()
    learn += ((),) if not api.returns_value else ()  # (a void function: its return is 0)
    if not aggregate:
        return tuple(out.size for out in api.outs), learn, layer
    return tuple(out.size for out in api.outs), learn, layer, aggregates.shape_of(api)


def _read_cookie() -> Items:
    """fp-280 = the attach cookie (R6 = ctx)."""
    return [asm.mov(R1, R6), asm.call(Helper.GET_ATTACH_COOKIE),
            asm.stx(DW, FP, layout.FN_ID_AT, R0)]


def entry_program(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    """Instructions of the entry probe of `api`."""
    return [asm.mov(R6, R1)] + in_namespace(options) + _entry_body(api, fn_id, arch, options)


def _entry_body(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    prog: Items = []
    # Storage is created only for followed processes: a thread that has it needs no lookup
    # in the `followed` map (when nothing is written before the stash).
    by_storage = (options.follow and options.task_storage and options.stash
                  and not options.emit_entry)
    # An entry record loads pid_tgid and comm through the task (task_read): fetched once,
    # before the followed check, which then needs no get_current_pid_tgid either.
    spilled = task_read(options) and (options.emit_entry or not options.stash)
    prog += spill_task() if spilled else []
    if options.follow and not by_storage:
        prog += only_followed(options, from_task=spilled)
    if options.py_stacks is not None:  # (before the entry time is taken: not in the call's)
        prog += pystack.walk(options.py_stacks, pid_tgid(options))
    if options.emit_entry or not options.stash:
        prog += _read_cookie() if fn_id is FROM_COOKIE else []
        prog += _emit_enter_record(api, fn_id, arch, options, spilled)
    if options.stash and options.task_storage:
        if by_storage:
            prog += task_storage(create=False) + [asm.jne(R0, 0, "have_storage")]
            prog += only_followed(options)
        prog += task_storage(create=True) + [asm.Label("have_storage")]
        prog += stash_in_task(api, arch, options)
    elif options.stash:
        prog += stash_entry(api, arch, options)
    return prog + [asm.mov(R0, 0), asm.exit()]


def return_program(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    """Instructions of the return probe of `api`: one complete-call record (`emit`) and/or
    in-kernel aggregates (`aggregate`), from the state the entry probe saved."""
    # On return the callee has popped what `call` pushed: x86-64's return address.
    # With task storage the followed-process check is the entry's alone: a thread of another
    # process has no storage of ours, and its returns end at the lookup.
    return [asm.mov(R6, R1)] + in_namespace(options) + _return_body(api, fn_id, arch, options)


def _return_body(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    followed_check = options.follow and not options.task_storage
    prog: Items = only_followed(options) if followed_check else []
    prog += _read_cookie() if fn_id is FROM_COOKIE else []
    prog += inflight_key(arch, arch.stack_args_start, options)
    layer = launch_layer(api)
    if options.task_storage:
        prog += find_in_task(bool(layer), task_read(options))
        if options.aggregate and options.per_process > 0 and not options.sample_returns:
            prog += [asm.stx(DW, FP, layout.TASK_STORAGE_AT, R9)]  # (aggregates' slot)
        prog += key_from_task(options)
    else:
        prog += find_in_map()
    prog += [asm.call(Helper.KTIME_GET_NS), asm.stx(DW, FP, layout.NOW_AT, R0)]
    if options.emit:
        prog += _emit_call_record(api, fn_id, arch, options)
    prog += _capture_gate(api, fn_id, arch, options)
    if options.aggregate:
        prog += aggregates.aggregate_call(api, fn_id, arch, _gated(api, options),
                                          bool(options.sample_returns), options.per_process)
        prog += aggregates.capture_count(api, arch)
    if not options.task_storage:  # (a task's stack was popped when the entry was found)
        prog += [asm.ld_map(R1, layout.INFLIGHT), asm.mov(R2, FP),
                 asm.add(R2, layout.INFLIGHT_KEY_AT),
                 asm.call(Helper.MAP_DELETE_ELEM)]
    prog += [asm.ja("done"), asm.Label("no_entry")]
    prog += twin_return() if options.task_storage and layer else []
    prog += dropped_return() if options.task_storage else []
    prog += count(record.STAT_NO_ENTRY)
    return prog + [asm.Label("done"), asm.mov(R0, 0), asm.exit()]


def session_program(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    """Instructions of the uprobe-session program of a launch row (options.sample_returns).
    At entry (bpf_session_is_return false) each call is counted, with its launch by process
    and kernel (aggregates.count_call), unless its process captures; 1 call in
    `sample_returns`, and every call while its process captures, is then stashed and returns
    0: its return runs (the return program: duration and outcome, and while capturing the
    call's count and record). The others return 1: the kernel sets no return probe."""
    prog: Items = [asm.mov(R6, R1)] + in_namespace(options, outside=1)
    # (R1 = ctx: newer kernels' bpf_session_is_return takes it, older ones ignore it)
    prog += [asm.mov(R1, R6), asm.kfunc_call(options.is_return_kfunc),
             asm.jne(R0, 0, "r_return")]
    if options.follow:  # (not followed: counted nowhere, no return)
        prog += asm.relabel(only_followed(options, outside=1), "f_")
    prog += _read_cookie() if fn_id is FROM_COOKIE else []
    prog += pid_tgid(options) + [asm.stx(DW, FP, layout.INFLIGHT_KEY_AT, R0)]
    prog += _twin_gate(api, arch)
    prog += _draw(options.sample_returns)
    prog += aggregates.capturing_gate([asm.ja("timed")])  # (all its return counts)
    prog += aggregates.count_call(api, fn_id, arch)
    prog += [asm.ldx(DW, R1, FP, layout.SAMPLE_AT), asm.jeq(R1, 0, "timed"),
             asm.mov(R0, 1), asm.exit(), asm.Label("timed")]
    prog += _entry_body(api, fn_id, arch, options)  # (ends returning 0)
    return prog + [asm.Label("r_return")] + asm.relabel(
        _return_body(api, fn_id, arch, options), "r_")


TWIN_REACH = 4096  # how far below a `_ptsz` launch's stack pointer its twin may be entered


def _twin_gate(api: Api, arch: Arch) -> Items:
    """Entry code of a sampled launch row with `_ptsz` aliases (R6 ctx, fp-16 pid_tgid),
    before it is counted. Its entries counted here have no return to tell a twin by
    (inflight.py's task-storage test), so the alias sites (cookie | ALIAS_COOKIE) mark this
    CPU's slot of their layer with (pid_tgid, stack pointer); a plain entry by the same thread
    at or within TWIN_REACH below that mark is the alias reaching it (a call or a jump), and
    takes the mark and returns 1: not counted, no return. A mark an alias that does not
    forward leaves is taken by the next such plain entry of that thread on that CPU."""
    layer = launch_layer(api)
    if not (layer and api.aliases):
        return []
    mark = 16 * (layer - 1)
    return [
        asm.st(DW, FP, layout.SAMPLE_AT, 0),  # (the key; the draw after it uses the slot)
        asm.ld_map(R1, layout.TWIN_MARKS), asm.mov(R2, FP), asm.add(R2, layout.SAMPLE_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "twin_checked"), asm.mov(R7, R0),
        asm.mov(R1, R6), asm.call(Helper.GET_ATTACH_COOKIE), asm.rsh(R0, 32),
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT), asm.ldx(DW, R2, R6, arch.sp),
        asm.jeq(R0, 0, "plain_site"),
        asm.stx(DW, R7, mark, R1), asm.stx(DW, R7, mark + 8, R2), asm.ja("twin_checked"),
        asm.Label("plain_site"),
        asm.ldx(DW, R3, R7, mark), asm.jne(R3, R1, "twin_checked"),
        asm.ldx(DW, R3, R7, mark + 8), asm.sub(R3, R2), asm.jgt(R3, TWIN_REACH, "twin_checked"),
        asm.st(DW, R7, mark, 0), asm.mov(R0, 1), asm.exit(),
        asm.Label("twin_checked"),
    ]


_XORSHIFT_SEED = 0x9E3779B97F4A7C15  # (any non-zero state)


def _draw(one_in: int) -> Items:
    """fp-368 = a draw in [0, one_in) (a power of two), 0 taking the return: the top bits of
    this CPU's xorshift64 state, stepped (an array lookup the verifier inlines, where the
    prandom helper is a call). Two threads of one CPU interleaving may draw alike: harmless."""
    bits = one_in.bit_length() - 1
    return [
        asm.st(DW, FP, layout.SAMPLE_AT, 0),
        asm.ld_map(R1, layout.SAMPLING), asm.mov(R2, FP), asm.add(R2, layout.SAMPLE_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "drawn"),  # (never: one entry)
        asm.ldx(DW, R1, R0, 0), asm.jne(R1, 0, "seeded"), asm.ld_imm64(R1, _XORSHIFT_SEED),
        asm.Label("seeded"),
        asm.mov(R2, R1), asm.lsh(R2, 13), asm.xor(R1, R2),
        asm.mov(R2, R1), asm.rsh(R2, 7), asm.xor(R1, R2),
        asm.mov(R2, R1), asm.lsh(R2, 17), asm.xor(R1, R2),
        asm.stx(DW, R0, 0, R1), asm.rsh(R1, 64 - bits), asm.stx(DW, FP, layout.SAMPLE_AT, R1),
        asm.Label("drawn"),
    ]


def _gated(api: Api, options: ProbeOptions) -> bool:
    """Whether the return program of `api` writes its record only while its process has a
    stream capture in progress (in-kernel aggregates without records: see
    aggregates.capturing_gate)."""
    return (options.aggregate and not options.emit
            and aggregates.capture_role(api) == "gated")


def _capture_gate(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    """The capture gate of a launch, copy, memset or event row with aggregates and no
    records (else nothing): while its process captures, the call is written as a record
    (graphs.py then tells captured work from eager work) and not counted as a launch in
    the kernel (aggregates.capturing_gate, capture_count)."""
    if not _gated(api, options):
        return []
    return aggregates.capturing_gate(_emit_call_record(api, fn_id, arch, options))


def _emit_call_record(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    """Reserve, fill and submit the record of a complete call (R7 = the inflight value)."""
    prog = reserve("ring_full")
    prog += [
        asm.ldx(DW, R1, FP, layout.NOW_AT), asm.stx(DW, R8, record.TS_EXIT, R1),
        asm.ldx(DW, R1, R7, record.INFLIGHT_TS), asm.stx(DW, R8, record.TS_ENTER, R1),
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT), asm.stx(DW, R8, record.PID_TGID, R1),
    ] + store_fn_and_phase(fn_id, record.PHASE_CALL)
    prog += stack_id() if options.stacks else [asm.st(W, R8, record.STACK_ID, 0)]
    prog += comm(options)
    for cell in range(record.ARG_CELLS):  # (the entry zeroed the cells its row leaves unused)
        prog += [asm.ldx(DW, R1, R7, record.INFLIGHT_ARGS + 8 * cell),
                 asm.stx(DW, R8, record.ARGS + 8 * cell, R1)]
    prog += layout.ret_into(R1, api.returns_value, arch.ret)
    prog += [asm.stx(DW, R8, record.RET, R1),
             asm.ldx(DW, R1, R7, record.INFLIGHT_PY), asm.stx(DW, R8, record.PY_STACK, R1)]
    prog += read_outs(api, arch, record.FLAG_ENTRY_SENT if options.emit_entry else 0)
    if api.learn_name:
        prog += learn_name(api, arch)
    prog += submit(options)
    prog += [asm.ja("emitted"), asm.Label("ring_full")]
    prog += count(record.STAT_RING_FULL)
    return prog + [asm.Label("emitted")]


def _emit_enter_record(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions,
                       spilled: bool = False) -> Items:
    """Write an enter record straight into the ring buffer: with return probes (--entries) an
    extra record of a call whose complete record follows (flagged so, and its loss counted
    apart: decode/losses.py), else (-r) the call's only record."""
    follows = options.stash  # (the entry is stashed: its return writes the complete record)
    flags = record.FLAG_RETURN_FOLLOWS if follows else 0
    prog = reserve("enter_lost") + entry_head(fn_id, record.PHASE_ENTER, options, flags,
                                              spilled)
    prog += load_args(api, arch, R6, R8, record.ARGS)
    prog += [asm.st(DW, R8, record.RET, 0)]
    prog += [asm.st(DW, R8, record.OUTS + 8 * j, 0) for j in range(record.OUT_CELLS)]
    prog += py_stack_into(R8, record.PY_STACK, options)
    prog += submit(options)
    prog += [asm.ja("enter_done"), asm.Label("enter_lost")]
    prog += count(record.STAT_ENTRY_LOST if follows else record.STAT_RING_FULL)
    return prog + [asm.Label("enter_done")]


def program_name(fn_id: int, retprobe: bool, shared: bool = False) -> str:
    """A kernel-visible program name (at most 15 characters of [A-Za-z0-9_]); a shared
    program is named after its shape's number."""
    return "cuda%s%d_%s" % ("s" if shared else "", fn_id, "ret" if retprobe else "ent")
