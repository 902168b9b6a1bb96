"""Summary tables from in-kernel aggregates (`--summary` alone: no record per call).

Counts, totals, averages, minima, maxima, errors, bytes and standard deviations are exact
(the kernel sums the squares of the durations in ns²: aggregates.sum_of_squares). Medians and
percentiles come from log2 histograms and are upper bounds of a power-of-two bucket (shown
with `<=`).

With both layers traced the kernel cannot tell a runtime copy's own driver copy from a direct
driver copy (cuBLAS's, through the runtime linked into it): it counts calls per function.
`layered_operations` splits them the way the event summary does (a copy counts once, as its
runtime call): each successful runtime copy or memset is carried out by one driver call of
the same operation, so the driver calls beyond those are direct ones.
"""
import math
from collections import defaultdict
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

from ..decode.aggregates import Aggregates, FunctionStats
from ..decode.events import decode_launch_config, decode_value
from ..decode.operations import LABELS, MB, MEMSET, Geometry, launch_geometry, operation_of
from ..spec.apis import BY_NAME, Api, Direction, Kind, Role, arg_cells
from ..spec.cuda_enums import error_name, memcpy_kind_name
from ._table import decimal, integer, table


def aggregate_tables(agg: Aggregates) -> List[str]:
    """API, percentile, memory, bandwidth and error tables."""
    per_api = _merge_kinds(agg.functions)
    operations = layered_operations(agg.functions)
    return [_api_table(per_api), _percentile_table(per_api), _memory_table(operations),
            _bandwidth_table(operations), _error_table(agg)]


def _merge_kinds(functions: List[FunctionStats]) -> List[FunctionStats]:
    """One entry per function (memcpy kinds folded together), by total time."""
    merged = {}
    for f in functions:
        m = merged.setdefault(f.api, FunctionStats(f.api, None))
        m.add_cpu((f.count, f.total_ns, f.min_ns, f.max_ns, f.errors, f.bytes, f.sumsq,
                   *f.histogram))
    return sorted(merged.values(), key=lambda f: (-f.total_ns, f.api))


def stdev_ns(f: FunctionStats) -> float:
    """The sample standard deviation of the durations (exact: integer sums)."""
    n = f.count
    if n < 2:
        return 0.0
    variance = (n * f.sumsq - f.total_ns * f.total_ns) / (n * (n - 1))
    return math.sqrt(max(variance, 0.0))


def _api_table(per_api: List[FunctionStats]) -> str:
    title = " ** CUDA API Summary (cuda_api_sum, in-kernel aggregates):\n\n"
    if not per_api:
        return title + " (no completed calls)"
    grand = sum(f.total_ns for f in per_api) or 1
    rows = [("%.1f" % (100.0 * f.total_ns / grand), integer(f.total_ns), integer(f.count),
             decimal(f.total_ns / f.count), "<=" + integer(f.percentile_ns(0.5)),
             integer(f.min_ns), integer(f.max_ns), decimal(stdev_ns(f)), f.api)
            for f in per_api]
    headers = ("Time (%)", "Total Time (ns)", "Num Calls", "Avg (ns)", "Med (ns)", "Min (ns)",
               "Max (ns)", "StdDev (ns)", "Name")
    return title + table(headers, rows, left=(8,))


def _percentile_table(per_api: List[FunctionStats]) -> str:
    title = " ** CUDA API Duration Percentiles (log2 buckets, upper bounds):\n\n"
    if not per_api:
        return title + " (no completed calls)"
    rows = [(integer(f.count), *("<=" + integer(f.percentile_ns(p)) for p in (0.5, 0.95, 0.99)),
             integer(f.max_ns), f.api) for f in per_api]
    headers = ("Num Calls", "P50 (ns)", "P95 (ns)", "P99 (ns)", "Max (ns)", "Name")
    return title + table(headers, rows, left=(5,))


# -- memory operations, each counted once across layers -------------------------------------

