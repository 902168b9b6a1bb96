"""Following a command's processes in the kernel.

The `followed` map holds the process ids (tgids) being traced. A program on the
sched:sched_process_fork tracepoint adds every child of a followed process as it is created
(threads too: the tracepoint cannot tell them apart, so each thread's entry goes when it
exits); one on sched:sched_process_exit removes a process when its last thread exits: told by the
tracepoint's `group_dead` field where the kernel has it (6.16+), else (6.1, 6.12) when its
leader thread exits (pid == tgid; a process whose leader ends before its other threads is
then forgotten early). Which one is read from the tracepoint's format. The uprobe
programs return at once in any process not in the map (see calls.ProbeOptions.follow), so
children are traced from their first call, however short they live, and other processes
using the same library cost only the uprobe trap.

In a PID namespace of the tracer's own (a container, `unshare --pid`), `followed` holds pids
as that namespace numbers them (the command's pid as the tracer forked it, the pids the
probes read with bpf_get_ns_current_pid_tgid), but the fork tracepoint's `child_pid` is the
kernel's (global) pid, and the parent cannot learn its child's pid in the namespace. So the
fork program puts the child's kernel pid in the `forked` map (when the parent is followed by
its namespace pid, or is itself still in `forked`); the child's first probe hit finds its
kernel pid there and moves it to `followed` under its namespace pid (scope.adopt_forked).
The exit program removes the exiting thread's kernel id from `forked` (threads are forked
too; a child may exit before any call) and, at the process's end, its namespace pid from
`followed`. A process outside the namespace, or in one nested in it, is not traced (the
helper only answers for the tracer's own namespace).
"""
from typing import Dict, List, Optional, Tuple

from .. import asm, syscalls
from ..asm import FP, R0, R1, R2, R3, R4, R6, Helper, W
from ..bpf import tracepoints
from ..bpf.maps import HashMap
from ..bpf.programs import Program
from ..bpf.workers import close_all
from ..errors import KernelError
from ..spec import layout

FOLLOWED_MAP = layout.FOLLOWED
FORKED_MAP = layout.FORKED
TRACEPOINTS = [("sched", "sched_process_fork"), ("sched", "sched_process_exit")]  # (read once)
PidNs = Optional[Tuple[int, int]]  # features.PidNamespace (nsfs device, inode), or None


def on_fork(child_pid_offset: int) -> list:
    """sched_process_fork (runs in the parent): followed[child] = 1 if the parent is followed."""
    return [
        asm.mov(R6, R1),
        asm.call(Helper.GET_CURRENT_PID_TGID), asm.rsh(R0, 32),
        asm.stx(W, FP, layout.TP_PID_AT, R0),
        asm.ld_map(R1, FOLLOWED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "out"),
        asm.ldx(W, R1, R6, child_pid_offset), asm.stx(W, FP, layout.TP_CHILD_AT, R1),
        asm.st(W, FP, layout.TP_ONE_AT, 1),
        asm.ld_map(R1, FOLLOWED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_CHILD_AT),
        asm.mov(R3, FP), asm.add(R3, layout.TP_ONE_AT), asm.mov(R4, 0),
        asm.call(Helper.MAP_UPDATE_ELEM),
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]


def _forget_own_thread() -> list:
    """Delete the exiting thread's own entry when it is not its process's leader: the fork
    program cannot tell a new thread from a new process, so each thread got one (left in
    place, they would fill the map in a long run and children would go untraced)."""
    return [
        asm.call(Helper.GET_CURRENT_PID_TGID),
        asm.mov(R1, R0), asm.rsh(R1, 32),  # tgid
        asm.mov32(R0, R0),  # thread id
        asm.jeq(R0, R1, "leader"),
        asm.stx(W, FP, layout.TP_PID_AT, R0),
        asm.ld_map(R1, FOLLOWED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_DELETE_ELEM),
        asm.Label("leader"),
    ]


