"""The in-kernel sums read back: the one reader of what probes/aggregates.py's programs add up
(per-function counts, durations, errors, bytes, squares and histograms per CPU; errors and
launches by key; the launch slots; calls by process), for `--summary` once at the end
(`read_aggregates`) and for the monitor again and again (`LiveSums`).
"""
import struct
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from .. import syscalls
from ..bpf.maps import possible_cpus
from ..probes.aggregates import func_cell
from ..spec import layout, record
from ..spec.apis import TABLE, Api, Kind, Role
from ..spec.layout import (AGG_BYTES, AGG_COUNT, AGG_ERRORS, AGG_HIST, AGG_SUMSQ, AGG_TOTAL,
                           AGG_VALUE, ERROR_KEY, HIST_BUCKETS, KIND_SLOTS, LAUNCH_KEY, LAUNCH_VALUE,
                           SUMSQ_EXP_AT, SUMSQ_MANTISSA)

_INDEX = struct.Struct("<I")  # (an `agg` key)
_U64 = struct.Struct("<Q")


def sum_of_squares(cell: int) -> int:
    """The sum of squared durations (ns²) a SUMSQ cell holds."""
    return (cell & SUMSQ_MANTISSA) << (2 * (cell >> SUMSQ_EXP_AT))


@dataclass
class FunctionStats:
    """Aggregates of one function (and memcpy kind, when it has one)."""

    api: str
    kind: Optional[int]
    count: int = 0
    total_ns: int = 0
    min_ns: int = 0
    max_ns: int = 0
    errors: int = 0
    bytes: int = 0
    sumsq: int = 0  # the sum of squared durations, ns²
    histogram: List[int] = field(default_factory=lambda: [0] * HIST_BUCKETS)

    def add_cpu(self, values: Tuple[int, ...]) -> None:
        count, total, low, high, errors, nbytes, sumsq = values[:7]
        if not count:
            return
        self.count += count
        self.total_ns += total
        self.min_ns = low if not self.min_ns else min(self.min_ns, low)
        self.max_ns = max(self.max_ns, high)
        self.errors += errors
        self.bytes += nbytes
        self.sumsq += sumsq
        self.histogram = [a + b for a, b in zip(self.histogram, values[7:])]

    def percentile_ns(self, fraction: float) -> int:
        """Upper bound of the log2 bucket holding the given fraction of calls."""
        target, seen = fraction * self.count, 0
        for bucket, n in enumerate(self.histogram):
            seen += n
            if n and seen >= target:
                return min((1 << (bucket + 1)) - 1, self.max_ns)
        return self.max_ns


@dataclass
class Aggregates:
    functions: List[FunctionStats]
    errors: Dict[Tuple[str, int], int]
    launches: List[Tuple[int, str, Tuple[int, ...], int, int]]  # pid, api, cells, count, ns


def agg_slots(fn_ids: Iterable[int],
              table: Sequence[Api] = TABLE) -> List[Tuple[Api, Optional[int], int]]:
    """(row, memcpy kind or None, index in `agg`) of each slot of these functions, in index
    order: a row with a memcpy kind argument has KIND_SLOTS of them, the others their first
    (the return probe adds their calls to it alone)."""
    slots = []
    for fn_id in sorted(set(fn_ids)):
        api = table[fn_id]
        if any(a.kind == Kind.MEMCPY_KIND for a in api.args):
            slots += [(api, kind, fn_id * KIND_SLOTS + kind) for kind in range(KIND_SLOTS)]
        else:
            slots.append((api, None, fn_id * KIND_SLOTS))
    return slots


def error_counts(errors_map) -> Dict[Tuple[int, int], int]:
    """The `errors` map: failed calls by (function id, error code)."""
    return {ERROR_KEY.unpack(key): _U64.unpack(value)[0] for key, value in errors_map.items()}


