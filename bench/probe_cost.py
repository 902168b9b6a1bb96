"""The probe programs' own cost per run in every mode (issue 36, "Programs"), from the
kernel's run statistics, beside the bare counters, interleaved.

bench/native/callloop calls cudaGetDevice (--op) of the stand-in runtime CALLS times (pinned to
CPU 1, SCHED_FIFO: no other process preempts it, nor its probes, whose run time would count
the preemption) under each mode, as a user runs it (the CLI in a child process pinned to CPU 0, its
programs found by id as they load and held open so that their statistics outlive it):

  bare         one counting program at entry, one at return (an atomic add: the floor)
  text         ebpf-cuda -o FILE -- loop          (the programs of JSON and --save too:
  json         ebpf-cuda --json -o FILE -- loop    the same TraceConfig, listed apart to
  save         ebpf-cuda --save FILE -- loop       show the reader's share is not in them)
  -r           ebpf-cuda -r -o FILE -- loop        (entry records only)
  summary      ebpf-cuda --summary -- loop
  monitor      ebpf-cuda monitor -p LIB --functions FUNCTION, the loop run beside it

Each round runs every mode once, the order rotated from round to round. The figure of a
program kind (entry, return) is Σ run_time_ns / Σ run_cnt of the mode's programs of that
kind; the statistics are switched on by a BPF_ENABLE_STATS descriptor held for the whole
run (other processes toggling the sysctl cannot switch them off meanwhile). Each mode's
figures are printed as median (min-max) over the rounds, and beside them the difference to
the bare counter of the same kind in the same round (median of the differences). With
--baseline DIR another checkout's CLI runs every mode in the same rounds (`base:` rows).

    sudo python3 bench/probe_cost.py [--rounds 7] [--calls 200000] [--ring 64M] [--baseline DIR]
                                     [--only text,summary] [--op getlasterror]
"""
import argparse
import ctypes
import os
import re
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import BareCounters  # noqa: E402

from ebpf_cuda import syscalls  # noqa: E402

FUNCTIONS = {"getdevice": "cudaGetDevice", "getlasterror": "cudaGetLastError",
             "launch": "cudaLaunchKernel"}
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
KINDS = ("ent", "ret", "ses")
# The tracer on CPU 0, the loop on CPU 1 (callloop pins itself): a uprobe's program runs
# preemptible, and its run time would count the tracer's threads preempting it (the
# reader's share of an unpinned run, issue 36's other part), not the program's own work.
TRACER_CPU = common._pin(0)
# mode -> CLI options ({out}: a file in the round's scratch folder); None: not the CLI
MODES: Dict[str, Optional[List[str]]] = {
    "bare": None,
    "text": ["-o", "{out}"],
    "json": ["--json", "-o", "{out}"],
    "save": ["--save", "{out}"],
    "-r": ["-r", "-o", "{out}"],
    "summary": ["--summary"],
    "monitor": None,
}


def enable_stats() -> int:
    """A descriptor that keeps the run statistics on while it is open."""
    attr = ctypes.create_string_buffer(16)
    struct.pack_into("<I", attr, 0, BPF_STATS_RUN_TIME)
    fd, err = syscalls.bpf_raw(BPF_ENABLE_STATS, attr)
    if fd < 0:
        raise OSError(err, "BPF_ENABLE_STATS")
    return fd


