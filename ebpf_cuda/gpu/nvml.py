"""NVML (`libnvidia-ml.so.1`, shipped with every NVIDIA driver) through ctypes, written by hand
against nvml.h: the few functions and structs the sampler uses, nothing installed.

A function the library lacks (an older driver) raises `NvmlMissing`; an NVML error code
raises `NvmlError` with NVML's own words. tests/test_gpu_nvml.py checks every struct below
against nvidia-ml-py's definitions (sizes and field offsets).
"""
import ctypes
import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..errors import TracerError
from . import FOLDERS, SONAME  # noqa: F401 (where the library is looked for)

# nvml.h's constants (the subset used)
SUCCESS = 0
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6  # (no process utilisation sample since the last asked for)
ERROR_INSUFFICIENT_SIZE = 7
ERROR_TIMEOUT = 10
TEMPERATURE_GPU = 0
CLOCK_SM, CLOCK_MEM = 1, 2
PCIE_UTIL_TX_BYTES, PCIE_UTIL_RX_BYTES = 0, 1
MEMORY_ERROR_TYPE_CORRECTED, MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
VOLATILE_ECC = 0
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_PSTATE = 0x4
EVENT_XID = 0x8
EVENT_CLOCK = 0x10
BUFFER_SIZE = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE
GPM_METRICS_GET_VERSION = 1
GPM_SUPPORT_VERSION = 1
GPM_METRIC_MAX = 477  # nvml.h 12.9's array size (the library fills numMetrics of them)
NO_INSTANCE = 0xFFFFFFFF  # a process's GPU/compute instance outside MIG
# NVLink's data counters (KiB since the driver loaded, payload only); the scope UINT_MAX sums
# every link (nvml.h: "A scopeId of UINT_MAX returns aggregate value summed up across all links")
FI_DEV_NVLINK_THROUGHPUT_DATA_TX, FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139
SCOPE_ALL_LINKS = 0xFFFFFFFF
# nvmlValueType_t -> the member of nvmlValue_t that holds it
VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                 6: "usVal"}


class NvmlError(TracerError):
    """An NVML call failed: `code` is its nvmlReturn_t, the message NVML's words."""

    def __init__(self, message: str, code: int = -1) -> None:
        super().__init__(message)
        self.code = code


class NvmlAbsent(NvmlError):
    """No library found where drivers install it."""


class NvmlMissing(NvmlError):
    """The library does not have this function (a driver older than it)."""


# -- structs (nvml.h) ---------------------------------------------------------------------------

class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):  # (its `used` leaves the driver's reserve out, as
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),  # nvidia-smi)
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


MEMORY_V2_VERSION = ctypes.sizeof(MemoryV2) | 2 << 24  # nvml.h's nvmlMemory_v2


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (_v2 and _v3 share it)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class ProcessUtilizationSample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong),
                ("smUtil", ctypes.c_uint), ("memUtil", ctypes.c_uint),
                ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


class EventData(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


class Value(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong),
                ("siVal", ctypes.c_int), ("usVal", ctypes.c_ushort)]


class FieldValue(ctypes.Structure):
    _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32),
                ("timestamp", ctypes.c_int64), ("latencyUsec", ctypes.c_int64),
                ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", Value)]


