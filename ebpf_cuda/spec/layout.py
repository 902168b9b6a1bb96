"""The kernel-side contract besides the record (record.py): the maps every program shares,
by name and size, and the stack slots of the generated programs.

probes/calls.py, probes/aggregates.py and probes/follow.py generate code against these names
and slots, and session.py creates the maps from `map_specs`: none of them reads another's
constants.
"""
import struct
from typing import List, NamedTuple, Optional

from . import record

# -- maps ------------------------------------------------------------------------------------

EVENTS = "events"  # the ring buffer of records
STATS = "stats"  # per-CPU u64 counters (record.STAT_*)
TASKS = "tasks"  # task storage: each thread's calls in flight (record.TASK_*)
INFLIGHT = "inflight"  # without task storage: calls in flight by (pid_tgid, entry sp)
STACKS = "stacks"  # user stacks of memory calls (--stacks)
NAMES = "names"  # (pid, handle, call time) -> NUL-terminated name (cuModuleGetFunction &c.)
SCRATCH = "scratch"  # per-CPU room to build a names entry (too big for the stack)
AGG = "agg"  # in-kernel aggregates per (function, memcpy kind)
ERRORS = "errors"  # (function, error code) -> count
LAUNCHES = "launches"  # (pid, function, shown argument cells) -> count, total ns
LAUNCH_SLOTS = "launch_slots"  # the sampled launch rows' counts at entry (probes/aggregates.py)
SAMPLING = "sampling"  # per-CPU xorshift state: which launches take their return (probes/calls.py)
# Per CPU, per launch layer, the last `_ptsz` launch entered there (pid_tgid, entry stack
# pointer): a plain launch entered next by that thread at or below it is its twin
# (probes/calls.py, _twin_gate).
TWIN_MARKS = "twin_marks"
TWIN_MARK = struct.Struct("<QQQQ")  # layer 1 (driver): pid_tgid, sp; layer 2 (runtime): the same
# An alias site's cookie (a `_ptsz` export of a sampled launch row): its function id | this.
ALIAS_COOKIE = 1 << 32
PROCESS_CALLS = "proc_calls"  # the monitor's (pid, agg index) -> calls, errors, total ns
# With task storage, the monitor's sums by process are kept by slot instead (no hash on a
# call's path, probes/aggregates.py): each slot's owner (a tgid; 0 free), and per slot a
# PROCESS_VALUE for every function (slot * table size + fn_id); `proc_calls` takes the calls
# of the processes that find no slot.
PROCESS_OWNERS = "proc_owners"
PROCESS_SUMS = "proc_sums"
# With in-kernel aggregates, the stream captures in progress (aggregates.capture_count):
# per process (tgid -> captures begun and not ended), and their sum over all processes in a
# one-entry array (checked first by the return programs of launches, copies, memsets and
# event calls: non-zero, and the process has one, the call is written as a record instead
# of counted as a launch: aggregates.capturing_gate)
CAPTURING = "capturing"
CAPTURING_ANY = "capturing_any"
FOLLOWED = "followed"  # tgids traced with a command and its children (follow.py)
# In a PID namespace: children of followed processes by their kernel pid, until they are
# known by their pid in the namespace (follow.py)
FORKED = "forked"
# With --py-stacks (probes/pystack.py): the processes whose interpreter is known, each
# thread's PyThreadState, the stacks and code objects already sent, per-CPU room, and the
# ring of stack and code object records.
PY_PROCS = "pyprocs"
PY_THREADS = "pythreads"
PY_SEEN = "pyseen"
PY_CODES = "pycodes"
PY_SCRATCH = "pyscratch"
PY_RING = "pystacks"

DEFAULT_RING_SIZE = 4 << 20  # 4 MiB (data pages mapped once): ~26k records, ~50 ms at 500k/s
INFLIGHT_ENTRIES = 16384  # concurrent calls in flight, all threads together (LRU)
NAME_ENTRIES = 16384  # name chunks kept by the probes (cuModuleGetFunction & co.), at least
NAME_ENTRIES_MAX = 65536  # and at most (~350 bytes of kernel memory each: memlock)
STACK_ENTRIES = 16384  # distinct user stacks kept with --stacks
MAX_PROCESSES = 1 << 16  # followed processes
NAME_KEY_SIZE = 24  # (u64 pid, u64 handle, u64 exit time of the call)
NAME_SIZE = 256  # bytes of one chunk of a learned name, NUL included
NAME_CHUNK = NAME_SIZE - 1  # characters per chunk: chunk k holds characters 255k...
NAME_CHUNKS = 32  # chunks of one name at most: 8,160 characters
NAME_KEY = struct.Struct("<QQQ")  # (pid | chunk << 32, handle, exit time)

