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
loader_watch.SystemWatch, whose notices of dlopens and execs go to a ring and a thread of
their own; that thread also detaches the probes of those files once no process maps them
(every loader_watch.DETACH_CHECK_S: the pids seen mapping each, then the processes known
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
"""
import ctypes
import errno
import fnmatch
import os
import struct
import threading
import time
from typing import (Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional,
                    Sequence, Set, Tuple)

from ..decode import aggregates as sums
from ..probes import aggregates
from ..spec import apis, layout, record
from ..targets import discovery, elf
from . import heap
from .. import syscalls
from ..spec.apis import TABLE, Api, Kind, Role
from ..targets.containers import container_of
from ..spec.cuda_enums import error_name, memcpy_kind_name
from ..errors import TracerError
from ..decode.events import EXIT
from ..decode.operations import event_bytes
from ..bpf.maps import MappedArrayMap, possible_cpus
from ..tracer import Tracer

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
OTHER_KERNEL = "other"
UNNAMED_KERNEL = "unnamed"
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")  # the rows that launch a graph
# Durations the histogram's buckets end at: powers of two of nanoseconds, 256 ns to 34 s
# (the kernel's log2 buckets merged below and above; buckets are cumulative).
HISTOGRAM_BOUNDS_LOG2 = tuple(range(8, 36))
_CUDA_FILES = ("libcudart.so*", "libcuda.so*")  # the runtime and the driver
Log = Callable[[str], None]
Labels = Tuple[Tuple[str, str], ...]


# -- the metrics model the exporters render (prometheus.py, otlp.py, pprof.py) -------------

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


# The launch rows' returns the monitor takes, 1 in this many (where the kernel has uprobe
# sessions): a return probe costs a launch loop ~50% on an H200 host (D21), the sampled
# returns' durations and errors stay representative, and calls and launches are exact.
DEFAULT_SAMPLE_RETURNS = 64


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


# -- which files ---------------------------------------------------------------------------

def cuda_files(log: Optional[Log] = None) -> List[str]:
    """Every distinct CUDA runtime and driver file of this machine: every copy the usual
    search finds (discovery.find_library, find_driver_library) and every libcudart.so* and
    libcuda.so* a running process maps, reached through /proc/PID/root when its mount
    namespace (a container) has it at a path we do not see. Deduplicated by inode.

    Renamed copies (libcudart-1a2b3c4d.so.12) and files that carry the runtime statically
    are not looked for here: the late-load watch (loader_watch.SystemWatch) finds those the
    running processes map, at its start, on a side thread."""
    found: List[str] = []
    seen: Set[Tuple[int, int]] = set()
    for path in discovery.find_library() + discovery.find_driver_library():
        _add_file(found, seen, path)
    for pid in _pids():
        for path in _mapped_cuda_files(pid):
            if _add_file(found, seen, path) and log is not None:
                log("%s: mapped by process %d" % (path, pid))
    return found


def _mapped_cuda_files(pid: int) -> List[str]:
    """The libcudart.so* and libcuda.so* files `pid` maps, as paths valid here (through
    /proc/PID/root when its mount namespace has them elsewhere; not resolved further: the
    real path of /proc/PID/root/x is x, which may not exist here)."""
    try:
        mappings = discovery.process_mappings(pid)
    except TracerError:  # gone, or a kernel thread
        return []
    names = {m.path: m.inode for m in mappings if m.is_file
             and any(fnmatch.fnmatch(os.path.basename(m.path), p) for p in _CUDA_FILES)}
    return [discovery.process_file_path(pid, path, inode) for path, inode in names.items()]


def _add_file(found: List[str], seen: Set[Tuple[int, int]], path: str) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    if (info.st_dev, info.st_ino) in seen:
        return False
    seen.add((info.st_dev, info.st_ino))
    found.append(path)
    return True


def _pids() -> List[int]:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


# -- processes -----------------------------------------------------------------------------

class Process:
    """A process seen making CUDA calls: its labels, and the sticky kernel labels of its
    launches ((fn_id, func) -> label)."""

    __slots__ = ("pid", "comm", "container", "start", "exited", "exited_at", "labels",
                 "kernels", "waiting")

    def __init__(self, pid: int, comm: str) -> None:
        """`comm`: the name of the thread that made the call, the label when the process
        is gone already (else the process's own name, which a thread's may differ from)."""
        self.pid = pid
        own, self.start = _stat(pid)
        self.comm = own if own is not None else comm
        self.container = container_of(pid)
        # The first published series that holds its end (its last values), and when.
        self.exited: Optional[int] = None
        self.exited_at = 0.0
        self.labels: Dict[Tuple[int, int], str] = {}
        self.kernels: Set[str] = set()  # kernel names that have a label of their own
        # (fn_id, func) of launches held back a tick, their name unknown (_kernel_label)
        self.waiting: Set[Tuple[int, int]] = set()

    def alive(self) -> bool:
        """Still running (the same process: a reused PID has another start time)."""
        _, start = _stat(self.pid)
        return start is not None and start == self.start

    def label_set(self) -> Labels:
        labels = (("pid", str(self.pid)), ("comm", self.comm))
        return labels + ((("container", self.container),) if self.container else ())


def _stat(pid: int) -> Tuple[Optional[str], Optional[int]]:
    """The process's name and start time in clock ticks since boot (/proc/PID/stat fields
    2 and 22); (None, None) when it has gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
        name, rest = stat[stat.index(b"(") + 1:].rsplit(b")", 1)
        return name.decode("utf-8", "replace"), int(rest.split()[19])
    except (OSError, IndexError, ValueError):
        return None, None


