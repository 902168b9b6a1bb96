"""Every threshold of `ebpf-cuda analyze`, in one table: (name, value, unit, why). The
module's constants are the table's values; docs/analysis.md shows the same table
(tests/test_analyze_units.py checks that each row is there with its value)."""
from typing import Dict, NamedTuple, Tuple


class Threshold(NamedTuple):
    name: str
    value: float
    unit: str
    reason: str


TABLE: Tuple[Threshold, ...] = (
    Threshold("MIN_STEPS", 3, "steps",
              "two repetitions can be chance (a warm-up call and the real one); three "
              "identical runs of calls are a loop"),
    Threshold("STEP_REGULAR_SHARE", 0.5, "share of steps",
              "a loop whose body differs in some iterations (a fallback, a periodic "
              "checkpoint) is still a loop when most iterations repeat the same calls"),
    Threshold("EDGE_STEP_MIN_SHARE", 0.5, "share of a step's calls",
              "a loop's first iteration may skip work the later ones do (gradients are "
              "zeroed once they exist) but has at least half a step's calls; an occurrence "
              "of the step's first call before the loop (after it) followed by fewer is "
              "the set-up's (the epilogue's), no step"),
    Threshold("SLOW_STEP_FACTOR", 1.5, "x median",
              "steps 50% over the median are outside the usual jitter of a host loop "
              "and worth naming"),
    Threshold("STEADY_SHARE", 0.5, "share of steady steps",
              "a rule about every step fires when at least half the steady steps show the "
              "problem (a one-off is no pattern)"),
    Threshold("SYNC_MIN_BLOCKED_NS", 20000, "ns",
              "a synchronising call that returns within 20 us found the GPU done: it did "
              "not wait (the call itself costs a few us)"),
    Threshold("SYNC_MIN_STEP_SHARE", 0.05, "share of step",
              "waits under 5% of a step cost less than run-to-run noise; above it, the host "
              "idles while it could queue the next step's work"),
    Threshold("PAGEABLE_MIN_BYTES", 65536, "bytes",
              "copies of pageable memory are staged through a pinned buffer; below 64 KiB "
              "the staging costs less than the call, above it bandwidth halves and an "
              "async copy blocks the host"),
    Threshold("CHURN_MIN_CALLS", 1, "calls per step",
              "a steady-state step should allocate nothing: a caching allocator reuses "
              "blocks, and cudaMalloc/cudaFree synchronise the device"),
    Threshold("LAUNCH_BOUND_MIN_LAUNCHES", 20, "launches per step",
              "a few launches cost a few tens of us; graphs pay off from tens of launches"),
    Threshold("LAUNCH_BOUND_MIN_SHARE", 0.3, "share of step",
              "when issuing the launch sequence takes under 30% of the host's step, the "
              "host's other work dominates and a graph of the sequence would save little"),
    Threshold("LAUNCH_BOUND_MAX_BLOCKED", 0.1, "share of steps' time",
              "a thread that waits for the GPU more than 10% of its steps' time (in them or "
              "in the synchronising calls after the loop) has a busy GPU: GPU-bound, not "
              "launch-bound"),
    Threshold("LAUNCH_MAX_CALL_NS", 50000, "ns",
              "a launch call costs a few us of host time; a median over 50 us means the "
              "calls wait for room in a full launch queue: the GPU is behind"),
    Threshold("IDLE_GAP_MIN_NS", 100000, "ns",
              "gaps under 100 us between a stream's completion and new work are the "
              "host's normal turnaround"),
    Threshold("IDLE_MIN_STEP_SHARE", 0.2, "share of step",
              "a stream idle for at least 20% of every step is starved by its host"),
)

_VALUES: Dict[str, float] = {t.name: t.value for t in TABLE}
MIN_STEPS = int(_VALUES["MIN_STEPS"])
STEP_REGULAR_SHARE = _VALUES["STEP_REGULAR_SHARE"]
EDGE_STEP_MIN_SHARE = _VALUES["EDGE_STEP_MIN_SHARE"]
SLOW_STEP_FACTOR = _VALUES["SLOW_STEP_FACTOR"]
STEADY_SHARE = _VALUES["STEADY_SHARE"]
SYNC_MIN_BLOCKED_NS = int(_VALUES["SYNC_MIN_BLOCKED_NS"])
SYNC_MIN_STEP_SHARE = _VALUES["SYNC_MIN_STEP_SHARE"]
PAGEABLE_MIN_BYTES = int(_VALUES["PAGEABLE_MIN_BYTES"])
CHURN_MIN_CALLS = int(_VALUES["CHURN_MIN_CALLS"])
LAUNCH_BOUND_MIN_LAUNCHES = int(_VALUES["LAUNCH_BOUND_MIN_LAUNCHES"])
LAUNCH_BOUND_MIN_SHARE = _VALUES["LAUNCH_BOUND_MIN_SHARE"]
LAUNCH_BOUND_MAX_BLOCKED = _VALUES["LAUNCH_BOUND_MAX_BLOCKED"]
LAUNCH_MAX_CALL_NS = int(_VALUES["LAUNCH_MAX_CALL_NS"])
IDLE_GAP_MIN_NS = int(_VALUES["IDLE_GAP_MIN_NS"])
IDLE_MIN_STEP_SHARE = _VALUES["IDLE_MIN_STEP_SHARE"]
