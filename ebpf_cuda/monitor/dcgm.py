"""The GPU's state as metric families named as dcgm-exporter names them (so the NVIDIA DCGM
Grafana dashboard reads them unchanged), from the sampler's latest samples (gpu/sampler.py),
plus the traced processes' GPU memory and SM utilisation, and the Xid counter.

dcgm-exporter's units are kept: framebuffer in MiB, clocks in MHz, power in W, profiling
metrics (DCGM_FI_PROF_*) as ratios 0..1, PCIe and NVLink in bytes a second.

`GpuState` is the monitor's GPU part: the sampler samples on its own thread at its period and
a scrape renders its last round, never calling NVML (a round took 50 ms on an H100 host, D35:
a scrape that sampled waited that long), with each device's sample age as a gauge so that
staleness shows (a hung driver stops the sampling: the device gauges go, the age grows).
"""
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..gpu.records import GpuEvent
from ..gpu.sampler import Sampler
from .metrics import Family, Labels

MIB = 1 << 20
# (family, help, the sample's key, scale): one gauge per device value
DCGM_GAUGES: Tuple[Tuple[str, str, str, float], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gpu_util", 1),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "mem_util", 1),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "mem_used", 1 / MIB),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w", 1),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c", 1),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz", 1),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (a bitmask).",
     "clock_reasons", 1),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus (in "
     "bytes a second).", "pcie_tx_kbs", 1024),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus (in bytes "
     "a second).", "pcie_rx_kbs", 1024),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "The rate of data transmitted over NVLink, not "
     "including protocol headers (in bytes a second).", "nvlink_tx_kbs", 1024),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "The rate of data received over NVLink, not including "
     "protocol headers (in bytes a second).", "nvlink_rx_kbs", 1024),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.",
     "ecc_corrected", 1),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.",
     "ecc_uncorrected", 1),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active (GPM).",
     "gr_engine_active", 0.01),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned "
     "(GPM).", "sm_active", 0.01),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM (GPM).",
     "sm_occupancy", 0.01),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active "
     "(GPM).", "tensor_active", 0.01),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active "
     "sending or receiving data (GPM).", "dram_active", 0.01),
)

ProcessLabels = Callable[[int], Labels]  # a host pid -> its labels (process, container)


def device_labels(sample, hostname: str) -> Labels:
    """dcgm-exporter's labels of a device."""
    return (("gpu", str(sample.device)), ("UUID", sample.uuid),
            ("device", "nvidia%d" % sample.device), ("modelName", sample.name),
            ("Hostname", hostname))


def gpu_families(samples: Sequence, xids: Dict[Tuple[int, str, int], int],
                 last_xid: Dict[int, int], process_labels: ProcessLabels,
                 hostname: Optional[str] = None) -> List[Family]:
    """The families of the latest samples (one a device), the Xids counted so far by (gpu,
    UUID, code) and each device's last Xid code."""
    hostname = hostname or socket.gethostname()
    families = []
    by_device = {s.device: device_labels(s, hostname) for s in samples}
    for name, text, key, scale in DCGM_GAUGES:
        rows = [(by_device[s.device], s.values[key] * scale) for s in samples
                if key in s.values]
        if rows:
            families.append(Family(name, "gauge", text, "1", rows))
    free = [(by_device[s.device], (s.values["mem_total"] - s.values["mem_used"]) / MIB)
            for s in samples if "mem_total" in s.values and "mem_used" in s.values]
    if free:
        families.append(Family("DCGM_FI_DEV_FB_FREE", "gauge",
                               "Framebuffer memory free (in MiB).", "1", free))
    families.append(Family("DCGM_FI_DEV_XID_ERRORS", "gauge",
                           "Value of the last XID error encountered.", "1",
                           [(by_device[s.device], last_xid.get(s.device, 0))
                            for s in samples]))
    families.append(Family(
        "ebpf_cuda_gpu_xid_errors", "counter", "Xid errors (NVML's critical Xid events) by "
        "GPU and code.", "1",
        [((("gpu", str(gpu)), ("UUID", uuid), ("xid", str(code))), n)
         for (gpu, uuid, code), n in sorted(xids.items())]))
    families += _process_families(samples, process_labels)
    return families


