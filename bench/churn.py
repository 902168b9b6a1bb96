"""Process churn for the memory benchmarks: PROCS short-lived stand-in CUDA processes,
PARALLEL at a time, while a tracer or monitor process runs; its resident set sampled every
REPORT processes. Each process's state must go with it: the growth per 1,000 processes over
the second half of the run (after the start-up allocations) says whether it does."""
import re
import subprocess
import time
from typing import Callable, List, Sequence, Tuple

Sample = Tuple[int, int]  # (processes started so far, VmRSS in KiB)


def rss_kib(pid: int, key: str = "VmRSS") -> int:
    """A KiB figure of /proc/PID/status: VmRSS, or one of its parts (RssAnon: the heap;
    RssShmem: the ring buffer's pages, touched once as it first fills)."""
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(key + r":\s+(\d+)", f.read()).group(1))


def churn(watched: int, argv: Sequence[str], procs: int, parallel: int, report: int,
          note: Callable[[str], None] = print) -> List[Sample]:
    """Run `argv` PROCS times, PARALLEL at a time; VmRSS of `watched` every REPORT starts,
    and once more 3 s after the last process ended (its records read, its state dropped)."""
    started = time.monotonic()
    samples = [(0, rss_kib(watched))]
    note("processes=0 rss_kib=%d" % samples[0][1])
    running: List[subprocess.Popen] = []
    count = 0
    while count < procs:
        for p in running:
            if p.poll() not in (None, 0):  # (a bench of failing programs measures nothing)
                raise SystemExit("churn: %s exited with status %d" % (argv[0], p.returncode))
        running = [p for p in running if p.poll() is None]
        while len(running) < parallel and count < procs:
            running.append(subprocess.Popen(list(argv), stdout=subprocess.DEVNULL))
            count += 1
            if count % report == 0:
                samples.append((count, rss_kib(watched)))
                note("processes=%d rss_kib=%d anon_kib=%d shmem_kib=%d elapsed_s=%.0f"
                     % (count, samples[-1][1], rss_kib(watched, "RssAnon"),
                        rss_kib(watched, "RssShmem"), time.monotonic() - started))
        time.sleep(0.002)
    for p in running:
        if p.wait() != 0:
            raise SystemExit("churn: %s exited with status %d" % (argv[0], p.returncode))
    time.sleep(3)
    samples.append((count, rss_kib(watched)))
    return samples


def growth_line(samples: List[Sample], procs: int, extrapolate_to: int = 10000) -> str:
    """The end line: RSS, growth per 1,000 processes over the second half, and what that
    growth gives at `extrapolate_to` processes."""
    half = [s for s in samples if s[0] >= procs // 2]
    growth = (half[-1][1] - half[0][1]) / max(half[-1][0] - half[0][0], 1) * 1000
    first = samples[1][1] if len(samples) > 2 else samples[0][1]
    return ("end: processes=%d rss_kib=%d first_report_rss_kib=%d growth_kib_per_1000=%.1f "
            "rss_at_%d_kib=%.0f" % (samples[-1][0], samples[-1][1], first, growth,
                                    extrapolate_to, samples[-1][1] + growth
                                    * max(extrapolate_to - samples[-1][0], 0) / 1000))
