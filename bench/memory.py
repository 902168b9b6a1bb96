"""Tracer memory: resident set of the ebpf-cuda CLI while it traces a full-speed workload.

Runs `python3 -m ebpf_cuda -p LIB --functions cudaGetDevice -o FILE -- callloop -s SECONDS`
(default settings: 4 MiB ring) and samples /proc/PID/status of the CLI process every 0.2 s:
VmRSS and its parts (RssAnon: Python heap; RssFile: code and libraries, and the ring
buffer's pages, mapped once) and the peak VmHWM. Also the same for --json, --summary and --save when present.
Needs root and gcc.

    sudo python3 bench/memory.py [--seconds 10] [--modes text,json,summary,save]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

KEYS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
MODE_OPTIONS = {
    "text": lambda out: ["-o", out],
    "json": lambda out: ["--json", "-o", out],
    "summary": lambda out: ["--summary"],
    "save": lambda out: ["--save", out],
}


def sample_run(argv: List[str], interval: float = 0.2) -> Dict[str, int]:
    """Peak of each KEYS field (KiB) of the process running `argv`, sampled until it ends."""
    peak: Dict[str, int] = {}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, cwd=str(common.REPO))
        while process.poll() is None:
            for key, value in common.proc_status(process.pid, KEYS).items():
                peak[key] = max(peak.get(key, 0), value)
            time.sleep(interval)
        if process.returncode != 0:
            err.seek(0)
            raise RuntimeError("tracer failed: %s" % err.read().decode()[-500:])
    return peak


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--modes", default="text,json,summary,save")
    parser.add_argument("--ring-size", help="--ring-size for the CLI (default: its default)")
    args = parser.parse_args(argv)
    common.need_root()
    built = common.build()
    print("memory: %s" % common.machine())
    print("peak KiB of the CLI process while tracing callloop flat out for %g s\n"
          % args.seconds)
    print("%-8s %9s %9s %9s %9s %9s" % ("mode", *KEYS))
    ring = ["--ring-size", args.ring_size] if args.ring_size else []
    worst = 0
    for mode in args.modes.split(","):
        if mode not in ("text", "json") and not common.cli_has("--" + mode):
            print("%-8s (skipped: no --%s yet)" % (mode, mode))
            continue
        with tempfile.TemporaryDirectory() as tmp:
            options = ["-p", str(built.lib), "--functions", "cudaGetDevice", *ring,
                       *MODE_OPTIONS[mode](os.path.join(tmp, "trace.out"))]
            peak = sample_run(common.cli_command(options, common.loop_args(
                built, seconds=args.seconds)))
        worst = max(worst, peak.get("VmHWM", 0))
        print("%-8s %s" % (mode, " ".join("%9d" % peak.get(k, 0) for k in KEYS)), flush=True)
    print("\ntarget: RSS <= 30 MB: %s (worst VmHWM %.1f MiB)"
          % ("met" if worst <= 30 * 1024 else "MISSED", worst / 1024))


if __name__ == "__main__":
    main(sys.argv[1:])
