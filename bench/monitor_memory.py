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
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
BUILD = Path(os.environ.get("EBPF_CUDA_BENCH_BUILD", "/tmp/ebpf-cuda-bench")) / "monitor"

from churn import churn, growth_line  # noqa: E402
from conftest import Builder  # noqa: E402
from fakecuda import build_fake_cuda  # noqa: E402


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
    try:
        samples = churn(monitor.pid, [str(prog), *ops], args.procs, args.parallel, args.report,
                        note=lambda line: print("%s page_bytes=%d" % (
                            line, pages[-1] if pages else 0), flush=True))
    finally:
        done.set()
        monitor.terminate()
        monitor.wait(30)
    print(growth_line(samples, args.procs))

if __name__ == "__main__":
    main()
