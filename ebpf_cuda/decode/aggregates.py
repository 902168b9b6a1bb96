"""The in-kernel sums read back: the one reader of what probes/aggregates.py's programs add up
(per-function counts, durations, errors, bytes, squares and histograms per CPU; errors and
launches by key; the launch slots), for `--summary` alone and for the monitor.
"""
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..probes.aggregates import (AGG_VALUE, ERROR_KEY, HIST_BUCKETS, KIND_SLOTS, LAUNCH_KEY,
                                 LAUNCH_VALUE, SUMSQ, SUMSQ_EXP_AT, func_cell)
from ..spec import record
from ..spec.apis import TABLE, Api, Kind

_MANTISSA = (1 << SUMSQ_EXP_AT) - 1


def sum_of_squares(cell: int) -> int:
    """The sum of squared durations (ns²) a SUMSQ cell holds."""
    return (cell & _MANTISSA) << (2 * (cell >> SUMSQ_EXP_AT))


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



def read_aggregates(agg_map, errors_map, launches_map,
                    table: Sequence[Api] = TABLE, slots_map=None) -> Aggregates:
    """Sum the per-CPU aggregates and read the error and launch maps (and the launch
    slots, added to the launches: one entry per process, function and kernel)."""
    functions = []
    for index in range(len(table) * KIND_SLOTS):
        per_cpu = agg_map[index]
        fn_id, kind = divmod(index, KIND_SLOTS)
        api = table[fn_id]
        has_kind = any(a.kind == Kind.MEMCPY_KIND for a in api.args)
        stats = FunctionStats(api.name, kind if has_kind else None)
        for raw in per_cpu:
            values = list(AGG_VALUE.unpack(raw) if isinstance(raw, bytes) else raw)
            values[SUMSQ // 8] = sum_of_squares(values[SUMSQ // 8])  # in ns², exact int
            stats.add_cpu(tuple(values))
        if stats.count:
            functions.append(stats)
    errors = {}
    for key, value in errors_map.items():
        fn_id, code = ERROR_KEY.unpack(key)
        errors[(table[fn_id].name, code)] = struct.unpack("<Q", value)[0]
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