def owned_slots(values: bytes) -> List[Tuple[int, int, int, int, int]]:
    """(index, pid, fn_id, func, count) of each owned slot of `launch_slots` (count_call),
    from the array's values in index order (LAUNCH_SLOT's 24 bytes are their own stride)."""
    cells = memoryview(values).cast("Q")
    try:
        return [(at // 3, owner & 0xFFFFFFFF, owner >> 32, cells[at + 1], cells[at + 2])
                for at, owner in zip(range(0, len(cells), 3), cells[::3]) if owner]
    finally:
        cells.release()


def owned_slots_of(slots_map) -> List[Tuple[int, int, int, int, int]]:
    """owned_slots of the `launch_slots` map (a maps.MappedArrayMap: read through its
    mapping, no syscall; a batch read of its 8,192 slots took ~2.3 ms on a 2-core VM, and
    the monitor reads them at every tick)."""
    return owned_slots(slots_map.values())


def free_slot(slots_map, index: int, owner: int) -> None:
    """Free a slot of `launch_slots` whose process has exited: its kernel and count are
    cleared while its owner still holds it (a launch finding another's owner goes to
    `launches`), then the owner, so no launch ever sees a half-cleared slot as free."""
    slots_map.set(index, (owner, 0, 0))
    slots_map.set(index, (0, 0, 0))


class ProcessSlots:
    """The monitor's sums by process slot (probes/aggregates._count_in_process_slot):
    `proc_owners` (a tgid a slot, 0 free) and `proc_sums` (per slot, [calls, errors, ns]
    of each function), both read through their mappings."""

    def __init__(self, owners_map, sums_map, table_size: int = len(TABLE)) -> None:
        self.owners, self.sums, self.table_size = owners_map, sums_map, table_size

    def owned(self) -> List[Tuple[int, int]]:
        """(slot, pid) of the slots a process holds (not those being freed)."""
        cells = memoryview(self.owners.values()).cast("Q")
        try:
            return [(slot, owner) for slot, owner in enumerate(cells)
                    if owner and not owner & layout.PROCESS_RETIRING]
        finally:
            cells.release()

    def calls(self, slot: int) -> Dict[int, List[int]]:
        """fn_id -> [calls, errors, API ns] of the slot's functions called."""
        raw = self.sums.values(slot * self.table_size, self.table_size)
        return {fn_id: list(values) for fn_id, values
                in enumerate(layout.PROCESS_VALUE.iter_unpack(raw)) if values[0]}

    def free(self, slot: int, pid: int) -> Dict[int, List[int]]:
        """Let an exited process's slot go; what it held. The owner is marked first (a
        thread finding it so claims another slot: nothing adds to a slot being cleared),
        the sums are read and cleared, then the slot is free. (The only threads that could
        still add to it are those of a new process given the exited one's pid before the
        monitor let it go, already past the owner check: as with `proc_calls`, whose entry
        such a process shares.)"""
        self.owners.set(slot, layout.PROCESS_RETIRING | pid)
        held = self.calls(slot)
        raw = self.sums.values(slot * self.table_size, self.table_size)
        zero = (0, 0, 0)
        for fn_id, values in enumerate(layout.PROCESS_VALUE.iter_unpack(raw)):
            if values != zero:
                self.sums.set(slot * self.table_size + fn_id, zero)
        self.owners.set(slot, 0)
        return held


def read_aggregates(agg_map, errors_map, launches_map,
                    table: Sequence[Api] = TABLE, slots_map=None) -> Aggregates:
    """Sum the per-CPU aggregates and read the error and launch maps (and the launch
    slots, added to the launches: one entry per process, function and kernel)."""
    functions = []
    for api, kind, index in agg_slots(range(len(table)), table):
        stats = FunctionStats(api.name, kind)
        for raw in agg_map[index]:
            values = list(AGG_VALUE.unpack(raw) if isinstance(raw, bytes) else raw)
            values[AGG_SUMSQ // 8] = sum_of_squares(values[AGG_SUMSQ // 8])  # in ns², exact int
            stats.add_cpu(tuple(values))
        if stats.count:
            functions.append(stats)
    errors = {(table[fn_id].name, code): n
              for (fn_id, code), n in error_counts(errors_map).items()}
    found: Dict[Tuple[int, int, Tuple[int, ...]], List[int]] = {}
    for key, value in launches_map.items():
        pid, fn_id, *cells = LAUNCH_KEY.unpack(key)
        found[(pid, fn_id, tuple(cells))] = list(LAUNCH_VALUE.unpack(value))
    if slots_map is not None:
        for _, pid, fn_id, func, count in owned_slots_of(slots_map):
            if not count:  # (claimed, its first count not yet added)
                continue
            cells = tuple(func if c == func_cell(table[fn_id]) else 0
                          for c in range(record.ARG_CELLS))
            found.setdefault((pid, fn_id, cells), [0, 0])[0] += count
    launches = [(pid, table[fn_id].name, cells, count, total)
                for (pid, fn_id, cells), (count, total) in found.items()]
    return Aggregates(functions, errors, launches)


# -- read again and again: the monitor ----------------------------------------------------

class FunctionTotals(NamedTuple):
    """One function's (and memcpy kind's) sums over its CPUs: the cells that add up (not
    min, max nor the sum of squares, which the fast summing of `per_cpu_total` cannot
    take)."""

    api: Api
    kind: Optional[int]
    count: int
    total_ns: int
    errors: int
    bytes: int
    histogram: Tuple[int, ...]


_COUNT, _TOTAL, _ERRORS, _BYTES, _HIST = (
    at // 8 for at in (AGG_COUNT, AGG_TOTAL, AGG_ERRORS, AGG_BYTES, AGG_HIST))


def per_cpu_total(raw: bytes) -> List[int]:
    """The u64 words of an `agg` value summed over its CPUs. Each CPU's words, read as one
    little-endian integer, are 64-bit lanes: adding the integers adds every lane at once
    (a lane carries into the next only past 2^64, where the kernel's own counter wraps)."""
    size = AGG_VALUE.size
    total = sum(int.from_bytes(raw[at:at + size], "little") for at in range(0, len(raw), size))
    return memoryview(total.to_bytes(size + 8, "little")[:size]).cast("Q").tolist()


class FunctionReader:
    """Reads the `agg` map's entries of some functions only, one lookup each (the monitor
    reads them at every tick: its buffers made once)."""

    def __init__(self, agg_map, fn_ids: Iterable[int], table: Sequence[Api] = TABLE) -> None:
        self._lookup = syscalls.ElementLookup(agg_map.fd, _INDEX.size,
                                              AGG_VALUE.size * possible_cpus())
        # (a function not called yet: all zero, told by one compare instead of a sum over
        # the CPUs, ~0.2 ms an entry with 224 of them)
        self._never = bytes(AGG_VALUE.size * possible_cpus())
        self.entries = [(api, kind, _INDEX.pack(index))
                        for api, kind, index in agg_slots(fn_ids, table)]

    def read(self) -> List[FunctionTotals]:
        """The functions called so far."""
        found = []
        for api, kind, key in self.entries:
            raw = self._lookup(key)
            if raw is None or raw == self._never:
                continue
            words = per_cpu_total(raw)
            if not words[_COUNT]:
                continue
            found.append(FunctionTotals(
                api, kind, words[_COUNT], words[_TOTAL], words[_ERRORS], words[_BYTES],
                tuple(words[_HIST:_HIST + HIST_BUCKETS])))
        return found


_FUNC_CELL = {fn_id: func_cell(api) for fn_id, api in enumerate(TABLE)
              if api.role == Role.LAUNCH}


class Forgotten(NamedTuple):
    """What the entries of processes let go held (LiveSums.forget)."""

    launches: List[Tuple[int, int, int, int]]  # (pid, fn_id, func, count), entry by entry
    calls: Dict[int, int]  # fn_id -> calls (`proc_calls`)


class LiveSums:
    """The sums of a running session read again and again, and the entries of processes
    that exited let go (so that the maps keep room for new ones): the monitor's. Launches
    are by (pid, fn_id, func): the key's cells other than the kernel are not told apart."""

    def __init__(self, agg_map, errors_map, launches_map, calls_map=None,
                 slots_map=None, process_slots: Optional[ProcessSlots] = None) -> None:
        self.agg_map = agg_map
        self._errors = errors_map
        self._launches_map = launches_map
        self._launches = launches_map.batch_reader()
        self._calls_map = calls_map
        self._calls = calls_map.batch_reader() if calls_map is not None else None
        self._slots = slots_map  # (launch_slots: sampled returns)
        self._process_slots = process_slots  # (with task storage: see ProcessSlots)

    @classmethod
    def of(cls, maps: dict) -> "LiveSums":
        """The sums of a session's maps (by name)."""
        slots = (ProcessSlots(maps[layout.PROCESS_OWNERS], maps[layout.PROCESS_SUMS])
                 if layout.PROCESS_OWNERS in maps else None)
        return cls(maps[layout.AGG], maps[layout.ERRORS], maps[layout.LAUNCHES],
                   maps.get(layout.PROCESS_CALLS), maps.get(layout.LAUNCH_SLOTS), slots)

    def function_reader(self, fn_ids: Iterable[int]) -> FunctionReader:
        return FunctionReader(self.agg_map, fn_ids)

    def errors(self) -> Dict[Tuple[int, int], int]:
        """Failed calls by (function id, error code)."""
        return error_counts(self._errors)

    def owned_slots(self) -> List[Tuple[int, int, int, int, int]]:
        """(index, pid, fn_id, func, count) of the owned launch slots (sampled rows)."""
        return [] if self._slots is None else owned_slots_of(self._slots)

    def launches(self) -> Dict[Tuple[int, int, int], int]:
        """Launches by (pid, fn_id, func): the `launches` map's and the launch slots'."""
        found: Dict[Tuple[int, int, int], int] = {}
        for key, value in self._launches.items():
            pid, fn_id, *cells = LAUNCH_KEY.unpack(key)
            at = (pid, fn_id, cells[_FUNC_CELL[fn_id]])
            found[at] = found.get(at, 0) + LAUNCH_VALUE.unpack(value)[0]
        for _, pid, fn_id, func, count in self.owned_slots():
            if count:  # (else claimed, its first launch not yet added)
                found[(pid, fn_id, func)] = found.get((pid, fn_id, func), 0) + count
        return found

    def process_calls(self) -> Dict[Tuple[int, int], List[int]]:
        """[calls, errors, API ns] by (pid, fn_id), memcpy kinds summed (`proc_calls`)."""
        found: Dict[Tuple[int, int], List[int]] = {}
        for key, value in self._calls.items() if self._calls is not None else ():
            pid, index = layout.PROCESS_KEY.unpack(key)
            entry = found.setdefault((pid, index // KIND_SLOTS), [0, 0, 0])
            for k, v in enumerate(layout.PROCESS_VALUE.unpack(value)):
                entry[k] += v
        slots = self._process_slots
        for slot, pid in slots.owned() if slots is not None else ():
            for fn_id, values in slots.calls(slot).items():
                entry = found.setdefault((pid, fn_id), [0, 0, 0])
                for k, v in enumerate(values):
                    entry[k] += v
        return found

    def processes_in_hash(self) -> Set[int]:
        """The processes with calls in `proc_calls` although process slots exist: those
        that found no free slot (every call still counted, by process)."""
        if self._process_slots is None or self._calls is None:
            return set()
        return {layout.PROCESS_KEY.unpack(key)[0] for key, _ in self._calls.items()}

    def forget(self, pids: Set[int]) -> Forgotten:
        """Let the entries of these processes (which exited) go from the `launches` map,
        the launch slots and `proc_calls`; what they held."""
        launches = []
        for key, value in self._launches.items():
            pid, fn_id, *cells = LAUNCH_KEY.unpack(key)
            if pid in pids:
                launches.append((pid, fn_id, cells[_FUNC_CELL[fn_id]],
                                 LAUNCH_VALUE.unpack(value)[0]))
                self._launches_map.delete(key)
        for index, pid, fn_id, func, count in self.owned_slots():
            if pid in pids:
                launches.append((pid, fn_id, func, count))
                free_slot(self._slots, index, fn_id << 32 | pid)
        calls: Dict[int, int] = {}
        for key, value in self._calls.items() if self._calls is not None else ():
            pid, index = layout.PROCESS_KEY.unpack(key)
            if pid in pids:
                fn_id = index // KIND_SLOTS
                calls[fn_id] = calls.get(fn_id, 0) + layout.PROCESS_VALUE.unpack(value)[0]
                self._calls_map.delete(key)
        slots = self._process_slots
        for slot, pid in slots.owned() if slots is not None else ():
            if pid in pids:
                for fn_id, values in slots.free(slot, pid).items():
                    calls[fn_id] = calls.get(fn_id, 0) + values[0]
        return Forgotten(launches, calls)
