"""When each process exec'd: what the names of its launches depend on.

An exec replaces a process's program and keeps its pid: the kernels, handles and mappings
learned of it before name nothing after. A program on the sched:sched_process_exec
tracepoint keeps, per process, the kernel time (CLOCK_MONOTONIC, as the records' times) of
each exec in the `execs` map: (pid) -> n, the number of execs seen, and (pid | k << 32) ->
the time of exec k (1 <= k <= n; each written before n counts it). A record of that process
whose time is before exec k belongs to the program that ran before it: names.py names every
launch from the image (its *generation*) that made it, however late the reader reads it.

The tracepoint runs in the exec'ing task after the new program is in place, before it runs
a single instruction of it: every record of the old program is timed before it, every
record of the new one after. A thread that made traced calls before (it has the probes'
task storage) also sends a hello record then, waking the reader, which reads the new
program's mappings while it runs (as a thread's first call does, probes/calls.py). The pids are
those the records carry: the initial PID
namespace's (bpf_get_current_pid_tgid), or, when the tracer runs in a PID namespace of its
own, that namespace's (bpf_get_ns_current_pid_tgid; a process outside it is not counted).

`ExecNotices` (the monitor's) tells of every exec, whatever the process: an *exec notice*
(a hello record whose first argument cell is EXEC_MARK) into a ring of monitor/system_watch.py's, so
that a program started after the monitor is checked for CUDA files and its dynamic loader
watched.
"""
import struct
from typing import Dict, List, Optional, Tuple

from .. import asm, syscalls
from ..asm import DW, FP, R0, R1, R2, R3, R4, R6, R8, RB_FORCE_WAKEUP, Helper, W
from ..bpf import tracepoints
from ..bpf.maps import LruHashMap, Map
from ..bpf.programs import Program
from ..bpf.workers import close_all
from ..errors import KernelError
from ..spec import layout, record

TRACEPOINT = ("sched", "sched_process_exec")
EXECS_MAP = "execs"
MAX_EXECS = 16384  # entries (a count and a time per exec); the least recent go first
KEY = struct.Struct("<Q")
VALUE = struct.Struct("<Q")
_KEY_AT, _COUNT_KEY_AT, _VALUE_AT, _NS_AT = -8, -16, -24, -32


def _current_pid(pid_ns: Optional[Tuple[int, int]]) -> list:
    """fp-16 = the current process's pid (in `pid_ns`, the (dev, inode) of a PID namespace,
    when given: out when the process is not in it)."""
    if pid_ns is None:
        return [asm.call(Helper.GET_CURRENT_PID_TGID), asm.rsh(R0, 32),
                asm.stx(DW, FP, _COUNT_KEY_AT, R0)]
    dev, ino = pid_ns
    return [  # struct bpf_pidns_info {u32 pid; u32 tgid} at fp-32
        asm.ld_imm64(R1, dev), asm.ld_imm64(R2, ino),
        asm.mov(R3, FP), asm.add(R3, _NS_AT), asm.mov(R4, 8),
        asm.call(Helper.GET_NS_CURRENT_PID_TGID),
        asm.jne(R0, 0, "out"),
        asm.ldx(W, R1, FP, _NS_AT + 4), asm.stx(DW, FP, _COUNT_KEY_AT, R1),
    ]


