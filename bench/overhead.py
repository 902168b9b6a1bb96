"""Per-call cost of tracing, measured inside the traced program.

bench/native/callloop calls one CUDA function (cudaGetDevice of the stand-in runtime by
default) N times per repetition and prints ns/call of each repetition (clock_gettime around
the loop; also the thread's CPU time, the default figure: it does not count time the thread
sat preempted, so other load on the machine inflates it far less). Every mode below runs
that same program; the figure is the median of the repetitions, and the median of that over
ROUNDS rounds (modes interleaved, so drift hits all):

  untraced         no probe
  bare-entry       one uprobe: atomic add into an array map (the floor of any entry tracer)
  bare-pair        uprobe + uretprobe, each an atomic add (the floor of any call tracer)
  tracer           Tracer(library=[stand-in], functions=[fn]) with return probes, raw frames
                   counted by this process (no decoding): the probes' own cost
  tracer -r        the same, entry probes only (return_probes=False)
  cli text         python3 -m ebpf_cuda -p LIB --functions FN -o /dev/null
  cli json         ... --json -o /dev/null
  cli -r           ... -r -o /dev/null
  cli summary      ... --summary (only when the CLI has --summary)
  monitor          the monitor's probes (in-kernel aggregates, no records): with --op launch
                   on a kernel with uprobe sessions, one session program taking 1 return in
                   64 (issue 21's bound: <= 1.02x bare-entry)
  monitor -R1      the same taking every return (--return-sampling 1)
  c:*              the breakdown: hash stash only, ring record only (with and without
                   consumer wakeups), the library's programs with and without wakeups

Ratios: tracer / bare-pair (target <= 1.10), tracer -r / bare-entry (<= 1.10), summary /
bare-pair (<= 1.05). The target is pinned to CPU 1 and the consumer to CPU 0 (--no-pin to
leave scheduling alone). Needs root and gcc.

    sudo python3 bench/overhead.py [--calls 200000] [--reps 5] [--rounds 3] [--op getdevice]
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import BareCounters, Built, LoopResult  # noqa: E402

import threading  # noqa: E402

from ebpf_cuda import asm
from ebpf_cuda.spec import layout, record
from ebpf_cuda.probes import calls as probes  # noqa: E402
from ebpf_cuda.arch import current as current_arch  # noqa: E402
from ebpf_cuda.asm import DW, FP, R0, R1, R2, R3, R4, R6, Helper  # noqa: E402
from ebpf_cuda.spec.apis import BY_NAME, FN_ID  # noqa: E402
from ebpf_cuda.targets.elf import ElfFile  # noqa: E402
from ebpf_cuda.bpf.maps import LruHashMap, PerCpuArrayMap, RingBufMap  # noqa: E402
from ebpf_cuda.bpf.programs import Program  # noqa: E402
from ebpf_cuda.bpf.ringbuf import RingBuffer  # noqa: E402
from ebpf_cuda.spec.layout import INFLIGHT_ENTRIES  # noqa: E402
from ebpf_cuda.tracer import Tracer  # noqa: E402
from ebpf_cuda.bpf.uprobe import attach_uprobe  # noqa: E402

BPF_RB_NO_WAKEUP = 1

FUNCTIONS = {"getdevice": "cudaGetDevice", "launch": "cudaLaunchKernel",
             "getlasterror": "cudaGetLastError"}


class Bench:
    def __init__(self, built: Built, args: argparse.Namespace) -> None:
        self.built, self.args = built, args
        self.function = FUNCTIONS[args.op]
        self.target_cpu = -1 if args.no_pin else 1
        self.tracer_cpu: Optional[int] = None if args.no_pin else 0
        self.baseline = Path(args.baseline).resolve() if args.baseline else None

    def command(self) -> List[str]:
        return common.loop_args(self.built, self.args.op, self.args.calls, self.args.reps,
                                cpu=self.target_cpu)

    def untraced(self) -> LoopResult:
        return common.run_plain(self.command())

    def bare(self, retprobe: bool) -> LoopResult:
        with BareCounters(self.built.lib, self.function, retprobe) as counters:
            result = common.run_plain(self.command())
            entries, returns = counters.values()
        _check("bare", result.made, entries, 0)
        if retprobe:
            _check("bare returns", result.made, returns, 0)
        return result

    def tracer(self, return_probes: bool) -> LoopResult:
        """The library's probes through the public Tracer; frames counted, not decoded."""
        def seen(tracer: Tracer) -> int:
            return sum(record.call_count(frames) for frames in tracer.frames())
        return self._traced("tracer", seen, return_probes=return_probes)

    def monitor(self, sample_returns: int) -> LoopResult:
        """The monitor's probes (Tracer(aggregate=True, emit=False) as `ebpf-cuda monitor`
        makes them): launch returns sampled 1 in `sample_returns` where the kernel has uprobe
        sessions (64, the monitor's default), or every return (1)."""
        def counted(tracer: Tracer) -> int:
            for _ in tracer.frames():
                pass
            return sum(f.count for f in tracer.aggregates().functions
                       if f.api == self.function)
        return self._traced("monitor", counted, aggregate=True, emit=False,
                            sample_returns=sample_returns, per_process=True)

    def _traced(self, what: str, count: Callable[[Tracer], int], **options) -> LoopResult:
        """The loop under a Tracer of the bench's function with `options`; `count(tracer)`
        reads until the end and says how many calls the tracer saw."""
        with tempfile.TemporaryFile("w+") as out:
            tracer = Tracer(library=[str(self.built.lib)], functions=[self.function],
                            command=self.command(), **options)
            try:
                with _stdout_to(out.fileno()):
                    tracer.start()  # forks the held command with stdout redirected
                with _pinned(self.tracer_cpu):
                    seen = count(tracer)
                lost = tracer.stats()["lost"]
            finally:
                tracer.close()
            out.seek(0)
            result = common.parse_loop(out.read())
        _check(what, result.made, seen, lost)
        return result

    def cli(self, *options: str, tree: Optional[Path] = None) -> LoopResult:
        run = common.run_cli(["-p", str(self.built.lib), "--functions", self.function,
                              *options], self.command(), cpu=self.tracer_cpu, tree=tree)
        return common.parse_loop(run.stdout)


