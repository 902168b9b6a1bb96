"""Issue 21's cost bounds on a noisy GPU host: the modes measured in turns, not in windows.

    python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz        # (where the repository is)
    sudo OUT=/tmp/out python3 scripts/gpu/monitor_turns.py --pyz ebpf-cuda.pyz

Earlier rounds (D24, D25) gave each mode a window of seconds and compared windows: the
host's own speed moved by ±15 % from one window to the next, more than the 2 % to resolve.
Here the three modes run side by side all the time, each in a process of its own that
loads its own copy of the CUDA libraries (LD_PRELOAD of copies with the same sonames):

- `untraced`: a copy no probe is on;
- `bare-entry`: a copy with one counting entry probe at every place the monitor probes
  (the floor any probe pays: one trap and one atomic add);
- `monitor`: a copy that `ebpf-cuda monitor -p COPY ...` probes, as it runs by default.

A uprobe belongs to a file (an inode), so each process pays for its own copy's probes
only. The three processes, pinned to the same core, take turns: one rep each (`--ops` tiny
ops, or `--steps` MLP steps, then a synchronise), the order rotated through all six
permutations, `--rounds` rounds. Only one runs at a time (no contention for the GPU or the
core), and the turns of a round are milliseconds apart, so the host's drift hits the three
alike and cancels in each round's ratios. The figures: the median of the per-round ratios
and the geometric mean with a 95 % bootstrap interval (resampling rounds).

Checks that the probes were where they should be (else the run says so and fails): each
child maps its own copies; the monitor's launch count for the monitor child equals the
launches it made; the bare probes' hits come from the bare child alone (at least one per op).

`--pyz-b OTHER.pyz` adds a fourth mode, `monitor-b`: the monitor of another build on copies
of its own, in the same turns (two builds compared on one host, its drift cancelled).

`--smoke LIB` runs the same plumbing on a CPU machine: the children call cudaLaunchKernel
of copies of LIB (the tests' stand-in runtime) through ctypes.
Writes JSON lines to $OUT/monitor_turns.jsonl (and prints them), and a PASS/FAIL line per
workload for the probes' placement (the exit status is 1 when one failed). With
`--check-bounds` (run.sh's `monitor-cost`), also issue 21's bounds as PASS/FAIL lines, which
then count in the exit status: tiny ops, monitor / bare-entry <= 1.02; the MLP step,
monitor / untraced <= 1.02 (each the geometric mean of the per-round ratios).
"""
import argparse
import itertools
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import monitor_h200 as h200  # noqa: E402  (Monitor, BareProbes, entry_sites, mlp_step)

HERE = os.path.abspath(__file__)
OUT = os.environ.get("OUT", "/tmp/ebpf-cuda-monitor-turns")
MODES = ("untraced", "bare-entry", "monitor")
SECOND = "monitor-b"  # (--pyz-b: another build's monitor)
# Issue 21's bounds: workload -> (the ratio bounded, its bound)
BOUNDS = {"tiny": ("monitor/bare-entry", 1.02), "mlp": ("monitor/untraced", 1.02)}


# -- the children ---------------------------------------------------------------------------