# In-kernel aggregates (probes/aggregates.py writes them, decode/aggregates.py reads them back).
KIND_SLOTS = 5  # cudaMemcpyKind 0-4; rows without a kind use slot 0
HIST_BUCKETS = 40  # log2(ns) buckets: 2^39 ns is about 9 minutes
AGG_VALUE = struct.Struct("<7Q%dQ" % HIST_BUCKETS)  # count, total, min, max, errors, bytes,
#                                                     sum of squares, histogram
# The offsets of those cells in an AGG_VALUE:
AGG_COUNT, AGG_TOTAL, AGG_MIN, AGG_MAX, AGG_ERRORS, AGG_BYTES, AGG_SUMSQ, AGG_HIST = (
    0, 8, 16, 24, 32, 40, 48, 56)
# The SUMSQ cell is a small float: the sum of squares is MANTISSA * 4**EXPONENT (ns²), the
# exponent in the top 6 bits. It stays 0, and the sum exact, until a duration reaches 2^29 ns
# (0.54 s) or the sum 2^58 ns² (e.g. 290,000 calls of 1 ms); each step up halves the
# durations squared from then on (d >> exponent), so no call and no sum ever overflows.
SUMSQ_EXP_AT = 58
SUMSQ_MANTISSA = (1 << SUMSQ_EXP_AT) - 1
ERROR_KEY = struct.Struct("<II")  # fn_id, code
ERROR_ENTRIES = 4096
LAUNCH_KEY = struct.Struct("<II%dQ" % record.ARG_CELLS)  # pid, fn_id, argument cells
LAUNCH_VALUE = struct.Struct("<QQ")  # count, total ns
LAUNCH_ENTRIES = 16384
# A sampled launch row counts each launch at entry in an array slot chosen by hashing its
# (process, function, kernel) in the program: no hash-map helper on the launch path. A slot
# is its first owner's for good (until the reader frees it at its process's exit); a
# launch finding its slot another's goes to `launches` (aggregates.count_call).
LAUNCH_SLOT = struct.Struct("<QQQ")  # owner (fn_id << 32 | pid), kernel (func), count
LAUNCH_SLOT_BITS = 13
LAUNCH_SLOT_ENTRIES = 1 << LAUNCH_SLOT_BITS
PROCESS_KEY = struct.Struct("<II")  # tgid, agg index (function * KIND_SLOTS + memcpy kind)
PROCESS_VALUE = struct.Struct("<QQQ")  # calls, errors, total ns
PROCESS_ENTRIES = 16384  # (processes x functions they call)
# Processes with a slot of their own at once (a power of two; ~3.9 KB of kernel memory each:
# 162 functions x 24 bytes); a thread claims its process's on its first call, probing
# PROCESS_SLOT_PROBES slots from the one its tgid hashes to; the reader frees a slot when
# it lets its exited process go (decode/aggregates.free_process_slot).
PROCESS_SLOTS = 256
PROCESS_SLOT_PROBES = 8
PROCESS_OWNER = struct.Struct("<Q")  # the owner's tgid (0: free; RETIRING | tgid: being freed)
PROCESS_RETIRING = 1 << 32
CAPTURING_ENTRIES = 16384  # processes that began a stream capture (entries stay, at 0)
U64 = struct.Struct("<Q")
PID = struct.Struct("<I")


class MapSpec(NamedTuple):
    """One map to create: its type (a maps.py class name), sizes and value layout."""

    name: str
    type: str  # RingBuf, Hash, LruHash, Array, MappedArray, PerCpuArray, StackTrace, TaskStorage
    key_size: int
    value_size: int
    entries: int
    value_struct: Optional[struct.Struct] = None
    key_struct: Optional[struct.Struct] = None


