"""In-kernel aggregation for `--summary`: the return probe adds each call to per-CPU
counters instead of (or besides) writing a record, so a summary costs no ring traffic.

Per function (and memcpy kind): count, total/min/max duration, errors, bytes of successful
calls, a sum of squared durations in 64 ns units (for the standard deviation) and a log2 histogram of
durations (for approximate percentiles). Errors by (function, code) and launches by
(process, function, geometry) go to hash maps. `read_aggregates` sums it all up at the end.
"""
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from . import asm, record
from .apis import TABLE, Api, Kind, arg_cells
from .arch import Arch
from .asm import DW, FP, R0, R1, R2, R3, R4, R6, R7, R8, R9, W, Helper

AGG_MAP = "agg"
ERRORS_MAP = "errors"
LAUNCHES_MAP = "launches"

KIND_SLOTS = 5  # cudaMemcpyKind 0-4; rows without a kind use slot 0
HIST_BUCKETS = 40  # log2(ns) buckets: 2^39 ns is about 9 minutes
COUNT, TOTAL, MIN, MAX, ERRORS, BYTES, SUMSQ, HIST = (0, 8, 16, 24, 32, 40, 48, 56)
SUMSQ_SHIFT = 6  # squares of durations in 64 ns units: no overflow below 2^38 ns (4.5 min)
AGG_VALUE = struct.Struct("<7Q%dQ" % HIST_BUCKETS)
ERROR_KEY = struct.Struct("<II")  # fn_id, code
LAUNCH_KEY = struct.Struct("<II%dQ" % record.ARG_CELLS)  # pid, fn_id, argument cells
LAUNCH_VALUE = struct.Struct("<QQ")  # count, total ns
ERROR_ENTRIES = 4096
LAUNCH_ENTRIES = 16384

# Stack of the return program below probes.NOW (fp-136).
_AGG_KEY = -144
_LAUNCH_KEY = _AGG_KEY - LAUNCH_KEY.size  # fp-232
_LAUNCH_VALUE = _LAUNCH_KEY - LAUNCH_VALUE.size  # fp-248
_ERROR_KEY = _LAUNCH_VALUE - 8  # fp-256
_ERROR_VALUE = _ERROR_KEY - 8  # fp-264


def agg_entries(table: Sequence[Api] = TABLE) -> int:
    return len(table) * KIND_SLOTS


def _cell_of(api: Api, predicate) -> Optional[int]:
    for arg, cell in arg_cells(api):
        if predicate(arg):
            return cell
    return None


def _shown_cells(api: Api) -> Tuple[int, ...]:
    """The record cells of the arguments a launch shows (its key in the `launches` map)."""
    return tuple(sorted({cell + k for arg, cell in arg_cells(api) if arg.show
                         for k in range(arg.cells)}))


def shape_of(api: Api) -> tuple:
    """What `aggregate_call` reads of `api` (see probes.shape_of)."""
    launch = _shown_cells(api) if api.category == "launch" else None
    return (_cell_of(api, lambda a: a.name == "size"),
            _cell_of(api, lambda a: a.kind == Kind.MEMCPY_KIND), launch)


