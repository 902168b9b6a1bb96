"""The probes' own time per call, from the kernel's run statistics (kernel.bpf_stats_enabled):
the program time of each probe, without the trap that every probe at a site pays alike, so
differences of a few nanoseconds show where end-to-end timings drown in noise.

bench/native/callloop calls one function of the stand-in runtime CALLS times (pinned to CPU
1) under each mode, ROUNDS rounds, modes alternated; the programs' run_time_ns / run_cnt are
read around the loop (the statistics' own clock reads are in every figure alike):

  bare-entry   one uprobe: an atomic add into an array map (the floor)
  monitor      the monitor's probes (Tracer(aggregate=True, emit=False, sample_returns=64,
               per_process=True)); with --op launch on a kernel with uprobe sessions, the
               launch row's session program, 1 run in 64 also at return
  monitor -R1  the same taking every return: its entry and return programs

Prints ns per call of each mode's programs (median of the rounds, and each round's).
Needs root and gcc.

    sudo python3 bench/program_time.py [--op launch] [--calls 500000] [--rounds 5]
"""
import argparse
import os
import statistics
import subprocess
import sys
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import BareCounters  # noqa: E402

from ebpf_cuda import syscalls  # noqa: E402
from ebpf_cuda.tracer import Tracer  # noqa: E402

FUNCTIONS = {"getdevice": "cudaGetDevice", "launch": "cudaLaunchKernel"}
STATS = "/proc/sys/kernel/bpf_stats_enabled"


def _stats(on: bool) -> None:
    with open(STATS, "w") as f:
        f.write("1" if on else "0")


def program_ns_per_call(programs: List, run: Callable[[], None], calls: int) -> float:
    """ns the `programs` (loaded Program objects) spent per call while `run()` made
    `calls` calls."""
    fds = [p.fd for p in programs]
    _stats(True)
    try:
        before = [syscalls.prog_info(fd) for fd in fds]
        run()
        after = [syscalls.prog_info(fd) for fd in fds]
    finally:
        _stats(False)
    return sum(a.run_time_ns - b.run_time_ns for a, b in zip(after, before)) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=sorted(FUNCTIONS), default="launch")
    parser.add_argument("--calls", type=int, default=500000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    built = common.build()
    function = FUNCTIONS[args.op]
    command = common.loop_args(built, args.op, args.calls, 1, cpu=1)

    def run() -> None:
        subprocess.run(command, stdout=subprocess.DEVNULL, check=True)

    def bare() -> float:
        with BareCounters(built.lib, function, False) as counters:
            return program_ns_per_call(counters.programs, run, args.calls)

    def monitor(sample: int) -> float:
        with Tracer(library=[str(built.lib)], functions=[function], aggregate=True,
                    emit=False, sample_returns=sample, per_process=True) as tracer:
            programs = list({id(p): p for p in tracer.programs.values()}.values())
            return program_ns_per_call(programs, run, args.calls)

    modes: Dict[str, Callable[[], float]] = {
        "bare-entry": bare, "monitor": lambda: monitor(64), "monitor -R1": lambda: monitor(1)}
    figures: Dict[str, List[float]] = {mode: [] for mode in modes}
    for _ in range(args.rounds):
        for mode, measure in modes.items():
            figures[mode].append(measure())
    print("program ns per %s call (median of %d rounds; each round):" % (function, args.rounds))
    for mode, values in figures.items():
        print("  %-12s %7.1f   %s" % (mode, statistics.median(values),
                                      " ".join("%.1f" % v for v in values)))
    floor = statistics.median(figures["bare-entry"])
    for mode in ("monitor", "monitor -R1"):
        print("  %s - bare-entry: %+.1f ns" % (mode, statistics.median(figures[mode]) - floor))


if __name__ == "__main__":
    main()
