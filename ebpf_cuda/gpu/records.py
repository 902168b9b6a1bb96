"""What the sampler produces: a device's state at one time (`GpuSample`, with its processes)
and a device event (`GpuEvent`: an Xid, an ECC error). Times are the probes' clock
(CLOCK_MONOTONIC, `ts_ns`) and wall-clock seconds (`ts`), as events' (decode/events.py).

JSON: `{"type": "gpu_sample", ...}` and `{"type": "gpu_event", ...}`, read back by
`from_json` (saved traces keep them that way)."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

# The device values a sample may carry, by key, with their unit (absent: not sampled)
DEVICE_VALUES = {
    "gpu_util": "%", "mem_util": "%", "mem_used": "bytes", "mem_total": "bytes",
    "power_w": "W", "temperature_c": "C", "sm_clock_mhz": "MHz", "mem_clock_mhz": "MHz",
    "clock_reasons": "mask", "pcie_tx_kbs": "KB/s", "pcie_rx_kbs": "KB/s",
    "nvlink_tx_kbs": "KB/s", "nvlink_rx_kbs": "KB/s",
    "ecc_corrected": "count", "ecc_uncorrected": "count",
    "gr_engine_active": "%", "sm_active": "%", "sm_occupancy": "%", "tensor_active": "%",
    "dram_active": "%",
}
# Clock-event reasons that are not throttling: the GPU idle (0x1), the application's clock
# setting (0x2); every other bit slows the clocks (nvml.h's nvmlClocksEventReason*)
NOT_THROTTLE = 0x1 | 0x2


@dataclass
class ProcessState:
    """One process on a device (its host pid, as NVML gives it)."""
    pid: int
    memory: Optional[int] = None  # bytes
    sm_util: Optional[int] = None  # %
    mem_util: Optional[int] = None  # %
    gpu_instance: Optional[int] = None  # its MIG instance, under MIG
    mig: Optional[str] = None  # that instance's MIG device, by name

    def to_json(self) -> Dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if value is not None}


@dataclass
class GpuSample:
    ts: float
    ts_ns: int
    device: int
    name: str
    uuid: str
    values: Dict[str, Union[int, float]]
    processes: List[ProcessState] = field(default_factory=list)
    mig: bool = False

    def to_json(self) -> Dict[str, Any]:
        obj: Dict[str, Any] = {"type": "gpu_sample", "ts": self.ts, "ts_ns": self.ts_ns,
                               "device": self.device, "name": self.name, "uuid": self.uuid}
        if self.mig:
            obj["mig"] = True
        obj.update(self.values)
        obj["processes"] = [p.to_json() for p in self.processes]
        return obj

    def throttled(self) -> bool:
        return bool(int(self.values.get("clock_reasons", 0)) & ~NOT_THROTTLE)

    def process(self, pid: int) -> Optional[ProcessState]:
        for state in self.processes:
            if state.pid == pid:
                return state
        return None


@dataclass
class GpuEvent:
    """A device event: `kind` (xid, ecc_single, ecc_double, ...), its `code` (the Xid) and
    `meaning`; `pid` when NVML gives one; `last_launches`: the traced processes' last launches
    before it (filled by the outputs that see the calls)."""
    ts: float
    ts_ns: int
    device: Optional[int]
    kind: str
    code: int
    meaning: str
    pid: Optional[int] = None
    uuid: str = ""
    last_launches: List[Dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        obj = {"type": "gpu_event", "ts": self.ts, "ts_ns": self.ts_ns, "device": self.device,
               "uuid": self.uuid, "kind": self.kind, "code": self.code,
               "meaning": self.meaning, "pid": self.pid}
        obj["last_launches"] = list(self.last_launches)
        return obj

    def sentence(self) -> str:
        """`GPU 0 Xid 79: GPU has fallen off the bus; last launches: ...` (one line)."""
        where = "GPU %s" % (self.device if self.device is not None else "?")
        what = "Xid %d: %s" % (self.code, self.meaning) if self.kind == "xid" else self.meaning
        text = "%s %s" % (where, what)
        if self.pid is not None:
            text += " (pid %d)" % self.pid
        if self.last_launches:
            text += "; last launches: " + ", ".join(
                "%s%s pid %d" % (launch["api"], " " + launch["kernel"] if launch.get("kernel")
                                 else "", launch["pid"]) for launch in self.last_launches)
        return text


GpuRecord = Union[GpuSample, GpuEvent]


def from_json(obj: Dict[str, Any]) -> GpuRecord:
    """A record back from its JSON object (KeyError/TypeError on a malformed one)."""
    if obj["type"] == "gpu_event":
        return GpuEvent(obj["ts"], obj["ts_ns"], obj["device"], obj["kind"], obj["code"],
                        obj["meaning"], obj.get("pid"), obj.get("uuid", ""),
                        list(obj.get("last_launches", ())))
    fixed = {"type", "ts", "ts_ns", "device", "name", "uuid", "processes", "mig"}
    return GpuSample(obj["ts"], obj["ts_ns"], obj["device"], obj["name"], obj["uuid"],
                     {k: v for k, v in obj.items() if k not in fixed},
                     [ProcessState(**p) for p in obj.get("processes", ())],
                     bool(obj.get("mig")))
