"""The GPU sampler's own CPU cost (gpu/sampler.py), on the stand-in NVML (tests/fakenvml.c):
the sampler at HZ for SECONDS against DEVICES devices, one process each; the CPU time of this
process over the run (all its threads: the sampling, the NVML worker, the event wait), per
second and per round, against the same time with no sampler (the baseline: an idle
interpreter).

    python3 bench/gpu_sampler.py [--hz 10] [--seconds 20] [--devices 2]

The stand-in's own work is in the figure: it lists a device's processes by scanning /proc
(twice a round: process memory and utilisation), which a real driver does not do, so this
is an upper bound of the Python side's cost plus that scan; the scan alone is measured too
(`scan_ms`: nvmlDeviceGetComputeRunningProcesses_v3 timed on its own) and left out in
`without_scan`.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hz", type=float, default=10)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    from ebpf_cuda.gpu import nvml
    from ebpf_cuda.gpu.sampler import Sampler
    from fakenvml import DEVICES

    work = Path(tempfile.mkdtemp(prefix="gpu-sampler-"))
    lib = work / "libnvidia-ml.so.1"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib),
                    str(REPO / "tests" / "native" / "fakenvml.c")], check=True)
    lines = [l for l in DEVICES.splitlines() if l][:1] * args.devices
    text = "".join(l.replace("dev 0", "dev %d" % i, 1) + "\n" for i, l in enumerate(lines))
    text += "".join("proc %d comm=python3 mem=1048576 sm=10 memutil=1\n" % i
                    for i in range(args.devices))
    (work / "script").write_text(text)
    os.environ["FAKENVML_SCRIPT"] = str(work / "script")

    before = cpu_s()
    time.sleep(args.seconds)
    idle = cpu_s() - before

    sampler = Sampler(1.0 / args.hz, str(lib))
    before = cpu_s()
    assert sampler.start()
    time.sleep(args.seconds)
    sampler.stop()
    used = cpu_s() - before - idle
    rounds = len(sampler.samples) // args.devices

    probe = nvml.Nvml(str(lib))
    probe.init()
    handle = probe.handle(0)
    start = time.process_time()
    for _ in range(50):
        probe.processes(handle)
    scan = (time.process_time() - start) / 50
    per_round = used / max(rounds, 1)
    print("hz=%g devices=%d seconds=%g rounds=%d cpu_ms_per_s=%.2f cpu_ms_per_round=%.3f "
          "scan_ms=%.3f without_scan_ms_per_round=%.3f without_scan_cpu_pct=%.3f"
          % (args.hz, args.devices, args.seconds, rounds, 1e3 * used / args.seconds,
             1e3 * per_round, 1e3 * scan, 1e3 * (per_round - 2 * args.devices * scan),
             100 * (per_round - 2 * args.devices * scan) * rounds / args.seconds))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
