"""The GPU's state beside a trace: one thread samples every device and its processes at a
period (or on demand: the monitor's scrape tick), a second waits on NVML's event set for Xids
and ECC errors. Both live in the tracer's own process; the traced program is untouched.

Every NVML call runs on a worker thread of its own and is waited for with a timeout: a driver
that hangs a call (it happens on faulted GPUs) stops the sampling with one line, never the
tracer. What cannot be sampled (no library, no GPU, a function the driver lacks or does not
support on a device) is said once, in one line, and the rest goes on.
"""
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set, Tuple

from ..decode.events import wall_minus_monotonic_ns
from . import nvml, xid
from .records import GpuEvent, GpuSample, ProcessState

Notice = Callable[[str], None]
DEFAULT_TIMEOUT_S = 2.0  # a call longer than this: the driver hangs
EVENT_WAIT_MS = 200  # the event thread's wait, between looks at whether it should stop

# GPM metric id (nvml.h's NVML_GPM_METRIC_*) -> the sample's key
GPM_METRICS = {1: "gr_engine_active", 2: "sm_active", 3: "sm_occupancy", 5: "tensor_active",
               10: "dram_active"}
# Event types waited for -> their name (P-state and clock changes left out: the samples carry
# the clocks, and those events come many a second on a busy GPU)
EVENT_KINDS = {nvml.EVENT_XID: "xid", nvml.EVENT_SINGLE_BIT_ECC: "ecc_single",
               nvml.EVENT_DOUBLE_BIT_ECC: "ecc_double"}

# What one round reads of a device: (name in the one line, the call, the sample's keys)
_READS: Tuple[Tuple[str, Callable, Tuple[str, ...]], ...] = (
    ("utilisation", lambda lib, h: lib.utilization(h), ("gpu_util", "mem_util")),
    ("memory", lambda lib, h: lib.memory(h), ("mem_used", "mem_total")),
    ("power", lambda lib, h: (lib.power_mw(h) / 1000.0,), ("power_w",)),
    ("temperature", lambda lib, h: (lib.temperature(h),), ("temperature_c",)),
    ("clocks", lambda lib, h: (lib.clock(h, nvml.CLOCK_SM), lib.clock(h, nvml.CLOCK_MEM)),
     ("sm_clock_mhz", "mem_clock_mhz")),
    ("clock-event reasons", lambda lib, h: (lib.clock_reasons(h),), ("clock_reasons",)),
    ("PCIe throughput", lambda lib, h: lib.pcie(h), ("pcie_tx_kbs", "pcie_rx_kbs")),
    ("ECC counts", lambda lib, h: lib.ecc(h), ("ecc_corrected", "ecc_uncorrected")),
)


class Hung(Exception):
    """An NVML call did not return within the timeout."""


@dataclass
class Device:
    index: int
    handle: int
    name: str
    uuid: str
    mig: bool = False
    gpm: Optional[List[int]] = None  # two GPM sample buffers, on devices that have GPM
    gpm_ready: bool = False  # the first buffer holds a sample
    util_since_us: int = 0  # the last process-utilisation sample seen
    mig_names: Optional[Dict[int, str]] = None  # GPU instance id -> its MIG device's name
    nvlink_last: Optional[Tuple[int, int, int]] = None  # (µs, TX KiB, RX KiB) last read


class _Worker:
    """One daemon thread that makes the NVML calls; `run` waits for each with a timeout."""

    def __init__(self) -> None:
        self._jobs: "queue.Queue" = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="ebpf-cuda nvml", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            job, box, done = self._jobs.get()
            if job is None:
                return
            try:
                box.append((True, job()))
            except Exception as err:  # noqa: BLE001 (handed to the caller, raised there)
                box.append((False, err))
            done.set()

    def run(self, job: Callable, timeout: float):
        box: list = []
        done = threading.Event()
        self._jobs.put((job, box, done))
        if not done.wait(timeout):
            raise Hung()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._jobs.put((None, None, None))


