"""Monitor memory under process churn: the resident set of `ebpf-cuda monitor` while
thousands of short-lived CUDA processes come and go (each one's per-process state must go
with it).

Starts `ebpf-cuda monitor -p LIB --prometheus 127.0.0.1:0` on the stand-in runtime, scrapes
/metrics every second (as Prometheus would: exited processes are dropped once scraped),
and runs PROCS stand-in processes, PARALLEL at a time, each making a few calls and
launching KERNELS different geometries before it exits. Prints VmRSS every REPORT
processes, then the growth per 1,000 processes over the second half of the run (after the
start-up allocations) and what it gives for 10,000. Needs root and gcc.

    sudo python3 bench/monitor_memory.py [--procs 10000] [--parallel 4] [--kernels 5]
"""
import argparse
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
BUILD = Path(os.environ.get("EBPF_CUDA_BENCH_BUILD", "/tmp/ebpf-cuda-bench")) / "monitor"

from conftest import Builder  # noqa: E402
from fakecuda import build_fake_cuda  # noqa: E402


def rss_kib(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=10000)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--kernels", type=int, default=5)
    parser.add_argument("--report", type=int, default=500)
    args = parser.parse_args()
    BUILD.mkdir(parents=True, exist_ok=True)
    lib, prog = build_fake_cuda(Builder(BUILD))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    monitor = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "monitor", "-p", str(lib),
                                "--prometheus", "127.0.0.1:0"], stderr=subprocess.PIPE,
                               text=True, env=env)
    port = None
    for line in monitor.stderr:
        found = re.search(r"metrics at http://127.0.0.1:(\d+)/", line)
        if found:
            port = int(found.group(1))
            break
    assert port, "the monitor did not start"
    done = threading.Event()
    pages = []

    def scrape() -> None:
        while not done.wait(1.0):
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port) as answer:
                pages.append(len(answer.read()))

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    ops = ["setdevice:0", "sleep:20", "loop:20:malloc:64"] + [
        "launch:%d,1,1:32,1,1" % (k + 1) for k in range(args.kernels)]
    started = time.monotonic()
    samples = [(0, rss_kib(monitor.pid))]
    print("processes=0 rss_kib=%d" % samples[0][1], flush=True)
    running = []
    count = 0
    try:
        while count < args.procs:
            running = [p for p in running if p.poll() is None]
            while len(running) < args.parallel and count < args.procs:
                running.append(subprocess.Popen([str(prog), *ops], stdout=subprocess.DEVNULL))
                count += 1
                if count % args.report == 0:
                    samples.append((count, rss_kib(monitor.pid)))
                    print("processes=%d rss_kib=%d elapsed_s=%.0f page_bytes=%d"
                          % (count, samples[-1][1], time.monotonic() - started,
                             pages[-1] if pages else 0), flush=True)
            time.sleep(0.002)
        for p in running:
            p.wait()
        time.sleep(3)  # the last ones scraped and dropped
        samples.append((count, rss_kib(monitor.pid)))
    finally:
        done.set()
        monitor.terminate()
        monitor.wait(30)
    half = [s for s in samples if s[0] >= args.procs // 2]
    growth = (half[-1][1] - half[0][1]) / max(half[-1][0] - half[0][0], 1) * 1000
    print("end: processes=%d rss_kib=%d elapsed_s=%.0f growth_kib_per_1000=%.1f "
          "rss_at_10000_kib=%.0f" % (count, samples[-1][1], time.monotonic() - started, growth,
                                     samples[-1][1] + growth * max(10000 - count, 0) / 1000))


if __name__ == "__main__":
    main()