# -- reading the per-CPU aggregates quickly --------------------------------------------------

class FunctionTotals(NamedTuple):
    """One function's (and memcpy kind's) aggregates, summed over CPUs."""

    api: Api
    kind: Optional[int]
    count: int
    total_ns: int
    errors: int
    bytes: int
    histogram: Tuple[int, ...]


_COUNT, _TOTAL, _ERRORS, _BYTES, _HIST = 0, 1, 4, 5, 7
_INDEX = struct.Struct("<I")


class AggregateReader:
    """Reads the `agg` map's entries of the probed functions only, one lookup each."""

    def __init__(self, agg_fd: int, fn_ids: Iterable[int]) -> None:
        # (read at every tick: its buffers made once)
        self._lookup = syscalls.ElementLookup(agg_fd, _INDEX.size,
                                              layout.AGG_VALUE.size * possible_cpus())
        # (a function not called yet: all zero, told by one compare instead of a sum over
        # the CPUs, ~0.2 ms an entry with 224 of them)
        self._never = bytes(layout.AGG_VALUE.size * possible_cpus())
        self.entries: List[Tuple[Api, Optional[int], bytes]] = []
        for fn_id in sorted(set(fn_ids)):
            api = TABLE[fn_id]
            kinds = (range(layout.KIND_SLOTS) if any(a.kind == Kind.MEMCPY_KIND
                                                      for a in api.args) else (None,))
            for kind in kinds:
                index = fn_id * layout.KIND_SLOTS + (kind or 0)
                self.entries.append((api, kind, _INDEX.pack(index)))

    def read(self) -> List[FunctionTotals]:
        found = []
        for api, kind, key in self.entries:
            raw = self._lookup(key)
            if raw is None or raw == self._never:
                continue
            words = _per_cpu_total(raw)
            if not words[_COUNT]:
                continue
            found.append(FunctionTotals(
                api, kind, words[_COUNT], words[_TOTAL], words[_ERRORS], words[_BYTES],
                tuple(words[_HIST:_HIST + layout.HIST_BUCKETS])))
        return found


def _per_cpu_total(raw: bytes) -> List[int]:
    """The u64 words of an `agg` value summed over its CPUs. Each CPU's words, read as one
    little-endian integer, are 64-bit lanes: adding the integers adds every lane at once
    (a lane carries into the next only past 2^64, where the kernel's own counter wraps)."""
    size = layout.AGG_VALUE.size
    total = sum(int.from_bytes(raw[at:at + size], "little") for at in range(0, len(raw), size))
    return memoryview(total.to_bytes(size + 8, "little")[:size]).cast("Q").tolist()


BPF_MAP_LOOKUP_BATCH = 24  # (Linux 5.6+)
_ENOTSUPP = 524  # the kernel's own "not supported" (not in errno)
_BATCH_ATTR = struct.Struct("<QQQQIIQQ")  # in_batch, out_batch, keys, values, count, map_fd,
#                                           elem_flags, flags