def _mapped(prefixes) -> list:
    """The files of this process whose names start with one of `prefixes`."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 5 and os.path.basename(parts[5]).startswith(tuple(prefixes)):
                found.add(parts[5])
    return sorted(found)


def _torch_work(what: str):
    """(step, synchronise) of the tiny op or the MLP step."""
    import torch

    if what == "mlp":
        step = h200.mlp_step()
    else:
        x = torch.zeros(16, device="cuda")

        def step():
            x.add_(1)
    return step, torch.cuda.synchronize


def _smoke_work(lib: str):
    """(step, synchronise): cudaLaunchKernel of the stand-in copy `lib`, through ctypes."""
    import ctypes

    class Dim3(ctypes.Structure):
        _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]

    cudart = ctypes.CDLL(lib)
    launch = cudart.cudaLaunchKernel
    launch.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t,
                       ctypes.c_void_p]
    grid, block, func = Dim3(4, 1, 1), Dim3(256, 1, 1), ctypes.c_void_p(0x1000)

    def step():
        if launch(func, grid, block, None, 0, None) != 0:
            raise SystemExit("the stand-in's launch failed")
    return step, lambda: None


def child_turns(what: str, per_turn: int, smoke_lib) -> None:
    """Warm up, say which CUDA files it maps, then one timed rep per line on stdin ("go"):
    `per_turn` steps and a synchronise, answered with the time per step (us) until "quit";
    then the number of steps made in all."""
    if os.environ.get("TURN_CPU"):
        os.sched_setaffinity(0, {int(os.environ["TURN_CPU"])})
    step, sync = _smoke_work(smoke_lib) if smoke_lib else _torch_work(what)
    made = 0
    for _ in range(50):
        step()
    made += 50
    sync()
    print(json.dumps({"pid": os.getpid(),
                      "maps": _mapped(["libcuda.so", "libcudart", "libfakecudart"])}),
          flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        t0 = time.perf_counter()
        for _ in range(per_turn):
            step()
        sync()
        took = time.perf_counter() - t0
        made += per_turn
        print("%.9f" % (took * 1e6 / per_turn), flush=True)
    print(json.dumps({"made": made}), flush=True)


# -- the orchestrator -----------------------------------------------------------------------

def cuda_files(python: str) -> list:
    """The libcuda and libcudart files a PyTorch process maps once CUDA is up."""
    code = ("import torch, json, sys; sys.path.insert(0, %r); import monitor_turns as t; "
            "torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize(); "
            "print(json.dumps(t._mapped(['libcuda.so', 'libcudart'])))"
            % os.path.dirname(HERE))
    out = subprocess.run([python, "-c", code], check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    files = json.loads(out.strip().splitlines()[-1])
    if not any("libcuda.so" in f for f in files):
        raise SystemExit("no libcuda in a CUDA process: %s" % files)
    return files


def make_copies(files, where: str, modes=MODES) -> dict:
    """mode -> the copies of `files` for that mode (same file names: same sonames)."""
    copies = {}
    for mode in modes:
        folder = os.path.join(where, mode)
        os.makedirs(folder, exist_ok=True)
        copies[mode] = []
        for path in files:
            target = os.path.join(folder, os.path.basename(path))
            shutil.copyfile(path, target)
            copies[mode].append(target)
    return copies


class TurnChild:
    def __init__(self, what: str, per_turn: int, preload, cpu: int, smoke) -> None:
        env = dict(os.environ, TURN_CPU=str(cpu))
        command = [sys.executable, HERE, "--child", what, "--per-turn", str(per_turn)]
        if smoke:
            command += ["--smoke", preload[0]]
        else:
            env["LD_PRELOAD"] = " ".join(preload)
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)

    def ready(self) -> dict:
        """Its pid and the CUDA files it maps, once warm."""
        return json.loads(self.proc.stdout.readline())

    def turn(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def finish(self) -> int:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        made = json.loads(self.proc.stdout.readline())["made"]
        self.proc.wait(60)
        return made


def emit(record: dict) -> None:
    line = json.dumps(record, sort_keys=True)
    print(line, flush=True)
    with open(os.path.join(OUT, "monitor_turns.jsonl"), "a") as f:
        f.write(line + "\n")


def bootstrap(ratios, draws: int = 2000) -> dict:
    """Geometric mean of `ratios` and its 95 % interval, resampling the rounds."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(21)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(draws))
    return {"geomean": math.exp(statistics.fmean(logs)),
            "ci95": [math.exp(means[int(0.025 * draws)]), math.exp(means[int(0.975 * draws)])],
            "median": statistics.median(ratios), "rounds": len(ratios)}


