"""The metrics model the monitor publishes and its exporters render (prometheus.py, otlp.py,
flight.py's own families): families of samples, a sample's labels, histograms of durations.
"""
from typing import List, NamedTuple, Sequence, Tuple

Labels = Tuple[Tuple[str, str], ...]
# Durations the histogram's buckets end at: powers of two of nanoseconds, 256 ns to 34 s
# (the kernel's log2 buckets merged below and above; buckets are cumulative).
HISTOGRAM_BOUNDS_LOG2 = tuple(range(8, 36))


class Histogram(NamedTuple):
    """Cumulative counts of durations at most each bound (seconds), their sum and count."""

    bounds: Tuple[float, ...]
    cumulative: Tuple[int, ...]
    sum: float
    count: int


class Family(NamedTuple):
    """One metric family: `kind` "counter", "gauge" or "histogram"; `samples` are (labels,
    value) with a number, or a Histogram for histograms. Counters are named without the
    Prometheus `_total` suffix; `unit` is UCUM (OTLP): "1", "s", "By"."""

    name: str
    kind: str
    help: str
    unit: str
    samples: List[Tuple[Labels, object]]


def histogram(buckets: Sequence[int], total_ns: int, count: int) -> Histogram:
    """The kernel's log2 buckets (bucket b: durations of 2^b to 2^(b+1)-1 ns) as cumulative
    counts at the HISTOGRAM_BOUNDS_LOG2 bounds."""
    cumulative, seen, b = [], 0, 0
    for bound in HISTOGRAM_BOUNDS_LOG2:
        while b < len(buckets) and b < bound:  # buckets wholly below 2^bound ns
            seen += buckets[b]
            b += 1
        cumulative.append(seen)
    return Histogram(tuple((1 << bound) / 1e9 for bound in HISTOGRAM_BOUNDS_LOG2),
                     tuple(cumulative), total_ns / 1e9, count)