class Tally(NamedTuple):
    """Successful calls of one operation: how many, their bytes and call time (ns)."""

    count: int = 0
    bytes: int = 0
    ns: int = 0

    def plus(self, other: "Tally") -> "Tally":
        return Tally(self.count + other.count, self.bytes + other.bytes, self.ns + other.ns)

    def minus(self, other: "Tally") -> "Tally":
        return Tally(self.count - other.count, self.bytes - other.bytes, self.ns - other.ns)

    def part(self, count: int) -> "Tally":
        """`count` of these calls, with their share of the bytes and time."""
        if count >= self.count:
            return self
        return Tally(count, self.bytes * count // self.count, self.ns * count // self.count)


# (operation, asynchronous): what a runtime call and the driver call it makes have in common.
Key = Tuple[str, bool]


def _key(api: Api, kind: Optional[int]) -> Optional[Key]:
    if api.role not in (Role.COPY, Role.MEMSET):
        return None
    operation = operation_of(api.name, memcpy_kind_name(kind) if kind is not None else None)
    return (operation, api.asynchronous) if operation is not None else None


def _tallies(functions: Iterable[FunctionStats], driver: bool) -> Dict[Key, Tally]:
    """Successful copies and memsets of one layer, by operation (errors carry no bytes;
    their time is left out)."""
    out: Dict[Key, Tally] = defaultdict(Tally)
    for f in functions:
        api = BY_NAME[f.api]
        key = _key(api, f.kind)
        if key is None or api.driver != driver or f.count <= f.errors:
            continue
        ok = f.count - f.errors
        out[key] = out[key].plus(Tally(ok, f.bytes, f.total_ns * ok // f.count))
    return out


_DEFAULT = "[CUDA memcpy %s]" % LABELS[Direction.DEFAULT]


def layered_operations(functions: Iterable[FunctionStats]) -> Dict[Key, Tally]:
    """Copies and memsets by (operation, asynchronous), each counted once as the event
    summary does: every runtime call, plus the driver calls no runtime call accounts for.
    A runtime copy is carried out by a driver copy of its direction, or else by one of
    unified addressing (cuMemcpy, cuMemcpyAsync: the direction comes from the pointers)."""
    functions = list(functions)
    runtime, driver = _tallies(functions, False), _tallies(functions, True)
    direct = dict(driver)
    for key, calls in sorted(runtime.items()):
        left = calls  # runtime calls whose driver call is still to be found
        for where in (key, (_DEFAULT, key[1])) if key[0] != MEMSET else (key,):
            have = direct.get(where, Tally())
            taken = left.part(min(left.count, have.count))
            # the driver call moved the runtime call's bytes; its time is its own
            direct[where] = Tally(have.count - taken.count, max(have.bytes - taken.bytes, 0),
                                  have.ns - have.part(taken.count).ns)
            left = left.minus(taken)
    merged: Dict[Key, Tally] = defaultdict(Tally)
    for key, calls in list(runtime.items()) + list(direct.items()):
        if calls.count > 0:
            merged[key] = merged[key].plus(calls)
    return dict(merged)


def _memory_table(operations: Dict[Key, Tally]) -> str:
    title = " ** CUDA Memory Operation Summary (in-kernel aggregates: totals only):\n\n"
    totals: Dict[str, Tally] = defaultdict(Tally)
    for (operation, _asynchronous), calls in operations.items():
        totals[operation] = totals[operation].plus(calls)
    if not totals:
        return title + " (no memory operations)"
    rows = [(decimal(t.bytes / MB, 3), integer(t.count), decimal(t.bytes / t.count / MB, 3),
             operation)
            for operation, t in sorted(totals.items(), key=lambda i: (-i[1].bytes, i[0]))]
    return title + table(("Total (MB)", "Count", "Avg (MB)", "Operation"), rows, left=(3,))


def _bandwidth_table(operations: Dict[Key, Tally]) -> str:
    title = " ** Synchronous Copy Bandwidth (bytes / call duration):\n\n"
    rows = [(integer(t.count), decimal(t.bytes / MB, 3), integer(t.ns),
             decimal(t.bytes / t.ns, 3), operation)
            for (operation, asynchronous), t in sorted(operations.items())
            if not asynchronous and operation != MEMSET and t.ns]
    if not rows:
        return title + " (no synchronous copies)"
    headers = ("Count", "Total (MB)", "Total Time (ns)", "Bandwidth (GB/s)", "Operation")
    return title + table(headers, rows, left=(4,))


def _error_table(agg: Aggregates) -> str:
    title = " ** CUDA API Errors:\n\n"
    if not agg.errors:
        return title + " (no errors)"
    rows = [(integer(count), str(code), error_name(code, BY_NAME[api].library), api)
            for (api, code), count in sorted(agg.errors.items(),
                                             key=lambda i: (-i[1], i[0][0], i[0][1]))]
    return title + table(("Count", "Code", "Error", "Name"), rows, left=(2, 3))


# -- launches --------------------------------------------------------------------------------

class Launch(NamedTuple):
    """Successful launches counted in the kernel with the same function and geometry."""

    pid: int
    api: str
    func: int
    geometry: Geometry
    count: int


def launch_values(api: Api, cells: Tuple[int, ...]) -> Dict[str, object]:
    """The shown arguments of a launch from its counted cells (decoded as events are)."""
    values: Dict[str, object] = {}
    for arg, cell in arg_cells(api):
        if not arg.show:
            continue
        if arg.kind == Kind.LAUNCH_CONFIG:
            values.update(decode_launch_config(cells[cell:cell + arg.cells]))
        else:
            values[arg.name] = decode_value(arg.kind, cells[cell:cell + 2])
    return values


def launches(agg: Aggregates) -> List[Launch]:
    """The in-kernel launch counts (failed launches are not counted: the event summary leaves
    them out too). With both layers traced only driver launches are kept: every runtime
    launch makes one."""
    driver_launches = any(BY_NAME[api].driver for _pid, api, _c, _n, _t in agg.launches)
    out = []
    for pid, api, cells, count, _total in agg.launches:
        row = BY_NAME[api]
        if driver_launches and not row.driver:
            continue
        values = launch_values(row, cells)
        out.append(Launch(pid, api, int(values["func"]), launch_geometry(values), count))
    return out
