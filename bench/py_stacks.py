"""Cost of --py-stacks (issue 18): ns added per traced call when the probe walks a 10-frame
and a 40-frame Python stack, against the same trace without --py-stacks, in the same run.

    sudo python3 bench/py_stacks.py [--rounds 7] [--calls 40000] [--reps 5] [--depths 10,40]
                                    [--lib PATH]

The traced program (written to a temporary file) loads NVIDIA's libcudart.so.12 (the
nvidia-cuda-runtime-cu12 wheel; the stand-in of tests/native/fakecudart.c when the wheel is
not installed, or --lib) with ctypes and calls cudaGetDeviceCount (35 without a driver: fine)
CALLS times per repetition, REPS timed repetitions after one warm-up, from the bottom of a
recursion such that DEPTH Python frames (the module's included) are on the thread at each
call. It prints thread CPU and wall ns per call of each repetition.

Modes, alternated within each round (the order rotates from round to round): untraced;
`--functions cudaGetDeviceCount -p LIB --save FILE` ("trace"); the same with --py-stacks
("trace+py"). --save is the output that keeps up (--summary alone counts in the kernel,
which --py-stacks refuses). Each run's figure is the median of its repetitions; the table
gives the median over rounds, and "added" is the median over rounds of the same round's
trace+py minus trace (paired). Thread CPU time is the ranked figure (the probes run in the
calling thread), wall time is shown too. A last short run per depth, with --json, checks that
the stacks were walked: every event carries a py_stack of DEPTH frames.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, build, machine, need_root  # noqa: E402
from fakecuda import wheel_libcudart  # noqa: E402

FUNCTION = "cudaGetDeviceCount"
MODES = ("untraced", "trace", "trace+py")

# The traced program: argv = LIB DEPTH CALLS REPS. DEPTH counts every Python frame on the
# thread at the call: the module's, then DEPTH - 1 frames of rec (the innermost one loops).
WORKLOAD = r'''
import ctypes, sys, time, traceback

LIB, DEPTH, CALLS, REPS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
call = ctypes.CDLL(LIB).cudaGetDeviceCount
count = ctypes.c_int()
ref = ctypes.byref(count)


def rec(depth):
    if depth > 1:
        return rec(depth - 1)
    print("frames=%d" % len(traceback.extract_stack()), flush=True)
    for rep in range(REPS + 1):  # (the first one warms up)
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        for _ in range(CALLS):
            call(ref)
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        if rep:
            print("rep cpu_ns=%.1f wall_ns=%.1f" % ((c1 - c0) / CALLS, (w1 - w0) / CALLS))
    print("ret=%d" % call(ref), flush=True)


rec(DEPTH - 1)
'''


def run_once(script: Path, lib: Path, mode: str, depth: int, calls: int, reps: int,
             save: str) -> Tuple[float, float, int, str]:
    """One run of the workload in `mode`: (median CPU ns/call, median wall ns/call, events
    lost, the tracer's stderr tail)."""
    command = [sys.executable, str(script), str(lib), str(depth), str(calls), str(reps)]
    if mode != "untraced":
        options = ["--functions", FUNCTION, "-p", str(lib), "--save", save]
        if mode == "trace+py":
            options.append("--py-stacks")
        command = [sys.executable, "-m", "ebpf_cuda", *options, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, cwd=str(REPO), timeout=300)
    if done.returncode != 0:
        raise RuntimeError("%s (depth %d) exited %d: %s" % (mode, depth, done.returncode,
                                                           done.stderr[-600:]))
    cpu, wall, frames = [], [], None
    for line in done.stdout.splitlines():
        if line.startswith("rep "):
            pairs = dict(p.split("=") for p in line.split()[1:])
            cpu.append(float(pairs["cpu_ns"]))
            wall.append(float(pairs["wall_ns"]))
        elif line.startswith("frames="):
            frames = int(line.split("=")[1])
    if frames != depth or len(cpu) != reps:
        raise RuntimeError("%s: the workload printed frames=%s and %d reps:\n%s"
                           % (mode, frames, len(cpu), done.stdout[-600:]))
    lost = 0
    for line in done.stderr.splitlines():
        if " events lost" in line:
            lost += int(line.split("ebpf-cuda: ", 1)[1].split()[0])
    tail = [line for line in done.stderr.splitlines() if "probing" not in line]
    return statistics.median(cpu), statistics.median(wall), lost, " | ".join(tail[-3:])


def check_stacks(script: Path, lib: Path, depth: int, folder: str) -> Dict[str, object]:
    """A short --json --py-stacks run: how many events carry a py_stack, of which depth, and
    whether the innermost frame is the workload's loop."""
    out = os.path.join(folder, "check-%d.jsonl" % depth)
    subprocess.run([sys.executable, "-m", "ebpf_cuda", "--json", "--py-stacks", "--functions",
                    FUNCTION, "-p", str(lib), "-o", out, "--", sys.executable, str(script),
                    str(lib), str(depth), "100", "1"], capture_output=True, text=True,
                   cwd=str(REPO), timeout=120, check=True)
    events = [json.loads(line) for line in open(out)]
    depths: Dict[int, int] = {}
    innermost_ok = 0
    for event in events:
        stack = event.get("py_stack") or []
        depths[len(stack)] = depths.get(len(stack), 0) + 1
        if stack and stack[0]["file"] == str(script) and stack[0]["function"] == "rec":
            innermost_ok += 1
    return {"events": len(events), "depths": depths, "innermost_rec": innermost_ok,
            "ok": bool(events) and depths == {depth: len(events)}
            and innermost_ok == len(events)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=40000, help="calls per repetition")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per run")
    parser.add_argument("--depths", default="10,40")
    parser.add_argument("--lib", help="the libcudart to call (default: the wheel's "
                                      "libcudart.so.12, else the stand-in)")
    args = parser.parse_args(argv)
    need_root()
    depths = [int(d) for d in args.depths.split(",")]
    lib = Path(args.lib) if args.lib else (wheel_libcudart() or build().lib)
    started = time.monotonic()
    print("py_stacks: %s" % machine())
    print("library: %s; %s, %d calls x %d reps per run, %d rounds, depths %s"
          % (lib, FUNCTION, args.calls, args.reps, args.rounds, depths), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-pystacks-") as folder:
        script = Path(folder) / "pystack_workload.py"
        script.write_text(WORKLOAD)
        save = os.path.join(folder, "trace.save")
        # results[depth][mode] = [(cpu, wall) per round]
        results: Dict[int, Dict[str, List[Tuple[float, float]]]] = {
            d: {m: [] for m in MODES} for d in depths}
        lost: Dict[str, int] = {m: 0 for m in MODES}
        for round_no in range(args.rounds):
            order = MODES[round_no % 3:] + MODES[:round_no % 3]
            for depth in depths:
                cells = []
                for mode in order:
                    cpu, wall, n_lost, _ = run_once(script, lib, mode, depth, args.calls,
                                                    args.reps, save)
                    results[depth][mode].append((cpu, wall))
                    lost[mode] += n_lost
                    cells.append("%s=%.0f/%.0f" % (mode, cpu, wall))
                print("round %d depth %2d  %s  (cpu/wall ns per call)"
                      % (round_no + 1, depth, "  ".join(cells)), flush=True)
        checks = {d: check_stacks(script, lib, d, folder) for d in depths}

    print("\nns per call, median over %d rounds (each: median of %d reps of %d calls); "
          "added = median over rounds of (trace+py - trace) in the same round"
          % (args.rounds, args.reps, args.calls))
    print("%-6s %-5s %10s %10s %10s %12s %12s" % ("frames", "clock", "untraced", "trace",
                                                 "trace+py", "added", "added range"))
    summary = {}
    for depth in depths:
        for which, clock in enumerate(("cpu", "wall")):
            med = {m: statistics.median(v[which] for v in results[depth][m]) for m in MODES}
            added = [p[which] - t[which] for p, t in zip(results[depth]["trace+py"],
                                                         results[depth]["trace"])]
            print("%-6d %-5s %10.0f %10.0f %10.0f %+12.0f %5.0f..%-5.0f"
                  % (depth, clock, med["untraced"], med["trace"], med["trace+py"],
                     statistics.median(added), min(added), max(added)))
            summary["%d_%s" % (depth, clock)] = dict(med, added=statistics.median(added))
    print("lost events: %s" % ", ".join("%s %d" % (m, lost[m]) for m in MODES[1:]))
    for depth in depths:
        check = checks[depth]
        print("stacks walked at depth %d: %s (%d events; py_stack lengths %s; innermost frame "
              "the loop in %d)" % (depth, "yes" if check["ok"] else "NO", check["events"],
                                   check["depths"], check["innermost_rec"]))
    if 10 in depths:
        added10 = summary["10_cpu"]["added"]
        print("target (issue 18): at most +1000 ns per call at 10 frames: %+.0f ns, %s"
              % (added10, "met" if added10 <= 1000 else "missed"))
    print("took %.0f s" % (time.monotonic() - started))


if __name__ == "__main__":
    main()
