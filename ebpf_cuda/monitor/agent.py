"""`ebpf-cuda monitor`: an always-on agent for a whole host.

    monitor = Monitor(MonitorOptions(kernel_labels=20), log=print).start()
    ... exporters call monitor.collect() from their own threads ...
    monitor.run()     # reads until monitor.stop() (safe in a signal handler)
    monitor.close()

One Tracer without a target over every distinct CUDA runtime and driver file of the machine
(`cuda_files`: the usual search places, and the files running processes map, whatever their
mount namespace). A uprobe on a file applies to every process that maps it, also those that
start later, so new processes are covered without doing anything. Files that appear later
(a new virtualenv's runtime dlopen'ed, a container's own copy, a program carrying the runtime
statically) are probed as they come, unless files were named (`MonitorOptions.late`):
monitor/system_watch.SystemWatch, whose notices of dlopens and execs go to a ring and a thread of
their own; that thread also detaches the probes of those files once no process maps them
(every monitor/system_watch.DETACH_CHECK_S: the pids seen mapping each, then the processes known
here), and a file mapped again is probed again. Calls are summed up in the
kernel (`Tracer(aggregate=True, emit=False)`: per-CPU counters and log2 histograms per
function, errors by code, successful launches by process and kernel); only the hello record
of each new thread and the calls that teach kernel names travel the ring. With a flight
recorder (flight.py) every call's record travels too.

Threads: `run()` is the reader. Every TICK_S it also names the launches in the kernel's
`launches` map and publishes them as series, and drops the state of processes that exited
once every exporter has collected their last values (at once with no exporter, and after
HOLD_S whatever the exporters do). Exporters call `collect(name)`
from their threads: it renders what the reader last published (the aggregates and the
launch series of one tick, at most TICK_S old; a scrape reads only the small error and loss
maps). Nothing here prints.

Its parts: files.py (which files), processes.py (the processes seen, their labels and exits),
series.py (what a tick publishes, and the counts by process the maps no longer hold),
families.py (the metric families), memory.py (device memory by process), metrics.py (the
model the exporters render); the in-kernel sums are read through decode/aggregates.LiveSums
(Tracer.live_sums), which also lets an exited process's entries go.
"""
import threading
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Set, Tuple

from ..decode.aggregates import FunctionReader, FunctionTotals, LiveSums
from ..errors import TracerError
from ..spec import apis
from ..spec.apis import TABLE
from ..spec.config import TraceConfig
from ..spec.layout import PROCESS_SLOTS
from ..targets import elf
from ..tracer import Tracer
from . import families as fam
from . import heap
from .cuda_files import cuda_files
from .memory import DeviceMemory
from .metrics import Family, Labels
from .processes import Process, Processes
from .series import Attribution, LaunchSeries, calls_by_process

TICK_S = 0.5  # how often the reader names launches and looks for processes that exited
# An exited process's series wait for every exporter to collect them, but no longer than
# this: an exporter that stopped collecting (a Prometheus down for a day) must not make the
# monitor keep every process that ever ran, nor fill the kernel's maps with their launches.
HOLD_S = 600.0
# hello records, name-teaching calls (a framework's import registers tens of thousands of
# kernels in a burst), graph calls and what a process does while it captures travel: 1 MiB
# lost most of PyTorch's import burst on the H200 host (D23), 4 MiB none (D25), and the
# ring's pages count in the monitor's memory
RING_SIZE = 4 << 20
FLIGHT_RING_SIZE = 16 << 20  # with a flight recorder every call travels
DEFAULT_KERNEL_LABELS = 20
Log = Callable[[str], None]
# The launch rows' returns the monitor takes, 1 in this many (where the kernel has uprobe
# sessions): a return probe costs a launch loop ~50% on an H200 host (D21), the sampled
# returns' durations and errors stay representative, and calls and launches are exact.
DEFAULT_SAMPLE_RETURNS = 64
# The GPU's state sampled once a second (a round of NVML's calls took 50 ms on an H100 host,
# D35; dcgm-exporter collects every 30 s by default): a scrape serves the last round
DEFAULT_GPU_PERIOD_S = 1.0

