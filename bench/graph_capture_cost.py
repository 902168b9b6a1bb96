"""What the in-kernel capture gate (`--summary` alone following CUDA graphs) costs an eager
launch.

With in-kernel aggregates the return program of every launch, copy, memset and event call
first asks whether some process has a stream capture in progress (`capturing_any`, a
one-entry array: the verifier inlines the lookup) and only then, by hash, whether this one
does (aggregates.capturing_gate). bench/native/callloop launches cudaLaunchKernel of the
stand-in runtime N times per repetition and prints ns/call (thread CPU time, as
bench/overhead.py); every mode runs that same program, interleaved over ROUNDS rounds,
under the library's own entry and return programs for cudaLaunchKernel with the session's
maps (layout.map_specs), loaded and attached here:

  untraced          no probe
  summary no-gate   ProbeOptions(aggregate=True, emit=False) as generated without the gate
                    (probes._gated patched to False): the summary-alone cost before it
  summary           the same with the gate, no process capturing: what eager launches pay now
  summary other     the same while another process captures (capturing_any = 1, this one has
                    no entry): the array lookup and a hash miss
  summary capturing this process captures (its `capturing` entry is 1): every launch is a
                    record (and its aggregates), as during a capture
  records           ProbeOptions(emit=True): one record per call (the plain trace's probes)

The figure is the median of the repetitions, then of the rounds. Under two minutes with the
defaults. Needs root and gcc.

    sudo python3 bench/graph_capture_cost.py [--calls 200000] [--reps 3] [--rounds 4]
"""
import argparse
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import LoopResult  # noqa: E402

from ebpf_cuda.spec import apis, layout, record
from ebpf_cuda import asm
from ebpf_cuda.probes import calls as probes  # noqa: E402
from ebpf_cuda.arch import current as current_arch  # noqa: E402
from ebpf_cuda.targets.elf import ElfFile  # noqa: E402
from ebpf_cuda.bpf.programs import Program  # noqa: E402
from ebpf_cuda.bpf.ringbuf import RingBuffer  # noqa: E402
from ebpf_cuda.session import create_map  # noqa: E402
from ebpf_cuda.bpf.uprobe import attach_uprobe  # noqa: E402

FUNCTION = "cudaLaunchKernel"
RING = 8 << 20
TARGET_CPU, READER_CPU = 1, 0


@contextmanager
def _without_gate():
    saved = probes._gated
    probes._gated = lambda api, options: False
    try:
        yield
    finally:
        probes._gated = saved


class Harness:
    def __init__(self, built, args) -> None:
        self.built, self.args = built, args
        self.api, self.fn_id = apis.BY_NAME[FUNCTION], apis.FN_ID[FUNCTION]
        self.offset = ElfFile(str(built.lib)).symbol_offset(FUNCTION)
        self._records: list = []  # the return program of the records mode

    def command(self) -> List[str]:
        return common.loop_args(self.built, "launch", self.args.calls, self.args.reps,
                                cpu=-1 if self.args.no_pin else TARGET_CPU)

    def untraced(self) -> LoopResult:
        return common.run_plain(self.command())

    def programs(self, gate: bool, **options) -> tuple:
        arch, opts = current_arch(), probes.ProbeOptions(task_storage=True, **options)
        if gate:
            return (probes.entry_program(self.api, self.fn_id, arch, opts),
                    probes.return_program(self.api, self.fn_id, arch, opts))
        with _without_gate():
            return (probes.entry_program(self.api, self.fn_id, arch, opts),
                    probes.return_program(self.api, self.fn_id, arch, opts))

    def run(self, programs: tuple, capturing: str = "none") -> LoopResult:
        specs = layout.map_specs(RING, len(apis.TABLE), False, True, False)
        maps = {spec.name: create_map(spec) for spec in specs}
        loaded, links = [], []
        try:
            for code, retprobe in zip(programs, (False, True)):
                used = {name: maps[name] for name in asm.map_names(code)}
                program = Program(code, used, name="bench_g%d" % retprobe).load()
                loaded.append(program)
                links.append(attach_uprobe(program, str(self.built.lib), self.offset,
                                           retprobe=retprobe, what=FUNCTION))
            if capturing != "none":
                maps[layout.CAPTURING_ANY][0] = 1
            ring = RingBuffer(maps[layout.EVENTS].fd, RING)
            stop, seen = threading.Event(), [0]
            drainer = threading.Thread(target=_drain, args=(ring, stop, self.args.no_pin,
                                                            seen))
            drainer.start()
            try:
                result = self._loop(maps, capturing)
            finally:
                stop.set()
                drainer.join()
                ring.close(drain=False)
            lost = sum(maps[layout.STATS][record.STAT_RING_FULL])
            want = result.made if capturing == "self" or programs[1] is self._records else 0
            if seen[0] + lost != want:
                print("  !! %s: %d records + %d lost, expected %d"
                      % (capturing, seen[0], lost, want))
            return result
        finally:
            for link in links:
                link.close()
            for program in loaded:
                program.close()
            for m in maps.values():
                m.close()

    def _loop(self, maps, capturing: str) -> LoopResult:
        """Run callloop; for "self", its `capturing` entry is set before its first launch
        (it is started stopped: SIGSTOP by a wrapper shell, continued once the entry is in)."""
        if capturing != "self":
            return common.run_plain(self.command())
        import signal
        import time

        child = subprocess.Popen(["sh", "-c", 'kill -STOP $$; exec "$@"', "sh",
                                  *self.command()], stdout=subprocess.PIPE, text=True)
        while _state(child.pid) != "T":
            time.sleep(0.001)
        maps[layout.CAPTURING][child.pid] = 1
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate()
        return common.parse_loop(out)