def aggregate_call(api: Api, fn_id, arch: Arch) -> list:
    """Return-probe code adding one call to the aggregates (R6 ctx, R7 inflight value);
    `fn_id` a constant or probes.FROM_COOKIE."""
    from .probes import NOW

    prog = [asm.ldx(DW, R8, FP, NOW), asm.ldx(DW, R1, R7, record.INFLIGHT_TS), asm.sub(R8, R1)]
    prog += _agg_index(api, fn_id)
    prog += [
        asm.ld_map(R1, AGG_MAP), asm.mov(R2, FP), asm.add(R2, _AGG_KEY),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "agg_done"),
        asm.mov(R9, R0),
    ]
    prog += _add(COUNT, 1) + _add_reg(TOTAL, R8)
    prog += [
        asm.ldx(DW, R1, R9, MIN), asm.jeq(R1, 0, "set_min"), asm.jle(R1, R8, "min_ok"),
        asm.Label("set_min"), asm.stx(DW, R9, MIN, R8), asm.Label("min_ok"),
        asm.ldx(DW, R1, R9, MAX), asm.jge(R1, R8, "max_ok"), asm.stx(DW, R9, MAX, R8),
        asm.Label("max_ok"),
        asm.ldx(DW, R1, R6, arch.ret), asm.jne32(R1, 0, "failed"),
    ]
    size_cell = _cell_of(api, lambda a: a.name == "size")
    if size_cell is not None:
        prog += [asm.ldx(DW, R1, R7, record.INFLIGHT_ARGS + 8 * size_cell)]
        prog += _add_reg(BYTES, R1)
    prog += [asm.ja("outcome_done"), asm.Label("failed")] + _add(ERRORS, 1)
    prog += [asm.Label("outcome_done"), asm.mov(R1, R8), asm.rsh(R1, SUMSQ_SHIFT),
             asm.mul(R1, R1)]
    prog += _add_reg(SUMSQ, R1) + _histogram() + [asm.Label("agg_done")]
    prog += _count_error(fn_id, arch)
    if api.category == "launch":
        prog += _count_launch(api, fn_id)
    return prog


def _agg_index(api: Api, fn_id) -> list:
    """fp-144 = fn_id * KIND_SLOTS + the call's memcpy kind (0 when none or out of range)."""
    from .probes import FROM_COOKIE, fn_id_into

    kind_cell = _cell_of(api, lambda a: a.kind == Kind.MEMCPY_KIND)
    if kind_cell is None and fn_id is not FROM_COOKIE:
        return [asm.st(W, FP, _AGG_KEY, fn_id * KIND_SLOTS)]
    prog = fn_id_into(R2, fn_id) + [asm.mul(R2, KIND_SLOTS)]
    if kind_cell is None:
        return prog + [asm.stx(W, FP, _AGG_KEY, R2)]
    return prog + [
        asm.ldx(DW, R1, R7, record.INFLIGHT_ARGS + 8 * kind_cell), asm.mov32(R1, R1),
        asm.jlt(R1, KIND_SLOTS, "kind_ok"), asm.mov(R1, 0), asm.Label("kind_ok"),
        asm.add(R1, R2), asm.stx(W, FP, _AGG_KEY, R1),
    ]


def _add(offset: int, amount: int) -> list:
    return [asm.ldx(DW, R1, R9, offset), asm.add(R1, amount), asm.stx(DW, R9, offset, R1)]


def _add_reg(offset: int, reg) -> list:
    return [asm.ldx(DW, R2, R9, offset), asm.add(R2, reg), asm.stx(DW, R9, offset, R2)]


def _histogram() -> list:
    """hist[floor(log2(duration))] += 1, by binary search on the bits of R8."""
    prog = [asm.mov(R1, R8), asm.mov(R2, 0)]
    for shift in (32, 16, 8, 4, 2, 1):
        label = "log2_%d" % shift
        prog += [asm.mov(R3, R1), asm.rsh(R3, shift), asm.jeq(R3, 0, label),
                 asm.mov(R1, R3), asm.add(R2, shift), asm.Label(label)]
    return prog + [
        asm.jle(R2, HIST_BUCKETS - 1, "bucket_ok"), asm.mov(R2, HIST_BUCKETS - 1),
        asm.Label("bucket_ok"),
        asm.lsh(R2, 3), asm.add(R2, R9),
        asm.ldx(DW, R1, R2, HIST), asm.add(R1, 1), asm.stx(DW, R2, HIST, R1),
    ]


def _count_error(fn_id, arch: Arch) -> list:
    """errors[(fn_id, code)] += 1 for a failed call."""
    from .probes import fn_id_into

    prog = [asm.ldx(DW, R1, R6, arch.ret), asm.jeq32(R1, 0, "error_done")]
    prog += fn_id_into(R2, fn_id) + [
        asm.stx(W, FP, _ERROR_KEY, R2), asm.stx(W, FP, _ERROR_KEY + 4, R1),
        asm.st(DW, FP, _ERROR_VALUE, 1),
    ]
    return prog + _hash_add(ERRORS_MAP, _ERROR_KEY, _ERROR_VALUE, [(0, None)], "error")