class Sampler:
    """Samples at `period_s` (0: only when `sample_now()` is called) from the library at
    `path` (None: found as nvml.py says). `samples` and `events` grow as they come (a
    trace's); with `keep=False` (the monitor, which runs for days) they are not kept, and
    `latest` alone holds the last round. `on_event` is called with each event (the monitor's
    Xid trigger), `notice` with each line saying what is not sampled. `clock_offset_ns`: wall
    minus monotonic, as the decoder's (the same wall times as the events')."""

    def __init__(self, period_s: float, path: Optional[str] = None,
                 notice: Optional[Notice] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 clock_offset_ns: Optional[int] = None, events: bool = True,
                 on_event: Optional[Callable[[GpuEvent], None]] = None,
                 keep: bool = True) -> None:
        self.period_s, self.path, self.timeout_s = period_s, path, timeout_s
        self.offset_ns = (wall_minus_monotonic_ns() if clock_offset_ns is None
                          else clock_offset_ns)
        self._notice, self._on_event, self._want_events = notice, on_event, events
        self.keep = keep
        self.samples: List[GpuSample] = []
        self.events: List[GpuEvent] = []
        # The last round, one sample a device (replaced whole: a reader on another thread
        # takes the list as it is), and the rounds made so far
        self.latest: List[GpuSample] = []
        self.rounds = 0
        # While a round is under way, when it began: its samples, appended at its end, are
        # no older (the writers that put records among the calls wait for them)
        self.round_since: Optional[int] = None
        self.lines: List[str] = []  # every line said (the outputs repeat them)
        self.devices: List[Device] = []
        self.stopped: Optional[str] = None  # why the sampling stopped, once it did
        self._said: Set[Tuple[str, str]] = set()
        self._off: Set[Tuple[int, str]] = set()  # (device, read) not sampled any more
        self._stop = threading.Event()
        self._lib: Optional[nvml.Nvml] = None
        self._worker: Optional[_Worker] = None
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._sampling = False  # the sample loop has begun
        self.cpu_ns = 0  # the sampler threads' own CPU time (its cost)

    # -- the lines ---------------------------------------------------------------------------

    def _say(self, what: str, why: str, line: Optional[str] = None) -> None:
        with self._lock:  # (set_notice: each line told once, before or after it)
            if (what, why) in self._said:
                return
            self._said.add((what, why))
            line = line or "GPU state: %s not sampled: %s" % (what, why)
            self.lines.append(line)
            notice = self._notice
        if notice is not None:
            notice(line)

    def set_notice(self, notice: Notice) -> None:
        """Who is told each line from now on; told now the lines said before."""
        with self._lock:
            self._notice, said = notice, list(self.lines)
        for line in said:
            notice(line)

    def _give_up(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why
            self._say("", why, "GPU state %s: %s" % (
                "sampling stopped" if self._sampling else "not sampled", why))
        self._stop.set()

    # -- start and stop ----------------------------------------------------------------------

    def start(self, absent_ok: bool = False) -> bool:
        """Load the library and start the threads (NVML's initialisation and the devices'
        discovery in them: the caller does not wait for the driver); False (after its one
        line) when there is no library. `absent_ok`: not even that line when none is found
        (a host without NVIDIA's driver, at the trace's default)."""
        try:
            self._lib = nvml.Nvml(self.path)
        except nvml.NvmlAbsent as err:
            if not absent_ok:
                self._give_up(str(err))
            return False
        except nvml.NvmlError as err:
            self._give_up(str(err))
            return False
        self._worker = _Worker()
        self._spawn(self._run, "ebpf-cuda gpu samples")
        return True

    def _run(self) -> None:
        """Initialise, find the devices, start the event thread, sample until stopped."""
        try:
            self._call(self._open)
        except nvml.NvmlError as err:
            self._give_up(str(err))
            return
        except Hung:
            return
        if not self.devices:
            self._give_up("NVML sees no GPU")
            return
        if self._want_events:
            self._spawn(self._event_loop, "ebpf-cuda gpu events")
        if self.period_s > 0:
            self._sample_loop()

    def _spawn(self, target: Callable, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        """Stop the threads (a hung call's thread is left behind: it is a daemon)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout_s + EVENT_WAIT_MS / 1000.0)
        if self._worker is not None:
            self._worker.close()

    def _call(self, job: Callable):
        """`job()` on the worker, bounded by the timeout; Hung stops the sampling."""
        if self._worker is None:
            raise Hung()
        try:
            return self._worker.run(job, self.timeout_s)
        except Hung:
            self._give_up("an NVML call did not return in %g s (a hung driver); the trace "
                          "goes on without GPU state" % self.timeout_s)
            raise

    def _open(self) -> None:
        lib, devices = self._lib, []
        lib.init()
        for index in range(lib.device_count()):
            handle = lib.handle(index)
            device = Device(index, handle, lib.name(handle), lib.uuid(handle))
            device.mig = self._optional(device, "MIG mode", lambda: lib.mig_mode(handle)) or False
            if device.mig:
                device.mig_names = {gi: name for gi, name, _ in self._optional(
                    device, "MIG devices", lambda: lib.mig_devices(handle)) or ()}
            if self._optional(device, "GPM metrics", lambda: lib.gpm_supported(handle)):
                device.gpm = [lib.gpm_alloc(), lib.gpm_alloc()]
            devices.append(device)
        self.devices = devices  # (at once: sample_now may look from another thread)

    def _optional(self, device: Device, what: str, read: Callable):
        """read(), or None (said once) when the driver lacks it or the device does not
        support it."""
        if (device.index, what) in self._off:
            return None
        try:
            return read()
        except nvml.NvmlError as err:
            self._off.add((device.index, what))
            self._say("%s of device %d" % (what, device.index) if not isinstance(
                err, nvml.NvmlMissing) else what, str(err))
            return None

    # -- sampling ----------------------------------------------------------------------------

    def _sample_loop(self) -> None:
        self._sampling = True
        started = time.thread_time_ns()
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self._took(self._call(self._round))
            except Hung:
                break
            except nvml.NvmlError as err:
                self._give_up(str(err))
                break
            # (a round late, the process stalled: the next one a period on, no burst)
            next_at = max(next_at + self.period_s, time.monotonic())
            self._stop.wait(next_at - time.monotonic())
        self.round_since = None  # (a round that hung or failed: its samples never come)
        self.cpu_ns += time.thread_time_ns() - started

    def sample_now(self) -> List[GpuSample]:
        """One round now (the monitor's scrape); [] once the sampling stopped."""
        if self.stopped is not None or not self.devices:
            return []
        try:
            samples = self._call(self._round)
        except Hung:
            self.round_since = None
            return []
        self._took(samples)
        return samples

    def _took(self, samples: List[GpuSample]) -> None:
        self.latest = samples
        self.rounds += 1
        if self.keep:
            self.samples.extend(samples)
        self.round_since = None  # (after the samples are in)

    def _round(self) -> List[GpuSample]:
        self.round_since = time.monotonic_ns()  # (before any of its samples' times)
        started = time.thread_time_ns()
        samples = [self._sample(device) for device in self.devices]
        self.cpu_ns += time.thread_time_ns() - started  # (the worker's share)
        return samples

    def _sample(self, device: Device) -> GpuSample:
        lib, handle = self._lib, device.handle
        ts_ns = time.monotonic_ns()
        values: Dict[str, float] = {}
        for what, read, keys in _READS:
            got = self._optional(device, what, lambda: read(lib, handle))
            if got is not None:
                values.update(zip(keys, got))
        values.update(self._nvlink(device))
        if device.gpm is not None:
            values.update(self._gpm(device))
        return GpuSample((ts_ns + self.offset_ns) / 1e9, ts_ns, device.index, device.name,
                         device.uuid, values, self._processes(device), device.mig)

    def _nvlink(self, device: Device) -> Dict[str, int]:
        """NVLink's TX/RX KB/s since the last round (NVML gives counters: the first round
        has none); nothing on a device without NVLink (said once)."""
        got = self._optional(device, "NVLink throughput", lambda: self._lib.nvlink_kib(
            device.handle))
        if got is None:
            return {}
        ts_us, tx, rx = got
        ts_us = ts_us or time.monotonic_ns() // 1000  # (a driver that leaves it 0)
        last, device.nvlink_last = device.nvlink_last, (ts_us, tx, rx)
        # (no rate across a counter reset, or over no time)
        if last is None or ts_us <= last[0] or tx < last[1] or rx < last[2]:
            return {}
        elapsed_us = ts_us - last[0]
        return {"nvlink_tx_kbs": round((tx - last[1]) * 1_000_000 / elapsed_us),
                "nvlink_rx_kbs": round((rx - last[2]) * 1_000_000 / elapsed_us)}

    def _gpm(self, device: Device) -> Dict[str, float]:
        """The GPM metrics between the last round's sample and this one's."""
        lib, buffers = self._lib, device.gpm
        try:
            lib.gpm_sample(device.handle, buffers[1])
        except nvml.NvmlError as err:
            device.gpm = None
            self._say("GPM metrics of device %d" % device.index, str(err))
            return {}
        ready, device.gpm_ready = device.gpm_ready, True
        previous, current = buffers
        buffers.reverse()  # (this round's sample is the next round's first)
        if not ready:
            return {}
        got = self._optional(device, "GPM metrics", lambda: lib.gpm_metrics(
            previous, current, list(GPM_METRICS))) or {}
        return {GPM_METRICS[metric]: value for metric, value in got.items()}

    def _processes(self, device: Device) -> List[ProcessState]:
        lib, handle = self._lib, device.handle
        states: Dict[int, ProcessState] = {}
        for info in self._optional(device, "process memory", lambda: lib.processes(handle)) or ():
            instance = info.gpuInstanceId if info.gpuInstanceId != nvml.NO_INSTANCE else None
            states[info.pid] = ProcessState(info.pid, info.usedGpuMemory, gpu_instance=instance,
                                            mig=(device.mig_names or {}).get(instance))
        utils = self._optional(device, "process utilisation", lambda: lib.process_utilization(
            handle, device.util_since_us)) or ()
        for sample in sorted(utils, key=lambda s: s.timeStamp):  # (the latest one wins)
            state = states.setdefault(sample.pid, ProcessState(sample.pid))
            state.sm_util, state.mem_util = sample.smUtil, sample.memUtil
            device.util_since_us = max(device.util_since_us, sample.timeStamp)
        return [states[pid] for pid in sorted(states)]

    # -- events ------------------------------------------------------------------------------

    def _event_loop(self) -> None:
        lib = self._lib
        try:
            event_set = self._call(lib.event_set)
            for device in self.devices:
                mask = self._optional(device, "events", lambda: lib.supported_events(
                    device.handle))
                wanted = (mask or 0) & sum(EVENT_KINDS)
                if wanted:
                    self._call(lambda: lib.register_events(device.handle, wanted, event_set))
        except nvml.NvmlError as err:
            self._say("Xid and ECC events", str(err))
            return
        except Hung:
            return
        by_handle = {device.handle: device for device in self.devices}
        while not self._stop.is_set():
            try:  # (its own thread: a wait that hangs stops only this thread)
                event = lib.wait(event_set, EVENT_WAIT_MS)
            except nvml.NvmlError as err:
                self._say("Xid and ECC events", str(err))
                return
            if event is not None:
                self._record_event(event, by_handle.get(event.handle))

    def _record_event(self, event: nvml.Event, device: Optional[Device]) -> None:
        ts_ns = time.monotonic_ns()
        kind = EVENT_KINDS.get(event.type, "event 0x%x" % event.type)
        code = event.data if event.type == nvml.EVENT_XID else 0
        words = xid.meaning(code) if event.type == nvml.EVENT_XID else kind.replace("_", " ") \
            + " ECC error"
        record = GpuEvent((ts_ns + self.offset_ns) / 1e9, ts_ns,
                          device.index if device is not None else None, kind, code, words,
                          uuid=device.uuid if device is not None else "")
        if self.keep:
            self.events.append(record)
        if self._on_event is not None:
            self._on_event(record)