def on_exit(group_dead_offset: int) -> list:
    """sched_process_exit: forget a thread's own entry, and a process once its whole thread
    group is gone."""
    return [
        asm.ldx(asm.B, R6, R1, group_dead_offset),
        *_forget_own_thread(),
        asm.jeq(R6, 0, "out"),
        asm.call(Helper.GET_CURRENT_PID_TGID), asm.rsh(R0, 32),
        asm.stx(W, FP, layout.TP_PID_AT, R0),
        asm.ld_map(R1, FOLLOWED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_DELETE_ELEM),
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]


def on_leader_exit() -> list:
    """sched_process_exit on kernels without `group_dead`: forget a process when its leader
    thread (the one whose thread id is the process id) exits, and any other thread's own
    entry when it exits. The tracepoint runs in the exiting thread, so no field of its
    record is needed: the exiting thread's id is the key either way."""
    return [
        asm.call(Helper.GET_CURRENT_PID_TGID),
        asm.mov32(R0, R0),  # thread id (the process id, for the leader)
        asm.stx(W, FP, layout.TP_PID_AT, R0),
        asm.ld_map(R1, FOLLOWED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_DELETE_ELEM),
        asm.mov(R0, 0), asm.exit(),
    ]


def _ns_pid_tgid(pid_ns: Tuple[int, int], fail: str) -> list:
    """fp-24 = the current thread's (tid, tgid) in the namespace; jump to `fail` when the
    thread is not in it."""
    dev, ino = pid_ns
    return [
        asm.ld_imm64(R1, dev), asm.ld_imm64(R2, ino),
        asm.mov(R3, FP), asm.add(R3, layout.TP_NS_AT), asm.mov(R4, 8),
        asm.call(Helper.GET_NS_CURRENT_PID_TGID),
        asm.jne(R0, 0, fail),
    ]


