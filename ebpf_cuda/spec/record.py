"""The binary layout of one event record, shared by the probe generator and the decoder.

Every record has the same size, so a batch of them decodes with one `struct.iter_unpack`.
A complete call is one record written by the return probe; the entry probe's timestamp and
arguments travel to it through the `inflight` map. With return probes off (or `--entries`)
the entry probe writes a record too, with PHASE_ENTER and no exit fields.
"""
import struct
from typing import Dict, List, Set

ARG_CELLS = 10  # u64 cells for entry arguments (cuLaunchKernel needs 9)
OUT_CELLS = 2  # u64 cells for out-parameters read at return
COMM_LEN = 16

# Offsets (bytes) of the fields, in the order the struct below packs them.
TS_ENTER = 0
TS_EXIT = 8
PID_TGID = 16  # low half tid, high half pid (tgid), as bpf_get_current_pid_tgid returns it
FN_ID = 24  # u16 index of the function in apis.TABLE
PHASE = 26  # u8
FLAGS = 27  # u8, FLAG_* bits
STACK_ID = 28  # u32: user stack id + 1 in the `stacks` map, 0 when not captured
COMM = 32
ARGS = COMM + COMM_LEN
RET = ARGS + 8 * ARG_CELLS
OUTS = RET + 8
# u64 with --py-stacks: the key of the calling thread's Python stack in the `pystacks` ring
# (pystacks.py; the probe hashes the frames with the tgid), 0 when the call had none
PY_STACK = OUTS + 8 * OUT_CELLS
SIZE = PY_STACK + 8

PHASE_ENTER = 0  # an entry record (return probes off, or --entries)
PHASE_CALL = 1  # a complete call: entry arguments, return value, out-parameters, both times
# A thread's first traced call has begun (only pid, tid, comm and the time are set): no event,
# but it wakes the reader, which reads the process's mappings while the process lives (kernel
# names of a short-lived process traced system-wide). Its function id is HELLO_FN.
PHASE_HELLO = 2
HELLO_FN = 0xFFFF
# A hello record's second argument cell: the thread's cgroup v2 id (bpf_get_current_cgroup_id)
# when it was sent, so that its container is known however soon the process exits.
HELLO_CGROUP = ARGS + 8

FLAG_OUT0_FAULT = 1 << 0  # probe_read_user of out-parameter 0 failed
FLAG_OUT1_FAULT = 1 << 1
FLAG_ARG_FAULT = 1 << 2  # probe_read_user of a stack or pointed-to argument failed
FLAG_ENTRY_SENT = 1 << 3  # the entry probe already wrote this call's enter record
# On an enter record of --entries: its call's complete record follows, so this one is no call
# of its own in the accounting of losses (call_count); -r's enter records are the calls.
FLAG_RETURN_FOLLOWS = 1 << 4
# On a teaching call's record (learn_name rows): the probe could not read (a chunk of) the
# name where the call pointed (its page not mapped in yet), so the names map lacks it.
FLAG_NAME_UNREAD = 1 << 5

# The inflight map: key (pid_tgid, entry stack pointer), value (entry time, argument cells,
# out-parameter pointers). Keying on the stack pointer pairs nested and recursive calls.
INFLIGHT_KEY = struct.Struct("<QQ")
INFLIGHT_TS = 0
INFLIGHT_ARGS = 8
INFLIGHT_OUTPTRS = INFLIGHT_ARGS + 8 * ARG_CELLS
INFLIGHT_PY = INFLIGHT_OUTPTRS + 8 * OUT_CELLS  # the record's PY_STACK, found at entry
INFLIGHT_VALUE_SIZE = INFLIGHT_PY + 8

# With task storage (the fast path) each thread has a small stack of the same entries, each
# followed by the entry stack pointer that identifies it: {u64 depth, slot[TASK_DEPTH],
# u64 greeted (the thread's hello record was sent), u64 dropped (entries let go when the
# stack was full: a return that finds no entry while some are left was lost to the depth)}.
INFLIGHT_SP = INFLIGHT_VALUE_SIZE
# A launch's slot keeps its layer (SLOT_LAUNCH: 1 a driver launch, 2 a runtime one, 0 another
# call) and how many launches of that layer were entered inside it (SLOT_TWINS): one launch
# reaching a second probed entry point of its library (a `_ptsz` export forwarding to the
# plain one, an interposer) is one launch, recorded once (probes/inflight.py).
SLOT_LAUNCH = INFLIGHT_SP + 8
SLOT_TWINS = SLOT_LAUNCH + 8
TASK_SLOT = SLOT_TWINS + 8
TASK_DEPTH = 8  # calls in flight on one thread at once (runtime → driver nests 2 deep; a
# deeper stack costs a return probe one skipped comparison per level, ~1 ns)
TASK_GREETED = 8 + TASK_DEPTH * TASK_SLOT
TASK_DROPPED = TASK_GREETED + 8
# The monitor's process slot, claimed on the thread's first return (probes/aggregates.py):
# slot + 1; 0 none yet; TASK_IN_HASH: none was free, the thread's calls go to `proc_calls`.
TASK_PROC_SLOT = TASK_DROPPED + 8
TASK_IN_HASH = (1 << 64) - 1
TASK_VALUE_SIZE = TASK_PROC_SLOT + 8