def on_exec(pid_ns: Optional[Tuple[int, int]] = None, notice: bool = False,
            python: bool = False, followed: bool = False) -> list:
    """sched_process_exec: execs[pid | n << 32] = now, then execs[pid] = n (n: this exec's
    number for the process, from 1); with `notice`, the hello record (`_notice`). With
    `python` (--py-stacks) the process leaves `pyprocs` (its new program is not walked
    with the old one's offsets) and, with `followed`, a followed process's exec sends the
    hello record too, whatever its threads did: the reader reads its new interpreter."""
    return _current_pid(pid_ns) + ([
        asm.ld_map(R1, layout.PY_PROCS), asm.mov(R2, FP), asm.add(R2, _COUNT_KEY_AT),
        asm.call(Helper.MAP_DELETE_ELEM),
    ] if python else []) + [
        asm.ld_map(R1, EXECS_MAP), asm.mov(R2, FP), asm.add(R2, _COUNT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.mov(R6, 1),
        asm.jeq(R0, 0, "first"),
        asm.ldx(DW, R6, R0, 0), asm.add(R6, 1),
        asm.Label("first"),
        asm.mov(R1, R6), asm.lsh(R1, 32),
        asm.ldx(DW, R2, FP, _COUNT_KEY_AT), asm.or_(R1, R2),
        asm.stx(DW, FP, _KEY_AT, R1),
        asm.call(Helper.KTIME_GET_NS), asm.stx(DW, FP, _VALUE_AT, R0),
        asm.ld_map(R1, EXECS_MAP), asm.mov(R2, FP), asm.add(R2, _KEY_AT),
        asm.mov(R3, FP), asm.add(R3, _VALUE_AT), asm.mov(R4, 0),
        asm.call(Helper.MAP_UPDATE_ELEM),
        asm.stx(DW, FP, _VALUE_AT, R6),
        asm.ld_map(R1, EXECS_MAP), asm.mov(R2, FP), asm.add(R2, _COUNT_KEY_AT),
        asm.mov(R3, FP), asm.add(R3, _VALUE_AT), asm.mov(R4, 0),
        asm.call(Helper.MAP_UPDATE_ELEM),
    ] + (_notice(pid_ns, python and followed) if notice else []) + [
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]


def _notice(pid_ns: Optional[Tuple[int, int]], followed: bool = False) -> list:
    """A hello record (record.PHASE_HELLO) of the exec'ing thread into the `events` ring,
    the reader woken, when the thread has the probes' task storage (it made traced calls:
    other processes' execs tell nothing), or with `followed` when its process is in the
    `followed` map. A full ring drops it (it is no event)."""
    check_followed = [
        asm.ld_map(R1, layout.FOLLOWED), asm.mov(R2, FP), asm.add(R2, _COUNT_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jne(R0, 0, "notice"),
    ] if followed else []
    return check_followed + [
        asm.call(Helper.GET_CURRENT_TASK_BTF), asm.mov(R2, R0),
        asm.ld_map(R1, layout.TASKS), asm.mov(R3, 0), asm.mov(R4, 0),
        asm.call(Helper.TASK_STORAGE_GET),
        asm.jeq(R0, 0, "out"),
    ] + ([asm.Label("notice")] if followed else []) + _hello_record(pid_ns, "out")


def _hello_record(pid_ns: Optional[Tuple[int, int]], full: str, mark: int = 0) -> list:
    """A hello record of the current thread into the `events` ring, its first argument cell
    `mark`, its cgroup in record.HELLO_CGROUP, the reader woken; a full ring jumps to `full`. With `pid_ns`, fp-32 holds the
    thread's bpf_pidns_info (`_current_pid`)."""
    pid_tgid = ([asm.ldx(DW, R0, FP, _NS_AT)] if pid_ns is not None  # (tgid << 32 | tid)
                else [asm.call(Helper.GET_CURRENT_PID_TGID)])
    return [
        asm.ld_map(R1, layout.EVENTS), asm.mov(R2, record.SIZE), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE),
        asm.jeq(R0, 0, full),
        asm.mov(R8, R0),
        asm.call(Helper.KTIME_GET_NS), asm.stx(DW, R8, record.TS_ENTER, R0),
        asm.st(DW, R8, record.TS_EXIT, 0),
    ] + pid_tgid + [
        asm.stx(DW, R8, record.PID_TGID, R0),
        asm.st(W, R8, record.FN_ID, record.HELLO_FN | record.PHASE_HELLO << 16),
        asm.st(W, R8, record.STACK_ID, 0),
        asm.mov(R1, R8), asm.add(R1, record.COMM), asm.mov(R2, record.COMM_LEN),
        asm.call(Helper.GET_CURRENT_COMM),
    ] + [asm.st(DW, R8, offset, mark if offset == record.ARGS else 0)
         for offset in range(record.ARGS, record.SIZE, 8)] + [
        asm.call(Helper.GET_CURRENT_CGROUP_ID), asm.stx(DW, R8, record.HELLO_CGROUP, R0),
        asm.mov(R1, R8), asm.mov(R2, RB_FORCE_WAKEUP), asm.call(Helper.RINGBUF_SUBMIT),
    ]


# -- every exec, told of (the monitor: programs started after it that may be CUDA's) -------

EXEC_MARK = 0x45584543  # "EXEC": the first argument cell of an exec notice
NOTICES_LOST = "loader_lost"  # (probes/loader.LOST: the per-CPU count of notices lost)
_LOST_KEY_AT = -40


def on_exec_notice(pid_ns: Optional[Tuple[int, int]] = None) -> list:
    """sched_process_exec: an *exec notice* of every exec (a hello record whose first
    argument cell is EXEC_MARK) into the `events` ring the program is given (not the
    session's: monitor/system_watch.SystemWatch's), the reader woken; one the full ring cannot take
    is counted in NOTICES_LOST[0]. With `pid_ns`, execs outside that PID namespace are not
    told of (their pids mean nothing here)."""
    prog: list = []
    if pid_ns is not None:
        dev, ino = pid_ns
        prog += [
            asm.ld_imm64(R1, dev), asm.ld_imm64(R2, ino),
            asm.mov(R3, FP), asm.add(R3, _NS_AT), asm.mov(R4, 8),
            asm.call(Helper.GET_NS_CURRENT_PID_TGID),
            asm.jne(R0, 0, "out"),
        ]
    return prog + _hello_record(pid_ns, "lost", EXEC_MARK) + [
        asm.ja("out"),
        asm.Label("lost"),
        asm.st(W, FP, _LOST_KEY_AT, 0),
        asm.ld_map(R1, NOTICES_LOST), asm.mov(R2, FP), asm.add(R2, _LOST_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "out"),
        asm.ldx(DW, R1, R0, 0), asm.add(R1, 1), asm.stx(DW, R0, 0, R1),
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]


def _run_on(tracepoint, program: Program, fds: List[syscalls.Fd]) -> None:
    """Run the loaded `program` on `tracepoint`: its perf event is opened (kept in `fds`, to
    be closed with them), given the program and enabled."""
    event = syscalls.perf_event_open_tracepoint(tracepoint.id, tracepoint.name)
    fds.append(event)
    syscalls.perf_event_set_bpf(event.value, program.fd)
    syscalls.perf_event_enable(event.value)


class _OnExec:
    """A program run on sched_process_exec, and its perf event (closed together)."""

    _fds: List[syscalls.Fd]
    _program: Optional[Program]

    def close(self) -> None:
        close_all(self._fds)
        self._fds = []
        if self._program is not None:
            self._program.close()
            self._program = None


class ExecNotices(_OnExec):
    """The exec notices' program on sched_process_exec (`on_exec_notice`), writing into
    `maps`' `events` ring and counting what it loses in its NOTICES_LOST map. Raises
    UnsupportedKernelError when the tracepoint cannot be found, KernelError when the
    program cannot be loaded or attached."""

    def __init__(self, maps: Dict[str, Map], pid_ns: Optional[Tuple[int, int]] = None) -> None:
        tracepoint = tracepoints.find(*TRACEPOINT)
        self._fds: List[syscalls.Fd] = []
        self._program: Optional[Program] = Program(
            on_exec_notice(pid_ns), {name: maps[name] for name in (layout.EVENTS, NOTICES_LOST)},
            name="exec_notices", prog_type=syscalls.BPF_PROG_TYPE_TRACEPOINT)
        try:
            _run_on(tracepoint, self._program.load(), self._fds)
        except KernelError:
            self.close()
            raise


class ExecWatcher(_OnExec):
    """The exec tracepoint's program and its `execs` map (module docstring). Raises
    UnsupportedKernelError when the tracepoint cannot be found, KernelError when the
    program cannot be loaded or attached. `pid_ns`: the (dev, inode) of the tracer's PID
    namespace when it is not the initial one (pids as the records carry them). `maps`: the
    session's `events` ring and `tasks` storage, for the hello record at an exec (none
    without both)."""

    def __init__(self, pid_ns: Optional[Tuple[int, int]] = None,
                 maps: Optional[Dict[str, Map]] = None) -> None:
        tracepoint = tracepoints.find(*TRACEPOINT)
        self.map = LruHashMap(KEY.size, VALUE.size, MAX_EXECS, name=EXECS_MAP,
                              key_struct=KEY, value_struct=VALUE)
        self._fds: List[syscalls.Fd] = []
        self._program: Optional[Program] = None
        try:
            shared = {name: m for name, m in (maps or {}).items()
                      if name in (layout.EVENTS, layout.TASKS)}
            notice = len(shared) == 2
            python = {name: m for name, m in (maps or {}).items()
                      if name in (layout.PY_PROCS, layout.FOLLOWED)}
            code = on_exec(pid_ns, notice, layout.PY_PROCS in python,
                           layout.FOLLOWED in python)
            self._program = Program(code, dict(shared if notice else {}, **python,
                                               **{EXECS_MAP: self.map}),
                                    name="exec_times",
                                    prog_type=syscalls.BPF_PROG_TYPE_TRACEPOINT).load()
            _run_on(tracepoint, self._program, self._fds)
        except KernelError:
            self.close()
            raise

    def times(self, pid: int, known: int = 0) -> List[int]:
        """The kernel times of the execs of process `pid` after the first `known` ones, in
        order (what the map holds now)."""
        count = self.map.get(pid)
        times = []
        for k in range(known + 1, (count or 0) + 1):
            when = self.map.get(pid | k << 32)
            if when is None:  # (evicted: the oldest go first; what follows is still right)
                continue
            times.append(when)
        return times

    def forget(self, pid: int) -> None:
        """Drop what the map holds of process `pid` (it exited)."""
        count = self.map.get(pid)
        for k in range(1, (count or 0) + 1):
            self.map.delete(pid | k << 32)
        self.map.delete(pid)

    def close(self) -> None:
        super().close()
        self.map.close()
