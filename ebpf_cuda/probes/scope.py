"""Which threads a generated program traces: the tracer's PID namespace (pids as it numbers
them, threads outside it not traced) and the followed processes (`followed`, and `forked`
children adopted in a namespace: follow.py)."""
from typing import List

from .. import asm
from ..asm import DW, FP, R0, R1, R2, R3, R4, Helper, W
from ..spec import layout
from .options import ProbeOptions

Items = List[object]


def in_namespace(options: ProbeOptions, outside: int = 0) -> Items:
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


def pid_tgid(options: ProbeOptions) -> Items:
    """R0 = this thread's pid_tgid (tgid << 32 | tid): the kernel's, or in a PID namespace
    the one `in_namespace` saved."""
    if options.pid_ns is None:
        return [asm.call(Helper.GET_CURRENT_PID_TGID)]
    return [asm.ldx(DW, R0, FP, layout.NS_PID_TGID_AT)]


def task_read(options: ProbeOptions) -> bool:
    """Whether pid_tgid and comm are loaded through the current task's pointer (spilled at
    layout.TASK_AT) rather than by helper calls."""
    return options.task_fields is not None


def pid_tgid_from_task(options: ProbeOptions) -> Items:
    """R0 = this thread's pid_tgid, from the task spilled at TASK_AT (task_read): the
    kernel's (bpf_get_current_pid_tgid's tgid << 32 | pid), or in a PID namespace the one
    `in_namespace` saved."""
    if options.pid_ns is not None or options.task_fields is None:
        return pid_tgid(options)
    pid, tgid, _ = options.task_fields
    return [asm.ldx(DW, R1, FP, layout.TASK_AT), asm.ldx(W, R0, R1, tgid), asm.lsh(R0, 32),
            asm.ldx(W, R1, R1, pid), asm.or_(R0, R1)]


def only_followed(options: ProbeOptions, outside: int = 0, from_task: bool = False) -> Items:
    """Return at once (with `outside`) unless this process is in the `followed` map
    (`from_task`: its pid from the task spilled at fp-408)."""
    prog = (pid_tgid_from_task(options) if from_task else pid_tgid(options)) + [
        asm.rsh(R0, 32),
        asm.stx(W, FP, layout.STAT_KEY_AT, R0),
        asm.ld_map(R1, layout.FOLLOWED), asm.mov(R2, FP), asm.add(R2, layout.STAT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
    ]
    if options.pid_ns is None:
        return prog + [asm.jne(R0, 0, "followed"), asm.mov(R0, outside), asm.exit(),
                       asm.Label("followed")]
    return prog + [asm.jne(R0, 0, "followed")] + adopt_forked() + [asm.Label("followed")]


def adopt_forked() -> Items:
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