def measure(what: str, per_turn: int, rounds: int, copies: dict, cpu: int, smoke,
            pairs=None) -> dict:
    """The modes' children in turns, each round's times, and the bootstrapped ratio of each
    pair of modes (`pairs`; by default the monitor's against its floors)."""
    modes = tuple(copies)
    children = {m: TurnChild(what, per_turn, copies[m], cpu, smoke) for m in modes}
    hellos = {m: c.ready() for m, c in children.items()}
    orders = list(itertools.permutations(modes))
    times = {m: [] for m in modes}
    t0 = time.monotonic()
    for r in range(rounds):
        for mode in orders[r % len(orders)]:
            times[mode].append(children[mode].turn())
    took = time.monotonic() - t0
    made = {m: c.finish() for m, c in children.items()}
    result = {"workload": what, "per_turn": per_turn, "rounds": rounds, "seconds": took,
              "unit": "us per step", "children": hellos, "made": made,
              "median": {m: statistics.median(v) for m, v in times.items()},
              "mean": {m: statistics.fmean(v) for m, v in times.items()},
              "times": times,  # (each round's, in round order: the raw data)
              "p10": {m: sorted(v)[len(v) // 10] for m, v in times.items()}}
    if pairs is None:
        pairs = [("monitor", "bare-entry"), ("monitor", "untraced"), ("bare-entry", "untraced")]
        if SECOND in modes:
            pairs += [(SECOND, "bare-entry"), (SECOND, "untraced"), ("monitor", SECOND)]
    for a, b in pairs:
        result["%s/%s" % (a, b)] = bootstrap([x / y for x, y in zip(times[a], times[b])])
    return result


def check_probes(result: dict, monitor_samples: dict, bare_hits: int, copies: dict) -> list:
    """What went wrong with the probes' placement (empty: nothing)."""
    problems = []
    for mode, hello in result["children"].items():
        mine = set(copies[mode])
        if not mine <= set(hello["maps"]):
            problems.append("%s child maps %s, not its copies %s" % (mode, hello["maps"],
                                                                       sorted(mine)))
    pid = result["children"]["monitor"]["pid"]
    counted = h200.total(monitor_samples, "ebpf_cuda_kernel_launches_total",
                         'pid="%d"' % pid)
    made = result["made"]["monitor"]  # (steps: a tiny op is one launch, an MLP step ~20)
    result["monitor_counted_launches"] = counted
    result["bare_hits"] = bare_hits
    # A tiny op is one launch; torch.zeros made one more (its fill kernel), the stand-in none
    if result["workload"] == "tiny" and counted != made + (0 if result["smoke"] else 1):
        problems.append("the monitor counted %d launches of the monitor child, which made %d"
                        % (counted, made))
    if counted < made:
        problems.append("the monitor counted %d launches for %d steps" % (counted, made))
    if bare_hits < result["made"]["bare-entry"]:
        problems.append("the bare probes hit %d times for %d steps" % (bare_hits,
                                                                      result["made"]["bare-entry"]))
    for (name, labels), value in monitor_samples.items():
        if name == "ebpf_cuda_kernel_launches_total" and value and 'pid="%d"' % pid not in labels:
            problems.append("the monitor counted launches of another process: %s" % labels)
    return problems


def trap_costs(result: dict) -> dict:
    """ns a probe hit adds, by the means: (mode - untraced) / the bare probes' hits a step.
    (Where the floor moves between runs, this tells a dearer trap from more of them.)"""
    hits = result["bare_hits"] / max(result["made"]["bare-entry"], 1)
    mean = result["mean"]
    costs = {"hits_per_step": hits}
    for mode in mean:
        if mode != "untraced":
            costs[mode.replace("-entry", "").replace("-", "_") + "_ns"] = (
                1e3 * (mean[mode] - mean["untraced"]) / hits if hits else None)
    return costs


def run(what: str, args, copies: dict, sites, cpu: int, per_turn=None) -> dict:
    """One workload: the monitor on its copies, the bare probes on theirs, the turns."""
    monitor_args = ["--kernel-labels", "20"] + [a for p in copies["monitor"] for a in ("-p", p)]
    monitor = h200.Monitor(os.path.abspath(args.pyz), monitor_args)
    bare_sites = [(os.path.join(os.path.dirname(copies["bare-entry"][0]),
                                os.path.basename(path)), offset) for path, offset in sites]
    bare = h200.BareProbes(bare_sites)
    second = None
    if SECOND in copies:
        second = h200.Monitor(os.path.abspath(args.pyz_b), ["--kernel-labels", "20"] + [
            a for p in copies[SECOND] for a in ("-p", p)])
    try:
        usual = args.ops if what == "tiny" else args.steps
        rounds = args.rounds  # (as long as the usual turns take, when a turn is longer)
        if per_turn is not None and per_turn != usual:
            rounds = max(args.rounds * usual // per_turn, 60)
        paused = [m.proc.pid for m in (monitor, second) if m is not None]
        if args.pause_monitor:  # (its probes stay on: the kernel's share alone is timed)
            for pid in paused:
                os.kill(pid, signal.SIGSTOP)
        try:
            result = measure(what, per_turn or usual, rounds, copies, cpu, args.smoke)
        finally:
            if args.pause_monitor:
                for pid in paused:
                    os.kill(pid, signal.SIGCONT)
        result["smoke"] = bool(args.smoke)
        result["monitor_paused"] = args.pause_monitor
        time.sleep(2.0)  # (three reader ticks: the exited child's launches published)
        samples = monitor.scrape()
        if second is not None:  # (its count of its own child's launches)
            pid = result["children"][SECOND]["pid"]
            result["monitor_b_counted_launches"] = h200.total(
                second.scrape(), "ebpf_cuda_kernel_launches_total", 'pid="%d"' % pid)
        result["monitor_said"] = [line for line in monitor.lines if "sampl" in line]
        for name, key in (("ebpf_cuda_api_calls_total", "monitor_calls_by_api"),
                          ("ebpf_cuda_api_errors_total", "monitor_errors_by_api")):
            result[key] = {labels: value for (n, labels), value in samples.items()
                           if n == name and value}  # (what the monitor child called)
    finally:
        hits = bare.close()
        status = monitor.close()
        status_b = second.close() if second is not None else None
    result["monitor_exit_status"] = status
    if second is not None:
        result["monitor_b_exit_status"] = status_b
    result["problems"] = check_probes(result, samples, hits, copies)
    result["per_hit"] = trap_costs(result)
    return result


def verdicts(workload: str, result: dict, bounds: bool) -> bool:
    """PASS/FAIL lines of one workload's result: the probes' placement, and (with `bounds`)
    issue 21's bound; False when a checked one failed."""
    problems = result["problems"]
    print("%s monitor-cost/%s placement: %s" % (
        "FAIL" if problems else "PASS", workload, "; ".join(problems) or
        "each child maps its own copies; the monitor counted %d launches of its child, which "
        "made %d steps; the bare probes hit %d times" % (
            result["monitor_counted_launches"], result["made"]["monitor"],
            result["bare_hits"])), flush=True)
    ok = not problems
    what = workload.partition(":")[0]
    if what in BOUNDS:
        pair, bound = BOUNDS[what]
        ratio = result[pair]
        met = ratio["geomean"] <= bound
        hits = result.get("per_hit", {})
        line = ("%s %.4f (95 %% interval %.4f-%.4f, median %.4f, %d rounds) against %.2f; "
                "us per step, means: %s; ns a probe hit adds: bare %s, monitor %s" % (
                    pair, ratio["geomean"], ratio["ci95"][0], ratio["ci95"][1],
                    ratio["median"], ratio["rounds"], bound,
                    ", ".join("%s %.2f" % kv for kv in result["mean"].items()),
                    _ns(hits.get("bare_ns")), _ns(hits.get("monitor_ns"))))
        if bounds:
            print("%s monitor-cost/%s bound: %s" % ("PASS" if met else "FAIL", workload, line),
                  flush=True)
            ok &= met
        else:
            print("INFO monitor-cost/%s bound: %s" % (workload, line), flush=True)
    return ok


def _ns(value) -> str:
    return "-" if value is None else "%.0f" % value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyz", default="ebpf-cuda.pyz")
    parser.add_argument("--pyz-b", metavar="OTHER.pyz",
                        help="a fourth mode: the monitor of another build (monitor-b)")
    parser.add_argument("--child", choices=("tiny", "mlp"))
    parser.add_argument("--per-turn", type=int)
    parser.add_argument("--workloads", default="tiny,mlp",
                        help="tiny, mlp; NAME:N for N steps a turn (fewer rounds: as long)")
    parser.add_argument("--ops", type=int, default=2000, help="tiny ops a turn")
    parser.add_argument("--steps", type=int, default=20, help="MLP steps a turn")
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--cpu", type=int, help="the children's core (default: the last)")
    parser.add_argument("--copies", default="/dev/shm/ebpf-cuda-turns")
    parser.add_argument("--smoke", metavar="LIB")
    parser.add_argument("--check-bounds", action="store_true",
                        help="issue 21's bounds as PASS/FAIL lines, in the exit status")
    parser.add_argument("--pause-monitor", action="store_true",
                        help="SIGSTOP the monitor process while the turns run: its probes "
                             "and their in-kernel work stay, its reader and ticks stop (what "
                             "of its cost is the user-space side's; records it misses are "
                             "counted lost)")
    args = parser.parse_args()
    if args.child:
        child_turns(args.child, args.per_turn, args.smoke)
        return 0
    if not args.smoke:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            print("SKIP monitor-cost/all: PyTorch not installed here (the workloads are "
                  "PyTorch's)")
            return 77
    os.makedirs(OUT, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    cpu = args.cpu if args.cpu is not None else cpus[-1]
    os.sched_setaffinity(0, set(cpus) - {cpu} or set(cpus))  # (the monitor too: elsewhere)
    files = [args.smoke] if args.smoke else cuda_files(sys.executable)
    copies = make_copies(files, args.copies, MODES + ((SECOND,) if args.pyz_b else ()))
    sites = h200.entry_sites(os.path.abspath(args.pyz), copies["monitor"])
    record = {"part": "turns", "files": files, "entry_sites": len(sites), "cpu": cpu,
              "host": h200.cpu_facts()}
    emit(dict(record, part="turns-start"))
    failed = False
    try:
        for workload in args.workloads.split(","):
            what, _, per_turn = workload.partition(":")  # ("mlp:100": 100 steps a turn)
            if args.smoke and what != "tiny":
                continue
            result = run(what, args, copies, sites, cpu, int(per_turn) if per_turn else None)
            failed |= bool(result["problems"])
            emit(dict(record, **result))
            failed |= not verdicts(workload, result, args.check_bounds)
    finally:
        shutil.rmtree(args.copies, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
