"""Summary tables from in-kernel aggregates (`--summary` alone: no record per call).

Counts, totals, averages, minima, maxima, errors and bytes are exact (but with both layers
traced, copies are counted at the runtime layer only: see `_operations`). Medians and
percentiles come from log2 histograms and are upper bounds of a power-of-two bucket (shown
with `<=`); standard deviations come from squares of 64 ns-rounded durations (`~`).
"""
import math
from typing import List, Tuple

from ..aggregates import SUMSQ_SHIFT, Aggregates, FunctionStats
from ..apis import BY_NAME
from ..cuda_enums import error_name, memcpy_kind_name
from ..events import Event
from ._table import decimal, integer, table
from .summary import MB, operation_of


def aggregate_tables(agg: Aggregates) -> List[str]:
    """API, percentile, memory, bandwidth and error tables."""
    per_api = _merge_kinds(agg.functions)
    return [_api_table(per_api), _percentile_table(per_api), _memory_table(agg),
            _bandwidth_table(agg), _error_table(agg)]


def _merge_kinds(functions: List[FunctionStats]) -> List[FunctionStats]:
    """One entry per function (memcpy kinds folded together), by total time."""
    merged = {}
    for f in functions:
        m = merged.setdefault(f.api, FunctionStats(f.api, None))
        m.add_cpu((f.count, f.total_ns, f.min_ns, f.max_ns, f.errors, f.bytes, f.sumsq,
                   *f.histogram))
    return sorted(merged.values(), key=lambda f: (-f.total_ns, f.api))


def _stdev_ns(f: FunctionStats) -> float:
    if f.count < 2:
        return 0.0
    unit = 1 << SUMSQ_SHIFT
    mean = f.total_ns / unit / f.count
    variance = (f.sumsq - f.count * mean * mean) / (f.count - 1)
    return math.sqrt(max(variance, 0.0)) * unit


def _api_table(per_api: List[FunctionStats]) -> str:
    title = " ** CUDA API Summary (cuda_api_sum, in-kernel aggregates):\n\n"
    if not per_api:
        return title + " (no completed calls)"
    grand = sum(f.total_ns for f in per_api) or 1
    rows = [("%.1f" % (100.0 * f.total_ns / grand), integer(f.total_ns), integer(f.count),
             decimal(f.total_ns / f.count), "<=" + integer(f.percentile_ns(0.5)),
             integer(f.min_ns), integer(f.max_ns), "~" + decimal(_stdev_ns(f)), f.api)
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


def _operations(agg: Aggregates):
    """(operation, FunctionStats) of every copy/set function that moved bytes. The kernel
    cannot tell a runtime copy's own driver copy from a direct driver copy, so when runtime
    copies were seen, driver copies are left out (each runtime copy makes one)."""
    runtime_copies = any(not BY_NAME[f.api].driver and operation_of(f.api) is not None
                         for f in agg.functions)
    for f in agg.functions:
        if runtime_copies and BY_NAME[f.api].driver:
            continue
        kind = memcpy_kind_name(f.kind) if f.kind is not None else "Default"
        operation = operation_of(f.api, kind)
        if operation is not None and f.count > f.errors:
            yield operation, f


def _memory_table(agg: Aggregates) -> str:
    title = " ** CUDA Memory Operation Summary (in-kernel aggregates: totals only):\n\n"
    totals = {}
    for operation, f in _operations(agg):
        count, nbytes = totals.get(operation, (0, 0))
        totals[operation] = (count + f.count - f.errors, nbytes + f.bytes)
    if not totals:
        return title + " (no memory operations)"
    rows = [(decimal(nbytes / MB, 3), integer(count), decimal(nbytes / count / MB, 3), operation)
            for operation, (count, nbytes) in sorted(totals.items(), key=lambda i: -i[1][1])]
    return title + table(("Total (MB)", "Count", "Avg (MB)", "Operation"), rows, left=(3,))


def _bandwidth_table(agg: Aggregates) -> str:
    title = " ** Synchronous Copy Bandwidth (bytes / call duration):\n\n"
    rows = []
    for operation, f in _operations(agg):
        row = BY_NAME[f.api]
        if "Async" in f.api or row.category != "memcpy" or not f.total_ns:
            continue
        rows.append((integer(f.count), decimal(f.bytes / MB, 3), integer(f.total_ns),
                     decimal(f.bytes / f.total_ns, 3), operation))
    if not rows:
        return title + " (no synchronous copies)"
    headers = ("Count", "Total (MB)", "Total Time (ns)", "Bandwidth (GB/s)", "Operation")
    return title + table(headers, sorted(rows, key=lambda r: r[-1]), left=(4,))


def _error_table(agg: Aggregates) -> str:
    title = " ** CUDA API Errors:\n\n"
    if not agg.errors:
        return title + " (no errors)"
    rows = [(integer(count), str(code), error_name(code, BY_NAME[api].driver), api)
            for (api, code), count in sorted(agg.errors.items(),
                                             key=lambda i: (-i[1], i[0][0], i[0][1]))]
    return title + table(("Count", "Code", "Error", "Name"), rows, left=(2, 3))


def launch_events(agg: Aggregates) -> List[Tuple[Event, int]]:
    """The in-kernel launch counts as (a launch event, count), arguments decoded from the
    counted cells. With both layers traced only driver launches are kept (each runtime
    launch makes one)."""
    from ..events import EXIT, Decoder, _ARGS_AT

    decoder = Decoder(clock_offset_ns=0)
    rows = {row.name: row for row in decoder.rows}
    driver_launches = any(BY_NAME[api].driver for _pid, api, _c, _n, _t in agg.launches)
    out = []
    for pid, api, cells, count, _total in agg.launches:
        if driver_launches and not BY_NAME[api].driver:
            continue
        fields = (0,) * _ARGS_AT + tuple(cells)
        args = rows[api].decode_args(fields)
        out.append((Event(0.0, 0, pid, pid, "", api, EXIT, args, 0, "", 0), count))
    return out