__all__ = ["Monitor", "MonitorOptions", "cuda_files", "TICK_S", "HOLD_S",
           "DEFAULT_KERNEL_LABELS", "DEFAULT_SAMPLE_RETURNS", "DEFAULT_GPU_PERIOD_S"]


class MonitorOptions(NamedTuple):
    """What to probe and how (see the CLI's `monitor --help`)."""

    paths: Tuple[str, ...] = ()  # files to probe; default: found by `cuda_files`
    functions: Optional[Tuple[str, ...]] = None
    api: str = "all"
    everything: bool = False
    kernel_labels: int = DEFAULT_KERNEL_LABELS  # kernel names per process as labels
    ring_size: Optional[int] = None  # default RING_SIZE, or FLIGHT_RING_SIZE
    flight: object = None  # a flight.FlightOptions: keep the last seconds of every call
    late: Optional[bool] = None  # probe CUDA files that appear later (default: unless -p)
    # Launch rows: 1 return in N taken (uprobe sessions, kernels with them); 1: every call
    sample_returns: int = DEFAULT_SAMPLE_RETURNS
    # The GPU's state through NVML (dcgm.py), sampled every `gpu_period_s` on its own thread
    # (a scrape serves the last round), its Xids counted and, with a flight recorder, each a
    # trigger (`trigger_xid`); `nvml`: the library (default: found)
    gpu: bool = True
    nvml: Optional[str] = None
    trigger_xid: bool = True
    gpu_period_s: float = DEFAULT_GPU_PERIOD_S  # (0: not sampled, as gpu=False)
    # Processes whose sums have a slot of their own (TraceConfig.process_slots); the
    # others' go to the `proc_calls` hash (said once as their number grows)
    process_slots: int = PROCESS_SLOTS