def on_fork_in_namespace(child_pid_offset: int, pid_ns: Tuple[int, int]) -> list:
    """sched_process_fork (runs in the parent), the tracer in a PID namespace:
    forked[child's kernel pid] = 1 if the parent is followed (by its pid in the namespace)
    or still in `forked` (a child that made no traced call yet)."""
    return [asm.mov(R6, R1)] + _ns_pid_tgid(pid_ns, "out") + [
        asm.ldx(W, R1, FP, layout.TP_NS_AT + 4), asm.stx(W, FP, layout.TP_PID_AT, R1),
        asm.ld_map(R1, FOLLOWED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jne(R0, 0, "add"),
        asm.call(Helper.GET_CURRENT_PID_TGID), asm.rsh(R0, 32),
        asm.stx(W, FP, layout.TP_PID_AT, R0),
        asm.ld_map(R1, FORKED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "out"),
        asm.Label("add"),
        asm.ldx(W, R1, R6, child_pid_offset), asm.stx(W, FP, layout.TP_CHILD_AT, R1),
        asm.st(W, FP, layout.TP_ONE_AT, 1),
        asm.ld_map(R1, FORKED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_CHILD_AT),
        asm.mov(R3, FP), asm.add(R3, layout.TP_ONE_AT), asm.mov(R4, 0),
        asm.call(Helper.MAP_UPDATE_ELEM),
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]


def on_exit_in_namespace(group_dead_offset: Optional[int], pid_ns: Tuple[int, int]) -> list:
    """sched_process_exit, the tracer in a PID namespace: the exiting thread's kernel id
    leaves `forked`; once the process ends (`group_dead`, or without that field its leader
    thread exits) its namespace pid leaves `followed`."""
    prog = [
        asm.mov(R6, R1),
        asm.call(Helper.GET_CURRENT_PID_TGID), asm.stx(W, FP, layout.TP_PID_AT, R0),  # tid
        asm.ld_map(R1, FORKED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_DELETE_ELEM),
    ]
    if group_dead_offset is not None:
        prog += [asm.ldx(asm.B, R1, R6, group_dead_offset), asm.jeq(R1, 0, "out")]
    prog += _ns_pid_tgid(pid_ns, "out") + [asm.ldx(W, R1, FP, layout.TP_NS_AT + 4)]
    if group_dead_offset is None:
        prog += [asm.ldx(W, R2, FP, layout.TP_NS_AT), asm.jne(R1, R2, "out")]
    return prog + [
        asm.stx(W, FP, layout.TP_PID_AT, R1),
        asm.ld_map(R1, FOLLOWED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_DELETE_ELEM),
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]


GROUP_DEAD, LEADER_EXIT = "group_dead", "leader_exit"


def followed_map(name: str = FOLLOWED_MAP) -> HashMap:
    """A new `followed` map: pid -> 1 for each process traced (or a `forked` one)."""
    return HashMap(4, 4, layout.MAX_PROCESSES, name=name, key_struct=layout.PID,
                   value_struct=layout.PID)


class ProcessFollower:
    """The two tracepoint programs that keep a `followed` map up to date (`followed_map`;
    a new one unless given: then the caller closes it). Raises UnsupportedKernelError when
    the tracepoints cannot be found. `exit_rule` says how exits are told: GROUP_DEAD or
    LEADER_EXIT (see the module's docstring). With `pid_ns` (the tracer's PID namespace,
    when not the initial one) pids are the namespace's and children go through a `forked`
    map (likewise a new one unless given)."""

    def __init__(self, followed: Optional[HashMap] = None, forked: Optional[HashMap] = None,
                 pid_ns: PidNs = None) -> None:
        fork, exit_ = tracepoints.find_all(TRACEPOINTS)
        self.pid_ns = pid_ns
        self.exit_rule = ""
        self.map = followed_map() if followed is None else followed
        self._own: List[HashMap] = [self.map] if followed is None else []
        self.forked: Optional[HashMap] = None
        self._fds: List[syscalls.Fd] = []
        self._programs: List[Program] = []
        try:
            if pid_ns is not None:
                self.forked = followed_map(FORKED_MAP) if forked is None else forked
                self._own += [self.forked] if forked is None else []
            group_dead = exit_.offset("group_dead") if "group_dead" in exit_.fields else None
            self.exit_rule = GROUP_DEAD if group_dead is not None else LEADER_EXIT
            if pid_ns is not None:
                fork_code = on_fork_in_namespace(fork.offset("child_pid"), pid_ns)
                exit_code = on_exit_in_namespace(group_dead, pid_ns)
            else:
                fork_code = on_fork(fork.offset("child_pid"))
                exit_code = on_exit(group_dead) if group_dead is not None else on_leader_exit()
            self._attach(fork, fork_code, "follow_fork")
            self._attach(exit_, exit_code, "follow_exit")
        except KernelError:
            self.close()
            raise

    def _maps(self) -> Dict[str, HashMap]:
        maps = {FOLLOWED_MAP: self.map}
        if self.forked is not None:
            maps[FORKED_MAP] = self.forked
        return maps

    def _attach(self, tracepoint: tracepoints.Tracepoint, code: list, name: str) -> None:
        program = Program(code, self._maps(), name=name,
                          prog_type=syscalls.BPF_PROG_TYPE_TRACEPOINT).load()
        self._programs.append(program)
        event = syscalls.perf_event_open_tracepoint(tracepoint.id, tracepoint.name)
        self._fds.append(event)
        syscalls.perf_event_set_bpf(event.value, program.fd)
        syscalls.perf_event_enable(event.value)

    def add(self, pid: int) -> None:
        """Follow process `pid` (and, from now on, the processes it starts)."""
        self.map[pid] = 1

    def followed(self) -> List[int]:
        return list(self.map.keys())

    def close(self) -> None:
        close_all(self._fds)  # each detach waits for a grace period: in parallel
        for program in self._programs:
            program.close()
        for own in self._own:
            own.close()
        self._fds, self._programs, self._own = [], [], []
