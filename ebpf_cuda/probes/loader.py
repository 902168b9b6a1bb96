"""The loader program: what a traced process's dynamic loader tells of the libraries it maps.

glibc's loader calls `_dl_debug_state()` (the r_debug `r_brk` rendezvous hook that debuggers
break on) twice around every dlopen and dlclose: once before it maps or unmaps objects
(RT_ADD, RT_DELETE) and once when the link map is consistent again (RT_CONSISTENT, after
mapping, before relocation and constructors). A uprobe on it in each loader file the traced
processes use runs `loader_program`, which (for RT_CONSISTENT only, read from _r_debug)
writes a *loader notice* into the events ring (a hello record, record.PHASE_HELLO, whose
first argument cell is LOADER_MARK, so that every consumer that skips hello records skips it
too) and wakes the reader at once. A notice the full ring could not take is counted in the
LOST map (`lost_map`).

What reads the notices and probes what they announce: late_loads.py (a session's),
monitor/system_watch.py (the whole machine's); decode/notices.py reads them from the ring's frames.
"""
from typing import Optional, Tuple

from .. import asm
from ..arch import Arch
from ..arch import current as current_arch
from ..asm import DW, FP, R0, R1, R2, R3, R6, R8, RB_FORCE_WAKEUP, Helper, W
from ..bpf.maps import PerCpuArrayMap
from ..spec import layout, record
from .execs import NOTICES_LOST
from .options import ProbeOptions
from .records import entry_head
from .scope import in_namespace, only_followed

HOOK = "_dl_debug_state"  # glibc's r_brk: called after every change of the link map
LOADER_MARK = 0x4C4F4144  # "LOAD": the first argument cell of a loader notice
LOST = NOTICES_LOST  # "loader_lost": per-CPU count of notices the full ring could not take
# struct r_debug (glibc, 64-bit): r_version, r_map, r_brk, then r_state, an int.
R_STATE = 24
RT_CONSISTENT = 0
STATE_AT, LOST_KEY_AT = -8, -16  # the program's stack slots (probes/calls.py's are lower)


def lost_map() -> PerCpuArrayMap:
    """A new LOST map: the per-CPU count of the notices the full ring could not take."""
    return PerCpuArrayMap(8, 1, name=LOST, value_struct=layout.U64)


def loader_program(follow: bool, pid_ns: Optional[Tuple[int, int]] = None,
                   arch: Optional[Arch] = None) -> list:
    """The uprobe program on _dl_debug_state: a loader notice into the ring, reader woken
    (`follow`: only processes of the `followed` map; else the link's pid filter decides;
    `pid_ns`: the tracer's PID namespace, whose pids the notice carries, as the call
    probes do). With the distance from _dl_debug_state to _r_debug as attach cookie, only
    a consistent link map (r_state RT_CONSISTENT: objects mapped, or unmapped) is told of:
    half the notices, and none before the mapping."""
    arch = arch or current_arch()
    options = ProbeOptions(follow=follow, pid_ns=pid_ns)
    prog = [asm.mov(R6, R1)] + in_namespace(options)
    if follow:
        prog += only_followed(options)
    prog += [
        asm.mov(R1, R6), asm.call(Helper.GET_ATTACH_COOKIE),
        asm.jeq(R0, 0, "tell"),  # (no cookie: every call is told of)
        asm.ldx(DW, R3, R6, arch.ip), asm.add(R3, R0), asm.add(R3, R_STATE),
        asm.mov(R1, FP), asm.add(R1, STATE_AT), asm.mov(R2, 4),
        asm.call(Helper.PROBE_READ_USER),
        asm.jne(R0, 0, "tell"),  # (unreadable: told of anyway)
        asm.ldx(W, R1, FP, STATE_AT),
        asm.jne(R1, RT_CONSISTENT, "out"),
        asm.Label("tell"),
        asm.ld_map(R1, layout.EVENTS), asm.mov(R2, record.SIZE), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE),
        asm.jeq(R0, 0, "lost"),
        asm.mov(R8, R0),
    ] + entry_head(record.HELLO_FN, record.PHASE_HELLO, options) + [
        asm.st(DW, R8, record.ARGS, LOADER_MARK),
    ]
    prog += [asm.st(DW, R8, offset, 0) for offset in range(record.ARGS + 8, record.SIZE, 8)]
    return prog + [
        asm.mov(R1, R8), asm.mov(R2, RB_FORCE_WAKEUP), asm.call(Helper.RINGBUF_SUBMIT),
        asm.ja("out"),
        asm.Label("lost"),
        asm.st(W, FP, LOST_KEY_AT, 0),
        asm.ld_map(R1, LOST), asm.mov(R2, FP), asm.add(R2, LOST_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "out"),
        asm.ldx(DW, R1, R0, 0), asm.add(R1, 1), asm.stx(DW, R0, 0, R1),
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]
