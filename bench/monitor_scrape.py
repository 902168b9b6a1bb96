"""Monitor scrape cost: how long one /metrics page takes (collect + render) and one reader
tick (naming and publishing the launches), with many processes and launch series live.

Starts a Monitor on the stand-in runtime in this process, then PROCS stand-in processes
that each launch one kernel with KERNELS different grid sizes and stay alive (KERNELS
entries of the kernel's `launches` map each where every launch return is taken; where
launch returns are sampled, kernels with uprobe sessions, one launch slot each: the
geometry is not part of a slot's key); times `collect()` + `prometheus.render()` and
`tick()` over many rounds, and a scrape as a scraper sees it (a GET of /metrics from the
monitor's server: the request, the collect and render, the answer). `--apis` makes each
process call ~20 more runtime functions first (a duration histogram each: a GPU host's page
has ~25-40). Needs root and gcc.

    sudo python3 bench/monitor_scrape.py [--procs 50] [--kernels 100] [--rounds 200] [--apis]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
BUILD = Path(os.environ.get("EBPF_CUDA_BENCH_BUILD", "/tmp/ebpf-cuda-bench")) / "monitor"

from conftest import Builder  # noqa: E402
from fakecuda import build_fake_cuda  # noqa: E402

from ebpf_cuda.spec import layout  # noqa: E402
from ebpf_cuda.monitor import prometheus  # noqa: E402
from ebpf_cuda.monitor.agent import Monitor, MonitorOptions  # noqa: E402


def percentile(values, fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _fetch(port: int) -> float:
    """Seconds one GET of /metrics takes, to the last byte of the answer."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
        while s.recv(1 << 16):
            pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=50)
    parser.add_argument("--kernels", type=int, default=100, help="launch geometries each")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--apis", action="store_true", help="~20 more functions called")
    args = parser.parse_args()
    BUILD.mkdir(parents=True, exist_ok=True)
    lib, prog = build_fake_cuda(Builder(BUILD))
    monitor = Monitor(MonitorOptions(paths=(str(lib),), kernel_labels=20)).start()
    reader = threading.Thread(target=monitor.run, daemon=True)
    reader.start()
    more = ["malloc:4096", "memset:0:4096", "memsetasync:0:4096", "memcpy:4096:1",
            "memcpyasync:4096:1", "mallochost:4096", "freehost", "streamcreate",
            "streamsync", "streamquery", "eventcreate", "eventrecord", "eventsync",
            "eventquery", "eventdestroy", "streamdestroy", "getdevice", "devsync", "meminfo",
            "free"] if args.apis else []
    ops = ["setdevice:0"] + more + ["sleep:200"] + ["launch:%d,1,1:32,1,1" % (g + 1)
                                          for g in range(args.kernels)] + ["sleep:600000"]
    procs = [subprocess.Popen([str(prog), *ops], stdout=subprocess.DEVNULL)
             for _ in range(args.procs)]
    try:
        time.sleep(3)
        entries = len(monitor.tracer.session.maps[layout.LAUNCHES])
        slots = len(monitor.sums.owned_slots())
        scrapes, ticks, size = [], [], 0
        for _ in range(args.rounds):
            start = time.perf_counter()
            page = prometheus.render(monitor.collect())
            scrapes.append(time.perf_counter() - start)
            size = len(page)
        server = prometheus.MetricsServer(("127.0.0.1", 0), monitor.collect).start()
        fetches = [_fetch(server.address[1]) for _ in range(args.rounds)]
        server.close()
        monitor.stop()  # (tick() is the reader's: timed here once the reader has finished)
        reader.join(10)
        for _ in range(max(args.rounds // 10, 5)):
            start = time.perf_counter()
            monitor.tick()
            ticks.append(time.perf_counter() - start)
        lines = page.count(b"\n")
        print("processes=%d launch_map_entries=%d launch_slots=%d page_bytes=%d page_lines=%d"
              % (args.procs, entries, slots, size, lines))
        print("scrape_ms median=%.2f p99=%.2f max=%.2f" % (
            1e3 * statistics.median(scrapes), 1e3 * percentile(scrapes, 0.99),
            1e3 * max(scrapes)))
        print("fetch_ms median=%.2f p99=%.2f (a GET of /metrics over loopback)" % (
            1e3 * statistics.median(fetches), 1e3 * percentile(fetches, 0.99)))
        print("tick_ms median=%.2f max=%.2f" % (1e3 * statistics.median(ticks),
                                               1e3 * max(ticks)))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        monitor.stop()
        reader.join(10)
        monitor.close()


if __name__ == "__main__":
    main()
