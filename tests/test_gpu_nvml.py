"""The NVML bindings (ebpf_cuda/gpu/nvml.py): their structs against nvidia-ml-py's (the
oracle of nvml.h's layouts), and every call against the stand-in library's scripted values."""
import ctypes

import pytest

from ebpf_cuda.gpu import nvml, xid
from fakenvml import DEVICES, H100, UUID0, UUID1, build_fake_nvml, script


@pytest.mark.parametrize("theirs", sorted(nvml.STRUCTS))
def test_struct_layouts_match_nvidia_ml_py(theirs):
    pynvml = pytest.importorskip("pynvml")
    ours, reference = nvml.STRUCTS[theirs], getattr(pynvml, theirs)
    assert ctypes.sizeof(ours) == ctypes.sizeof(reference)
    assert [name for name, _ in ours._fields_] == [name for name, _ in reference._fields_]
    for (name, _), (_, their_type) in zip(ours._fields_, reference._fields_):
        assert getattr(ours, name).offset == getattr(reference, name).offset, name
        assert getattr(ours, name).size == getattr(reference, name).size, name


def test_constants_match_nvidia_ml_py():
    pynvml = pytest.importorskip("pynvml")
    pairs = {"SUCCESS": "NVML_SUCCESS", "ERROR_NOT_SUPPORTED": "NVML_ERROR_NOT_SUPPORTED",
             "ERROR_NOT_FOUND": "NVML_ERROR_NOT_FOUND",
             "ERROR_INSUFFICIENT_SIZE": "NVML_ERROR_INSUFFICIENT_SIZE",
             "ERROR_TIMEOUT": "NVML_ERROR_TIMEOUT", "TEMPERATURE_GPU": "NVML_TEMPERATURE_GPU",
             "CLOCK_SM": "NVML_CLOCK_SM", "CLOCK_MEM": "NVML_CLOCK_MEM",
             "PCIE_UTIL_TX_BYTES": "NVML_PCIE_UTIL_TX_BYTES",
             "PCIE_UTIL_RX_BYTES": "NVML_PCIE_UTIL_RX_BYTES",
             "MEMORY_ERROR_TYPE_CORRECTED": "NVML_MEMORY_ERROR_TYPE_CORRECTED",
             "MEMORY_ERROR_TYPE_UNCORRECTED": "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
             "VOLATILE_ECC": "NVML_VOLATILE_ECC", "EVENT_XID": "nvmlEventTypeXidCriticalError",
             "EVENT_SINGLE_BIT_ECC": "nvmlEventTypeSingleBitEccError",
             "EVENT_DOUBLE_BIT_ECC": "nvmlEventTypeDoubleBitEccError",
             "EVENT_PSTATE": "nvmlEventTypePState", "EVENT_CLOCK": "nvmlEventTypeClock",
             "BUFFER_SIZE": "NVML_DEVICE_UUID_V2_BUFFER_SIZE",
             "GPM_METRICS_GET_VERSION": "NVML_GPM_METRICS_GET_VERSION",
             "GPM_SUPPORT_VERSION": "NVML_GPM_SUPPORT_VERSION",
             "GPM_METRIC_MAX": "NVML_GPM_METRIC_MAX", "MEMORY_V2_VERSION": "nvmlMemory_v2",
             "FI_DEV_NVLINK_THROUGHPUT_DATA_TX": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
             "FI_DEV_NVLINK_THROUGHPUT_DATA_RX": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"}
    assert {ours: getattr(nvml, ours) for ours in pairs} == \
        {ours: getattr(pynvml, theirs) for ours, theirs in pairs.items()}
    # each value type's member of the union, as nvidia-ml-py's NVML_VALUE_TYPE_* order them
    assert [nvml.VALUE_MEMBERS[getattr(pynvml, "NVML_VALUE_TYPE_" + kind)] for kind in (
        "DOUBLE", "UNSIGNED_INT", "UNSIGNED_LONG", "UNSIGNED_LONG_LONG", "SIGNED_LONG_LONG",
        "SIGNED_INT", "UNSIGNED_SHORT")] == [name for name, _ in pynvml.c_nvmlValue_t._fields_]
    from ebpf_cuda.gpu.sampler import GPM_METRICS

    assert {name: metric for metric, name in GPM_METRICS.items()} == {
        "gr_engine_active": pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
        "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
        "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        "tensor_active": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        "dram_active": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL}


@pytest.fixture
def loaded(cc, tmp_path, monkeypatch):
    folder = build_fake_nvml(cc)
    monkeypatch.setenv("FAKENVML_SCRIPT", str(script(tmp_path / "s", DEVICES)))
    lib = nvml.Nvml(str(folder / "libnvidia-ml.so.1"))
    lib.init()
    return lib


def test_every_call_reads_the_scripted_values(loaded):
    lib = loaded
    assert lib.device_count() == 2
    first, second = lib.handle(0), lib.handle(1)
    assert (lib.name(first), lib.uuid(first), lib.uuid(second)) == (H100, UUID0, UUID1)
    assert lib.utilization(first) == (75, 30) and lib.utilization(second) == (5, 1)
    assert lib.memory(first) == (20 << 30, 80 << 30)
    assert (lib.power_mw(first), lib.temperature(first)) == (350000, 61)
    assert (lib.clock(first, nvml.CLOCK_SM), lib.clock(first, nvml.CLOCK_MEM)) == (1980, 2619)
    assert lib.clock_reasons(first) == 4 and lib.clock_reasons(second) == 1
    assert lib.pcie(first) == (1200, 3400)
    assert lib.ecc(first) == (2, 0) and lib.ecc(second) == (0, 1)
    assert lib.mig_mode(first) is False and lib.mig_devices(first) == []
    assert lib.mig_mode(second) is True
    assert lib.mig_devices(second) == [(1, H100 + "-MIG-1g.10gb", "MIG-" + UUID1)]
    assert lib.gpm_supported(first) and not lib.gpm_supported(second)
    one, two = lib.gpm_alloc(), lib.gpm_alloc()
    lib.gpm_sample(first, one)
    lib.gpm_sample(first, two)
    assert lib.gpm_metrics(one, two, [1, 2, 3, 5, 10, 99]) == {1: 81.0, 2: 64.0, 3: 37.0,
                                                              5: 22.0, 10: 48.0}
    assert lib.processes(first) == [] and lib.process_utilization(first, 0) == []


def test_nvlink_counters_of_all_links_and_a_device_without_nvlink(loaded):
    """The stand-in's counters grow at the scripted KiB/s over all links (the scope that
    sums them; link 0's alone is refused); device 1 has no NVLink: its field's own return."""
    import time

    lib = loaded
    first, second = lib.handle(0), lib.handle(1)
    ts0, tx0, rx0 = lib.nvlink_kib(first)
    time.sleep(0.05)
    ts1, tx1, rx1 = lib.nvlink_kib(first)
    assert ts1 - ts0 >= 50000 and ts1 % 1000 == ts0 % 1000
    assert ((tx1 - tx0) * 10 ** 6 // (ts1 - ts0), (rx1 - rx0) * 10 ** 6 // (ts1 - ts0)) == (
        25000000, 12000000)
    with pytest.raises(nvml.NvmlError, match=r"\(field 138\): Not Supported") as err:
        lib.nvlink_kib(second)
    assert err.value.code == nvml.ERROR_NOT_SUPPORTED
    with pytest.raises(nvml.NvmlError, match="Invalid Argument"):
        lib.field_values(first, [nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX], scope=0)


def test_the_sampler_gives_nvlink_rates_from_the_second_round(cc, tmp_path, monkeypatch):
    """NVML gives counters: the first round has no NVLink keys, the next the scripted rates
    (KB/s, as PCIe's); device 1, without NVLink, none, said once."""
    import time

    from ebpf_cuda.gpu.sampler import Sampler

    folder = build_fake_nvml(cc)
    monkeypatch.setenv("FAKENVML_SCRIPT", str(script(tmp_path / "s", DEVICES)))
    sampler = Sampler(0, str(folder / "libnvidia-ml.so.1"), events=False)
    assert sampler.start()
    deadline = time.monotonic() + 10
    while not sampler.devices and time.monotonic() < deadline:
        time.sleep(0.02)
    rounds = []
    for _ in range(3):
        rounds.append(sampler.sample_now())
        time.sleep(0.03)
    sampler.stop()
    keys = ("nvlink_tx_kbs", "nvlink_rx_kbs")
    assert [[{k: s.values[k] for k in keys if k in s.values} for s in r] for r in rounds] == [
        [{}, {}]] + [[{"nvlink_tx_kbs": 25000000, "nvlink_rx_kbs": 12000000}, {}]] * 2
    assert sampler.lines == ["GPU state: NVLink throughput of device 1 not sampled: "
                             "nvmlDeviceGetFieldValues (field 138): Not Supported"]


def test_a_scripted_xid_is_an_event_of_its_device(cc, tmp_path, monkeypatch):
    folder = build_fake_nvml(cc)
    monkeypatch.setenv("FAKENVML_SCRIPT", str(script(
        tmp_path / "s", DEVICES + "xid 1 after_ms=50 code=79\n")))
    lib = nvml.Nvml(str(folder / "libnvidia-ml.so.1"))
    lib.init()
    events = lib.event_set()
    for index in range(2):
        handle = lib.handle(index)
        lib.register_events(handle, lib.supported_events(handle), events)
    assert lib.wait(events, 10) is None  # (not yet)
    event = lib.wait(events, 2000)
    assert (event.handle, event.type, event.data) == (lib.handle(1), nvml.EVENT_XID, 79)
    assert xid.meaning(79) == "GPU has fallen off the bus"
    assert xid.meaning(12345) == "Xid 12345 (not in the catalogue)"


def test_a_missing_function_and_an_unsupported_one(cc, tmp_path, monkeypatch):
    folder = build_fake_nvml(cc, "OMIT_GPM")
    monkeypatch.setenv("FAKENVML_SCRIPT", str(script(
        tmp_path / "s", DEVICES + "unsupported nvmlDeviceGetPowerUsage\n")))
    lib = nvml.Nvml(str(folder / "libnvidia-ml.so.1"))
    lib.init()
    with pytest.raises(nvml.NvmlMissing, match="nvmlGpmQueryDeviceSupport is not in"):
        lib.gpm_supported(lib.handle(0))
    with pytest.raises(nvml.NvmlError, match="nvmlDeviceGetPowerUsage: Not Supported") as err:
        lib.power_mw(lib.handle(0))
    assert err.value.code == nvml.ERROR_NOT_SUPPORTED


def test_no_library_is_one_sentence(tmp_path):
    with pytest.raises(nvml.NvmlError, match="cannot load %s" % tmp_path):
        nvml.Nvml(str(tmp_path / "libnvidia-ml.so.1"))


def test_the_gpu_script_passes_a_consistent_run_and_fails_a_wrong_one(tmp_path, capsys):
    """scripts/gpu/nvml_check.py's checks on a hand-made run (the GPU host runs it for real):
    each comparison passes on consistent numbers and fails when one is off."""
    import json
    import sys
    from collections import Counter
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "gpu"))
    import gpucheck
    import nvml_check

    mib, pid, t0 = 1 << 20, 77, 1000.0
    phases = {"busy1_start": t0, "sleep_start": t0 + 4, "sleep_end": t0 + 7, "busy2_end": t0 + 11}
    known = {"pid": pid, "phases": phases, "reserved": 64 * mib, "allocated": 10 * mib,
             "smi_used": 2000 * mib, "smi_at": t0 + 4.05, "capability": [9, 0], "name": "H100",
             "steps": 100}

    def run(util_in_sleep: int, nvml_memory: int) -> Counter:
        calls = [{"ts": t0 + 0.1, "pid": pid, "phase": "exit", "api": "cudaMalloc",
                  "args": {"size": 64 * mib}, "ptr": 0x7f00, "ret": 0}]
        calls += [{"ts": t, "pid": pid, "phase": "exit", "api": "cudaLaunchKernel",
                   "args": {}, "ret": 0} for t in (t0 + 3.99, t0 + 7.01)]
        samples = [{"type": "gpu_sample", "device": 0, "ts": t0 + i / 10,
                    "gpu_util": util_in_sleep if 4.2 < i / 10 <= 7.05 else 95, "sm_active": 60.0,
                    "mem_used": 2010 * mib, "processes": [{"pid": pid, "memory": nvml_memory}]}
                   for i in range(111)]
        (tmp_path / "target.json").write_text(json.dumps(known))
        (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps(o) for o in calls + samples))
        verdicts = gpucheck.Verdicts("nvml")
        nvml_check.check_run(verdicts, str(tmp_path), " %d  0  564  64  500\n" % pid)
        return verdicts.counts

    assert run(0, 564 * mib) == Counter(PASS=8)
    assert run(40, 64 * mib) == Counter(PASS=6, FAIL=2)  # a busy sleep, no gap
    capsys.readouterr()