class GpmMetricInfo(ctypes.Structure):
    _fields_ = [("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p),
                ("unit", ctypes.c_char_p)]


class GpmMetric(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", ctypes.c_double), ("metricInfo", GpmMetricInfo)]


class GpmMetricsGet(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint),
                ("sample1", ctypes.c_void_p), ("sample2", ctypes.c_void_p),
                ("metrics", GpmMetric * GPM_METRIC_MAX)]


class GpmSupport(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


STRUCTS = {"c_nvmlMemory_t": Memory, "c_nvmlMemory_v2_t": MemoryV2,
           "c_nvmlUtilization_t": Utilization,
           "c_nvmlProcessInfo_v3_t": ProcessInfo,
           "c_nvmlProcessUtilizationSample_t": ProcessUtilizationSample,
           "c_nvmlEventData_t": EventData, "c_nvmlGpmMetric_t": GpmMetric,
           "c_nvmlGpmMetricsGet_t": GpmMetricsGet, "c_nvmlGpmSupport_t": GpmSupport,
           "c_nvmlValue_t": Value, "c_nvmlFieldValue_t": FieldValue}
# (the name each has in nvidia-ml-py, the test's oracle)


class Event(NamedTuple):
    """One NVML event: the device's handle, its type (EVENT_*), its data (the Xid code)."""
    handle: int
    type: int
    data: int
    gpu_instance: int
    compute_instance: int


def _load(path: Optional[str]) -> Tuple[ctypes.CDLL, str]:
    """The library at `path`, or as the loader finds it, or in the drivers' folders."""
    tried = [path] if path else [SONAME] + [os.path.join(f, SONAME) for f in FOLDERS]
    errors = []
    for candidate in tried:
        if candidate != SONAME and not os.path.exists(candidate):
            continue
        try:
            return ctypes.CDLL(candidate), candidate
        except OSError as err:
            errors.append(str(err))
    if path:
        raise NvmlError("cannot load %s: %s" % (path, errors[0] if errors else "no such file"))
    raise NvmlAbsent("no %s (no NVIDIA driver on this host; --nvml PATH names one)" % SONAME)


class Nvml:
    """One loaded library: `Nvml(path).init()`, then the calls below by device handle."""

    def __init__(self, path: Optional[str] = None) -> None:
        self.lib, self.path = _load(path)
        self._functions: Dict[str, object] = {}

    def has(self, name: str) -> bool:
        try:
            self._function(name)
            return True
        except NvmlMissing:
            return False

    def _function(self, name: str):
        fn = self._functions.get(name)
        if fn is None:
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                raise NvmlMissing("%s is not in %s (an older driver)" % (name, self.path)) \
                    from None
            fn.restype = ctypes.c_int
            self._functions[name] = fn
        return fn

    def error_string(self, code: int) -> str:
        try:
            fn = self._function("nvmlErrorString")
        except NvmlMissing:
            return "NVML error %d" % code
        fn.restype = ctypes.c_char_p
        text = fn(code)
        return text.decode(errors="replace") if text else "NVML error %d" % code

    def call(self, name: str, *args) -> int:
        """`name(*args)`; NvmlError on a failure other than INSUFFICIENT_SIZE and TIMEOUT
        (the two that callers handle), which are returned."""
        code = self._function(name)(*args)
        if code not in (SUCCESS, ERROR_INSUFFICIENT_SIZE, ERROR_TIMEOUT):
            raise NvmlError("%s: %s" % (name, self.error_string(code)), code)
        return code

    # -- the library and its devices -------------------------------------------------------

    def init(self) -> None:
        self.call("nvmlInit_v2")

    def shutdown(self) -> None:
        self.call("nvmlShutdown")

    def device_count(self) -> int:
        count = ctypes.c_uint()
        self.call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        return count.value

    def handle(self, index: int) -> int:
        handle = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        return handle.value or 0

    def _text(self, name: str, handle: int) -> str:
        buf = ctypes.create_string_buffer(BUFFER_SIZE)
        self.call(name, ctypes.c_void_p(handle), buf, ctypes.c_uint(BUFFER_SIZE))
        return buf.value.decode(errors="replace")

    def name(self, handle: int) -> str:
        return self._text("nvmlDeviceGetName", handle)

    def uuid(self, handle: int) -> str:
        return self._text("nvmlDeviceGetUUID", handle)

    def _uint(self, name: str, handle: int, *args, kind=ctypes.c_uint) -> int:
        value = kind()
        self.call(name, ctypes.c_void_p(handle), *args, ctypes.byref(value))
        return value.value

    # -- a device's state ------------------------------------------------------------------

    def utilization(self, handle: int) -> Tuple[int, int]:
        """(SM %, memory %) over the driver's last sample period."""
        rates = Utilization()
        self.call("nvmlDeviceGetUtilizationRates", ctypes.c_void_p(handle), ctypes.byref(rates))
        return rates.gpu, rates.memory

    def memory(self, handle: int) -> Tuple[int, int]:
        """(used, total) bytes of the device's memory: used as nvidia-smi shows it (v2, the
        driver's reserve left out), else as the older call counts it."""
        if self.has("nvmlDeviceGetMemoryInfo_v2"):
            info2 = MemoryV2(version=MEMORY_V2_VERSION)
            self.call("nvmlDeviceGetMemoryInfo_v2", ctypes.c_void_p(handle),
                      ctypes.byref(info2))
            return info2.used, info2.total
        info = Memory()
        self.call("nvmlDeviceGetMemoryInfo", ctypes.c_void_p(handle), ctypes.byref(info))
        return info.used, info.total

    def power_mw(self, handle: int) -> int:
        return self._uint("nvmlDeviceGetPowerUsage", handle)

    def temperature(self, handle: int) -> int:
        return self._uint("nvmlDeviceGetTemperature", handle, ctypes.c_int(TEMPERATURE_GPU))

    def clock(self, handle: int, which: int) -> int:
        return self._uint("nvmlDeviceGetClockInfo", handle, ctypes.c_int(which))

    def clock_reasons(self, handle: int) -> int:
        """The clock-event (throttle) reasons mask; the older name where the newer is not."""
        name = "nvmlDeviceGetCurrentClocksEventReasons"
        if not self.has(name):
            name = "nvmlDeviceGetCurrentClocksThrottleReasons"
        return self._uint(name, handle, kind=ctypes.c_ulonglong)

    def pcie(self, handle: int) -> Tuple[int, int]:
        """(TX, RX) KB/s over the last 20 ms."""
        return (self._uint("nvmlDeviceGetPcieThroughput", handle, ctypes.c_int(PCIE_UTIL_TX_BYTES)),
                self._uint("nvmlDeviceGetPcieThroughput", handle, ctypes.c_int(PCIE_UTIL_RX_BYTES)))

    def field_values(self, handle: int, ids: Sequence[int],
                     scope: int = 0) -> List[Tuple[int, float]]:
        """(CPU time in µs, value) of each field, in the order asked; NvmlError when a field
        failed (its own nvmlReturn: NOT_SUPPORTED on a device without it)."""
        values = (FieldValue * len(ids))()
        for value, field in zip(values, ids):
            value.fieldId, value.scopeId = field, scope
        self.call("nvmlDeviceGetFieldValues", ctypes.c_void_p(handle), ctypes.c_int(len(ids)),
                  values)
        for value in values:
            if value.nvmlReturn != SUCCESS:
                raise NvmlError("nvmlDeviceGetFieldValues (field %d): %s" % (
                    value.fieldId, self.error_string(value.nvmlReturn)), value.nvmlReturn)
        return [(value.timestamp, getattr(value.value, VALUE_MEMBERS.get(
            value.valueType, "ullVal"))) for value in values]

    def nvlink_kib(self, handle: int) -> Tuple[int, int, int]:
        """(CPU time in µs, TX KiB, RX KiB): the data sent and received over all the device's
        NVLinks since the driver loaded."""
        (ts, tx), (_, rx) = self.field_values(handle, (
            FI_DEV_NVLINK_THROUGHPUT_DATA_TX, FI_DEV_NVLINK_THROUGHPUT_DATA_RX), SCOPE_ALL_LINKS)
        return int(ts), int(tx), int(rx)

    def ecc(self, handle: int) -> Tuple[int, int]:
        """(corrected, uncorrected) volatile ECC error counts."""
        return tuple(self._uint("nvmlDeviceGetTotalEccErrors", handle, ctypes.c_int(kind),
                                ctypes.c_int(VOLATILE_ECC), kind=ctypes.c_ulonglong)
                     for kind in (MEMORY_ERROR_TYPE_CORRECTED, MEMORY_ERROR_TYPE_UNCORRECTED))

    def mig_mode(self, handle: int) -> bool:
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        self.call("nvmlDeviceGetMigMode", ctypes.c_void_p(handle), ctypes.byref(current),
                  ctypes.byref(pending))
        return current.value == 1

    def mig_devices(self, handle: int) -> List[Tuple[int, str, str]]:
        """(GPU instance id, name, UUID) of each MIG device of a GPU in MIG mode."""
        found = []
        for index in range(self._uint("nvmlDeviceGetMaxMigDeviceCount", handle)):
            mig = ctypes.c_void_p()
            try:
                self.call("nvmlDeviceGetMigDeviceHandleByIndex", ctypes.c_void_p(handle),
                          ctypes.c_uint(index), ctypes.byref(mig))
            except NvmlError as err:
                if err.code == ERROR_NOT_FOUND:  # (an empty slot)
                    continue
                raise
            found.append((self._uint("nvmlDeviceGetGpuInstanceId", mig.value or 0),
                          self.name(mig.value or 0), self.uuid(mig.value or 0)))
        return found

    # -- its processes ---------------------------------------------------------------------

    def processes(self, handle: int) -> List[ProcessInfo]:
        """The compute processes on the device, with their memory (host pids)."""
        fn = "nvmlDeviceGetComputeRunningProcesses_v3"
        count = ctypes.c_uint(0)
        if self.call(fn, ctypes.c_void_p(handle), ctypes.byref(count), None) == SUCCESS:
            return []
        for _ in range(4):  # (processes may come between the two calls)
            count.value = count.value * 2 + 4
            infos = (ProcessInfo * count.value)()
            if self.call(fn, ctypes.c_void_p(handle), ctypes.byref(count), infos) == SUCCESS:
                return list(infos[:count.value])
        return []

    def process_utilization(self, handle: int, since_us: int) -> List[ProcessUtilizationSample]:
        """The per-process SM/memory samples the driver took since `since_us`."""
        fn = "nvmlDeviceGetProcessUtilization"
        count = ctypes.c_uint(0)
        for _ in range(4):
            samples = (ProcessUtilizationSample * count.value)() if count.value else None
            try:
                code = self.call(fn, ctypes.c_void_p(handle), samples, ctypes.byref(count),
                                 ctypes.c_ulonglong(since_us))
            except NvmlError as err:
                if err.code == ERROR_NOT_FOUND:
                    return []
                raise
            if code == SUCCESS:
                return list(samples[:count.value]) if samples is not None else []
        return []

    # -- GPM (Hopper and newer) --------------------------------------------------------------

    def gpm_supported(self, handle: int) -> bool:
        support = GpmSupport(version=GPM_SUPPORT_VERSION)
        self.call("nvmlGpmQueryDeviceSupport", ctypes.c_void_p(handle), ctypes.byref(support))
        return bool(support.isSupportedDevice)

    def gpm_alloc(self) -> int:
        sample = ctypes.c_void_p()
        self.call("nvmlGpmSampleAlloc", ctypes.byref(sample))
        return sample.value or 0

    def gpm_sample(self, handle: int, sample: int) -> None:
        self.call("nvmlGpmSampleGet", ctypes.c_void_p(handle), ctypes.c_void_p(sample))

    def gpm_metrics(self, first: int, second: int, ids: Sequence[int]) -> Dict[int, float]:
        """The metrics between two samples of one device, by id (those it could not
        compute left out)."""
        query = GpmMetricsGet(version=GPM_METRICS_GET_VERSION, numMetrics=len(ids),
                              sample1=first, sample2=second)
        for i, metric in enumerate(ids):
            query.metrics[i].metricId = metric
        self.call("nvmlGpmMetricsGet", ctypes.byref(query))
        return {query.metrics[i].metricId: query.metrics[i].value for i in range(len(ids))
                if query.metrics[i].nvmlReturn == SUCCESS}

    # -- events ------------------------------------------------------------------------------

    def event_set(self) -> int:
        event_set = ctypes.c_void_p()
        self.call("nvmlEventSetCreate", ctypes.byref(event_set))
        return event_set.value or 0

    def supported_events(self, handle: int) -> int:
        return self._uint("nvmlDeviceGetSupportedEventTypes", handle, kind=ctypes.c_ulonglong)

    def register_events(self, handle: int, mask: int, event_set: int) -> None:
        self.call("nvmlDeviceRegisterEvents", ctypes.c_void_p(handle), ctypes.c_ulonglong(mask),
                  ctypes.c_void_p(event_set))

    def wait(self, event_set: int, timeout_ms: int) -> Optional[Event]:
        """The next event, or None when `timeout_ms` passed without one."""
        data = EventData()
        code = self.call("nvmlEventSetWait_v2", ctypes.c_void_p(event_set), ctypes.byref(data),
                         ctypes.c_uint(timeout_ms))
        if code != SUCCESS:
            return None
        return Event(data.device or 0, data.eventType, data.eventData, data.gpuInstanceId,
                     data.computeInstanceId)
