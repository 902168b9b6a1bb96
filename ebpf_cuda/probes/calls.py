"""Generate the eBPF programs for a row of the function table.

For each traced function, with return probes on (the default):
- the entry program saves the entry time, the argument cells, the out-parameter pointers and
  the entry stack pointer: on a small per-thread stack in task-local storage (`tasks`), or,
  on kernels without it, in the `inflight` LRU hash keyed by (pid_tgid, entry stack pointer);
- the return program finds that entry, reserves one record in the `events` ring buffer,
  fills it (times, ids, comm, arguments, return value, out-parameters read with
  probe_read_user when the call succeeded) and submits it, and/or adds the call to the
  in-kernel aggregates (aggregates.py).
With return probes off, or `emit_entry=True`, the entry program writes a record itself.
Lost records and unpaired returns are counted in the per-CPU `stats` array.
"""
from typing import Hashable, List, NamedTuple, Optional, Tuple

from . import aggregates, pystack as pystack_probe
from .. import asm
from ..spec import layout, record
from ..spec.apis import Api, Kind, arg_cells
from ..arch import Arch
from ..asm import (B, DW, FP, R0, R1, R2, R3, R4, R6, R7, R8, R9, RB_FORCE_WAKEUP, RB_NO_WAKEUP, W,
                   Helper)

BPF_F_USER_STACK = 1 << 8
BPF_RB_AVAIL_DATA = 0  # ringbuf_query: bytes not yet consumed
BPF_LOCAL_STORAGE_GET_F_CREATE = 1

Items = List[object]

FnId = layout.FnId
FROM_COOKIE = layout.FROM_COOKIE
fn_id_into = layout.fn_id_into


def shape_of(api: Api, retprobe: bool, arch: Arch, aggregate: bool = False) -> Hashable:
    """Everything the generated entry (or return) code of `api` for `arch` depends on besides
    its function id (`aggregate`: with in-kernel aggregates): rows of equal shape share that
    program when the id comes from the attach cookie (tests/test_probes_shared.py checks
    that equal shapes mean equal code)."""
    if not retprobe:
        args = "registers" if in_registers(api, arch) else tuple(
            (arg.slot, arg.cells, arg.deref, arg.deref_at) for arg in api.args)
        return args, tuple(out.slot for out in api.outs)
    learn = tuple(_field_offset(api, f) for f in api.learn_name) if api.learn_name else ()
    learn += ((),) if not api.returns_value else ()  # (a void function: its return is 0)
    if not aggregate:
        return tuple(out.size for out in api.outs), learn
    return tuple(out.size for out in api.outs), learn, aggregates.shape_of(api)


def _read_cookie() -> Items:
    """fp-280 = the attach cookie (R6 = ctx)."""
    return [asm.mov(R1, R6), asm.call(Helper.GET_ATTACH_COOKIE),
            asm.stx(DW, FP, layout.FN_ID_AT, R0)]


def _store_fn_and_phase(fn_id: FnId, phase: int) -> Items:
    """The record's u16 function id and u8 phase (flags zeroed), at R8."""
    if fn_id is FROM_COOKIE:
        return fn_id_into(R1, fn_id) + [asm.or_(R1, phase << 16),
                                       asm.stx(W, R8, record.FN_ID, R1)]
    return [asm.st(W, R8, record.FN_ID, fn_id | phase << 16)]