def test_a_hung_init_is_one_line_within_the_timeout(cc, tmp_path, monkeypatch):
    """nvmlInit_v2 that never returns: start() gives up after the timeout, says why once."""
    import time

    from ebpf_cuda.gpu.sampler import Sampler

    folder = build_fake_nvml(cc)
    monkeypatch.setenv("FAKENVML_SCRIPT", str(script(tmp_path / "s",
                                                     DEVICES + "block nvmlInit_v2\n")))
    said = []
    sampler = Sampler(0.1, str(folder / "libnvidia-ml.so.1"), notice=said.append,
                      timeout_s=0.5)
    started = time.monotonic()
    assert sampler.start() is True  # (the library loads; its initialisation hangs)
    assert time.monotonic() - started < 0.5
    while sampler.stopped is None and time.monotonic() - started < 10:
        time.sleep(0.05)
    assert 0.5 <= time.monotonic() - started < 2
    assert said == ["GPU state not sampled: an NVML call did not return in 0.5 s (a hung "
                    "driver); the trace goes on without GPU state"]
    assert sampler.sample_now() == [] and sampler.samples == []
    sampler.stop()


def test_the_gap_and_the_device_table_from_made_up_records():
    """analysis/gpu.py on its own: live allocations over time (each allocation once across
    the layers), the gap at every sample and at the peak, throttled time, a record's JSON
    read back."""
    from ebpf_cuda.analysis.gpu import GpuState
    from ebpf_cuda.gpu.records import GpuSample, ProcessState, from_json
    from helpers import event

    state = GpuState()
    mib, ms = 1 << 20, 10 ** 6
    state.write([event("cudaMalloc", args={"size": 4 * mib}, ts_ns=100 * ms, pid=5, ret=0,
                       outs={"ptr": 0x1000}),
                 event("cudaMalloc", args={"size": 2 * mib}, ts_ns=300 * ms, pid=5, ret=0,
                       outs={"ptr": 0x2000}),
                 event("cudaFree", args={"ptr": 0x1000}, ts_ns=500 * ms, pid=5, ret=0)])

    def sample(ts_ns, memory, reasons):
        return GpuSample(ts_ns / 1e9, ts_ns, 0, "GPU", "GPU-0",
                         {"gpu_util": 50, "mem_used": 9 * mib, "clock_reasons": reasons},
                         [ProcessState(5, memory), ProcessState(6, 1)])

    samples = [sample(50 * ms, 10 * mib, 0x4), sample(200 * ms, 20 * mib, 0x1),
               sample(400 * ms, 20 * mib, 0), sample(600 * ms, 12 * mib, 0)]
    state.note_gpu(samples)
    assert [(g.nvml // mib, g.live // mib, g.gap // mib) for g in state.gaps()] == [
        (10, 0, 10), (20, 4, 16), (20, 6, 14), (12, 2, 10)]  # (pid 6 was not traced)
    (peak,) = state.peak_gaps()
    assert (peak.ts_ns, peak.gap) == (400 * ms, 14 * mib)
    row = state.device_table().splitlines()[-1].split()
    # (throttled: 0x4, the power cap, from the first sample to the next)
    assert row[:4] == ["0", "4", "50.0", "50"] and row[8] == "0.15"
    assert [from_json(s.to_json()) for s in samples] == samples


def test_the_sampler_names_a_process_on_a_mig_device(cc, tmp_path, monkeypatch):
    """This process, scripted on device 1 (in MIG mode): its sample names its MIG device."""
    import os
    import time

    from ebpf_cuda.gpu.sampler import Sampler

    comm = open("/proc/self/comm").read().strip()
    folder = build_fake_nvml(cc)
    monkeypatch.setenv("FAKENVML_SCRIPT", str(script(
        tmp_path / "s", DEVICES + "proc 1 comm=%s mem=4096 sm=7 memutil=3\n" % comm)))
    sampler = Sampler(0, str(folder / "libnvidia-ml.so.1"), events=False)
    assert sampler.start()
    deadline = time.monotonic() + 10
    while not sampler.devices and time.monotonic() < deadline:
        time.sleep(0.02)
    samples = sampler.sample_now()
    sampler.stop()
    assert [(s.device, s.mig) for s in samples] == [(0, False), (1, True)]
    mine = samples[1].process(os.getpid())
    assert mine.to_json() == {"pid": os.getpid(), "memory": 4096, "sm_util": 7, "mem_util": 3,
                              "gpu_instance": 1, "mig": H100 + "-MIG-1g.10gb"}
    assert samples[0].processes == [] and sampler.lines == [
        "GPU state: NVLink throughput of device 1 not sampled: nvmlDeviceGetFieldValues "
        "(field 138): Not Supported"]
