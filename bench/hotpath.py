"""The hot path's whole table (issue 36) in one interleaved run: what a traced call costs the
program in each mode against the floors (untraced, a bare entry counter, a bare entry+return
counter pair), at 1, 4 and 16 threads, pinned apart and not; the tracer's own CPU per call
and its peak RSS; start-up (spawn to the command's first instruction) and exit (command end
to the tracer's exit).

The workload is bench/native/callloop calling cudaGetDevice of the stand-in runtime (every
export starts with `push %rbp`, as NVIDIA's do). Each case runs once per round, the order
rotated from round to round, so a noisy minute weighs on every case alike; min, median and
max over the rounds. The program's figure is its calling thread's CPU time per call (the
probes run in its context; a busy machine's preemptions do not inflate it), wall time
beside it. The tracer's CPU is the CPU its process spent inside `Tracer.trace_into` (reader
and lines thread, start-up and exit left out) over the calls made; RSS is its peak
(ru_maxrss). With --baseline DIR another checkout's CLI runs the same CLI cases in the same
rounds (`base:` rows).

    sudo python3 bench/hotpath.py [--rounds 3] [--calls 200000] [--reps 3] [--baseline DIR]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import exit as exit_bench  # noqa: E402
import startup  # noqa: E402
from common import BareCounters, LoopResult  # noqa: E402

FUNCTION = "cudaGetDevice"

# Runs the CLI in a child interpreter and tells, on stderr, the CPU its process spent in
# Tracer.trace_into and its peak RSS (works with any checkout that has Tracer.trace_into).
WRAPPER = r'''
import os, resource, sys
import ebpf_cuda.tracer as T
marks = []
real = T.Tracer.trace_into
def trace_into(self, *a, **k):
    marks.append(resource.getrusage(resource.RUSAGE_SELF))
    try:
        return real(self, *a, **k)
    finally:
        marks.append(resource.getrusage(resource.RUSAGE_SELF))
T.Tracer.trace_into = trace_into
from ebpf_cuda.cli.main import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as done:
    code = done.code if isinstance(done.code, int) else 1
if len(marks) == 2:
    a, b = marks
    sys.stderr.write("\nhotpath: trace_cpu_s=%f maxrss_kb=%d\n" % (
        b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime, b.ru_maxrss))
sys.stderr.flush()
sys.stdout.flush()
os._exit(code)
'''
_FIGURES = re.compile(r"hotpath: trace_cpu_s=([\d.]+) maxrss_kb=(\d+)")
_LOST = re.compile(r"(\d+) events lost")


class Figures(dict):
    """One run's figures by name: cpu_ns, wall_ns (the program's, per call), tracer_us
    (per call), rss_mb, lost, ms (start-up, exit)."""


class Cases:
    def __init__(self, built: common.Built, args: argparse.Namespace) -> None:
        self.built, self.args = built, args

    def loop(self, threads: int = 1, cpu: int = -1) -> List[str]:
        """callloop making --calls calls a repetition over all of its threads."""
        return common.loop_args(self.built, "getdevice", self.args.calls // threads,
                                self.args.reps, threads=threads, cpu=cpu)

    @staticmethod
    def _of(result: LoopResult) -> Figures:
        return Figures(cpu_ns=result.cpu_ns_per_call, wall_ns=result.ns_per_call)

    def untraced(self, threads: int) -> Figures:
        return self._of(common.run_plain(self.loop(threads)))

    def bare(self, retprobe: bool, threads: int) -> Figures:
        with BareCounters(self.built.lib, FUNCTION, retprobe):
            return self._of(common.run_plain(self.loop(threads)))

    def cli(self, options: Sequence[str], tree: Path, threads: int = 1,
            pinned: bool = False) -> Figures:
        """The CLI of `tree` tracing the loop; pinned: tracer on CPU 0, program on CPU 1."""
        argv = [sys.executable, "-c", WRAPPER, "-p", str(self.built.lib), "--functions",
                FUNCTION, *options, "--", *self.loop(threads, 1 if pinned else -1)]
        env = dict(os.environ, PYTHONPATH=str(tree))
        done = subprocess.run(argv, capture_output=True, text=True, cwd=str(tree), env=env,
                              timeout=900, preexec_fn=common._pin(0 if pinned else None))
        if done.returncode != 0:
            raise RuntimeError("ebpf-cuda %s failed (%d): %s"
                               % (" ".join(options), done.returncode, done.stderr[-800:]))
        result = common.parse_loop(done.stdout)
        figures = self._of(result)
        found = _FIGURES.search(done.stderr)
        if found:
            figures.update(tracer_us=float(found.group(1)) * 1e6 / max(result.made, 1),
                           rss_mb=int(found.group(2)) / 1024)
        lost = _LOST.search(done.stderr)
        figures["lost"] = int(lost.group(1)) if lost else 0
        return figures

    def startup(self, tree: Path) -> Figures:
        argv = common.cli_command(["-p", str(self.built.lib)], [str(self.built.stamp)])
        env = dict(os.environ, PYTHONPATH=str(tree))
        return Figures(ms=startup.time_to_stamp(argv, cwd=str(tree), env=env) * 1000)

    def exit(self, tree: Path) -> Figures:
        return Figures(ms=exit_bench.one_round(str(tree)))


MODES = {"text": ["-o", "{out}"], "json": ["--json", "-o", "{out}"], "-r": ["-r", "-o", "{out}"],
         "save": ["--save", "{out}"], "summary": ["--summary"]}


def table(cases: Cases, out: str, baseline: Optional[Path]) -> Dict[str, Callable[[], Figures]]:
    """Every case by its row name (the floor a row is compared with is `floor_of`)."""
    rows: Dict[str, Callable[[], Figures]] = {}
    for threads in (1, 4, 16):
        t = "" if threads == 1 else " %dt" % threads
        rows["untraced" + t] = lambda n=threads: cases.untraced(n)
        rows["bare entry" + t] = lambda n=threads: cases.bare(False, n)
        rows["bare pair" + t] = lambda n=threads: cases.bare(True, n)
    trees = [("", common.REPO)] + ([("base: ", baseline)] if baseline is not None else [])
    for prefix, tree in trees:
        def cli(mode: str, threads: int = 1, pinned: bool = False, tree=tree) -> Figures:
            options = [o.format(out=out) for o in MODES[mode]]
            return cases.cli(options, tree, threads, pinned)
        for mode in MODES:
            rows[prefix + mode] = lambda m=mode, c=cli: c(m)
        rows[prefix + "text pinned"] = lambda c=cli: c("text", pinned=True)
        rows[prefix + "save pinned"] = lambda c=cli: c("save", pinned=True)
        for threads in (4, 16):
            for mode in ("text", "save"):
                rows[prefix + "%s %dt" % (mode, threads)] = lambda m=mode, n=threads, c=cli: c(m, n)
        rows[prefix + "start-up"] = lambda tree=tree: cases.startup(tree)
        rows[prefix + "exit"] = lambda tree=tree: cases.exit(tree)
    return rows


def floor_of(name: str) -> Optional[str]:
    """The bare row a traced row is divided by (same thread count)."""
    plain = name.replace("base: ", "")
    if plain.startswith(("untraced", "start-up", "exit")):
        return None
    threads = re.search(r" (\d+t)$", plain)
    t = " " + threads.group(1) if threads else ""
    if plain.startswith("bare"):
        return "untraced" + t
    return ("bare entry" if plain == "-r" else "bare pair") + t


def spread(values: List[float], fmt: str = "%.0f") -> str:
    if not values:
        return "-"
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(values), min(values),
                                                    max(values))


def report(results: Dict[str, List[Figures]]) -> None:
    print("\n%-16s %-22s %-22s %-20s %-20s %-9s %s" % (
        "case", "program CPU ns/call", "wall ns/call", "/ floor (CPU; wall)",
        "tracer CPU us/call", "RSS MB", "lost"))
    for name, runs in results.items():
        if "ms" in runs[0]:
            print("%-16s %s ms" % (name, spread([r["ms"] for r in runs])))
            continue
        cpu, wall = [r["cpu_ns"] for r in runs], [r["wall_ns"] for r in runs]
        floor = floor_of(name)
        ratio = "-"
        if floor in results:
            base_cpu = statistics.median(r["cpu_ns"] for r in results[floor])
            base_wall = statistics.median(r["wall_ns"] for r in results[floor])
            ratio = "%.2fx; %.2fx" % (statistics.median(cpu) / base_cpu,
                                      statistics.median(wall) / base_wall)
        tracer = [r["tracer_us"] for r in runs if "tracer_us" in r]
        rss = [r["rss_mb"] for r in runs if "rss_mb" in r]
        lost = sum(r.get("lost", 0) for r in runs)
        print("%-16s %-22s %-22s %-20s %-20s %-9s %s" % (
            name, spread(cpu), spread(wall), ratio, spread(tracer, "%.1f"),
            "%.1f" % max(rss) if rss else "-", lost if "lost" in runs[0] else "-"))


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200000,
                        help="calls per repetition (over all threads)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per run")
    parser.add_argument("--baseline", metavar="DIR",
                        help="another checkout (git worktree add DIR COMMIT) run in the "
                             "same rounds")
    parser.add_argument("--only", help="comma-separated case names")
    args = parser.parse_args(argv)
    common.need_root()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # (as installed: bytecode cached)
    built = common.build()
    baseline = Path(args.baseline).resolve() if args.baseline else None
    out = "/tmp/ebpf-cuda-hotpath.out"
    rows = table(Cases(built, args), out, baseline)
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        rows = {k: v for k, v in rows.items() if k in wanted}
    print("hotpath: %s" % common.machine())
    print("%s of the stand-in, %d calls x %d reps a run, %d interleaved rounds; this tree "
          "%s%s" % (FUNCTION, args.calls, args.reps, args.rounds, common.REPO,
                    ", baseline %s" % baseline if baseline else ""))
    results: Dict[str, List[Figures]] = {name: [] for name in rows}
    # Each case beside its baseline twin (a load that comes and goes weighs on both), the
    # order shifted from round to round.
    names = [n for name in rows if not name.startswith("base: ")
             for n in (name, "base: " + name) if n in rows]
    for round_no in range(args.rounds):
        shift = (round_no * 7) % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(rows[name]())
        print("  round %d done" % (round_no + 1), flush=True)
    try:
        os.unlink(out)
    except OSError:
        pass
    report(results)


if __name__ == "__main__":
    main(sys.argv[1:])