class Grabber:
    """Opens, every 5 ms until stopped, each program that process `pid` holds (its program
    and link descriptors, as /proc/PID/fdinfo tells their program ids): other processes'
    programs, of the same names maybe, are left out. The descriptors keep the programs (and
    their statistics) after their loader is gone."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fds: Dict[int, object] = {}
        self.names: Dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.grab()
            time.sleep(0.005)

    def _their_ids(self) -> List[int]:
        ids = []
        folder = "/proc/%d/fdinfo" % self.pid
        try:
            entries = os.listdir(folder)
        except OSError:
            return ids
        for entry in entries:
            try:
                with open(os.path.join(folder, entry)) as f:
                    text = f.read()
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith("prog_id:"):
                    ids.append(int(line.split()[1]))
        return ids

    def grab(self) -> None:
        for prog_id in self._their_ids():
            if prog_id in self.fds:
                continue
            try:
                fd = syscalls.prog_fd_by_id(prog_id)
            except Exception:  # (gone already)
                continue
            self.fds[prog_id], self.names[prog_id] = fd, syscalls.prog_info(int(fd)).name

    def count(self) -> int:
        return len(self.fds)

    def stop(self) -> Dict[str, Tuple[int, int]]:
        """(Σ run_time_ns, Σ run_cnt) by kind of program (cuda*_ent, _ret, _ses); the
        descriptors closed."""
        self._stop.set()
        self._thread.join()
        sums = {kind: (0, 0) for kind in KINDS}
        for prog_id, fd in self.fds.items():
            info = syscalls.prog_info(int(fd))
            name = self.names[prog_id]
            kind = name[-3:]
            if name.startswith("cuda") and kind in sums:
                time_ns, runs = sums[kind]
                sums[kind] = (time_ns + info.run_time_ns, runs + info.run_cnt)
            fd.close()
        return sums


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.built = common.build()
        # SCHED_FIFO: other processes of this shared machine cannot preempt the loop (and
        # with it a program in its run) on its CPU.
        self.function = FUNCTIONS[args.op]
        self.loop = ["chrt", "-f", "1"] + common.loop_args(
            self.built, args.op, args.calls, 1, cpu=1)
        self.scratch = Path(tempfile.mkdtemp(prefix="probe_cost."))

    def env(self, tree: Optional[Path]) -> Dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(tree or common.REPO)
        return env

    def bare(self) -> Dict[str, Tuple[int, int]]:
        with BareCounters(self.built.lib, self.function, True) as counters:
            before = [syscalls.prog_info(p.fd) for p in counters.programs]
            subprocess.run(self.loop, stdout=subprocess.DEVNULL, check=True)
            after = [syscalls.prog_info(p.fd) for p in counters.programs]
        pairs = [(a.run_time_ns - b.run_time_ns, a.run_cnt - b.run_cnt)
                 for a, b in zip(after, before)]
        return {"ent": pairs[0], "ret": pairs[1], "ses": (0, 0)}

    def cli(self, options: Sequence[str], tree: Optional[Path]) -> Dict[str, Tuple[int, int]]:
        out = str(self.scratch / "out")
        command = [sys.executable, "-m", "ebpf_cuda", "-p", str(self.built.lib), "--functions",
                   self.function] + [o.format(out=out) for o in options]
        if self.args.ring and "--summary" not in options:
            command += ["--ring-size", self.args.ring]
        child = subprocess.Popen(command + ["--"] + self.loop, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, env=self.env(tree),
                                 cwd=str(tree or common.REPO), preexec_fn=TRACER_CPU)
        grabber = Grabber(child.pid)
        _, err = child.communicate(timeout=600)
        if child.returncode != 0:
            raise RuntimeError("ebpf-cuda %s failed: %s" % (" ".join(options), err[-500:]))
        lost = re.search(rb"(\d+) events lost", err)
        sums = grabber.stop()
        sums["lost"] = (int(lost.group(1)) if lost else 0, 0)
        return sums

    def monitor(self, tree: Optional[Path]) -> Dict[str, Tuple[int, int]]:
        child = subprocess.Popen(
            [sys.executable, "-m", "ebpf_cuda", "monitor", "-p", str(self.built.lib),
             "--functions", self.function], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=self.env(tree), cwd=str(tree or common.REPO), preexec_fn=TRACER_CPU)
        grabber = Grabber(child.pid)
        try:
            deadline = time.monotonic() + 30
            seen, steady = 0, 0.0
            while time.monotonic() < deadline:  # (loaded: no new program for 0.3 s)
                time.sleep(0.05)
                if grabber.count() != seen:
                    seen, steady = grabber.count(), time.monotonic()
                elif seen and time.monotonic() - steady > 0.3:
                    break
            time.sleep(0.2)  # (attached after loading)
            subprocess.run(self.loop, stdout=subprocess.DEVNULL, check=True)
        finally:
            child.send_signal(signal.SIGINT)
            child.wait(timeout=60)
        return grabber.stop()

    def run(self, mode: str, tree: Optional[Path]) -> Dict[str, Tuple[int, int]]:
        if mode == "bare":
            return self.bare()
        if mode == "monitor":
            return self.monitor(tree)
        return self.cli(MODES[mode] or [], tree)


def per_run(sums: Dict[str, Tuple[int, int]], kind: str) -> Optional[float]:
    time_ns, runs = sums[kind]
    return time_ns / runs if runs else None


def spread(values: Sequence[float]) -> str:
    return "%.0f (%.0f-%.0f)" % (statistics.median(values), min(values), max(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200000)
    parser.add_argument("--op", choices=sorted(FUNCTIONS), default="getdevice",
                        help="the call: cudaGetDevice (an out-parameter read at return), "
                        "cudaGetLastError (none), cudaLaunchKernel")
    parser.add_argument("--ring", default="64M", help="the record modes' --ring-size ('' for"
                        " the default): big enough that no reader falls behind by a ring")
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--only", default="", help="modes besides bare (comma-separated)")
    args = parser.parse_args()
    modes = ["bare"] + [m for m in MODES if m != "bare" and
                        (not args.only or m in args.only.split(","))]
    cases = [(m, None) for m in modes]
    if args.baseline:
        cases += [(m, args.baseline) for m in modes if m != "bare"]
    bench = Bench(args)
    stats_fd = enable_stats()
    results: Dict[Tuple[str, Optional[Path]], List[Dict[str, Tuple[int, int]]]] = {
        case: [] for case in cases}
    try:
        for round_number in range(args.rounds):
            shift = round_number % len(cases)
            for case in cases[shift:] + cases[:shift]:
                results[case].append(bench.run(*case))
            print("round %d done" % (round_number + 1), file=sys.stderr)
    finally:
        os.close(stats_fd)
    report(results, args)


def report(results, args) -> None:
    print("probe_cost: %s; %d rounds x %d %s calls; record modes' ring %s" % (
        common.machine(), args.rounds, args.calls, FUNCTIONS[args.op], args.ring or "default"))
    print("%-14s %-18s %-18s %-18s %-14s %-14s %s" % (
        "mode", "entry ns/run", "return ns/run", "session ns/run", "entry - bare",
        "return - bare", "pair / bare pair   lost"))
    bare = results[("bare", None)]
    for (mode, tree), rounds in results.items():
        label = ("base: " if tree else "") + mode
        cells, diffs = [], []
        for kind in KINDS:
            values = [v for v in (per_run(r, kind) for r in rounds) if v is not None]
            cells.append(spread(values) if values else "-")
        for kind in ("ent", "ret"):
            d = [per_run(r, kind) - per_run(b, kind) for r, b in zip(rounds, bare)
                 if per_run(r, kind) is not None]
            diffs.append("%+.0f" % statistics.median(d) if d else "-")
        ratios = [((per_run(r, "ent") or 0) + (per_run(r, "ret") or 0)
                   + (per_run(r, "ses") or 0)) / (per_run(b, "ent") + per_run(b, "ret"))
                  for r, b in zip(rounds, bare)]
        lost = sum(r.get("lost", (0, 0))[0] for r in rounds)
        print("%-14s %-18s %-18s %-18s %-14s %-14s %-18s %d" % (
            label, cells[0], cells[1], cells[2], diffs[0], diffs[1],
            "%.2fx" % statistics.median(ratios), lost))


if __name__ == "__main__":
    main()
