"""Monitor memory under process churn: the resident set of `ebpf-cuda monitor` while
thousands of short-lived CUDA processes come and go (each one's per-process state must go
with it).

Starts `ebpf-cuda monitor -p LIB --prometheus 127.0.0.1:0` on the stand-in runtime, scrapes
/metrics every second (as Prometheus would: exited processes are dropped once scraped),
and runs PROCS stand-in processes, PARALLEL at a time, each making a few calls and
launching KERNELS different geometries before it exits (with --registrations N:LEN, also
registering N kernels with names of LEN bytes first, as a PyTorch process does: ~30000:300;
such bursts overrun the ring unless the processes live a while: --live-ms keeps each one
that long before its exit; the last scrape's losses count what was lost). Prints VmRSS
every REPORT processes, then the growth per 1,000 processes over the second half of the
run (after the start-up allocations) and what it gives for 10,000 (meaningless when each
living process holds megabytes: read the plateau). Then, with --idle-minutes, it keeps
scraping with no process running and prints VmRSS each minute and the growth per hour that
time alone adds: the churn's figure is per process, this one per hour of a day's run.
Needs root and gcc.

    sudo python3 bench/monitor_memory.py [--procs 10000] [--parallel 4] [--kernels 5]
                                         [--idle-minutes 0] [--registrations N:LEN]
                                         [--live-ms 0]
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
sys.path.insert(0, str(REPO / "bench"))
BUILD = Path(os.environ.get("EBPF_CUDA_BENCH_BUILD", "/tmp/ebpf-cuda-bench")) / "monitor"

from churn import churn, growth_line, rss_kib  # noqa: E402
from conftest import Builder  # noqa: E402
from fakecuda import build_fake_cuda  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=10000)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--kernels", type=int, default=5)
    parser.add_argument("--report", type=int, default=500)
    parser.add_argument("--idle-minutes", type=float, default=0.0)
    parser.add_argument("--registrations", help="N:LEN, kernels each process registers")
    parser.add_argument("--live-ms", type=int, default=0, help="each process, before exit")
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
    register = ["registermany:" + args.registrations] if args.registrations else []
    ops = ["setdevice:0", "sleep:20", *register, "loop:20:malloc:64"] + [
        "launch:%d,1,1:32,1,1" % (k + 1) for k in range(args.kernels)] + (
        ["sleep:%d" % args.live_ms] if args.live_ms else [])
    try:
        samples = churn(monitor.pid, [str(prog), *ops], args.procs, args.parallel, args.report,
                        note=lambda line: print("%s page_bytes=%d" % (
                            line, pages[-1] if pages else 0), flush=True))
        print(growth_line(samples, args.procs), flush=True)
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port) as answer:
            lost = [line for line in answer.read().decode().splitlines()
                    if line.startswith("ebpf_cuda_events_lost_total")]
        print("lost: " + " ".join(line.split("{", 1)[1] for line in lost), flush=True)
        if args.idle_minutes > 0:
            print(idle_growth(monitor.pid, args.idle_minutes), flush=True)
    finally:
        done.set()
        monitor.terminate()
        monitor.wait(30)


def idle_growth(pid: int, minutes: float) -> str:
    """VmRSS each minute for `minutes` with no process running (the scrapes go on), and the
    growth per hour from the first sample to the last."""
    started = time.monotonic()
    first = rss_kib(pid)
    print("idle: minute=0 rss_kib=%d" % first, flush=True)
    while time.monotonic() - started < minutes * 60:
        time.sleep(min(60.0, max(minutes * 60 - (time.monotonic() - started), 0.1)))
        print("idle: minute=%.0f rss_kib=%d anon_kib=%d" % (
            (time.monotonic() - started) / 60, rss_kib(pid), rss_kib(pid, "RssAnon")),
            flush=True)
    last, hours = rss_kib(pid), (time.monotonic() - started) / 3600
    return "idle end: minutes=%.1f rss_kib=%d growth_kib_per_hour=%.1f" % (
        hours * 60, last, (last - first) / hours)

if __name__ == "__main__":
    main()
