"""GPU state beside a real trace (issue 37): the stand-in runtime's driver program traced
with the stand-in NVML (tests/fakenvml.py) scripting two devices, the program as a process on
device 0, an Xid between two launches; every output carries exactly the scripted samples and
events, at the right calls. What cannot be sampled is one line, and the trace completes."""
import json
import os
import re
import shutil

import pytest

from fakenvml import DEVICES, H100, UUID0, UUID1, build_fake_nvml, script
from helpers import cli_env, run_cli

pytestmark = pytest.mark.kernel

PROCESS_MEMORY = 300 << 20
LAUNCH = "launch:1:1"
SCRIPTED = {  # device 0's sample values, as the script gives them
    "gpu_util": 75, "mem_util": 30, "mem_used": 20 << 30, "mem_total": 80 << 30,
    "power_w": 350.0, "temperature_c": 61, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
    "clock_reasons": 4, "pcie_tx_kbs": 1200, "pcie_rx_kbs": 3400, "ecc_corrected": 2,
    "ecc_uncorrected": 0, "gr_engine_active": 81.0, "sm_active": 64.0, "sm_occupancy": 37.0,
    "tensor_active": 22.0, "dram_active": 48.0,
    "nvlink_tx_kbs": 25000000, "nvlink_rx_kbs": 12000000}
# Between two rounds (GPM's metrics, NVLink's counters' rates): the first sample has none
BETWEEN = ("gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
           "nvlink_tx_kbs", "nvlink_rx_kbs")
NO_NVLINK = ("GPU state: NVLink throughput of device 1 not sampled: nvmlDeviceGetFieldValues "
             "(field 138): Not Supported")


@pytest.fixture
def gpu_prog(prog, tmp_path):
    """The driver program under a name of its own (the stand-in lists processes by name:
    other runs of the driver program on this host must not count)."""
    name = "nvml%d" % (os.getpid() % 10**6)
    copy = tmp_path / name
    shutil.copy(prog, copy)
    return copy, name


def nvml_env(cc, tmp_path, text: str, *omit: str):
    folder = build_fake_nvml(cc, *omit)
    path = script(tmp_path / "nvml.script", text)
    return str(folder / "libnvidia-ml.so.1"), cli_env(FAKENVML_SCRIPT=str(path))


def scripted(name: str, xid_ms: int = 1000) -> str:
    return DEVICES + "proc 0 comm=%s mem=%d sm=40 memutil=10\nxid 0 after_ms=%d code=79\n" % (
        name, PROCESS_MEMORY, xid_ms)