class ProbeOptions(NamedTuple):
    """What the generated programs do beyond the basics."""

    stash: bool = True  # entry saves state for a return probe
    emit_entry: bool = False  # entry also writes an enter record
    # Wake the reader only once this many bytes wait in the ring (0: the kernel's adaptive
    # wakeup, one per record when the reader keeps up, which costs the traced thread about
    # half a microsecond each time); the reader also polls on a short timeout.
    wakeup_bytes: int = 0
    wake_now: bool = False  # wake the reader at once (calls that teach kernel names: rare)
    stacks: bool = False  # return records carry the caller's user stack id (`stacks` map)
    emit: bool = True  # the return probe writes a record per call
    follow: bool = False  # only processes in the `followed` map (see follow.py) are traced
    # Keep calls in flight in task-local storage (`tasks` map: a small per-thread stack)
    # rather than the `inflight` hash map: no hashing, no deletes, nothing left by dead threads.
    task_storage: bool = False
    aggregate: bool = False  # the return probe adds the call to in-kernel aggregates
    # The tracer's PID namespace (features.PidNamespace: nsfs device, inode) when it is not
    # the initial one: pids as that namespace numbers them (bpf_get_ns_current_pid_tgid,
    # once per program run), threads outside it not traced, children followed through the
    # `forked` map (follow.py). None: the kernel's pids (bpf_get_current_pid_tgid).
    pid_ns: Optional[Tuple[int, int]] = None
    # --py-stacks: where task_struct keeps the thread pointer (kernel_btf.py); the entry
    # walks the thread's Python frames (pystack_probe.py). None: no Python stacks.
    py_stacks: Optional[int] = None
    # Uprobe sessions (the monitor's launch rows, kernels with them): one program on entry and
    # return, the return taken by 1 call in `sample_returns` (a power of two) and by every
    # call while its process captures; the others are counted at entry (calls, launches)
    # and cost no return trap. `is_return_kfunc`: bpf_session_is_return's BTF id.
    sample_returns: int = 0
    is_return_kfunc: int = 0
    per_process: bool = False  # aggregates also by process (`proc_calls`: the monitor)