# -- components: where the tracer's time goes --------------------------------------------------
#
# Each variant is an entry/return program pair on the same function, with the tracer's maps,
# and a consumer thread draining the ring: the difference between two variants is the cost of
# what one adds over the other.


def _key_on_stack() -> list:
    """fp-16 = (pid_tgid, sp): the inflight key as the tracer builds it."""
    arch = current_arch()
    return [asm.mov(R6, R1), asm.call(Helper.GET_CURRENT_PID_TGID), asm.stx(DW, FP, -16, R0),
            asm.ldx(DW, R1, R6, arch.sp), asm.stx(DW, FP, -8, R1)]


def hash_entry() -> list:
    """Entry: inflight[(pid_tgid, sp)] = 104 zero bytes (the stash without its contents)."""
    value = -16 - record.INFLIGHT_VALUE_SIZE
    zero = [asm.st(DW, FP, value + 8 * k, 0) for k in range(record.INFLIGHT_VALUE_SIZE // 8)]
    return _key_on_stack() + zero + [
        asm.ld_map(R1, "inflight"), asm.mov(R2, FP), asm.add(R2, -16),
        asm.mov(R3, FP), asm.add(R3, value), asm.mov(R4, 0),
        asm.call(Helper.MAP_UPDATE_ELEM), asm.mov(R0, 0), asm.exit()]


def hash_return() -> list:
    """Return: look the stash up and delete it (no record)."""
    return _key_on_stack() + [
        asm.ld_map(R1, "inflight"), asm.mov(R2, FP), asm.add(R2, -16),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.ld_map(R1, "inflight"), asm.mov(R2, FP), asm.add(R2, -16),
        asm.call(Helper.MAP_DELETE_ELEM), asm.mov(R0, 0), asm.exit()]


def ring_only(flags: int) -> list:
    """Reserve one record.SIZE record and submit it unfilled."""
    return [
        asm.ld_map(R1, "events"), asm.mov(R2, record.SIZE), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE), asm.jeq(R0, 0, "out"),
        asm.mov(R1, R0), asm.mov(R2, flags), asm.call(Helper.RINGBUF_SUBMIT),
        asm.Label("out"), asm.mov(R0, 0), asm.exit()]


def counter_only() -> list:
    return common.counter_program(0)


class Components:
    """Runs the target under one variant of entry/return programs."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        api = BY_NAME[bench.function]
        self.fn_id, self.api = FN_ID[bench.function], api
        self.offset = ElfFile(str(bench.built.lib)).symbol_offset(bench.function)

    def variants(self) -> Dict[str, Callable[[], LoopResult]]:
        arch = current_arch()
        def lib(**options):  # the library's own programs, with these ProbeOptions
            opts = probes.ProbeOptions(**options)
            return (probes.entry_program(self.api, self.fn_id, arch, opts),
                    probes.return_program(self.api, self.fn_id, arch, opts))

        batched = (4 << 20) // 8  # the tracer's default: wake the reader at 1/8 of its 4 MiB ring
        return {
            "c:hash": lambda: self.run(hash_entry(), hash_return()),
            "c:ring": lambda: self.run(counter_only(), ring_only(0)),
            "c:ring-nowake": lambda: self.run(counter_only(), ring_only(BPF_RB_NO_WAKEUP)),
            "c:lib": lambda: self.run(*lib(task_storage=True, wakeup_bytes=batched)),
            "c:lib-wake": lambda: self.run(*lib(task_storage=True)),
            "c:lib-hash": lambda: self.run(*lib(wakeup_bytes=batched)),
        }

    def _maps(self) -> Dict[str, object]:
        from ebpf_cuda.bpf.maps import ArrayMap, TaskStorageMap
        return {
            "events": RingBufMap(8 << 20, name="events"),
            "inflight": LruHashMap(record.INFLIGHT_KEY.size, record.INFLIGHT_VALUE_SIZE,
                                   INFLIGHT_ENTRIES, name="inflight"),
            "stats": PerCpuArrayMap(8, record.STAT_COUNT, name="stats"),
            "names": LruHashMap(layout.NAME_KEY_SIZE, layout.NAME_SIZE, 16, name="names"),
            "scratch": PerCpuArrayMap(layout.NAME_KEY_SIZE + layout.NAME_SIZE, 1,
                                      name="scratch"),
            "counts": ArrayMap(16, 1, "bench_counts"),
            "tasks": TaskStorageMap(record.TASK_VALUE_SIZE, name="tasks"),
        }

    def run(self, entry: list, ret: list) -> LoopResult:
        maps = self._maps()
        loaded, links = [], []
        try:
            for code, retprobe in ((entry, False), (ret, True)):
                used = {name: maps[name] for name in asm.map_names(code)}
                program = Program(code, used, name="bench_c%d" % retprobe).load()
                loaded.append(program)
                links.append(attach_uprobe(program, str(self.bench.built.lib), self.offset,
                                           retprobe=retprobe, what=self.bench.function))
            ring = RingBuffer(maps["events"].fd, 8 << 20)  # type: ignore[attr-defined]
            stop = threading.Event()
            drainer = threading.Thread(target=_drain, args=(ring, stop, self.bench.tracer_cpu))
            drainer.start()
            try:
                return common.run_plain(self.bench.command())
            finally:
                stop.set()
                drainer.join()
                ring.close(drain=False)
        finally:
            for link in links:
                link.close()
            for program in loaded:
                program.close()
            for m in maps.values():
                m.close()  # type: ignore[attr-defined]


def _drain(ring: RingBuffer, stop: threading.Event, cpu: Optional[int]) -> None:
    """Consume like the tracer does: wait (100 ms at most), drain everything, repeat."""
    if cpu is not None:
        os.sched_setaffinity(threading.get_native_id(), {cpu})
    while not stop.is_set():
        ring.poll(0.1)
        ring.drain_frames(record.SIZE)
    ring.drain_frames(record.SIZE)


class _stdout_to:
    """Point fd 1 at `fd` for the duration (the tracer's forked command inherits it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        sys.stdout.flush()
        self.saved = os.dup(1)
        os.dup2(self.fd, 1)

    def __exit__(self, *exc) -> None:
        os.dup2(self.saved, 1)
        os.close(self.saved)


class _pinned:
    """Run this process on `cpu` for the duration (None: leave it)."""

    def __init__(self, cpu: Optional[int]) -> None:
        self.cpu = cpu

    def __enter__(self) -> None:
        self.saved = os.sched_getaffinity(0)
        if self.cpu is not None:
            os.sched_setaffinity(0, {self.cpu})

    def __exit__(self, *exc) -> None:
        os.sched_setaffinity(0, self.saved)


def _check(what: str, made: int, seen: int, lost: int) -> None:
    if seen + lost != made:
        print("  !! %s: seen %d + lost %d != made %d" % (what, seen, lost, made))


def modes(bench: Bench, summary: bool,
          components: bool) -> Dict[str, Callable[[], LoopResult]]:
    table: Dict[str, Callable[[], LoopResult]] = {
        "untraced": bench.untraced,
        "bare-entry": lambda: bench.bare(False),
        "bare-pair": lambda: bench.bare(True),
        "tracer": lambda: bench.tracer(True),
        "tracer -r": lambda: bench.tracer(False),
        "cli text": lambda: bench.cli("-o", os.devnull),
        "cli json": lambda: bench.cli("--json", "-o", os.devnull),
        "cli -r": lambda: bench.cli("-r", "-o", os.devnull),
        "monitor": lambda: bench.monitor(64),
        "monitor -R1": lambda: bench.monitor(1),
    }
    # TODO(issue 7): drop this guard once --summary (in-kernel aggregation) is merged.
    if summary:
        table["cli summary"] = lambda: bench.cli("--summary")
    if components:
        table.update(Components(bench).variants())
    if bench.baseline is not None:  # another checkout's CLI in the same rounds (--baseline)
        tree = bench.baseline
        table.update({
            "baseline cli text": lambda: bench.cli("-o", os.devnull, tree=tree),
            "baseline cli json": lambda: bench.cli("--json", "-o", os.devnull, tree=tree),
            "baseline cli summary": lambda: bench.cli("--summary", tree=tree),
        })
    return table


def report(results: Dict[str, List[float]], walls: Dict[str, List[float]],
           clock: str) -> None:
    med = {name: common.median(values) for name, values in results.items()}
    print("\n%-14s %12s %12s   %s" % ("mode", clock + " ns", "wall ns", "per-round medians"))
    for name, values in results.items():
        print("%-14s %12.1f %12.1f   %s" % (name, med[name], common.median(walls[name]),
                                            " ".join("%.1f" % v for v in values)))
    print("\nsame-run ratios (%s-time medians):" % clock)

    def ratio(a: str, b: str, target: Optional[float] = None) -> None:
        if a in med and b in med and med[b] > 0:
            r = med[a] / med[b]
            verdict = "" if target is None else ("  target <= %.2f: %s" % (
                target, "met" if r <= target else "MISSED"))
            print("  %-12s / %-11s = %5.2f%s" % (a, b, r, verdict))

    ratio("bare-entry", "untraced")
    ratio("bare-pair", "untraced")
    ratio("tracer", "bare-pair", 1.10)
    ratio("tracer -r", "bare-entry", 1.10)
    ratio("cli text", "bare-pair")
    ratio("cli json", "bare-pair")
    ratio("cli -r", "bare-entry", 1.10)
    ratio("cli summary", "bare-pair", 1.05)
    ratio("monitor", "bare-entry", 1.02)  # (--op launch; other ops take every return)
    ratio("monitor -R1", "bare-pair")
    print("\nbreakdown (ns/call added, all over bare-pair unless said):")
    for name, base, what in (
            ("c:hash", "bare-pair", "inflight LRU hash update at entry + lookup/delete at return"),
            ("c:ring", "bare-pair", "reserve+submit of one %d-byte record, adaptive wakeup"
             % record.SIZE),
            ("c:ring-nowake", "bare-pair", "the same with BPF_RB_NO_WAKEUP"),
            ("c:lib", "bare-pair", "the library's programs (same as `tracer`, own harness)"),
            ("c:lib-wake", "c:lib", "a reader wakeup per record (the kernel's adaptive mode)"),
            ("c:lib-hash", "c:lib", "calls in flight in an LRU hash instead of task storage")):
        if name in med and base in med:
            print("  %-13s - %-13s = %6.0f ns  %s" % (name, base, med[name] - med[base], what))
    for name in ("tracer", "tracer -r", "cli text", "cli summary"):
        base = "bare-entry" if "-r" in name else "bare-pair"
        if name in med and base in med:
            print("  %-12s adds %.0f ns/call over %s" % (name, med[name] - med[base], base))


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200000, help="calls per repetition")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per mode (interleaved)")
    parser.add_argument("--op", choices=sorted(FUNCTIONS), default="getdevice")
    parser.add_argument("--lib", help="libcudart.so.12 to use instead of the stand-in")
    parser.add_argument("--only", help="comma-separated mode names to run")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--no-components", action="store_true",
                        help="skip the breakdown variants (c:*)")
    parser.add_argument("--baseline", metavar="DIR",
                        help="another checkout (git worktree add DIR COMMIT) whose CLI runs as "
                             "'baseline cli text/json/summary' in the same rounds")
    parser.add_argument("--wall", action="store_true",
                        help="rank by wall-clock ns/call (default: the calling thread's CPU "
                             "time, which a busy machine's preemptions do not inflate)")
    args = parser.parse_args(argv)
    common.need_root()
    built = common.build(args.lib)
    bench = Bench(built, args)
    table = modes(bench, common.cli_has("--summary"), not args.no_components)
    if args.only:
        wanted = [m.strip() for m in args.only.split(",")]
        table = {k: v for k, v in table.items() if k in wanted}
    print("overhead: %s" % common.machine())
    print("op %s (%s), %d calls x %d reps per run, %d rounds, lib %s"
          % (args.op, bench.function, args.calls, args.reps, args.rounds, built.lib))
    clock = "wall" if args.wall else "cpu"
    results: Dict[str, List[float]] = {name: [] for name in table}
    walls: Dict[str, List[float]] = {name: [] for name in table}
    for round_no in range(args.rounds):
        for name, run in table.items():
            result = run()
            figure = result.ns_per_call if args.wall else result.cpu_ns_per_call
            results[name].append(figure)
            walls[name].append(result.ns_per_call)
            print("  round %d %-12s %8.1f %s ns/call, %8.1f wall  (%s reps %s)" % (
                round_no + 1, name, figure, clock, result.ns_per_call, clock,
                " ".join("%.0f" % r for r in (result.reps if args.wall
                                              else result.cpu_reps))), flush=True)
    report(results, walls, clock)


if __name__ == "__main__":
    main(sys.argv[1:])