def _count_launch(api: Api, fn_id) -> list:
    """launches[(pid, fn_id, shown argument cells)] += (1, duration)."""
    from .probes import fn_id_into

    shown = _shown_cells(api)
    prog = [
        asm.ldx(DW, R1, FP, -16), asm.rsh(R1, 32),  # pid from the inflight key (fp-16)
    ] + fn_id_into(R2, fn_id) + [
        asm.lsh(R2, 32), asm.or_(R1, R2),
        asm.stx(DW, FP, _LAUNCH_KEY, R1),
    ]
    for cell in range(record.ARG_CELLS):
        where = _LAUNCH_KEY + 8 + 8 * cell
        if cell in shown:
            prog += [asm.ldx(DW, R1, R7, record.INFLIGHT_ARGS + 8 * cell),
                     asm.stx(DW, FP, where, R1)]
        else:
            prog.append(asm.st(DW, FP, where, 0))
    prog += [asm.st(DW, FP, _LAUNCH_VALUE, 1), asm.stx(DW, FP, _LAUNCH_VALUE + 8, R8)]
    return prog + _hash_add(LAUNCHES_MAP, _LAUNCH_KEY, _LAUNCH_VALUE, [(0, None), (8, R8)],
                            "launch")


def _hash_add(map_name: str, key: int, value: int, adds, tag: str) -> list:
    """Add to a shared hash map entry atomically, creating it (with the value on the stack
    at `value`) when missing; a lost creation race falls back to adding."""
    def add_all(base) -> list:
        out = []
        for offset, reg in adds:
            if reg is None:
                out += [asm.mov(R1, 1), asm.atomic_add(DW, base, offset, R1)]
            else:
                out += [asm.atomic_add(DW, base, offset, reg)]
        return out

    lookup = [asm.ld_map(R1, map_name), asm.mov(R2, FP), asm.add(R2, key),
              asm.call(Helper.MAP_LOOKUP_ELEM)]
    return (lookup + [asm.jeq(R0, 0, tag + "_create")] + add_all(R0)
            + [asm.ja(tag + "_done"), asm.Label(tag + "_create"),
               asm.ld_map(R1, map_name), asm.mov(R2, FP), asm.add(R2, key),
               asm.mov(R3, FP), asm.add(R3, value), asm.mov(R4, 1),  # BPF_NOEXIST
               asm.call(Helper.MAP_UPDATE_ELEM), asm.jeq(R0, 0, tag + "_done")]
            + lookup + [asm.jeq(R0, 0, tag + "_done")] + add_all(R0)
            + [asm.Label(tag + "_done")])


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
    sumsq: int = 0
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


def read_aggregates(agg_map, errors_map, launches_map,
                    table: Sequence[Api] = TABLE) -> Aggregates:
    """Sum the per-CPU aggregates and read the error and launch maps."""
    functions = []
    for index in range(len(table) * KIND_SLOTS):
        per_cpu = agg_map[index]
        fn_id, kind = divmod(index, KIND_SLOTS)
        api = table[fn_id]
        has_kind = any(a.kind == Kind.MEMCPY_KIND for a in api.args)
        stats = FunctionStats(api.name, kind if has_kind else None)
        for raw in per_cpu:
            stats.add_cpu(AGG_VALUE.unpack(raw) if isinstance(raw, bytes) else raw)
        if stats.count:
            functions.append(stats)
    errors = {}
    for key, value in errors_map.items():
        fn_id, code = ERROR_KEY.unpack(key)
        errors[(table[fn_id].name, code)] = struct.unpack("<Q", value)[0]
    launches = []
    for key, value in launches_map.items():
        pid, fn_id, *cells = LAUNCH_KEY.unpack(key)
        count, total = LAUNCH_VALUE.unpack(value)
        launches.append((pid, table[fn_id].name, tuple(cells), count, total))
    return Aggregates(functions, errors, launches)
