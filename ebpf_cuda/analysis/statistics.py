"""Exact statistics of lists of numbers, shared by every table."""
import math
from typing import NamedTuple, Sequence


class Stats(NamedTuple):
    """Exact statistics of a list of numbers (StdDev is the sample standard deviation)."""

    count: int
    total: float
    mean: float
    median: float
    minimum: float
    maximum: float
    stdev: float


def stats(values: Sequence[float]) -> Stats:
    """Count, total, mean, exact median, min, max and sample standard deviation."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return Stats(0, 0, 0.0, 0.0, 0, 0, 0.0)
    total = math.fsum(ordered)
    mean = total / n
    deviation = math.sqrt(math.fsum((v - mean) ** 2 for v in ordered) / (n - 1)) if n > 1 else 0.0
    return Stats(n, total, mean, percentile(ordered, 50), ordered[0], ordered[-1], deviation)


def percentile(ordered: Sequence[float], p: float) -> float:
    """The p-th percentile of sorted values, linear between closest ranks (p50 = median)."""
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * p / 100.0
    low = int(math.floor(rank))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
