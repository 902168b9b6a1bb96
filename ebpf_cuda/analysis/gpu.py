"""The GPU's state against the calls (gpu/records.py): a short table per device (mean and
maximum utilisation, peak memory, throttled time, events) and the memory gap of each traced
process, NVML's memory for it against the live device allocations the trace saw (the driver's
context, cuBLAS workspaces, NCCL buffers, an allocator's cache the calls did not show), over
time and at its peak.

`GpuState` is fed the events (as a sink's `write` is) and the records (`note_gpu`); the
summary, the timeline and the HTML report each keep one."""
from bisect import bisect_right
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..decode.events import Event
from ..spec.apis import BY_NAME, DEVICE
from ._table import decimal, integer, table
from .memory import ALLOCATORS, FREES, LeakTracker

MIB = 1 << 20
POINT_NS = 1_000_000  # the live-memory timeline keeps a process's last change in each ms


def device_only(entries: Dict[str, object]) -> Dict[str, object]:
    """The entries of an allocator or free table (memory.py) for device memory."""
    return {name: v for name, v in entries.items() if BY_NAME[name].memory == DEVICE}


class Gap(NamedTuple):
    """One process at one sample: NVML's bytes, the live allocations the trace saw, the gap."""
    ts: float
    ts_ns: int
    pid: int
    device: int
    nvml: int
    live: int

    @property
    def gap(self) -> int:
        return self.nvml - self.live


class LiveTimeline:
    """Each process's live device memory over time (fed by a LeakTracker's changes)."""

    def __init__(self) -> None:
        self._times: Dict[int, List[int]] = {}
        self._values: Dict[int, List[int]] = {}

    def change(self, event: Event, live: int) -> None:
        times = self._times.setdefault(event.pid, [])
        values = self._values.setdefault(event.pid, [])
        if times and event.ts_ns // POINT_NS == times[-1] // POINT_NS:
            times[-1], values[-1] = event.ts_ns, live  # (bounded: a point per ms at most)
        else:
            times.append(event.ts_ns)
            values.append(live)

    def at(self, pid: int, ts_ns: int) -> int:
        """The live bytes of `pid` at `ts_ns` (0 before its first allocation)."""
        times = self._times.get(pid)
        if not times:
            return 0
        i = bisect_right(times, ts_ns)
        return self._values[pid][i - 1] if i else 0


class GpuState:
    """The calls' side (live device memory, the traced pids) and the GPU's records."""

    def __init__(self, tracker: Optional[LeakTracker] = None) -> None:
        self.live = LiveTimeline()
        if tracker is None:  # (a writer with its own tracker feeds `live.change` itself)
            tracker = LeakTracker(allocators=device_only(ALLOCATORS), frees=device_only(FREES),
                                  keep_timeline=False, on_change=self.live.change)
            self._tracker: Optional[LeakTracker] = tracker
        else:
            self._tracker = None
        self.pids: Set[int] = set()
        self.samples: list = []
        self.events: list = []

    def write(self, events: Iterable[Event]) -> None:
        for event in events:
            self.pids.add(event.pid)
        if self._tracker is not None:
            self._tracker.write(events)

    def note_gpu(self, records: Sequence) -> None:
        if self._tracker is not None:
            self._tracker.flush()  # (driver calls held back: see LayerFilter)
        self.samples = [r for r in records if not hasattr(r, "kind")]
        self.events = [r for r in records if hasattr(r, "kind")]

    def __bool__(self) -> bool:
        return bool(self.samples or self.events)

    # -- the memory gap --------------------------------------------------------------------

    def gaps(self) -> List[Gap]:
        """Every traced process at every sample that lists it (NVML's host pids are the
        probes' pids: no namespace to cross)."""
        found = []
        for sample in self.samples:
            for state in sample.processes:
                if state.pid in self.pids and state.memory is not None:
                    found.append(Gap(sample.ts, sample.ts_ns, state.pid, sample.device,
                                     state.memory, self.live.at(state.pid, sample.ts_ns)))
        return found

    def peak_gaps(self) -> List[Gap]:
        """Each (process, device) at its sample of most NVML memory (of those, the one with
        the most live allocations)."""
        peaks: Dict[Tuple[int, int], Gap] = {}
        for gap in self.gaps():
            key = (gap.pid, gap.device)
            if key not in peaks or (gap.nvml, gap.live) > (peaks[key].nvml, peaks[key].live):
                peaks[key] = gap
        return [peaks[key] for key in sorted(peaks)]

    # -- tables ----------------------------------------------------------------------------

    def tables(self) -> List[str]:
        """The device table, the memory gap table (when a traced process was on a GPU)."""
        if not self:
            return []
        out = [self.device_table()] if self.samples else []
        if self.peak_gaps():
            out.append(self.gap_table())
        if self.events:
            out.append(" ** GPU Events:\n\n" + "\n".join(
                " " + event.sentence() for event in self.events))
        return out

    def device_table(self) -> str:
        rows = []
        for device in sorted({s.device for s in self.samples}):
            mine = [s for s in self.samples if s.device == device]
            rows.append(_device_row(device, mine, sum(
                1 for e in self.events if e.device == device)))
        headers = ("GPU", "Samples", "Util Avg (%)", "Util Max (%)", "SM Active Avg (%)",
                   "Mem Peak (MiB)", "Mem Total (MiB)", "Power Max (W)", "Throttled (s)",
                   "Events", "Name")
        return (" ** GPU Devices (NVML samples):\n\n"
                + table(headers, rows, left=(10,)))

    def gap_table(self) -> str:
        rows = [(str(g.pid), str(g.device), integer(g.nvml / MIB), integer(g.live / MIB),
                 integer(g.gap / MIB)) for g in self.peak_gaps()]
        headers = ("PID", "GPU", "NVML Peak (MiB)", "Live Allocations (MiB)", "Gap (MiB)")
        return (" ** GPU Memory Gap (NVML's memory of each traced process at its peak, "
                "against the device allocations the trace saw live then):\n\n"
                + table(headers, rows))


def _mean(values: List[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _device_row(device: int, samples: List, events: int) -> Tuple[str, ...]:
    util = [s.values["gpu_util"] for s in samples if "gpu_util" in s.values]
    active = [s.values["sm_active"] for s in samples if "sm_active" in s.values]
    used = [s.values["mem_used"] for s in samples if "mem_used" in s.values]
    total = max((s.values.get("mem_total", 0) for s in samples), default=0)
    power = [s.values["power_w"] for s in samples if "power_w" in s.values]
    throttled = sum(later.ts - earlier.ts for earlier, later in zip(samples, samples[1:])
                    if earlier.throttled())
    return (str(device), str(len(samples)), decimal(_mean(util)),
            integer(max(util, default=0)), decimal(_mean(active)) if active else "-",
            integer(max(used, default=0) / MIB), integer(total / MIB),
            decimal(max(power, default=0)) if power else "-", decimal(throttled, 2),
            str(events), samples[0].name if samples else "")