def _process_families(samples: Sequence, process_labels: ProcessLabels) -> List[Family]:
    memory, sm = [], []
    for sample in samples:
        gpu = (("gpu", str(sample.device)), ("UUID", sample.uuid))
        for state in sample.processes:
            labels = process_labels(state.pid) + gpu
            if state.memory is not None:
                memory.append((labels, state.memory))
            if state.sm_util is not None:
                sm.append((labels, state.sm_util / 100.0))
    return [
        Family("ebpf_cuda_process_gpu_memory_bytes", "gauge",
               "GPU memory each process holds, as NVML counts it (its context, its "
               "allocator's cache and everything it allocated).", "By", sorted(memory)),
        Family("ebpf_cuda_process_sm_utilization", "gauge",
               "The ratio of time a kernel of the process ran on the GPU's SMs over NVML's "
               "last sample period (nvmlDeviceGetProcessUtilization).", "1", sorted(sm)),
    ]


def age_family(samples: Sequence, now_ns: int) -> Family:
    """Each device's last sample's age at `now_ns` (monotonic), in seconds."""
    return Family("ebpf_cuda_gpu_sample_age_seconds", "gauge",
                  "Seconds since the GPU's state served was sampled (sampled on its own "
                  "thread, not at the scrape; it grows when the sampling stopped).", "s",
                  [((("gpu", str(s.device)), ("UUID", s.uuid)), (now_ns - s.ts_ns) / 1e9)
                   for s in samples])


class GpuState:
    """The sampler at `period_s` on its threads (NVML's calls there only), the Xids counted
    (each handed to `on_xid` too: the flight recorder's trigger), and the families of the
    last round (`families`, from any thread)."""

    def __init__(self, period_s: float, path: Optional[str] = None,
                 notice: Optional[Callable[[str], None]] = None,
                 clock_offset_ns: Optional[int] = None,
                 on_xid: Optional[Callable[[GpuEvent], None]] = None) -> None:
        self.sampler = Sampler(period_s, path, notice=notice, on_event=self._event,
                               clock_offset_ns=clock_offset_ns, keep=False)
        self._on_xid = on_xid
        self._lock = threading.Lock()
        self._xids: Dict[Tuple[int, str, int], int] = {}  # (gpu, UUID, code) -> Xids
        self._last_xid: Dict[int, int] = {}  # gpu -> its last Xid code

    def start(self, absent_ok: bool = False) -> bool:
        """Start sampling; False (said, unless `absent_ok` and no library) when it cannot."""
        return self.sampler.start(absent_ok=absent_ok)

    def _event(self, event: GpuEvent) -> None:
        """An NVML event (the sampler's event thread): an Xid is counted and handed on."""
        if event.kind != "xid":
            return
        with self._lock:
            key = (event.device, event.uuid, event.code)
            self._xids[key] = self._xids.get(key, 0) + 1
            self._last_xid[event.device] = event.code
        if self._on_xid is not None:
            self._on_xid(event)

    def families(self, process_labels: ProcessLabels) -> List[Family]:
        """The families of the last round and its age; no NVML call (the sampler's
        threads make them). Once the sampling stopped, the age and the Xid counter alone."""
        samples, now_ns = self.sampler.latest, time.monotonic_ns()
        if not samples:
            return []
        with self._lock:
            xids, last = dict(self._xids), dict(self._last_xid)
        families = gpu_families(samples, xids, last, process_labels)
        if self.sampler.stopped is not None:  # (stale values not served; the counter stays)
            families = [f for f in families if f.name == "ebpf_cuda_gpu_xid_errors"]
        return families + [age_family(samples, now_ns)]

    def close(self) -> None:
        self.sampler.stop()