def entry_program(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    """Instructions of the entry probe of `api`."""
    return [asm.mov(R6, R1)] + _in_namespace(options) + _entry_body(api, fn_id, arch, options)


def _entry_body(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    prog: Items = []
    # Storage is created only for followed processes: a thread that has it needs no lookup
    # in the `followed` map (when nothing is written before the stash).
    by_storage = (options.follow and options.task_storage and options.stash
                  and not options.emit_entry)
    if options.follow and not by_storage:
        prog += _only_followed(options)
    if options.py_stacks is not None:  # (before the entry time is taken: not in the call's)
        prog += pystack_probe.walk(options.py_stacks, _pid_tgid(options))
    if options.emit_entry or not options.stash:
        prog += _read_cookie() if fn_id is FROM_COOKIE else []
        prog += _emit_enter_record(api, fn_id, arch, options)
    if options.stash and options.task_storage:
        if by_storage:
            prog += _task_storage(create=False) + [asm.jne(R0, 0, "have_storage")]
            prog += _only_followed(options)
        prog += _task_storage(create=True) + [asm.Label("have_storage")]
        prog += _stash_in_task(api, arch, options)
    elif options.stash:
        prog += _stash_entry(api, arch, options)
    return prog + [asm.mov(R0, 0), asm.exit()]


def return_program(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    """Instructions of the return probe of `api`: one complete-call record (`emit`) and/or
    in-kernel aggregates (`aggregate`), from the state the entry probe saved."""
    # On return the callee has popped what `call` pushed: x86-64's return address.
    # With task storage the followed-process check is the entry's alone: a thread of another
    # process has no storage of ours, and its returns end at the lookup.
    return [asm.mov(R6, R1)] + _in_namespace(options) + _return_body(api, fn_id, arch, options)


def _return_body(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    followed_check = options.follow and not options.task_storage
    prog: Items = _only_followed(options) if followed_check else []
    prog += _read_cookie() if fn_id is FROM_COOKIE else []
    prog += _inflight_key(arch, arch.stack_args_start, options)
    prog += _find_in_task() if options.task_storage else _find_in_map()
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
    prog += _count(record.STAT_NO_ENTRY)
    return prog + [asm.Label("done"), asm.mov(R0, 0), asm.exit()]


def session_program(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    """Instructions of the uprobe-session program of a launch row (options.sample_returns).
    At entry (bpf_session_is_return false) each call is counted, with its launch by process
    and kernel (aggregates.count_call), unless its process captures; 1 call in
    `sample_returns`, and every call while its process captures, is then stashed and returns
    0: its return runs (the return program: duration and outcome, and while capturing the
    call's count and record). The others return 1: the kernel sets no return probe."""
    prog: Items = [asm.mov(R6, R1)] + _in_namespace(options, outside=1)
    # (R1 = ctx: newer kernels' bpf_session_is_return takes it, older ones ignore it)
    prog += [asm.mov(R1, R6), asm.kfunc_call(options.is_return_kfunc),
             asm.jne(R0, 0, "r_return")]
    if options.follow:  # (not followed: counted nowhere, no return)
        prog += asm.relabel(_only_followed(options, outside=1), "f_")
    prog += _read_cookie() if fn_id is FROM_COOKIE else []
    prog += _draw(options.sample_returns)
    prog += _pid_tgid(options) + [asm.stx(DW, FP, layout.INFLIGHT_KEY_AT, R0)]
    prog += aggregates.capturing_gate([asm.ja("timed")])  # (all its return counts)
    prog += aggregates.count_call(api, fn_id, arch)
    prog += [asm.ldx(DW, R1, FP, layout.SAMPLE_AT), asm.jeq(R1, 0, "timed"),
             asm.mov(R0, 1), asm.exit(), asm.Label("timed")]
    prog += _entry_body(api, fn_id, arch, options)  # (ends returning 0)
    return prog + [asm.Label("r_return")] + asm.relabel(
        _return_body(api, fn_id, arch, options), "r_")


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
    prog = _reserve("ring_full")
    prog += [
        asm.ldx(DW, R1, FP, layout.NOW_AT), asm.stx(DW, R8, record.TS_EXIT, R1),
        asm.ldx(DW, R1, R7, record.INFLIGHT_TS), asm.stx(DW, R8, record.TS_ENTER, R1),
        asm.ldx(DW, R1, FP, layout.INFLIGHT_KEY_AT), asm.stx(DW, R8, record.PID_TGID, R1),
    ] + _store_fn_and_phase(fn_id, record.PHASE_CALL)
    prog += _stack_id() if options.stacks else [asm.st(W, R8, record.STACK_ID, 0)]
    prog += _comm()
    for cell in range(record.ARG_CELLS):  # (the entry zeroed the cells its row leaves unused)
        prog += [asm.ldx(DW, R1, R7, record.INFLIGHT_ARGS + 8 * cell),
                 asm.stx(DW, R8, record.ARGS + 8 * cell, R1)]
    prog += layout.ret_into(R1, api.returns_value, arch.ret)
    prog += [asm.stx(DW, R8, record.RET, R1),
             asm.ldx(DW, R1, R7, record.INFLIGHT_PY), asm.stx(DW, R8, record.PY_STACK, R1)]
    prog += _read_outs(api, arch, record.FLAG_ENTRY_SENT if options.emit_entry else 0)
    if api.learn_name:
        prog += _learn_name(api, arch)
    prog += _submit(options)
    prog += [asm.ja("emitted"), asm.Label("ring_full")]
    prog += _count(record.STAT_RING_FULL)
    return prog + [asm.Label("emitted")]


def _in_namespace(options: ProbeOptions, outside: int = 0) -> Items:
    """In a PID namespace: fp-296 = this thread's (tid, tgid) as the namespace numbers them;
    a thread outside it (the host's, a nested namespace's) returns at once: the tracer can
    neither name nor follow it."""
    if options.pid_ns is None:
        return []
    dev, ino = options.pid_ns
    return [
        asm.ld_imm64(R1, dev), asm.ld_imm64(R2, ino),
        asm.mov(R3, FP), asm.add(R3, layout.NS_PID_TGID_AT), asm.mov(R4, 8),
        asm.call(Helper.GET_NS_CURRENT_PID_TGID),
        asm.jeq(R0, 0, "in_namespace"), asm.mov(R0, outside), asm.exit(),
        asm.Label("in_namespace"),
    ]


def _pid_tgid(options: ProbeOptions) -> Items:
    """R0 = this thread's pid_tgid (tgid << 32 | tid): the kernel's, or in a PID namespace
    the one `_in_namespace` saved."""
    if options.pid_ns is None:
        return [asm.call(Helper.GET_CURRENT_PID_TGID)]
    return [asm.ldx(DW, R0, FP, layout.NS_PID_TGID_AT)]


def _only_followed(options: ProbeOptions, outside: int = 0) -> Items:
    """Return at once (with `outside`) unless this process is in the `followed` map."""
    prog = _pid_tgid(options) + [
        asm.rsh(R0, 32),
        asm.stx(W, FP, layout.STAT_KEY_AT, R0),
        asm.ld_map(R1, layout.FOLLOWED), asm.mov(R2, FP), asm.add(R2, layout.STAT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
    ]
    if options.pid_ns is None:
        return prog + [asm.jne(R0, 0, "followed"), asm.mov(R0, outside), asm.exit(),
                       asm.Label("followed")]
    return prog + [asm.jne(R0, 0, "followed")] + _adopt_forked() + [asm.Label("followed")]


def _adopt_forked() -> Items:
    """In a PID namespace, a process not followed by its pid there may be a child of a
    followed one, which the fork tracepoint knows only by its kernel pid (`forked`, see
    follow.py): if so it is followed from now on by its pid here (fp-136) and dropped from
    `forked`; else return at once. The inflight key's slot (fp-16), written only after
    this check, holds the kernel tgid (key) and 1 (value) meanwhile."""
    key, one = layout.INFLIGHT_KEY_AT, layout.INFLIGHT_KEY_AT + 4
    return [
        asm.call(Helper.GET_CURRENT_PID_TGID), asm.rsh(R0, 32), asm.stx(W, FP, key, R0),
        asm.ld_map(R1, layout.FORKED), asm.mov(R2, FP), asm.add(R2, key),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jne(R0, 0, "adopt"), asm.mov(R0, 0), asm.exit(), asm.Label("adopt"),
        asm.st(W, FP, one, 1),
        asm.ld_map(R1, layout.FOLLOWED), asm.mov(R2, FP), asm.add(R2, layout.STAT_KEY_AT),
        asm.mov(R3, FP), asm.add(R3, one), asm.mov(R4, 0),
        asm.call(Helper.MAP_UPDATE_ELEM),
        asm.ld_map(R1, layout.FORKED), asm.mov(R2, FP), asm.add(R2, key),
        asm.call(Helper.MAP_DELETE_ELEM),
    ]


def _find_in_map() -> Items:
    """R7 = this call's entry in the inflight map (key at fp-16), else jump to no_entry."""
    return [
        asm.ld_map(R1, layout.INFLIGHT), asm.mov(R2, FP), asm.add(R2, layout.INFLIGHT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "no_entry"),
        asm.mov(R7, R0),
    ]


def _task_storage(create: bool) -> Items:
    """R0 = this thread's `tasks` value (created when asked), or NULL."""
    return [
        asm.call(Helper.GET_CURRENT_TASK_BTF), asm.mov(R2, R0),
        asm.ld_map(R1, layout.TASKS), asm.mov(R3, 0),
        asm.mov(R4, BPF_LOCAL_STORAGE_GET_F_CREATE if create else 0),
        asm.call(Helper.TASK_STORAGE_GET),
    ]


def _stash_in_task(api: Api, arch: Arch, options: ProbeOptions) -> Items:
    """Push entry time, argument cells, out-parameter pointers and the entry stack pointer
    on this thread's stack of calls in flight (R0: its task storage, or NULL). A full stack
    (entries whose return never came: longjmp, exceptions) is emptied, and counted."""
    slot = record.TASK_SLOT
    prog = [
        asm.jeq(R0, 0, "stash_lost"),
        asm.mov(R9, R0),
        asm.ldx(DW, R1, R9, 0),
        asm.jlt(R1, record.TASK_DEPTH, "depth_ok"),
        asm.st(DW, R9, 0, 0),
    ] + _count(record.STAT_INFLIGHT_FULL, "full", record.TASK_DEPTH) + [
        asm.mov(R1, 0),
        asm.Label("depth_ok"),
        asm.mov(R8, R1), asm.mul(R8, slot), asm.add(R8, R9), asm.add(R8, 8),
        asm.call(Helper.KTIME_GET_NS), asm.stx(DW, R8, record.INFLIGHT_TS, R0),
    ]
    prog += _load_args(api, arch, R6, R8, record.INFLIGHT_ARGS)
    for j in range(record.OUT_CELLS):
        where = record.INFLIGHT_OUTPTRS + 8 * j
        if j < len(api.outs):
            prog += [asm.ldx(DW, R1, R6, arch.arg(api.outs[j].slot)), asm.stx(DW, R8, where, R1)]
        else:
            prog.append(asm.st(DW, R8, where, 0))
    prog += _py_stack_into(R8, record.INFLIGHT_PY, options)
    return prog + [
        asm.ldx(DW, R1, R6, arch.sp), asm.stx(DW, R8, record.INFLIGHT_SP, R1),
        asm.ldx(DW, R1, R9, 0), asm.add(R1, 1), asm.stx(DW, R9, 0, R1),
    ] + _hello_once(options) + [
        asm.ja("stashed"), asm.Label("stash_lost"),
    ] + _count(record.STAT_INFLIGHT_FULL, "lost") + [asm.Label("stashed")]


def _py_stack_into(base, offset: int, options: ProbeOptions) -> Items:
    """base+offset = the key of the call's Python stack (pystack_probe.walk left it), or 0."""
    if options.py_stacks is None:
        return [asm.st(DW, base, offset, 0)]
    return [asm.ldx(DW, R1, FP, layout.PY_STACK_AT), asm.stx(DW, base, offset, R1)]


def _hello_once(options: ProbeOptions) -> Items:
    """A thread's first stash (R9: its task storage) sends a hello record and wakes the
    reader (record.PHASE_HELLO). A full ring drops it: it is no event, so it is not counted."""
    prog = [
        asm.ldx(DW, R1, R9, record.TASK_GREETED),
        asm.jne(R1, 0, "greeted"),
        asm.st(DW, R9, record.TASK_GREETED, 1),
    ] + _reserve("greeted") + _entry_head(record.HELLO_FN, record.PHASE_HELLO, options)
    prog += [asm.st(DW, R8, offset, 0) for offset in range(record.ARGS, record.SIZE, 8)]
    return prog + [asm.mov(R1, R8), asm.mov(R2, RB_FORCE_WAKEUP),
                   asm.call(Helper.RINGBUF_SUBMIT), asm.Label("greeted")]


def _find_in_task() -> Items:
    """R7 = this call's slot on the thread's stack (the topmost whose entry stack pointer is
    the one at fp-8), popping it and anything above; else jump to no_entry (or, for a thread
    without storage, one whose entries were never stashed, to done)."""
    return list(_FIND_IN_TASK)


def _build_find_in_task() -> Items:
    prog = _task_storage(create=False) + [
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
            asm.mov(R7, R9), asm.add(R7, at), asm.st(DW, R9, 0, level),
            asm.ja("found"),
            asm.Label("below_%d" % level),
        ]
    return prog + [asm.ja("no_entry"), asm.Label("found")]


# The same in every return program (instructions are immutable values): built once.
_FIND_IN_TASK = tuple(_build_find_in_task())


def _inflight_key(arch: Arch, sp_adjust: int, options: ProbeOptions) -> Items:
    """fp-16 = pid_tgid, fp-8 = the stack pointer as it was at function entry."""
    prog: Items = _pid_tgid(options) + [asm.stx(DW, FP, layout.INFLIGHT_KEY_AT, R0),
                                        asm.ldx(DW, R1, R6, arch.sp)]
    if sp_adjust:
        prog.append(asm.sub(R1, sp_adjust))
    return prog + [asm.stx(DW, FP, layout.INFLIGHT_KEY_AT + 8, R1)]


def _stash_entry(api: Api, arch: Arch, options: ProbeOptions) -> Items:
    """Save entry time, argument cells and out-parameter pointers in the inflight map."""
    prog: Items = [asm.call(Helper.KTIME_GET_NS), asm.stx(DW, FP, layout.INFLIGHT_VALUE_AT, R0)]
    prog += _load_args(api, arch, R6, FP, layout.INFLIGHT_VALUE_AT + record.INFLIGHT_ARGS)
    for j in range(record.OUT_CELLS):
        where = layout.INFLIGHT_VALUE_AT + record.INFLIGHT_OUTPTRS + 8 * j
        if j < len(api.outs):
            prog += [asm.ldx(DW, R1, R6, arch.arg(api.outs[j].slot)), asm.stx(DW, FP, where, R1)]
        else:
            prog.append(asm.st(DW, FP, where, 0))
    prog += _py_stack_into(FP, layout.INFLIGHT_VALUE_AT + record.INFLIGHT_PY, options)
    prog += _inflight_key(arch, 0, options)
    return prog + [
        asm.ld_map(R1, layout.INFLIGHT), asm.mov(R2, FP), asm.add(R2, layout.INFLIGHT_KEY_AT),
        asm.mov(R3, FP), asm.add(R3, layout.INFLIGHT_VALUE_AT), asm.mov(R4, 0),
        asm.call(Helper.MAP_UPDATE_ELEM),
    ]


def _emit_enter_record(api: Api, fn_id: FnId, arch: Arch, options: ProbeOptions) -> Items:
    """Write an enter record straight into the ring buffer."""
    prog = _reserve("enter_lost") + _entry_head(fn_id, record.PHASE_ENTER, options)
    prog += _load_args(api, arch, R6, R8, record.ARGS)
    prog += [asm.st(DW, R8, record.RET, 0)]
    prog += [asm.st(DW, R8, record.OUTS + 8 * j, 0) for j in range(record.OUT_CELLS)]
    prog += _py_stack_into(R8, record.PY_STACK, options)
    prog += _submit(options)
    prog += [asm.ja("enter_done"), asm.Label("enter_lost")]
    prog += _count(record.STAT_RING_FULL)
    return prog + [asm.Label("enter_done")]


def _entry_head(fn_id: FnId, phase: int, options: ProbeOptions) -> Items:
    """The head of a record written at entry, at R8: the time now, no exit time, pid_tgid,
    function id and phase, no stack, comm."""
    return [
        asm.call(Helper.KTIME_GET_NS), asm.stx(DW, R8, record.TS_ENTER, R0),
        asm.st(DW, R8, record.TS_EXIT, 0),
    ] + _pid_tgid(options) + [
        asm.stx(DW, R8, record.PID_TGID, R0),
    ] + _store_fn_and_phase(fn_id, phase) + [asm.st(W, R8, record.STACK_ID, 0)] + _comm()


def in_registers(api: Api, arch: Arch) -> bool:
    """Whether every argument of `api` is a register whose slot is its cell: then the entry
    copies all argument registers, whatever the row uses (one program for many rows)."""
    return all(cell == arg.slot and not arg.deref and arg.slot + arg.cells <= len(arch.args)
               for arg, cell in arg_cells(api))


def _load_args(api: Api, arch: Arch, ctx, base, offset: int) -> Items:
    """Copy every argument cell to base+offset+8*cell; registers by load, stack slots by
    one probe_read_user per run of consecutive slots; unused cells are zeroed. A row whose
    arguments are all in registers gets every argument register (the cells past its own
    arguments hold whatever the registers held: the decoder never reads them)."""
    if in_registers(api, arch):
        prog: Items = []
        for slot in range(record.ARG_CELLS):
            if slot < len(arch.args):
                prog += [asm.ldx(DW, R1, ctx, arch.arg(slot)),
                         asm.stx(DW, base, offset + 8 * slot, R1)]
            else:
                prog.append(asm.st(DW, base, offset + 8 * slot, 0))
        return prog
    prog = []
    stack_runs: List[Tuple[int, int, int]] = []  # (first stack slot, first cell, count)
    used = 0
    derefs: List[Tuple[int, int, int, int]] = []  # (register slot, first cell, bytes, at)
    callers: List[int] = []  # cells of the caller's return address
    for arg, first in arg_cells(api):
        if arg.kind == Kind.CALLER:
            callers.append(first)
            used = max(used, first + 1)
            continue
        if arg.deref:
            derefs.append((arg.slot, first, arg.deref, arg.deref_at))
            used = max(used, first + arg.cells)
            continue
        for c in range(arg.cells):
            slot, cell = arg.slot + c, first + c
            used = max(used, cell + 1)
            if slot < len(arch.args):
                prog += [asm.ldx(DW, R1, ctx, arch.arg(slot)),
                         asm.stx(DW, base, offset + 8 * cell, R1)]
            elif stack_runs and stack_runs[-1][0] + stack_runs[-1][2] == slot - len(arch.args) \
                    and stack_runs[-1][1] + stack_runs[-1][2] == cell:
                k, first_cell, n = stack_runs[-1]
                stack_runs[-1] = (k, first_cell, n + 1)
            else:
                stack_runs.append((slot - len(arch.args), cell, 1))
    for cell in range(used, record.ARG_CELLS):
        prog.append(asm.st(DW, base, offset + 8 * cell, 0))
    for k, cell, n in stack_runs:
        prog += [
            asm.mov(R1, base), asm.add(R1, offset + 8 * cell), asm.mov(R2, 8 * n),
            asm.ldx(DW, R3, ctx, arch.sp), asm.add(R3, arch.stack_arg(k)),
            asm.call(Helper.PROBE_READ_USER),
        ]
    for cell in callers:  # at entry the stack pointer points at the return address
        prog += [
            asm.mov(R1, base), asm.add(R1, offset + 8 * cell), asm.mov(R2, 8),
            asm.ldx(DW, R3, ctx, arch.sp),
            asm.call(Helper.PROBE_READ_USER),
        ]
    for slot, cell, size, at in derefs:
        # A struct behind a pointer argument (e.g. a launch configuration); a bad pointer
        # leaves the cells zeroed by the helper.
        prog += [
            asm.mov(R1, base), asm.add(R1, offset + 8 * cell), asm.mov(R2, size),
            asm.ldx(DW, R3, ctx, arch.arg(slot)),
        ] + ([asm.add(R3, at)] if at else []) + [
            asm.call(Helper.PROBE_READ_USER),
        ]
    return prog


def _read_outs(api: Api, arch: Arch, flags: int = 0) -> Items:
    """Out-parameters, read only when the call returned success (0); faults flagged (on top
    of `flags`)."""
    prog: Items = [asm.mov(R9, flags)]
    prog += [asm.st(DW, R8, record.OUTS + 8 * j, 0) for j in range(record.OUT_CELLS)]
    if api.outs:
        prog += layout.ret_into(R1, api.returns_value, arch.ret) + [
            asm.jne32(R1, 0, "outs_done")]
        for j, out in enumerate(api.outs):
            prog += [
                asm.mov(R1, R8), asm.add(R1, record.OUTS + 8 * j), asm.mov(R2, out.size),
                asm.ldx(DW, R3, R7, record.INFLIGHT_OUTPTRS + 8 * j),
                asm.call(Helper.PROBE_READ_USER),
                asm.jeq(R0, 0, "out%d_ok" % j),
                asm.or_(R9, record.FLAG_OUT0_FAULT << j),
                asm.Label("out%d_ok" % j),
            ]
        prog.append(asm.Label("outs_done"))
    return prog + [asm.stx(B, R8, record.FLAGS, R9)]


def _field_offset(api: Api, name: str) -> int:
    """Offset in the record of the argument or out-parameter called `name`."""
    for j, out in enumerate(api.outs):
        if out.name == name:
            return record.OUTS + 8 * j
    for arg, cell in arg_cells(api):
        if arg.name == name:
            return record.ARGS + 8 * cell
    raise ValueError("%s has no field %r" % (api.name, name))


def _learn_name(api: Api, arch: Arch) -> Items:
    """On success, the string the name field points to goes to the `names` map in chunks of
    NAME_CHUNK characters: names[(pid | k << 32, handle, exit time)] = chunk k,
    NUL-terminated, for k = 0, 1, ... until the string ends (at most NAME_CHUNKS chunks):
    names of any length are kept whole, read while the call's memory is still there. The
    call's time in the key keeps each call's name apart: a handle made again (a program
    exec'd in the same process, laid out the same way) does not overwrite the name of the
    one before, which the reader may not have read yet (execs.py)."""
    assert api.learn_name is not None
    handle, string = (_field_offset(api, f) for f in api.learn_name)
    prog = layout.ret_into(R1, api.returns_value, arch.ret) + [
        asm.jne32(R1, 0, "name_done"),
        asm.st(W, FP, layout.STAT_KEY_AT, 0),
        asm.ld_map(R1, layout.SCRATCH), asm.mov(R2, FP), asm.add(R2, layout.STAT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "name_done"),
        asm.mov(R9, R0),
        asm.ldx(DW, R1, R8, handle), asm.stx(DW, R9, 8, R1),
        asm.ldx(DW, R1, R8, record.TS_EXIT), asm.stx(DW, R9, 16, R1),
    ]
    for k in range(layout.NAME_CHUNKS):
        prog += [
            asm.ldx(DW, R1, R8, record.PID_TGID), asm.rsh(R1, 32),
        ] + ([asm.mov(R2, k), asm.lsh(R2, 32), asm.or_(R1, R2)] if k else []) + [
            asm.stx(DW, R9, 0, R1),
            asm.mov(R1, R9), asm.add(R1, layout.NAME_KEY_SIZE), asm.mov(R2, layout.NAME_SIZE),
            asm.ldx(DW, R3, R8, string),
        ] + ([asm.add(R3, k * layout.NAME_CHUNK)] if k else []) + [
            asm.call(Helper.PROBE_READ_USER_STR),
            asm.jsle(R0, 0, "name_done"),
            asm.stx(DW, FP, layout.NAME_LEN_AT, R0),
            asm.ld_map(R1, layout.NAMES), asm.mov(R2, R9), asm.mov(R3, R9),
            asm.add(R3, layout.NAME_KEY_SIZE), asm.mov(R4, 0),
            asm.call(Helper.MAP_UPDATE_ELEM),
            asm.ldx(DW, R1, FP, layout.NAME_LEN_AT),
            asm.jlt(R1, layout.NAME_SIZE, "name_done"),  # the string ended in this chunk
        ]
    return prog + [asm.Label("name_done")]


def _reserve(fail_label: str) -> Items:
    """R8 = a new record in the ring buffer, or jump to fail_label."""
    return [
        asm.ld_map(R1, layout.EVENTS), asm.mov(R2, record.SIZE), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE),
        asm.jeq(R0, 0, fail_label),
        asm.mov(R8, R0),
    ]


def _stack_id() -> Items:
    """record.STACK_ID = 1 + get_stackid(user stack), or 0 (counted) when it fails."""
    return [
        asm.mov(R1, R6), asm.ld_map(R2, layout.STACKS), asm.mov(R3, BPF_F_USER_STACK),
        asm.call(Helper.GET_STACKID),
        asm.jsge(R0, 0, "stack_ok"),
    ] + _count(record.STAT_STACK_LOST) + [
        asm.mov(R0, -1),
        asm.Label("stack_ok"),
        asm.add(R0, 1),
        asm.stx(W, R8, record.STACK_ID, R0),
    ]


def _comm() -> Items:
    return [asm.mov(R1, R8), asm.add(R1, record.COMM), asm.mov(R2, record.COMM_LEN),
            asm.call(Helper.GET_CURRENT_COMM)]


def _submit(options: ProbeOptions) -> Items:
    """Submit the record at R8, waking the reader as `wakeup_bytes` says."""
    if options.wake_now or not options.wakeup_bytes:
        flags = RB_FORCE_WAKEUP if options.wake_now else 0
        return [asm.mov(R1, R8), asm.mov(R2, flags), asm.call(Helper.RINGBUF_SUBMIT)]
    return [
        asm.ld_map(R1, layout.EVENTS), asm.mov(R2, BPF_RB_AVAIL_DATA),
        asm.call(Helper.RINGBUF_QUERY),
        asm.mov(R2, RB_NO_WAKEUP),
        asm.jlt(R0, options.wakeup_bytes, "quiet"),
        asm.mov(R2, RB_FORCE_WAKEUP),
        asm.Label("quiet"),
        asm.mov(R1, R8), asm.call(Helper.RINGBUF_SUBMIT),
    ]


def _count(stat: int, tag: str = "", amount: int = 1) -> Items:
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


def program_name(fn_id: int, retprobe: bool, shared: bool = False) -> str:
    """A kernel-visible program name (at most 15 characters of [A-Za-z0-9_]); a shared
    program is named after its shape's number."""
    return "cuda%s%d_%s" % ("s" if shared else "", fn_id, "ret" if retprobe else "ent")
