"""GPU state in `ebpf-cuda monitor` (issue 37): a real Prometheus scrapes the DCGM-named
families, the processes' GPU memory and SM utilisation, and the Xid counter, all carrying the
stand-in NVML's scripted values; an Xid from the stand-in triggers a flight-recorder dump that
holds the calls made before it."""
import json
import os
import shutil
import signal

import pytest

from fakenvml import DEVICES, H100, UUID0, build_fake_nvml, script
from helpers import cli_env, run_cli
from monitor_support import Held, MonitorCli
from test_prometheus import PROMETHEUS, Prometheus

pytestmark = [pytest.mark.kernel, pytest.mark.skipif(
    PROMETHEUS is None, reason="Debian's prometheus package is not installed")]

PROCESS_MEMORY = 300 << 20
DEVICE0 = '{gpu="0",UUID="%s",device="nvidia0",modelName="%s"}' % (UUID0, H100)
EXPECTED = {  # dcgm-exporter's names and units for the scripted device 0
    "DCGM_FI_DEV_GPU_UTIL": 75, "DCGM_FI_DEV_MEM_COPY_UTIL": 30, "DCGM_FI_DEV_FB_USED": 20480,
    "DCGM_FI_DEV_FB_FREE": 61440, "DCGM_FI_DEV_POWER_USAGE": 350, "DCGM_FI_DEV_GPU_TEMP": 61,
    "DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_MEM_CLOCK": 2619,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 4, "DCGM_FI_PROF_PCIE_TX_BYTES": 1200 * 1024,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 3400 * 1024, "DCGM_FI_PROF_NVLINK_TX_BYTES": 25000000 * 1024,
    "DCGM_FI_PROF_NVLINK_RX_BYTES": 12000000 * 1024, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 2,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.81,
    "DCGM_FI_PROF_SM_ACTIVE": 0.64,
    "DCGM_FI_PROF_SM_OCCUPANCY": 0.37, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.22,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.48}


def test_prometheus_scrapes_the_scripted_gpu_and_an_xid_dumps_the_calls_before_it(
        tmp_path, cc, prog, lib):
    name = "nvmon%d" % (os.getpid() % 10**6)
    copy = tmp_path / name
    shutil.copy(prog, copy)
    fault = tmp_path / "xid-now"
    text = DEVICES + "proc 0 comm=%s mem=%d sm=40 memutil=10\nxid 0 when_file=%s code=79\n" % (
        name, PROCESS_MEMORY, fault)
    nvml = build_fake_nvml(cc) / "libnvidia-ml.so.1"
    env = cli_env(FAKENVML_SCRIPT=str(script(tmp_path / "nvml.script", text)))
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    held = Held(copy, ["setdevice:0", "sleep:300", "loop:3:malloc:4096", "launch:1:1",
                       "sleep:60000"])
    monitor = server = None
    try:
        monitor = MonitorCli("-p", lib, "--prometheus", "127.0.0.1:0", "--nvml", nvml,
                             "--flight-recorder", "60", "--flight-dir", dumps,
                             "--return-sampling", "1", env=env)
        server = Prometheus(tmp_path, monitor.metrics_port)
        server.wait_for('up{job="ebpf-cuda"}', 1)
        held.go()
        for family, expected in EXPECTED.items():
            server.wait_for(family + DEVICE0, expected)
        server.wait_for('DCGM_FI_DEV_GPU_UTIL{gpu="1"}', 5)
        # (sampled on the sampler's thread, once a second: each device's age is served)
        server.wait_for('count(ebpf_cuda_gpu_sample_age_seconds)', 2)
        assert 0 <= server.number('max(ebpf_cuda_gpu_sample_age_seconds)') < 60
        # (device 1 has no NVLink: no series of its own)
        assert server.number('count(DCGM_FI_PROF_NVLINK_TX_BYTES{gpu="1"})') is None
        mine = '{pid="%d",comm="%s",gpu="0",UUID="%s"}' % (held.pid, name, UUID0)
        server.wait_for("ebpf_cuda_process_gpu_memory_bytes" + mine, PROCESS_MEMORY)
        server.wait_for("ebpf_cuda_process_sm_utilization" + mine, 0.4)
        server.wait_for('sum(ebpf_cuda_process_api_calls_total{pid="%d",api="cudaMalloc"})'
                        % held.pid, 3)
        assert server.number('sum(ebpf_cuda_gpu_xid_errors_total)') in (None, 0)
        fault.write_text("")  # the Xid, now that the calls were made
        server.wait_for('ebpf_cuda_gpu_xid_errors_total{gpu="0",UUID="%s",xid="79"}' % UUID0, 1)
        server.wait_for('DCGM_FI_DEV_XID_ERRORS' + DEVICE0, 79)
        line = monitor.wait_for("(Xid 79 on GPU 0: GPU has fallen off the bus)")
        path = line.split(" written to ")[1].split(" (")[0]
        assert os.path.dirname(path) == str(dumps)
        done = run_cli("report", path, "--json", timeout=120)
        assert done.returncode == 0, done.stderr
        calls = [json.loads(l) for l in done.stdout.splitlines() if l.startswith("{")]
        ours = [(c["api"], c["phase"]) for c in calls if c.get("pid") == held.pid]
        assert ours.count(("cudaMalloc", "exit")) == 3 and ("cudaLaunchKernel", "exit") in ours
    finally:
        held.kill()
        if server is not None:
            server.close()
        if monitor is not None:
            assert monitor.stop(signal.SIGTERM) == 0, monitor.lines
    (said,) = [l for l in monitor.lines if "GPU state" in l]
    assert said.endswith("GPU state: NVLink throughput of device 1 not sampled: "
                         "nvmlDeviceGetFieldValues (field 138): Not Supported"), said