def name_entries(ring_size: int) -> int:
    """Entries of the names map for a ring of `ring_size` bytes: two chunks for every
    record the ring can hold. A name must outlive its record's wait in the ring: with fewer
    entries than records, a burst of registrations that the ring still holds (PyTorch's
    30,000 at its start) had a fifth to a third of its names let go before the reader came to them."""
    records = ring_size // (record.FRAME_SIZE + 8)  # (8: the ring's own record header)
    return max(NAME_ENTRIES, min(NAME_ENTRIES_MAX, 2 * records))


def map_specs(ring_size: int, table_size: int, stacks: bool, aggregate: bool,
              follow: bool, pid_ns: bool = False, per_process: bool = False,
              launch_slots: bool = False, process_slots: int = 0) -> List[MapSpec]:
    """The maps of one session, calls in flight in task storage (see `inflight_fallback`);
    `pid_ns`: the tracer runs in a PID namespace of its own (see follow.py); `per_process`:
    aggregates also by process (the monitor), in `process_slots` slots (0: the hash alone);
    `launch_slots`: launches counted at entry (sampled returns)."""
    specs = [
        MapSpec(EVENTS, "RingBuf", 0, 0, ring_size),
        MapSpec(TASKS, "TaskStorage", 4, record.TASK_VALUE_SIZE, 0),
        MapSpec(NAMES, "LruHash", NAME_KEY_SIZE, NAME_SIZE, name_entries(ring_size)),
        MapSpec(SCRATCH, "PerCpuArray", 4, NAME_KEY_SIZE + NAME_SIZE, 1),
        MapSpec(STATS, "PerCpuArray", 4, 8, record.STAT_COUNT, value_struct=U64),
    ]
    if stacks:
        specs.append(MapSpec(STACKS, "StackTrace", 4, 0, STACK_ENTRIES))
    if aggregate:
        specs += [
            MapSpec(AGG, "PerCpuArray", 4, AGG_VALUE.size, table_size * KIND_SLOTS,
                    value_struct=AGG_VALUE),
            MapSpec(ERRORS, "Hash", ERROR_KEY.size, 8, ERROR_ENTRIES),
            MapSpec(LAUNCHES, "Hash", LAUNCH_KEY.size, LAUNCH_VALUE.size, LAUNCH_ENTRIES),
            MapSpec(CAPTURING, "Hash", 4, 8, CAPTURING_ENTRIES, U64, PID),
            MapSpec(CAPTURING_ANY, "Array", 4, 8, 1, U64),
        ]
        if launch_slots:
            specs += [MapSpec(LAUNCH_SLOTS, "MappedArray", 4, LAUNCH_SLOT.size,
                              LAUNCH_SLOT_ENTRIES, LAUNCH_SLOT),
                      MapSpec(SAMPLING, "PerCpuArray", 4, 8, 1, U64),
                      MapSpec(TWIN_MARKS, "PerCpuArray", 4, TWIN_MARK.size, 1, TWIN_MARK)]
        if per_process:
            specs.append(MapSpec(PROCESS_CALLS, "Hash", PROCESS_KEY.size, PROCESS_VALUE.size,
                                 PROCESS_ENTRIES))
        if per_process and process_slots:
            specs += [MapSpec(PROCESS_OWNERS, "MappedArray", 4, PROCESS_OWNER.size,
                              process_slots, PROCESS_OWNER),
                      MapSpec(PROCESS_SUMS, "MappedArray", 4, PROCESS_VALUE.size,
                              process_slots * table_size, PROCESS_VALUE)]
    if follow:
        specs.append(MapSpec(FOLLOWED, "Hash", 4, 4, MAX_PROCESSES, PID, PID))
        if pid_ns:
            specs.append(MapSpec(FORKED, "Hash", 4, 4, MAX_PROCESSES, PID, PID))
    return specs


def inflight_fallback() -> MapSpec:
    """Where calls in flight go on kernels without task storage."""
    return MapSpec(INFLIGHT, "LruHash", record.INFLIGHT_KEY.size, record.INFLIGHT_VALUE_SIZE,
                   INFLIGHT_ENTRIES)


# -- stack slots of the generated programs (offsets from the frame pointer) ------------------