def traced_json(cc, lib, tmp_path, gpu_prog, *options, text=None):
    prog, name = gpu_prog
    nvml, env = nvml_env(cc, tmp_path, text or scripted(name))
    done = run_cli("--json", "-p", lib, "--nvml", nvml, "--gpu-samples", "20", *options, "--",
                   prog, "malloc:1048576", "malloc:2097152", LAUNCH, "sleep:2500", LAUNCH,
                   "free:@0", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    objects = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done, objects


@pytest.mark.parametrize("spool", [(), ("--spool-size", "0")], ids=["spooled", "inline"])
def test_json_lines_carry_the_scripted_samples_and_the_xid_after_its_launch(
        root, cc, lib, tmp_path, gpu_prog, spool):
    done, objects = traced_json(cc, lib, tmp_path, gpu_prog, *spool)
    calls = [o for o in objects if "api" in o]
    samples = [o for o in objects if o.get("type") == "gpu_sample"]
    events = [o for o in objects if o.get("type") == "gpu_event"]
    pid = calls[0]["pid"]
    # (everything sampled but device 1's NVLink: it has none)
    assert [l for l in done.stderr.splitlines() if "GPU state" in l] == [
        "ebpf-cuda: " + NO_NVLINK], done.stderr
    first = [s for s in samples if s["device"] == 0]
    second = [s for s in samples if s["device"] == 1]
    assert len(first) == len(second) >= 40  # 20 a second over 2.5 s and more
    assert [{k: s.get(k) for k in SCRIPTED} for s in first[1:]] == [SCRIPTED] * (len(first) - 1)
    assert {k: v for k, v in first[0].items() if k in SCRIPTED} == {
        k: v for k, v in SCRIPTED.items() if k not in BETWEEN}
    assert {(s["name"], s["uuid"]) for s in first} == {(H100, UUID0)}
    assert all(s["uuid"] == UUID1 and s["power_w"] == 90.0 and "sm_active" not in s
               and "nvlink_tx_kbs" not in s and "nvlink_rx_kbs" not in s for s in second)
    launches = [c for c in calls if c["api"] == "cudaLaunchKernel"]
    # (samples of the program's sleep: a round stamped before its last calls may list the
    # processes after it exited, on a loaded machine)
    during = [s for s in first if launches[1]["ts"] < s["ts"] < launches[2]["ts"] - 0.5]
    assert during and all(s["processes"] == [{"pid": pid, "memory": PROCESS_MEMORY,
                                               "sm_util": 40, "mem_util": 10}] for s in during)
    (xid,) = events
    assert (xid["device"], xid["uuid"], xid["kind"], xid["code"], xid["meaning"]) == (
        0, UUID0, "xid", 79, "GPU has fallen off the bus")
    assert launches[1]["ts"] < xid["ts"] < launches[2]["ts"]  # (enter, exit, enter, exit)
    assert [(l["pid"], l["api"], l["kernel"]) for l in xid["last_launches"]] == [
        (pid, "cudaLaunchKernel", "vec_add_kernel")]
    assert xid["last_launches"][0]["ts"] == pytest.approx(launches[0]["ts"], abs=1e-6)
    _among_the_calls(objects)


def _among_the_calls(objects: list) -> None:
    """The GPU's records written among the calls, not at the end: the Xid and the samples of
    the sleep between the two launches' lines; every record in time order."""
    launches = [o for o in objects if o.get("api") == "cudaLaunchKernel"]
    samples = [o for o in objects if o.get("type") == "gpu_sample"]
    (xid,) = [o for o in objects if o.get("type") == "gpu_event"]
    at = {id(o): i for i, o in enumerate(objects)}
    assert at[id(launches[1])] < at[id(xid)] < at[id(launches[2])]
    sleeping = [s for s in samples if launches[1]["ts"] + 0.1 < s["ts"] < launches[2]["ts"] - 0.1]
    assert len(sleeping) >= 2 * 30  # (2 devices at 20 Hz, ~2.3 s)
    assert all(at[id(launches[1])] < at[id(s)] < at[id(launches[2])] for s in sleeping)
    records = [o["ts_ns"] for o in objects if "type" in o]
    assert records == sorted(records)


def test_text_lines_show_the_xid_between_the_calls_around_it(root, cc, lib, tmp_path, gpu_prog):
    prog, name = gpu_prog
    nvml, env = nvml_env(cc, tmp_path, scripted(name))
    done = run_cli("-p", lib, "--nvml", nvml, "--gpu-samples", "20", "--", prog, LAUNCH,
                   "sleep:2500", LAUNCH, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [l for l in done.stdout.splitlines() if "cudaLaunchKernel" in l and (
        "[ENTER]" in l or "[EXIT]" in l) or "[GPU EVENT]" in l]  # (not the program's own)
    assert [("EVENT" if "[GPU EVENT]" in l else "ENTER" if "[ENTER]" in l else "EXIT")
            for l in lines] == ["ENTER", "EXIT", "EVENT", "ENTER", "EXIT"], lines
    clock, text = lines[2].split(" ", 1)  # (the time of day, as the calls' lines have)
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{6}", clock), lines
    assert text.startswith("[GPU EVENT] GPU 0 Xid 79: GPU has fallen off the bus; last "
                           "launches: cudaLaunchKernel vec_add_kernel pid "), lines


def test_a_missing_function_an_unsupported_one_and_no_gpu_are_one_line_each(
        root, cc, lib, tmp_path, gpu_prog):
    prog, name = gpu_prog
    text = scripted(name) + "unsupported nvmlDeviceGetPowerUsage\n"
    nvml, env = nvml_env(cc, tmp_path, text, "OMIT_GPM")
    done = run_cli("--json", "-p", lib, "--nvml", nvml, "--", prog, LAUNCH, "sleep:500",
                   env=env, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if "GPU state" in line]
    assert said == [
        "ebpf-cuda: GPU state: GPM metrics not sampled: nvmlGpmQueryDeviceSupport is not in "
        "%s (an older driver)" % nvml,
        "ebpf-cuda: GPU state: power of device 0 not sampled: nvmlDeviceGetPowerUsage: "
        "Not Supported",
        "ebpf-cuda: GPU state: power of device 1 not sampled: nvmlDeviceGetPowerUsage: "
        "Not Supported", "ebpf-cuda: " + NO_NVLINK], said
    samples = [json.loads(l) for l in done.stdout.splitlines() if '"gpu_sample"' in l]
    assert samples and all("power_w" not in s and "sm_active" not in s and s["gpu_util"] in
                           (75, 5) for s in samples)
    empty, env = nvml_env(cc, tmp_path, "")
    done = run_cli("-p", lib, "--nvml", empty, "--", prog, LAUNCH, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [l for l in done.stderr.splitlines() if "GPU" in l] == [
        "ebpf-cuda: GPU state not sampled: NVML sees no GPU"]


def test_a_blocking_call_stops_the_sampling_with_one_line_and_the_trace_completes(
        root, cc, lib, tmp_path, gpu_prog):
    prog, name = gpu_prog
    nvml, env = nvml_env(cc, tmp_path, scripted(name) + "block nvmlDeviceGetTemperature\n")
    done = run_cli("--json", "-p", lib, "--nvml", nvml, "--", prog, LAUNCH, "sleep:3000",
                   LAUNCH, env=env, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert [l for l in done.stderr.splitlines() if "GPU" in l] == [
        "ebpf-cuda: GPU state sampling stopped: an NVML call did not return in 2 s (a hung "
        "driver); the trace goes on without GPU state"]
    # (call lines only: the scripted Xid may come first, its event holding the launches
    # before it, when the event thread registered before the round that hangs took the
    # worker)
    calls = [json.loads(l) for l in done.stdout.splitlines() if l.startswith("{")]
    assert sum(1 for c in calls if "type" not in c and c.get("api") == "cudaLaunchKernel") == 4


def test_no_library_at_the_default_says_nothing_and_named_says_why(root, lib, prog, tmp_path):
    env = cli_env(LD_LIBRARY_PATH=str(tmp_path))  # (no libnvidia-ml.so.1 on this CPU host)
    if any(os.path.exists(os.path.join(f, "libnvidia-ml.so.1")) for f in
           ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")):
        pytest.skip("this host has an NVIDIA driver")
    done = run_cli("-p", lib, "--", prog, LAUNCH, env=env)
    assert done.returncode == 0 and "GPU" not in done.stderr, done.stderr
    done = run_cli("-p", lib, "--gpu-samples", "5", "--", prog, LAUNCH, env=env)
    assert done.returncode == 0, done.stderr
    assert [l for l in done.stderr.splitlines() if "GPU" in l] == [
        "ebpf-cuda: GPU state not sampled: no libnvidia-ml.so.1 (no NVIDIA driver on this host; "
        "--nvml PATH names one)"]


def test_every_output_carries_the_samples_the_gap_and_the_xid(root, cc, lib, tmp_path, gpu_prog):
    """One trace, every output: JSON lines, the summary, the saved trace (and `report` of it),
    the Perfetto timeline and the HTML report agree on the scripted samples and the Xid; the
    memory gap while 3 MiB are live is the scripted 300 MiB less those 3 MiB."""
    out, saved, timeline, page = (tmp_path / n for n in ("calls.json", "run.ebpfcuda",
                                                          "trace.json", "report.html"))
    done, _ = traced_json(cc, lib, tmp_path, gpu_prog, "-o", out, "--summary", "--save", saved,
                          "--trace-out", timeline, "--report", page)
    objects = [json.loads(line) for line in out.read_text().splitlines()]
    calls = [o for o in objects if "api" in o]
    records = [o for o in objects if "type" in o]
    _among_the_calls(objects)  # (JSON beside other outputs: decoded events, not frames)
    pid = calls[0]["pid"]
    mallocs = [c for c in calls if c["api"] == "cudaMalloc" and c["phase"] == "exit"]
    free = next(c for c in calls if c["api"] == "cudaFree")
    # the summary: the device table and the gap at the peak (3 MiB live then)
    report = done.stdout
    assert " ** GPU Devices (NVML samples):" in report, report
    row0 = next(line.split() for line in report.splitlines() if line.split()[:1] == ["0"]
                and line.rstrip().endswith(H100))
    assert row0[2:9] == ["75.0", "75", "64.0", "20,480", "81,920", "350.0", row0[8]]
    assert float(row0[8]) > 2.0 and row0[9] == "1"  # throttled (0x4: power cap) throughout
    gap_row = next(line.split() for line in report.splitlines()
                   if line.split()[:2] == [str(pid), "0"])
    assert gap_row[2:] == ["300", "3", "297"]
    assert "GPU 0 Xid 79: GPU has fallen off the bus; last launches: cudaLaunchKernel " \
           "vec_add_kernel pid %d" % pid in report
    # the saved trace keeps the records; `report` gives them back
    again = run_cli("report", saved, "--json", timeout=120)
    assert again.returncode == 0, again.stderr
    replayed = [json.loads(l) for l in again.stdout.splitlines() if l.startswith("{")]
    assert [o for o in replayed if "type" in o] == records
    _among_the_calls(replayed)  # (as the live trace wrote them)
    beside = tmp_path / "again.json"  # (JSON beside a summary: decoded events)
    again = run_cli("report", saved, "--json", "-o", beside, "--summary", timeout=120)
    assert again.returncode == 0, again.stderr
    _among_the_calls([json.loads(l) for l in beside.read_text().splitlines()])
    # the timeline: counter tracks per device, the gap per traced process, the Xid marker
    trace = json.loads(timeline.read_text())
    util = [e for e in trace if e.get("name") == "GPU utilisation (%)"]
    assert {(e["pid"], e["args"]["gpu"]) for e in util} == {(1 << 24, 75), ((1 << 24) + 1, 5)}
    nvlink = [e for e in trace if e.get("name") == "GPU NVLink (KB/s)"]
    assert len(nvlink) == sum(1 for r in records if r["type"] == "gpu_sample"
                                  and r["device"] == 0) - 1
    assert {(e["pid"], e["args"]["tx"], e["args"]["rx"]) for e in nvlink} == {
        (1 << 24, 25000000, 12000000)}
    gaps = [e for e in trace if e.get("name") == "GPU 0 memory (NVML, bytes)"]
    assert gaps and all(e["pid"] == pid and e["args"]["nvml"] == PROCESS_MEMORY for e in gaps)
    between = [e["args"]["gap"] for e in gaps
               if mallocs[1]["ts"] * 1e6 < _wall_us(e, trace, calls) < free["ts"] * 1e6]
    assert between and set(between) == {PROCESS_MEMORY - (3 << 20)}
    (marker,) = [e for e in trace if e.get("cat") == "gpu event"]
    assert marker["name"] == "Xid 79" and marker["pid"] == 1 << 24
    html = page.read_text()
    figures = re.findall(r"<figure>(.*?)<figcaption>(.*?)</figcaption>", html)
    bars = {caption.split(" per ")[0]: {float(v) for v in re.findall(
        r"<title>[^<]*: ([0-9.]+)</title>", figure)} - {0.0} for figure, caption in figures}
    assert bars["GPU 0 utilisation (%, mean)"] == {75}
    assert bars["GPU 1 utilisation (%, mean)"] == {5}
    assert bars["GPU 0 memory used (bytes, mean)"] == {20 << 30}
    assert "Xid 79: GPU has fallen off the bus" in html


def _wall_us(counter: dict, trace: list, calls: list) -> float:
    """A timeline entry's time as wall-clock microseconds (the timeline's clock is the
    probes' monotonic one: the calls' slices give the offset)."""
    first = next(e for e in trace if e.get("ph") == "X" and e.get("name") == calls[0]["api"])
    return counter["ts"] - first["ts"] + calls[0]["ts"] * 1e6


def test_a_process_in_a_pid_namespace_of_its_own_is_matched_by_its_host_pid(
        root, cc, lib, tmp_path, gpu_prog):
    """The traced program in a container's PID namespace (unshare): NVML lists it by its host
    pid, which is the pid the probes report (the tracer in the host's namespace), so its
    samples and its memory gap are its own; inside, it is pid 1 or 2."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    prog, name = gpu_prog
    nvml, env = nvml_env(cc, tmp_path, scripted(name, xid_ms=60000))
    done = run_cli("--json", "--summary", "-p", lib, "--nvml", nvml, "--",
                   "unshare", "--pid", "--fork", "--mount-proc", prog, "malloc:1048576",
                   "sleep:1500", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    objects = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    pids = {o["pid"] for o in objects if o.get("api") == "cudaMalloc"}
    (pid,) = pids
    assert pid > 2  # (the host's number: inside its namespace it is 1 or 2)
    listed = {p["pid"] for o in objects if o.get("type") == "gpu_sample" for p in o["processes"]}
    assert listed == {pid}
    gap_row = next(line.split() for line in done.stderr.splitlines() + done.stdout.splitlines()
                   if line.split()[:2] == [str(pid), "0"])
    assert gap_row[2:] == ["300", "1", "299"]