# Per-CPU counters the probes keep (PERCPU_ARRAY, u64 each).
STAT_RING_FULL = 0  # a record could not be reserved: the event is lost
STAT_NO_ENTRY = 1  # a return without its entry (probe attached mid-call): ignored
# Calls lost because their entry could not be kept ("too_deep" in every output): no task
# storage for the thread (counted at entry), or nested deeper than TASK_DEPTH on it (the full
# stack is emptied; each call that then returns without its entry is counted, at its return:
# entries left by longjmp, whose calls never return, are no loss).
STAT_INFLIGHT_FULL = 2
STAT_STACK_LOST = 3  # a user stack could not be captured
STAT_PY_LOST = 4  # a Python stack or code object record found the `pystacks` ring full
STAT_ENTRY_LOST = 5  # --entries: an entry record found the ring full (its call is not lost)
STAT_COUNT = 6

LAYOUT = struct.Struct("<QQIIHBBI%ds%dQq%dQQ" % (COMM_LEN, ARG_CELLS, OUT_CELLS))
assert LAYOUT.size == SIZE, (LAYOUT.size, SIZE)

# The ring hands records over as frames: an 8-byte header, then the record (SIZE is a
# multiple of 8, so frames lie back to back).
FRAME_HEADER = 8
FRAME_SIZE = FRAME_HEADER + SIZE
_WIDTHS = {"H": 2, "I": 4, "Q": 8}


def _strided(frames: bytes, offset: int, fmt: str) -> memoryview:
    width = _WIDTHS[fmt]
    return memoryview(frames).cast(fmt)[(FRAME_HEADER + offset) // width::FRAME_SIZE // width]


def frame_column(frames: bytes, offset: int, fmt: str) -> List[int]:
    """One field (at record `offset`, of type "H", "I" or "Q") of every frame in a batch,
    read in bulk without unpacking the records."""
    return _strided(frames, offset, fmt).tolist()


def _same(column: memoryview) -> bool:
    """Whether every value of a column is its first (compared as bytes, in C: no int
    object a record, as tolist makes; a batch is mostly one process, often one call)."""
    packed = column.tobytes()
    return packed[:column.itemsize] * len(column) == packed


def frame_pids(frames: bytes) -> Set[int]:
    """The processes (tgids) of a batch of frames."""
    pids = _strided(frames, PID_TGID + 4, "I")
    if pids and _same(pids):
        return {pids[0]}
    return set(pids.tolist())


def frame_ids(frames: bytes) -> Set[int]:
    """The function ids of a batch of frames (which rows it holds)."""
    ids = _strided(frames, FN_ID, "H")
    if ids and _same(ids):
        return {ids[0]}
    return set(ids.tolist())


def hello_cgroups(frames: bytes) -> Dict[int, int]:
    """The cgroup v2 id (HELLO_CGROUP) of each process with a hello record in a batch of
    frames (its last; none when it has none, or the cell is 0)."""
    ids = _strided(frames, FN_ID, "H")
    if _HELLO_BYTES not in ids.tobytes():  # (in C: most batches have none)
        return {}
    tgids = _strided(frames, PID_TGID + 4, "I")
    cgroups = _strided(frames, HELLO_CGROUP, "Q")
    return {tgids[k]: cgroups[k] for k, fn in enumerate(ids.tolist())
            if fn == HELLO_FN and cgroups[k]}


def call_count(frames: bytes) -> int:
    """Calls in a batch of frames: its records but hellos and the enter records of --entries
    (FLAG_RETURN_FOLLOWS: their calls are counted by their complete records), the unit every
    loss is counted in (decode/losses.py)."""
    ids = _strided(frames, FN_ID, "H")
    if ids and _same(ids):
        hellos = len(ids) if ids[0] == HELLO_FN else 0
    else:
        hellos = ids.tolist().count(HELLO_FN)
    flags = bytes(memoryview(frames)[FRAME_HEADER + FLAGS::FRAME_SIZE])
    return len(ids) - hellos - flags.translate(_FOLLOWS).count(1)


_HELLO_BYTES = HELLO_FN.to_bytes(2, "little")
_FOLLOWS = bytes(1 if value & FLAG_RETURN_FOLLOWS else 0 for value in range(256))