# Every uprobe program:
INFLIGHT_KEY_AT = -record.INFLIGHT_KEY.size  # (pid_tgid, entry stack pointer): fp-16
INFLIGHT_VALUE_AT = INFLIGHT_KEY_AT - record.INFLIGHT_VALUE_SIZE  # the map's value: fp-128
STAT_KEY_AT = INFLIGHT_VALUE_AT - 8  # a u32 stats (or scratch) index: fp-136
# Return programs:
NOW_AT = STAT_KEY_AT - 8  # the exit time: fp-144
AGG_KEY_AT = NOW_AT - 8  # u32 index into `agg`: fp-152
LAUNCH_KEY_AT = AGG_KEY_AT - LAUNCH_KEY.size  # fp-240
LAUNCH_VALUE_AT = LAUNCH_KEY_AT - LAUNCH_VALUE.size  # fp-256
ERROR_KEY_AT = LAUNCH_VALUE_AT - 8  # fp-264
ERROR_VALUE_AT = ERROR_KEY_AT - 8  # fp-272
FN_ID_AT = ERROR_VALUE_AT - 8  # the function id read from the attach cookie: fp-280
NAME_LEN_AT = FN_ID_AT - 8  # the length of the name chunk just read: fp-288
# In a PID namespace: the thread's (tid, tgid) as the namespace numbers them, written by
# bpf_get_ns_current_pid_tgid at the start of every program (its struct bpf_pidns_info
# {u32 pid; u32 tgid} read as one u64 is pid_tgid's layout): fp-296.
NS_PID_TGID_AT = NAME_LEN_AT - 8
# Entry programs with --py-stacks (probes/pystack.py): the stack's key for the record
# (fp-304), the thread's pid_tgid and its tgid as a u32 map key (fp-320), the key of a
# code object (tgid, address) (fp-336).
PY_STACK_AT = NS_PID_TGID_AT - 8
PY_KEY_AT = PY_STACK_AT - 16
PY_CODE_KEY_AT = PY_KEY_AT - 16
# Return programs with in-kernel aggregates (aggregates.capture_count, capturing_gate): the
# u32 key of `capturing` (the tgid) or `capturing_any` (0), the u64 value of a new entry,
# and whether this call was made while its process captures (1: written as a record, not
# counted as a launch): fp-344, fp-352, fp-360.
CAPTURE_KEY_AT = PY_CODE_KEY_AT - 8
CAPTURE_VALUE_AT = CAPTURE_KEY_AT - 8
CAPTURE_FLAG_AT = CAPTURE_VALUE_AT - 8
SAMPLE_AT = CAPTURE_FLAG_AT - 8  # a session program's draw: 0 takes the return
PROCESS_KEY_AT = SAMPLE_AT - PROCESS_KEY.size  # the monitor's per-process aggregates: fp-376
PROCESS_VALUE_AT = PROCESS_KEY_AT - PROCESS_VALUE.size  # fp-400
# Programs reading task_struct's fields (ProbeOptions.task_fields): the current task's
# pointer (bpf_get_current_task_btf), spilled: fp-408.
TASK_AT = PROCESS_VALUE_AT - 8
# The monitor's return programs with process slots: the thread's task storage, spilled
# when its call is found (the slot cached there is read and written after): fp-416.
TASK_STORAGE_AT = TASK_AT - 8
# Tracepoint programs (follow.py) have their own small frame:
TP_PID_AT, TP_CHILD_AT, TP_ONE_AT, TP_NS_AT = -4, -8, -12, -24

assert FN_ID_AT == -280 and TASK_STORAGE_AT >= -512  # the eBPF stack is 512 bytes


# -- the function id ------------------------------------------------------------------------

# The function id of a program is either a constant (one program per function) or, with
# FROM_COOKIE, the attach cookie of the probe that fired, saved at FN_ID_AT: then one program
# serves every function of the same shape (probes/calls.shape_of), attached with each function's
# id as cookie.
FnId = Optional[int]
FROM_COOKIE: FnId = None


def fn_id_into(reg, fn_id: FnId) -> list:
    """Instructions: reg = the function id."""
    from .. import asm

    if fn_id is FROM_COOKIE:
        return [asm.ldx(asm.DW, reg, asm.FP, FN_ID_AT)]
    return [asm.mov(reg, fn_id)]


def ret_into(reg, returns_value: bool, ret_offset: int) -> list:
    """Instructions: reg = the probed function's return value (pt_regs at R6, the return
    register at `ret_offset`), or 0 for a function that returns nothing (its return
    register holds whatever it last held: a void call always succeeds)."""
    from .. import asm

    if not returns_value:
        return [asm.mov(reg, 0)]
    return [asm.ldx(asm.DW, reg, asm.R6, ret_offset)]
