"""Following a command's processes in the kernel.

The `followed` map holds the process ids (tgids) being traced. A program on the
sched:sched_process_fork tracepoint adds every child of a followed process as it is created;
one on sched:sched_process_exit removes a process when its last thread exits: told by the
tracepoint's `group_dead` field where the kernel has it (6.16+), else (6.1, 6.12) when its
leader thread exits (pid == tgid; a process whose leader ends before its other threads is
then forgotten early). Which one is read from the tracepoint's format. The uprobe
programs return at once in any process not in the map (see probes.ProbeOptions.follow), so
children are traced from their first call, however short they live, and other processes
using the same library cost only the uprobe trap.
"""
from typing import List, Optional

from . import asm, layout, syscalls, tracepoints
from .asm import FP, R0, R1, R2, R3, R4, R6, W, Helper
from .errors import KernelError
from .maps import HashMap
from .programs import Program
from .workers import close_all

FOLLOWED_MAP = layout.FOLLOWED


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


def on_exit(group_dead_offset: int) -> list:
    """sched_process_exit: forget a process once its whole thread group is gone."""
    return [
        asm.ldx(asm.B, R6, R1, group_dead_offset),
        asm.jeq(R6, 0, "out"),
        asm.call(Helper.GET_CURRENT_PID_TGID), asm.rsh(R0, 32),
        asm.stx(W, FP, layout.TP_PID_AT, R0),
        asm.ld_map(R1, FOLLOWED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_DELETE_ELEM),
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]


def on_leader_exit() -> list:
    """sched_process_exit on kernels without `group_dead`: forget a process when its leader
    thread (the one whose thread id is the process id) exits. The tracepoint runs in the
    exiting thread, so no field of its record is needed."""
    return [
        asm.call(Helper.GET_CURRENT_PID_TGID),
        asm.mov(R1, R0), asm.rsh(R1, 32),  # tgid
        asm.mov32(R0, R0),  # thread id
        asm.jne(R0, R1, "out"),
        asm.stx(W, FP, layout.TP_PID_AT, R1),
        asm.ld_map(R1, FOLLOWED_MAP), asm.mov(R2, FP), asm.add(R2, layout.TP_PID_AT),
        asm.call(Helper.MAP_DELETE_ELEM),
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]


GROUP_DEAD, LEADER_EXIT = "group_dead", "leader_exit"


def followed_map() -> HashMap:
    """A new `followed` map: pid -> 1 for each process traced."""
    return HashMap(4, 4, layout.MAX_PROCESSES, name=FOLLOWED_MAP, key_struct=layout.PID,
                   value_struct=layout.PID)


class ProcessFollower:
    """The two tracepoint programs that keep a `followed` map up to date (`followed_map`;
    a new one unless given: then the caller closes it). Raises UnsupportedKernelError when
    the tracepoints cannot be found. `exit_rule` says how exits are told: GROUP_DEAD or
    LEADER_EXIT (see the module's docstring)."""

    def __init__(self, followed: Optional[HashMap] = None) -> None:
        fork, exit_ = tracepoints.find_all([("sched", "sched_process_fork"),
                                            ("sched", "sched_process_exit")])
        self._own_map = followed is None
        self.exit_rule = ""
        self.map = followed_map() if followed is None else followed
        self._fds: List[syscalls.Fd] = []
        self._programs: List[Program] = []
        try:
            self._attach(fork, on_fork(fork.offset("child_pid")), "follow_fork")
            if "group_dead" in exit_.fields:
                self.exit_rule = GROUP_DEAD
                self._attach(exit_, on_exit(exit_.offset("group_dead")), "follow_exit")
            else:
                self.exit_rule = LEADER_EXIT
                self._attach(exit_, on_leader_exit(), "follow_exit")
        except KernelError:
            self.close()
            raise

    def _attach(self, tracepoint: tracepoints.Tracepoint, code: list, name: str) -> None:
        program = Program(code, {FOLLOWED_MAP: self.map}, name=name,
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
        if self._own_map:
            self.map.close()
        self._fds, self._programs = [], []
