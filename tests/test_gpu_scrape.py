"""The monitor's GPU part (monitor/dcgm.GpuState, issue 37's follow-up): NVML is sampled on the
sampler's thread at its period, and a scrape serves the last round with its age, calling no
NVML function. The stand-in counts every call made to it (`fakenvml_calls`) and, here, makes
each one slow (FAKENVML_DELAY_US), as a real driver's round was (50 ms on an H100, D35)."""
import ctypes
import time

from ebpf_cuda.monitor.dcgm import GpuState
from fakenvml import DEVICES, UUID0, UUID1, build_fake_nvml, script

DELAY_US = 20000  # each NVML call 20 ms: a round of two devices takes ~1 s


def _values(families, name):
    (family,) = [f for f in families if f.name == name]
    return {dict(labels)["gpu"]: value for labels, value in family.samples}


def _wait(what, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "waited %g s" % seconds
        time.sleep(0.02)


def test_a_scrape_serves_the_last_round_with_its_age_and_calls_no_nvml(
        cc, tmp_path, monkeypatch):
    library = build_fake_nvml(cc) / "libnvidia-ml.so.1"
    monkeypatch.setenv("FAKENVML_SCRIPT", str(script(tmp_path / "s", DEVICES)))
    monkeypatch.setenv("FAKENVML_DELAY_US", str(DELAY_US))
    # (the same path: the loader hands back the library the sampler loads, one counter)
    calls = ctypes.c_ulong.in_dll(ctypes.CDLL(str(library)), "fakenvml_calls")
    state = GpuState(3600.0, str(library))  # one round at the start, the next in an hour
    assert state.families(lambda pid: ()) == []  # (no round yet: nothing served)
    assert state.start()
    try:
        sampler = state.sampler
        _wait(lambda: sampler.rounds == 1)
        made = calls.value
        assert made > 0  # (the round's calls were counted)
        latest = sampler.latest
        ages = []
        for _ in range(5):
            before = time.monotonic_ns()
            families = state.families(lambda pid: (("pid", str(pid)),))
            after = time.monotonic_ns()
            age = _values(families, "ebpf_cuda_gpu_sample_age_seconds")
            for sample in latest:  # the age is the served sample's, taken at the scrape
                assert (before - sample.ts_ns) / 1e9 <= age[str(sample.device)] <= \
                    (after - sample.ts_ns) / 1e9
            ages.append(age["0"])
            assert _values(families, "DCGM_FI_DEV_GPU_UTIL") == {"0": 75, "1": 5}
            assert _values(families, "DCGM_FI_DEV_POWER_USAGE") == {"0": 350, "1": 90}
            time.sleep(DELAY_US / 1e6)
        assert calls.value == made  # five scrapes, not one NVML call
        assert sampler.rounds == 1 and sampler.latest is latest
        assert ages == sorted(ages) and ages[0] < ages[-1]
        (family,) = [f for f in families if f.name == "ebpf_cuda_gpu_sample_age_seconds"]
        assert [dict(labels)["UUID"] for labels, _ in family.samples] == [UUID0, UUID1]
        assert sampler.samples == [] and sampler.events == []  # (the monitor keeps none)
    finally:
        state.close()


def test_the_sampler_thread_takes_rounds_at_its_period_and_the_scrape_the_latest(
        cc, tmp_path, monkeypatch):
    """At 20 Hz, rounds follow one another; each scrape serves whichever round is the
    latest then (its device timestamps, not a new one's), so consecutive scrapes' ages fall
    back as new rounds come."""
    library = build_fake_nvml(cc) / "libnvidia-ml.so.1"
    monkeypatch.setenv("FAKENVML_SCRIPT", str(script(tmp_path / "s", DEVICES)))
    state = GpuState(0.05, str(library))
    assert state.start()
    try:
        sampler = state.sampler
        _wait(lambda: sampler.rounds >= 1)
        served = set()
        deadline = time.monotonic() + 20
        while len(served) < 3 and time.monotonic() < deadline:
            latest = sampler.latest
            now = time.monotonic_ns()
            age = _values(state.families(lambda pid: ()), "ebpf_cuda_gpu_sample_age_seconds")
            # (a round may land between the two reads: then the newer one is served)
            assert age["0"] <= (time.monotonic_ns() - latest[0].ts_ns) / 1e9
            assert age["0"] >= 0 and now >= latest[0].ts_ns
            served.add(latest[0].ts_ns)
            time.sleep(0.06)
        assert len(served) == 3  # three different rounds served, one after the other
        assert sampler.samples == []
    finally:
        state.close()


def test_a_hung_driver_stops_the_sampling_and_a_scrape_shows_the_age_alone(
        cc, tmp_path, monkeypatch):
    """A round whose call hangs after the first round: the device values are no longer
    served (they would be stale), the age of the last round is, and grows."""
    library = build_fake_nvml(cc) / "libnvidia-ml.so.1"
    flag = tmp_path / "hang"
    monkeypatch.setenv("FAKENVML_SCRIPT", str(script(
        tmp_path / "s", DEVICES + "block_when_file nvmlDeviceGetPowerUsage %s\n" % flag)))
    said = []
    state = GpuState(0.05, str(library), notice=said.append)
    state.sampler.timeout_s = 0.3
    assert state.start()
    try:
        sampler = state.sampler
        _wait(lambda: sampler.rounds >= 1)
        assert "DCGM_FI_DEV_GPU_UTIL" in [f.name for f in state.families(lambda pid: ())]
        flag.write_text("")
        _wait(lambda: sampler.stopped is not None)
        first = state.families(lambda pid: ())
        time.sleep(0.05)
        second = state.families(lambda pid: ())
        assert [f.name for f in first] == ["ebpf_cuda_gpu_xid_errors",
                                           "ebpf_cuda_gpu_sample_age_seconds"]
        a, b = (_values(f, "ebpf_cuda_gpu_sample_age_seconds")["0"] for f in (first, second))
        assert 0.05 <= b - a
        assert said[-1] == ("GPU state sampling stopped: an NVML call did not return in 0.3 s "
                            "(a hung driver); the trace goes on without GPU state")
    finally:
        state.close()


def test_the_gpu_host_memory_script_measures_each_step_on_the_stand_in(cc, tmp_path):
    """scripts/gpu/nvml_memory.py (run.sh's monitor check runs it on the GPU host) on the
    stand-in: every step measured, in order, and its record written."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    library = build_fake_nvml(cc) / "libnvidia-ml.so.1"
    script_path = Path(__file__).resolve().parent.parent / "scripts" / "gpu" / "nvml_memory.py"
    env = dict(os.environ, FAKENVML_SCRIPT=str(script(tmp_path / "s", DEVICES)))
    done = subprocess.run([sys.executable, str(script_path), "--nvml", str(library),
                           "--rounds", "3", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    steps = ["imported", "loaded", "initialised", "devices", "device_values", "processes",
             "gpm", "sampling", "trimmed", "rounds", "scrapes"]
    said = [line.split(":")[0].split("/")[1] for line in done.stdout.splitlines()
            if line.startswith("INFO nvml-memory/")]
    assert said[:len(steps)] == steps and "total" in said and "child" in said, done.stdout
    (record,) = [json.loads(l) for l in (tmp_path / "nvml_memory.jsonl").read_text().splitlines()]
    assert list(record["rss"]["steps"]) == ["base"] + steps
    assert record["rss"]["steps"]["sampling"]["Threads"] >= 4  # (sampler, worker, events)
    assert record["smallest"]["ok"] is True


def test_the_gpu_host_memory_script_skips_without_nvml(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script_path = Path(__file__).resolve().parent.parent / "scripts" / "gpu" / "nvml_memory.py"
    done = subprocess.run([sys.executable, str(script_path), "--nvml", str(tmp_path / "none.so"),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 77 and done.stdout.startswith("SKIP nvml-memory/all: no NVML"), \
        done.stdout + done.stderr
