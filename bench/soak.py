"""Soak test: trace a steady, high-rate stand-in CUDA workload for minutes and watch the tracer.

    sudo python3 bench/soak.py [--minutes 10] [--rate 20000] [--interval 30] [--ring-size 8M]

Builds tests/native/robust_stub.c (a libcudart stand-in) and tests/native/robust_load.c into a
temporary folder, then traces `robust_load rate RATE SECONDS` with the public `Tracer`, decoding
every record and writing it as JSON Lines to /dev/null (the CLI's `-j -o /dev/null` path).
Every INTERVAL seconds it prints one line: elapsed time, the tracer's resident memory (RSS and
its peak), CPU time used, events decoded in the interval and their rate, records lost so far.
At the end it checks the accounting: records seen + records lost == calls made.
Not part of the test suite (it takes minutes).
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ebpf_cuda.spec import record  # noqa: E402
from ebpf_cuda.output.plan import parse_size  # noqa: E402
from ebpf_cuda.output.jsonl import JsonWriter  # noqa: E402
from ebpf_cuda.tracer import Tracer  # noqa: E402

NATIVE = REPO / "tests" / "native"
LIB_FLAGS = ["-fcf-protection=none", "-fno-shrink-wrap", "-fno-ipa-icf",
             "-fno-optimize-sibling-calls", "-Wl,-soname,libcudart.so.12"]


def build(folder: Path) -> Path:
    """The workload program, linked against the stub libcudart.so.12 next to it."""
    lib, prog = folder / "libcudart.so.12", folder / "robust_load"
    subprocess.run(["gcc", "-O2", "-g", "-shared", "-fPIC", "-fno-omit-frame-pointer", *LIB_FLAGS,
                    "-o", str(lib), str(NATIVE / "robust_stub.c")], check=True)
    subprocess.run(["gcc", "-O2", "-g", "-o", str(prog), str(NATIVE / "robust_load.c"),
                    "-L", str(folder), "-l:libcudart.so.12", "-Wl,-rpath," + str(folder),
                    "-lpthread"], check=True)
    return prog


def memory_kib() -> "tuple":
    """(VmRSS, VmHWM) of this process in KiB."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    return values["VmRSS"], values["VmHWM"]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def soak(prog: Path, minutes: float, rate: int, interval: float, ring_size: int) -> int:
    seconds = max(1, int(minutes * 60))
    made = max(1, rate // 1000) * 1000 * seconds  # robust_load makes whole 1 ms batches
    sink = JsonWriter(open(os.devnull, "w"))
    seen = window = 0
    start = last = time.monotonic()
    print("soak: %d calls/s for %d s (%d calls), ring %d bytes, report every %g s"
          % (rate, seconds, made, ring_size, interval), flush=True)
    print("%8s %10s %10s %8s %10s %10s %8s" % ("elapsed", "rss_kib", "peak_kib", "cpu_s",
                                              "events", "events/s", "lost"), flush=True)
    with Tracer(functions=["cudaMemcpy"], command=[str(prog), "rate", str(rate), str(seconds)],
                ring_size=ring_size) as tracer:
        decode = tracer.decoder.decode_frames
        for frames in tracer.frames():
            events = list(decode(frames))
            sink.write(events)
            calls = record.call_count(frames)
            seen += calls
            window += len(events)
            now = time.monotonic()
            if now - last >= interval:
                report(now - start, window / (now - last), window, tracer.stats()["lost"])
                window, last = 0, now
        now = time.monotonic()
        lost = tracer.stats()["lost"]
        report(now - start, window / max(now - last, 1e-9), window, lost)
        status = tracer.exit_status
    sink.close()
    ok = seen + lost == made and status == 0
    print("soak: made %d, seen %d, lost %d, seen+lost %s made; workload exit %s"
          % (made, seen, lost, "==" if seen + lost == made else "!=", status), flush=True)
    return 0 if ok else 1


def report(elapsed: float, per_second: float, events: int, lost: int) -> None:
    rss, peak = memory_kib()
    print("%8.0f %10d %10d %8.1f %10d %10.0f %8d" % (elapsed, rss, peak, cpu_seconds(), events,
                                                      per_second, lost), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=20000, help="calls a second")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between reports")
    parser.add_argument("--ring-size", default="8M")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ebpf-cuda-soak-") as folder:
        prog = build(Path(folder))
        return soak(prog, args.minutes, args.rate, args.interval, parse_size(args.ring_size))


if __name__ == "__main__":
    sys.exit(main())