class HashReader:
    """Every (key, value) of a hash map in a few BPF_MAP_LOOKUP_BATCH calls (two system
    calls per entry with get-next-key and lookup: 10,000 of them for a full launches map,
    ~0.2 s here); the element-wise way where the kernel has no batches."""

    BATCH = 512  # entries per call (ENOSPC, a hash bucket holding more: twice as many)

    def __init__(self, hash_map) -> None:
        self.map = hash_map
        self.tokens = (ctypes.create_string_buffer(8), ctypes.create_string_buffer(8))
        self.batches = True
        self._room(self.BATCH)

    def _room(self, count: int) -> None:
        self.count = count
        self.keys = ctypes.create_string_buffer(count * self.map.key_size)
        self.values = ctypes.create_string_buffer(count * self.map.value_size)

    def items(self) -> List[Tuple[bytes, bytes]]:
        if self.batches:
            try:
                return self._batched()
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP, _ENOTSUPP):
                    raise
                self.batches = False
        return list(self.map.items())

    def _batched(self) -> List[Tuple[bytes, bytes]]:
        ksize, vsize = self.map.key_size, self.map.value_size
        return [(keys[i * ksize:(i + 1) * ksize], values[i * vsize:(i + 1) * vsize])
                for count, keys, values in self.batches_raw() for i in range(count)]

    def batches_raw(self) -> Iterator[Tuple[int, bytes, bytes]]:
        """(count, keys, values) of each batch: the entries packed, as the kernel gave them.
        OSError where the kernel has no batches."""
        first = True
        while True:
            attr = ctypes.create_string_buffer(_BATCH_ATTR.size)
            _BATCH_ATTR.pack_into(
                attr, 0, 0 if first else ctypes.addressof(self.tokens[0]),
                ctypes.addressof(self.tokens[1]), ctypes.addressof(self.keys),
                ctypes.addressof(self.values), self.count, self.map.fd, 0, 0)
            res, err = syscalls.bpf_raw(BPF_MAP_LOOKUP_BATCH, attr)
            if res < 0 and err == errno.ENOSPC and self.count < self.map.max_entries:
                self._room(self.count * 2)  # (the same batch again, with more room)
                continue
            if res < 0 and err != errno.ENOENT:
                raise OSError(err, os.strerror(err))
            yield struct.unpack_from("<I", attr, 32)[0], self.keys.raw, self.values.raw
            if res < 0:  # ENOENT: that was the last batch
                return
            ctypes.memmove(self.tokens[0], self.tokens[1], 8)
            first = False


def _per_cpu_sum(stats_map, index: int) -> int:
    return sum(stats_map[index])


_FUNC_CELL = {fn_id: aggregates.func_cell(api) for fn_id, api in enumerate(TABLE)
              if api.role == Role.LAUNCH}


class LaunchSeries(NamedTuple):
    """What the reader publishes every tick: launches by (process labels, function, kernel
    label), the launches the full `launches` map could not take (so far), the live
    processes, and the aggregates it read (exporters render these: a scrape reads no map
    of per-CPU values, and its families agree with each other)."""

    launches: Dict[Tuple[Labels, str, str], int]  # (process labels, api, kernel label)
    map_full: int
    processes: int
    memory: Tuple[Tuple[Labels, int], ...] = ()  # device bytes held, by live process
    # (process labels, function id) -> [calls, errors, API ns] (`proc_calls`; the sampled
    # rows' calls: their launches by process, errors and time None)
    per_process: Dict[Tuple[Labels, int], list] = {}
    totals: Tuple[FunctionTotals, ...] = ()  # every function's aggregates


# -- live device memory ----------------------------------------------------------------------

class DeviceMemory:
    """The device memory each process holds: what its traced allocations returned and its
    frees have not released (their records travel the ring: allocations are rare). Memory
    allocated before the monitor started is not known; freeing it changes nothing. A runtime
    allocation and the driver allocation inside it return one pointer: counted once."""

    def __init__(self) -> None:
        self._live: Dict[int, Dict[int, int]] = {}  # pid -> {pointer: bytes}
        self.fn_ids: Set[int] = {i for i, api in enumerate(TABLE) if api.memory == apis.DEVICE
                                 and api.role in (apis.Role.ALLOC, apis.Role.FREE)}

    def add(self, events) -> None:
        for event in events:
            if event.phase != EXIT or event.ret != 0:
                continue
            api = apis.BY_NAME.get(event.api)
            if api is None or api.memory != apis.DEVICE:
                continue
            if api.role == apis.Role.ALLOC:
                pointer, size = event.outs.get(api.ptr), event_bytes(event)
                if pointer and size is not None:
                    self._live.setdefault(event.pid, {})[pointer] = size
            elif api.role == apis.Role.FREE:
                self._live.get(event.pid, {}).pop(event.args.get(api.ptr), None)

    def held(self, pid: int) -> int:
        return sum(self._live.get(pid, {}).values())

    def forget(self, pid: int) -> None:
        self._live.pop(pid, None)


# -- the monitor -----------------------------------------------------------------------------