def _state(pid: int) -> str:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def _drain(ring: RingBuffer, stop: threading.Event, no_pin: bool, seen: List[int]) -> None:
    """Consume as the tracer does (wait 100 ms at most, drain all), counting the records."""
    if not no_pin:
        os.sched_setaffinity(threading.get_native_id(), {READER_CPU})
    while not stop.is_set():
        ring.poll(0.1)
        seen[0] += record.call_count(ring.drain_frames(record.SIZE))
    seen[0] += record.call_count(ring.drain_frames(record.SIZE))


def modes(h: Harness) -> Dict[str, Callable[[], LoopResult]]:
    summary = dict(aggregate=True, emit=False)
    batched = dict(wakeup_bytes=RING // 8)
    gated = h.programs(True, **summary, **batched)
    records = h._records = h.programs(True, **batched)[1]
    return {
        "untraced": h.untraced,
        "summary no-gate": lambda: h.run(h.programs(False, **summary, **batched)),
        "summary": lambda: h.run(gated),
        "summary other": lambda: h.run(gated, "other"),
        "summary capturing": lambda: h.run(gated, "self"),
        "records": lambda: h.run((h.programs(True, **batched)[0], records)),
    }


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200000, help="launches per repetition")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per run")
    parser.add_argument("--rounds", type=int, default=4, help="runs per mode (interleaved)")
    parser.add_argument("--no-pin", action="store_true")
    args = parser.parse_args(argv)
    common.need_root()
    built = common.build()
    harness = Harness(built, args)
    table = modes(harness)
    print("graph_capture_cost: %s" % common.machine())
    print("%s of the stand-in runtime, %d calls x %d reps per run, %d rounds"
          % (FUNCTION, args.calls, args.reps, args.rounds))
    cpu: Dict[str, List[float]] = {name: [] for name in table}
    wall: Dict[str, List[float]] = {name: [] for name in table}
    for _ in range(args.rounds):
        for name, run in table.items():
            result = run()
            cpu[name].append(result.cpu_ns_per_call)
            wall[name].append(result.ns_per_call)
    med = {name: common.median(v) for name, v in cpu.items()}
    print("\n%-18s %10s %10s   %s" % ("mode", "cpu ns", "wall ns", "per-round cpu medians"))
    for name in table:
        print("%-18s %10.1f %10.1f   %s" % (name, med[name], common.median(wall[name]),
                                            " ".join("%.1f" % v for v in cpu[name])))
    print()
    for a, b in (("summary", "summary no-gate"), ("summary other", "summary"),
                 ("summary capturing", "summary"), ("records", "summary"),
                 ("summary", "untraced")):
        print("  %-18s - %-16s = %7.1f ns/launch" % (a, b, med[a] - med[b]))


if __name__ == "__main__":
    main(sys.argv[1:])