class Monitor:
    """See the module's docstring."""

    def __init__(self, options: MonitorOptions = MonitorOptions(),
                 log: Optional[Log] = None, notice: Optional[Log] = None) -> None:
        self.options = options
        self.log = log or (lambda message: None)  # progress notes (which files, offsets)
        self.notice = notice or self.log  # what happened (a flight-recorder dump)
        self.tracer: Optional[Tracer] = None
        self.sums: Optional[LiveSums] = None  # (the tracer's in-kernel sums)
        self.flight = None  # a flight.FlightRecorder, with options.flight
        self.processes = Processes()  # (those seen and not dropped yet)
        self.started_at = time.time()
        self._lock = threading.Lock()  # the published series and what exporters collected
        self._series = LaunchSeries({}, 0, 0)
        self._published = 0  # series published so far (the version of `_series`)
        self._collected: Dict[str, int] = {}  # exporter -> the last version it collected
        self.attribution = Attribution()  # (the reader's)
        self._stopping = False
        self._agg: Optional[FunctionReader] = None
        self._agg_for = 0  # the attachments `_agg` reads the functions of
        self._agg_fns: Set[int] = set()  # every function probed so far (files detached too)
        self._probed_files = 0  # attachments when ELF files were last forgotten
        self.watch = None  # a monitor/system_watch.SystemWatch: CUDA files that appear later
        self.start_files = 0  # files probed at the start (never detached)
        self._known: Tuple[int, ...] = ()  # the pids of `processes`, for the watch's thread
        self.memory = DeviceMemory()  # (the reader's; published with the series)
        self.gpu = None  # the GPU's state (dcgm.GpuState), when NVML answers
        self._gpu_trimmed = False  # the heap trimmed after the GPU's first round
        self._labels: Dict[int, Labels] = {}  # the live processes' labels (the reader's)
        self.slots_full = 0  # the most processes seen at once without a process slot

    @property
    def seen(self) -> int:
        """Processes seen in all."""
        return self.processes.seen

    # -- set-up ----------------------------------------------------------------------------

    def start(self) -> "Monitor":
        """Find the files, load and attach every probe."""
        o = self.options
        paths = list(o.paths) or cuda_files(self.log)
        if not paths:
            raise TracerError("no CUDA library (libcudart or libcuda) found on this machine; "
                              "name one with -p PATH")
        ring = o.ring_size or (FLIGHT_RING_SIZE if o.flight is not None else RING_SIZE)
        self.tracer = Tracer(TraceConfig(
            functions=o.functions, library=paths, api=o.api, everything=o.everything,
            ring_size=ring, aggregate=True, emit=o.flight is not None, log=self.log,
            emit_memory=True, sample_returns=o.sample_returns, per_process=True,
            process_slots=o.process_slots))
        try:
            self.tracer.start()
            self.start_files = len(self.files)
            if o.flight is not None:
                from .flight import FlightRecorder

                self.flight = FlightRecorder(o.flight, self.tracer, log=self.notice)
            self.sums = self.tracer.live_sums()
            self._start_gpu()
            self._aggregates()
            if o.late if o.late is not None else not o.paths:
                self.watch = self._watch_late()
            self._probed_files = len(self.tracer.attachments)
            elf.forget_files()
        except BaseException:
            self.close()
            raise
        return self

    def _start_gpu(self) -> None:
        """The GPU's state, sampled on its own thread; what it cannot sample is said once."""
        if not self.options.gpu or self.options.gpu_period_s <= 0:
            return
        from .dcgm import GpuState

        state = GpuState(self.options.gpu_period_s, self.options.nvml, notice=self.notice,
                         clock_offset_ns=self.tracer.decoder.clock_offset_ns,
                         on_xid=self._xid)
        if state.start(absent_ok=self.options.nvml is None):
            self.gpu = state

    def _xid(self, event) -> None:
        """An Xid (the sampler's event thread) triggers the flight recorder (`trigger_xid`)."""
        if self.flight is not None and self.options.trigger_xid:
            self.flight.xid(event)

    def _gpu_families(self) -> List[Family]:
        if self.gpu is None:
            return []
        with self._lock:
            labels = self._labels
        return self.gpu.families(lambda pid: labels.get(pid, (("pid", str(pid)),)))

    def _watch_late(self):
        """Probe the CUDA files that appear after the start (monitor/system_watch.SystemWatch), or
        say why not."""
        from .system_watch import SystemWatch

        session = self.tracer.session
        try:
            return SystemWatch(session.late_loads_everywhere, session.pid_ns, self.log,
                               known=lambda: self._known)
        except TracerError as err:
            self.notice("CUDA files that appear after the start are not probed: %s" % err)
            return None

    def _aggregates(self) -> List[FunctionTotals]:
        """The aggregates of every function probed so far (the reader is made again when
        files probed late brought functions the others had not; those of a file detached
        since are still read: their counts stay)."""
        attachments = self.tracer.attachments
        if self._agg is None or len(attachments) != self._agg_for:
            self._agg_for = len(attachments)
            fns = {apis.FN_ID[a.api] for a in list(attachments)}
            if self._agg is None or not fns <= self._agg_fns:
                self._agg_fns |= fns
                self._agg = self.sums.function_reader(self._agg_fns)
        return self._agg.read()

    @property
    def late_loads(self) -> List[Tuple[str, int, float, str]]:
        """The files probed after the start: (path, pid that mapped it, ms from its notice
        to its probes, how it came)."""
        late = self.watch.late if self.watch is not None else None
        if late is None:
            return []
        return [(path, pid, ms, late.reasons.get(path, "")) for path, pid, ms in late.late]

    @property
    def files(self) -> List[str]:
        """The files probed."""
        return sorted({a.path for a in self.tracer.attachments}) if self.tracer else []

    @property
    def functions(self) -> List[str]:
        return sorted({a.api for a in self.tracer.attachments}) if self.tracer else []

    # -- the reader ------------------------------------------------------------------------

    def run(self) -> None:
        """Read until `stop()`: every batch's new processes noted (and handed to the flight
        recorder); every TICK_S launches named and published, exited processes dropped."""
        assert self.tracer is not None
        stream = self.tracer.stream
        while not self._stopping:
            for frames in stream.frames(timeout=TICK_S):
                self.processes.note(frames)
                if not self.tracer.emit:
                    self.attribution.note_captured(frames)
                self.memory.add(self.tracer.decoder.decode_batch(frames, self.memory.fn_ids))
                if self.flight is not None:
                    self.flight.put(frames)
            if self.flight is not None:
                self.flight.poll()
            # (once more after the stop: the series include the last batch, nothing waits)
            self.tick(final=self._stopping)

    def stop(self) -> None:
        """Finish `run()` after draining the ring (safe in a signal handler)."""
        self._stopping = True
        if self.tracer is not None:
            self.tracer.stop()

    def tick(self, final: bool = False) -> None:
        """Name the launches and publish them; drop the processes whose last values every
        exporter has collected; note the processes that exited since the last tick.
        `final` (the tick after the stop, whose series the last push and the profile
        take): no launch waits for its name."""
        with self._lock:  # (no exporter: what is published counts as seen)
            seen = min(self._collected.values(), default=self._published)
        self._prune(seen)
        # (before the series: they hold its end)
        self.processes.note_exits(self._published + 1)
        series = self._launch_series(final)
        self.processes.hold_back(self._published + 2)  # (held back: in the next)
        with self._lock:
            self._series = series
            self._published += 1
        self._known = tuple(self.processes)
        labels = {p.pid: p.label_set() for p in self.processes.live()}
        with self._lock:
            self._labels = labels
        if self.gpu is not None and not self._gpu_trimmed and self.gpu.sampler.rounds:
            self._gpu_trimmed = True
            heap.trim()  # (what NVML's initialisation freed leaves the resident set)
        if len(self.tracer.attachments) != self._probed_files:  # (files probed late)
            self._probed_files = len(self.tracer.attachments)
            elf.forget_files()

    def _launch_series(self, final: bool = False) -> LaunchSeries:
        """Launches from the kernel's maps by process and kernel label, calls by process,
        and what the full maps could not take."""
        assert self.tracer is not None
        sampled = set(self.tracer.sampled_returns())  # (their map counts every attempt)
        totals = self._aggregates()  # (read first: the maps by process can only be ahead)
        per_key = self.sums.launches()
        launches: Dict[Tuple[Labels, str, str], int] = {}
        for (pid, fn_id, func), count in sorted(per_key.items()):
            process = self.processes.of(pid)
            label = self._kernel_label(process, fn_id, func, wait=not final)
            if label is None:  # (held back: published at the next tick)
                continue
            series = (process.label_set(), TABLE[fn_id].name, label)
            launches[series] = launches.get(series, 0) + count
        per_process = calls_by_process(self.sums.process_calls(), per_key, sampled,
                                       self.processes)
        self._note_slots_full()
        self.attribution.account(totals, sampled, per_key, per_process)
        live = self.processes.live()
        memory = tuple((p.label_set(), self.memory.held(p.pid)) for p in live)
        return LaunchSeries(launches, self.attribution.map_full, len(live), memory,
                            per_process, tuple(totals))

    def _note_slots_full(self) -> None:
        """Say when more processes than before found no process slot free (their calls
        are counted by process all the same, through the `proc_calls` hash)."""
        beyond = len(self.sums.processes_in_hash())
        if beyond > self.slots_full:
            self.slots_full = beyond
            self.notice("%d processes found no free slot of the %d for sums by process: "
                        "their calls are counted through a hash map (slower)"
                        % (beyond, self.options.process_slots))

    def _kernel_label(self, process: Process, fn_id: int, func: int,
                      wait: bool = True) -> Optional[str]:
        """The launch's kernel label (Process.kernel_label); None: held back a tick."""
        return process.kernel_label(fn_id, func, self.tracer.names,
                                    self.options.kernel_labels, wait)

    def _prune(self, seen: int) -> None:
        """Drop the processes whose last values are in a series every exporter has
        collected (`seen`: the oldest version collected), or that exited HOLD_S ago: their
        entries leave the kernel's maps (counted as retired), their names go."""
        gone = self.processes.gone(seen, HOLD_S)
        if not gone:
            return
        self.attribution.retire(self.sums.forget(set(gone)), self.processes)
        for pid in gone:
            self.processes.drop(pid)
            self.tracer.names.forget(pid)
            self.memory.forget(pid)
            if self.flight is not None:
                self.flight.forget(pid)
        heap.trim()  # (what they kept, freed now, leaves the resident set)

    # -- what exporters call ---------------------------------------------------------------

    def add_exporter(self, name: str) -> None:
        """Count `name` as an exporter before its first `collect`: the processes that exit
        from now on keep their series until it has collected them too."""
        with self._lock:
            self._collected.setdefault(name, self._published)

    def collect(self, exporter: str = "") -> List[Family]:
        """Every metric family now (thread-safe). Each exporter collects under a name of
        its own: an exited process's series go once every exporter has collected its last
        values (or HOLD_S after its exit)."""
        assert self.tracer is not None and self._agg is not None
        with self._lock:
            series = self._series
            self._collected[exporter] = self._published
        families = fam.function_families(series.totals)
        families.append(fam.error_family(self.sums.errors()))
        families.append(fam.sampling_family(self.tracer.sampled_returns(),
                                            self.options.sample_returns))
        families.append(fam.launch_family(series.launches))
        families += fam.process_families(series.per_process)
        families.append(fam.lost_family(self._losses(series.map_full)))
        families.append(fam.processes_family(series.processes))
        late, detached = self.watch.counts() if self.watch is not None else (0, 0)
        families.append(fam.files_family(self.start_files, late, detached))
        families.append(fam.memory_family(series.memory))
        if self.flight is not None:
            families += self.flight.families()
        return families + self._gpu_families()

    def _losses(self, map_full: int) -> List[Tuple[str, int]]:
        """What could not be counted or kept so far, by cause (lost_family)."""
        stats, names = self.tracer.stats(), self.tracer.names
        lost = [("ring_full", stats["lost"]), ("too_deep", stats["too_deep"]),
                ("launch_map_full", map_full),
                ("process_map_full", self.attribution.process_map_full),
                ("name_map_full", names.names_lost - names.names_unread),
                ("name_unreadable", names.names_unread)]
        if self.flight is not None:
            lost.append(("flight_recorder_full", self.flight.overwritten))
            lost.append(("flight_recorder_unwritten", self.flight.ring.unwritten))
        if self.watch is not None:
            lost.append(("notice_ring_full", self.watch.lost()))
        return lost

    def launch_totals(self) -> Dict[Tuple[str, str, str], int]:
        """Launches by (comm, api, kernel label) of the whole run: the processes dropped and
        those still known (as of the last tick)."""
        with self._lock:
            series = self._series
        return self.attribution.launch_totals(series)

    # -- tear-down -------------------------------------------------------------------------

    def close(self) -> None:
        """Detach every probe and free every kernel object (idempotent)."""
        if self.watch is not None:  # (first: it attaches the session's probes)
            self.watch.close()
            self.watch = None
        if self.flight is not None:
            self.flight.close()
        if self.gpu is not None:
            self.gpu.close()
        if self.tracer is not None:
            self.tracer.close()