class Monitor:
    """See the module's docstring."""

    def __init__(self, options: MonitorOptions = MonitorOptions(),
                 log: Optional[Log] = None, notice: Optional[Log] = None) -> None:
        self.options = options
        self.log = log or (lambda message: None)  # progress notes (which files, offsets)
        self.notice = notice or self.log  # what happened (a flight-recorder dump)
        self.tracer: Optional[Tracer] = None
        self.flight = None  # a flight.FlightRecorder, with options.flight
        self.processes: Dict[int, Process] = {}  # (those seen and not dropped yet)
        self.seen = 0  # processes seen in all
        self.started_at = time.time()
        self._lock = threading.Lock()  # the published series and what exporters collected
        self._series = LaunchSeries({}, 0, 0)
        self._published = 0  # series published so far (the version of `_series`)
        self._collected: Dict[str, int] = {}  # exporter -> the last version it collected
        self._retired: Dict[int, int] = {}  # launches of pruned processes, by function id
        # ... and by (comm, api, kernel label), for a profile of the whole run
        self.retired_launches: Dict[Tuple[str, str, str], int] = {}
        self._map_full = 0
        self._stopping = False
        self._agg: Optional[AggregateReader] = None
        self._agg_for = 0  # the attachments `_agg` reads the functions of
        self._agg_fns: Set[int] = set()  # every function probed so far (files detached too)
        self._probed_files = 0  # attachments when ELF files were last forgotten
        self.watch = None  # a loader_watch.SystemWatch: CUDA files that appear later
        self.start_files = 0  # files probed at the start (never detached)
        self._known: Tuple[int, ...] = ()  # the pids of `processes`, for the watch's thread
        self._launches: Optional[HashReader] = None
        self._slots: Optional[MappedArrayMap] = None  # (launch_slots: sampled returns)
        self._process_calls: Optional[HashReader] = None
        self._retired_calls: Dict[int, int] = {}  # calls of pruned processes, by function id
        self._process_map_full = 0  # calls counted, not by process (the full `proc_calls`)
        self._launch_ids = {i for i, api in enumerate(TABLE) if api.role == Role.LAUNCH}
        self._captured: Dict[int, int] = {}  # launches captures recorded, by function id
        self.memory = DeviceMemory()  # (the reader's; published with the series)

    # -- set-up ----------------------------------------------------------------------------

    def start(self) -> "Monitor":
        """Find the files, load and attach every probe."""
        o = self.options
        paths = list(o.paths) or cuda_files(self.log)
        if not paths:
            raise TracerError("no CUDA library (libcudart or libcuda) found on this machine; "
                              "name one with -p PATH")
        ring = o.ring_size or (FLIGHT_RING_SIZE if o.flight is not None else RING_SIZE)
        self.tracer = Tracer(functions=o.functions, library=paths, api=o.api,
                             everything=o.everything, ring_size=ring, aggregate=True,
                             emit=o.flight is not None, log=self.log, emit_memory=True,
                             sample_returns=o.sample_returns, per_process=True)
        try:
            self.tracer.start()
            self.start_files = len(self.files)
            if o.flight is not None:
                from .flight import FlightRecorder

                self.flight = FlightRecorder(o.flight, self.tracer, log=self.notice)
            maps = self.tracer.session.maps
            self._aggregates()
            self._launches = HashReader(maps[layout.LAUNCHES])
            self._slots = maps.get(layout.LAUNCH_SLOTS)
            self._process_calls = HashReader(maps[layout.PROCESS_CALLS])
            if o.late if o.late is not None else not o.paths:
                self.watch = self._watch_late()
            self._probed_files = len(self.tracer.attachments)
            elf.forget_files()
        except BaseException:
            self.close()
            raise
        return self

    def _watch_late(self):
        """Probe the CUDA files that appear after the start (loader_watch.SystemWatch), or
        say why not."""
        from .loads import SystemWatch

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
                self._agg = AggregateReader(self.tracer.session.maps[layout.AGG].fd,
                                            self._agg_fns)
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
                self._note_processes(frames)
                if not self.tracer.emit:
                    self._note_captured(frames)
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

    def _note_processes(self, frames: bytes) -> None:
        pids = record.frame_column(frames, record.PID_TGID + 4, "I")
        new = set(pids).difference(self.processes)
        for pid in new:
            at = pids.index(pid) * record.FRAME_SIZE + record.FRAME_HEADER + record.COMM
            comm = frames[at:at + record.COMM_LEN].split(b"\0", 1)[0]
            self.processes[pid] = Process(pid, comm.decode("utf-8", "replace"))
            self.seen += 1

    def _note_captured(self, frames: bytes) -> None:
        """Launches a stream capture recorded: with aggregates alone their rows write a
        record only while their process captures, and the kernel leaves them out of its
        launch map (aggregates.capturing_gate): work recorded into a graph, not run, not
        "lost" to a full map."""
        ids = record.frame_column(frames, record.FN_ID, "H")
        if self._launch_ids.isdisjoint(ids):
            return
        rets = record.frame_column(frames, record.RET, "Q")
        for fn_id, ret in zip(ids, rets):
            if fn_id in self._launch_ids and not ret & 0xFFFFFFFF:
                self._captured[fn_id] = self._captured.get(fn_id, 0) + 1

    def tick(self, final: bool = False) -> None:
        """Name the launches and publish them; drop the processes whose last values every
        exporter has collected; note the processes that exited since the last tick.
        `final` (the tick after the stop, whose series the last push and the profile
        take): no launch waits for its name."""
        with self._lock:  # (no exporter: what is published counts as seen)
            seen = min(self._collected.values(), default=self._published)
        self._prune(seen)
        now = time.monotonic()
        for process in self.processes.values():  # (before the series: they hold its end)
            if process.exited is None and not process.alive():
                process.exited, process.exited_at = self._published + 1, now
        series = self._launch_series(final)
        for process in self.processes.values():
            if process.exited is not None and process.waiting:  # (held back: in the next)
                process.exited = self._published + 2
        with self._lock:
            self._series = series
            self._published += 1
        self._known = tuple(self.processes)
        if len(self.tracer.attachments) != self._probed_files:  # (files probed late)
            self._probed_files = len(self.tracer.attachments)
            elf.forget_files()

    def _launch_series(self, final: bool = False) -> LaunchSeries:
        """Launches from the kernel's map by process and kernel label. The successful
        launches the aggregates counted beyond those the map holds (and those of processes
        already dropped) are the ones the full map could not take."""
        assert self.tracer is not None
        sampled = set(self.tracer.sampled_returns())  # (their map counts every attempt)
        totals = self._aggregates()  # (read first: the maps by process can only be ahead)
        ok = {apis.FN_ID[f.api.name]: f.count - (0 if f.api.name in sampled else f.errors)
              for f in totals if f.api.role == Role.LAUNCH}
        per_key: Dict[Tuple[int, int, int], int] = {}
        for key, value in self._launches.items():
            pid, fn_id, *cells = layout.LAUNCH_KEY.unpack(key)
            func = cells[_FUNC_CELL[fn_id]]
            count = layout.LAUNCH_VALUE.unpack(value)[0]
            per_key[(pid, fn_id, func)] = per_key.get((pid, fn_id, func), 0) + count
        for _, pid, fn_id, func, count in self._owned_slots():
            if count:  # (else claimed, its first launch not yet added)
                per_key[(pid, fn_id, func)] = per_key.get((pid, fn_id, func), 0) + count
        attributed = dict(self._retired)
        for fn_id, count in self._captured.items():  # (in the aggregates, not in the map)
            attributed[fn_id] = attributed.get(fn_id, 0) + count
        launches: Dict[Tuple[Labels, str, str], int] = {}
        for (pid, fn_id, func), count in sorted(per_key.items()):
            attributed[fn_id] = attributed.get(fn_id, 0) + count
            process = self._process(pid)
            label = self._kernel_label(process, fn_id, func, wait=not final)
            if label is None:  # (held back: published at the next tick)
                continue
            series = (process.label_set(), TABLE[fn_id].name, label)
            launches[series] = launches.get(series, 0) + count
        missing = sum(max(n - attributed.get(fn_id, 0), 0) for fn_id, n in ok.items())
        self._map_full = max(self._map_full, missing)
        per_process = self._per_process(per_key, sampled)
        self._process_map_full = max(self._process_map_full, self._calls_unattributed(
            [f for f in totals if f.api.name not in sampled], per_process))
        live = [p for p in self.processes.values() if p.exited is None]
        memory = tuple((p.label_set(), self.memory.held(p.pid))
                       for p in sorted(live, key=lambda p: p.pid))
        return LaunchSeries(launches, self._map_full, len(live), memory, per_process,
                            tuple(totals))

    def _calls_unattributed(self, totals: Sequence[FunctionTotals],
                            per_process: Dict[Tuple[Labels, int], list]) -> int:
        """The calls of `totals` (the rows counted by process in `proc_calls`) that no
        process's entry holds, nor one of a process dropped: those the full map could not
        take."""
        held: Dict[int, int] = dict(self._retired_calls)
        for (_, fn_id), values in per_process.items():
            held[fn_id] = held.get(fn_id, 0) + values[0]
        counted: Dict[int, int] = {}
        for f in totals:
            fn_id = apis.FN_ID[f.api.name]
            counted[fn_id] = counted.get(fn_id, 0) + f.count
        return sum(max(n - held.get(fn_id, 0), 0) for fn_id, n in counted.items())

    def _process(self, pid: int) -> Process:
        process = self.processes.get(pid)
        if process is None:  # (its hello record was lost: a full ring)
            process = self.processes[pid] = Process(pid, "?")
            self.seen += 1
        return process

    def _per_process(self, launches: Dict[Tuple[int, int, int], int],
                     sampled: Set[str]) -> Dict[Tuple[Labels, int], list]:
        """Calls, errors and API time by (process, function) from `proc_calls`; a sampled
        row's calls are its launches by process (`launches`: (pid, fn_id, func) -> count)."""
        found: Dict[Tuple[Labels, int], list] = {}
        for key, value in self._process_calls.items():
            pid, index = layout.PROCESS_KEY.unpack(key)
            entry = found.setdefault((self._process(pid).label_set(),
                                      index // layout.KIND_SLOTS), [0, 0, 0])
            for k, v in enumerate(layout.PROCESS_VALUE.unpack(value)):
                entry[k] += v
        for (pid, fn_id, _), count in launches.items():
            if TABLE[fn_id].name in sampled:
                # (no errors nor times: the sampled returns are not by process)
                found.setdefault((self._process(pid).label_set(), fn_id),
                                 [0, None, None])[0] += count
        return found

    def _kernel_label(self, process: Process, fn_id: int, func: int,
                      wait: bool = True) -> Optional[str]:
        """The launch's kernel label, decided once per (function, func) of a process, so
        that every series only grows: the name while fewer than `kernel_labels` names have
        one, else "other" (the first kernels a process launches get the labels). None: not
        decided yet. A launch whose name is not known when first seen waits one tick: the
        call that taught it (cuKernelGetFunction, say) came before the launch, but its
        record may have reached the ring after the reader drained it for this tick."""
        label = process.labels.get((fn_id, func))
        if label is not None:
            return label
        name = self.tracer.names.name_for(process.pid, TABLE[fn_id].name, func)
        limit = self.options.kernel_labels
        if name is None and limit and wait and (fn_id, func) not in process.waiting:
            process.waiting.add((fn_id, func))
            return None
        process.waiting.discard((fn_id, func))
        if name is None:
            label = UNNAMED_KERNEL if limit else OTHER_KERNEL
        elif name in process.kernels or len(process.kernels) < limit:
            process.kernels.add(name)
            label = name
        else:
            label = OTHER_KERNEL
        process.labels[(fn_id, func)] = label
        return label

    def _owned_slots(self) -> List[Tuple[int, int, int, int, int]]:
        """(index, pid, fn_id, func, count) of the owned launch slots (sampled rows)."""
        return [] if self._slots is None else sums.owned_slots_of(self._slots)

    def _retire_launches(self, pid: int, fn_id: int, func: int, count: int) -> None:
        """An exited process's launches of one kernel, leaving the kernel's maps."""
        self._retired[fn_id] = self._retired.get(fn_id, 0) + count
        process = self.processes[pid]
        label = process.labels.get((fn_id, func), UNNAMED_KERNEL)
        series = (process.comm, TABLE[fn_id].name, label)
        self.retired_launches[series] = self.retired_launches.get(series, 0) + count

    def _prune(self, seen: int) -> None:
        """Drop the processes whose last values are in a series every exporter has
        collected (`seen`: the oldest version collected), or that exited HOLD_S ago: their
        launch entries leave the kernel's map (counted as retired), their names go."""
        held_since = time.monotonic() - HOLD_S
        gone = [p.pid for p in self.processes.values()  # (not one whose launches wait)
                if p.exited is not None and not p.waiting
                and (p.exited <= seen or p.exited_at < held_since)]
        if not gone:
            return
        launches = self.tracer.session.maps[layout.LAUNCHES]
        doomed = set(gone)
        for key, value in self._launches.items():
            pid, fn_id, *cells = layout.LAUNCH_KEY.unpack(key)
            if pid in doomed:
                count = layout.LAUNCH_VALUE.unpack(value)[0]
                self._retire_launches(pid, fn_id, cells[_FUNC_CELL[fn_id]], count)
                launches.delete(key)
        for index, pid, fn_id, func, count in self._owned_slots():
            if pid in doomed:
                self._retire_launches(pid, fn_id, func, count)
                sums.free_slot(self.tracer.session.maps[layout.LAUNCH_SLOTS], index,
                                     fn_id << 32 | pid)
        calls = self.tracer.session.maps[layout.PROCESS_CALLS]
        for key, value in self._process_calls.items():
            pid, index = layout.PROCESS_KEY.unpack(key)
            if pid in doomed:
                fn_id = index // layout.KIND_SLOTS
                self._retired_calls[fn_id] = (self._retired_calls.get(fn_id, 0)
                                              + layout.PROCESS_VALUE.unpack(value)[0])
                calls.delete(key)
        for pid in gone:
            del self.processes[pid]
            forget_process(self.tracer.names, pid)
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
        families = function_families(series.totals)
        families.append(_error_family(self.tracer.session.maps[layout.ERRORS]))
        sampled = self.tracer.sampled_returns()
        families.append(Family(
            "ebpf_cuda_api_return_sampling", "gauge",
            "Functions whose returns are sampled, 1 call in the value (uprobe sessions): "
            "their durations and errors are those of the sampled calls; their calls, and "
            "their kernel launches (failed ones included), are all counted.", "1",
            [((("api", api), ("layer", TABLE[apis.FN_ID[api]].library)),
              self.options.sample_returns) for api in sampled]))
        families.append(Family(
            "ebpf_cuda_kernel_launches", "counter",
            "Kernel launches by process and kernel (the first N kernels of a process by "
            "name, the rest as kernel=\"other\"): the successful ones, or for the functions "
            "of ebpf_cuda_api_return_sampling every attempt.", "1",
            [(labels + (("api", api), ("layer", TABLE[apis.FN_ID[api]].library),
                        ("kernel", kernel)), n)
             for (labels, api, kernel), n in sorted(series.launches.items())]))
        families += _process_families(series.per_process)
        families.append(self._lost_family(series.map_full))
        families.append(Family("ebpf_cuda_processes", "gauge",
                               "Processes seen making CUDA calls that still run.", "1",
                               [((), series.processes)]))
        families.append(self._files_family())
        families.append(Family(
            "ebpf_cuda_device_memory_bytes", "gauge",
            "Device memory each running process holds: what its traced allocations returned "
            "and its frees have not released (allocations made before the monitor started "
            "are not known).", "By", list(series.memory)))
        if self.flight is not None:
            families += self.flight.families()
        return families

    def _lost_family(self, map_full: int) -> Family:
        stats = self.tracer.session.maps[layout.STATS]
        lost = [("ring_full", _per_cpu_sum(stats, record.STAT_RING_FULL)),
                ("inflight_full", _per_cpu_sum(stats, record.STAT_INFLIGHT_FULL)),
                ("launch_map_full", map_full),
                ("process_map_full", self._process_map_full),
                ("name_map_full", self.tracer.names.names_lost)]
        if self.flight is not None:
            lost.append(("flight_recorder_full", self.flight.overwritten))
            lost.append(("flight_recorder_unwritten", self.flight.ring.unwritten))
        if self.watch is not None:
            lost.append(("notice_ring_full", self.watch.lost()))
        return Family("ebpf_cuda_events_lost", "counter",
                      "What the probes could not count or keep, by cause: ring_full (records "
                      "of name-teaching calls, or with a flight recorder every call's), "
                      "inflight_full (calls not counted), launch_map_full (launches counted "
                      "but not by process), process_map_full (calls counted but not by "
                      "process), name_map_full (kernel names gone from the probes' names "
                      "map before the reader read their registrations), "
                      "flight_recorder_full (calls overwritten in the "
                      "flight recorder before they were SECONDS old), "
                      "flight_recorder_unwritten (calls its disk refused), notice_ring_full "
                      "(notices of dlopens and execs: every process is scanned again).", "1",
                      [((("cause", cause),), n) for cause, n in lost])

    def _files_family(self) -> Family:
        late, detached = self.watch.counts() if self.watch is not None else (0, 0)
        return Family("ebpf_cuda_probed_files", "gauge",
                      "CUDA files probed, by state: start (found at the start, probed until "
                      "the monitor stops), late (probed after the start, probes on now), "
                      "detached (probed late, then detached once no process mapped them: so "
                      "far; a file mapped again is probed again).", "1",
                      [((("state", "start"),), self.start_files),
                       ((("state", "late"),), late), ((("state", "detached"),), detached)])

    def launch_totals(self) -> Dict[Tuple[str, str, str], int]:
        """Launches by (comm, api, kernel label) of the whole run: the processes dropped and
        those still known (as of the last tick)."""
        with self._lock:
            series = self._series
        totals = dict(self.retired_launches)
        for (labels, api, kernel), n in series.launches.items():
            key = (dict(labels)["comm"], api, kernel)
            totals[key] = totals.get(key, 0) + n
        return totals

    # -- tear-down -------------------------------------------------------------------------

    def close(self) -> None:
        """Detach every probe and free every kernel object (idempotent)."""
        if self.watch is not None:  # (first: it attaches the session's probes)
            self.watch.close()
            self.watch = None
        if self.flight is not None:
            self.flight.close()
        if self.tracer is not None:
            self.tracer.close()


def forget_process(namer, pid: int) -> None:
    """Drop what the namer keeps of an exited process."""
    namer.forget(pid)


# -- families from the aggregates ------------------------------------------------------------

def function_families(functions: Sequence[FunctionTotals]) -> List[Family]:
    """Calls, durations, bytes and graph launches per function (and layer, copy kind)."""
    calls: Dict[Labels, int] = {}
    hists: Dict[Labels, List[int]] = {}
    sums: Dict[Labels, int] = {}
    graphs: Dict[Labels, int] = {}
    moved: Dict[str, Dict[Labels, int]] = {Role.COPY: {}, Role.MEMSET: {}, Role.ALLOC: {}}
    for f in functions:
        labels = (("api", f.api.name), ("layer", f.api.library))
        calls[labels] = calls.get(labels, 0) + f.count
        sums[labels] = sums.get(labels, 0) + f.total_ns
        hist = hists.setdefault(labels, [0] * len(f.histogram))
        hists[labels] = [a + b for a, b in zip(hist, f.histogram)]
        if f.api.name in GRAPH_LAUNCHES:
            graphs[labels] = graphs.get(labels, 0) + f.count - f.errors
        if f.api.role in moved and f.bytes:
            key = labels + ((("kind", copy_kind(f.api, f.kind)),)
                            if f.api.role == Role.COPY else ())
            moved[f.api.role][key] = moved[f.api.role].get(key, 0) + f.bytes
    return [
        Family("ebpf_cuda_api_calls", "counter", "CUDA API calls, failed ones included.",
               "1", sorted(calls.items())),
        Family("ebpf_cuda_api_duration_seconds", "histogram",
               "CUDA API call durations (log2 buckets of the kernel: bounds are powers of "
               "two of nanoseconds).", "s",
               [(labels, histogram(hists[labels], sums[labels], sum(hists[labels])))
                for labels in sorted(hists)]),
        Family("ebpf_cuda_memcpy_bytes", "counter",
               "Bytes of successful copies, by direction (kind).", "By",
               sorted(moved[Role.COPY].items())),
        Family("ebpf_cuda_memset_bytes", "counter", "Bytes of successful memsets.", "By",
               sorted(moved[Role.MEMSET].items())),
        Family("ebpf_cuda_alloc_bytes", "counter", "Bytes of successful allocations.", "By",
               sorted(moved[Role.ALLOC].items())),
        Family("ebpf_cuda_graph_launches", "counter", "Successful CUDA graph launches.", "1",
               sorted(graphs.items())),
    ]


def copy_kind(api: Api, kind: Optional[int]) -> str:
    """A copy's direction: its memcpy kind argument's name, or the row's fixed direction."""
    if kind is not None:
        return memcpy_kind_name(kind)
    return api.direction or "Default"


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


def _function_key(row: Tuple[str, str, list]) -> Tuple[str, str]:
    return row[0], row[1]


def _process_families(per_process: Dict[Tuple[Labels, int], list]) -> List[Family]:
    """Calls, errors and API time by process and function (a process's series go with its
    launch series, once every exporter has collected its last values)."""
    by_process: Dict[Labels, List[Tuple[str, str, list]]] = {}
    for (labels, fn_id), values in per_process.items():
        by_process.setdefault(labels, []).append((TABLE[fn_id].name, TABLE[fn_id].library,
                                                  values))
    # (sorted by process, then function: the processes' labels compared once each)
    rows = [(labels + (("api", name), ("layer", library)), values)
            for labels in sorted(by_process)
            for name, library, values in sorted(by_process[labels], key=_function_key)]
    return [
        Family("ebpf_cuda_process_api_calls", "counter",
               "CUDA API calls by process, failed ones included (the functions of "
               "ebpf_cuda_api_return_sampling: their launches, counted at entry).", "1",
               [(labels, v[0]) for labels, v in rows]),
        Family("ebpf_cuda_process_api_errors", "counter",
               "Failed CUDA API calls by process (the functions of "
               "ebpf_cuda_api_return_sampling: none).", "1",
               [(labels, v[1]) for labels, v in rows if v[1] is not None]),
        Family("ebpf_cuda_process_api_seconds", "counter",
               "Time spent in CUDA API calls by process (the functions of "
               "ebpf_cuda_api_return_sampling: none).", "s",
               [(labels, v[2] / 1e9) for labels, v in rows if v[2] is not None]),
    ]


def _error_family(errors_map) -> Family:
    counts: Dict[Labels, int] = {}
    for key, value in errors_map.items():
        fn_id, code = layout.ERROR_KEY.unpack(key)
        api = TABLE[fn_id]
        labels = (("api", api.name), ("layer", api.library),
                  ("error", error_name(code, api.driver)))
        counts[labels] = counts.get(labels, 0) + layout.U64.unpack(value)[0]
    return Family("ebpf_cuda_api_errors", "counter", "Failed CUDA API calls by error.", "1",
                  sorted(counts.items()))
