"""Shared pieces of the overhead, loss, start-up and memory benchmarks.

Builds the stand-in libcudart.so.12 (tests/native/fakecudart.c, every export starting with
`push %rbp` so uprobes on it are emulated, as on NVIDIA's library) and the workload programs
of bench/native (callloop: a timed tight loop of CUDA calls; stamp: prints the wall clock as
its first act); runs the ebpf-cuda CLI; parses `key=value` printouts; assembles bare counter
programs (the floor any uprobe tracer pays); medians and the machine description.
"""
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "bench" / "native"
TEST_NATIVE = REPO / "tests" / "native"
BUILD = Path(os.environ.get("EBPF_CUDA_BENCH_BUILD", "/tmp/ebpf-cuda-bench"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from fakecuda import LIB_FLAGS, SONAME, VERSION_SCRIPT  # noqa: E402

from ebpf_cuda import asm  # noqa: E402
from ebpf_cuda.asm import DW, R0, R1, R2  # noqa: E402
from ebpf_cuda.targets.elf import ElfFile  # noqa: E402
from ebpf_cuda.bpf.maps import ArrayMap  # noqa: E402
from ebpf_cuda.bpf.programs import Program  # noqa: E402
from ebpf_cuda.bpf.uprobe import Link, attach_uprobe  # noqa: E402

CFLAGS = ["-O2", "-g", "-fno-omit-frame-pointer"]


@dataclass
class Built:
    """Paths of the stand-in library and the workload programs."""

    lib: Path
    callloop: Path
    stamp: Path


def _newer(out: Path, *sources: Path) -> bool:
    return out.exists() and all(out.stat().st_mtime >= s.stat().st_mtime for s in sources)


def build(lib: Optional[str] = None) -> Built:
    """Build (once, in BUILD) the stand-in library and callloop linked against `lib` (the
    stand-in when None) plus stamp."""
    BUILD.mkdir(parents=True, exist_ok=True)
    if lib is None:
        folder = BUILD / "fakecuda"
        folder.mkdir(exist_ok=True)
        target = folder / SONAME
        source = TEST_NATIVE / "fakecudart.c"
        if not _newer(target, source):
            script = folder / "libcudart.map"
            script.write_text(VERSION_SCRIPT)
            _gcc(["-shared", "-fPIC", *LIB_FLAGS, "-Wl,--version-script=" + str(script),
                  "-o", str(target), str(source)])
        library = target
    else:
        library = Path(lib).resolve()
    callloop = BUILD / ("callloop-" + library.parent.name)
    if not _newer(callloop, NATIVE / "callloop.c", library):
        _gcc(["-o", str(callloop), str(NATIVE / "callloop.c"), "-L", str(library.parent),
              "-l:" + library.name, "-Wl,-rpath," + str(library.parent), "-lpthread"])
    stamp = BUILD / "stamp"
    if not _newer(stamp, NATIVE / "stamp.c"):
        _gcc(["-o", str(stamp), str(NATIVE / "stamp.c")])
    return Built(library, callloop, stamp)


def _gcc(args: List[str]) -> None:
    subprocess.run(["gcc", *CFLAGS, *args], check=True)


# -- the workload's printout ------------------------------------------------------------------

_PAIR = re.compile(r"(\w+)=(\S+)")


@dataclass
class LoopResult:
    """What callloop printed."""

    start: Dict[str, float] = field(default_factory=dict)
    reps: List[float] = field(default_factory=list)  # wall ns/call of each repetition
    cpu_reps: List[float] = field(default_factory=list)  # thread CPU ns/call of each
    total: Dict[str, float] = field(default_factory=dict)

    @property
    def made(self) -> int:
        return int(self.total.get("calls", 0))

    @property
    def ns_per_call(self) -> float:
        return statistics.median(self.reps)

    @property
    def cpu_ns_per_call(self) -> float:
        return statistics.median(self.cpu_reps)


def parse_loop(text: str) -> LoopResult:
    result = LoopResult()
    for line in text.splitlines():
        head = line.split(" ", 1)[0]
        if head not in ("start", "rep", "total"):
            continue
        try:
            pairs = {k: float(v) for k, v in _PAIR.findall(line)}
        except ValueError:  # someone else's line
            continue
        if head == "start":
            result.start = pairs
        elif head == "rep":
            result.reps.append(pairs["ns_per_call"])
            result.cpu_reps.append(pairs.get("cpu_ns_per_call", pairs["ns_per_call"]))
        elif head == "total":
            result.total = pairs
    return result


def loop_args(built: Built, op: str = "getdevice", calls: int = 0, reps: int = 0,
              seconds: float = 0, rate: float = 0, threads: int = 1,
              cpu: int = -1) -> List[str]:
    args = [str(built.callloop), "--op", op, "-t", str(threads), "--cpu", str(cpu)]
    if seconds:
        args += ["-s", str(seconds), "-r", str(rate)]
    else:
        args += ["-n", str(calls), "-k", str(reps)]
    return args


def run_plain(args: Sequence[str]) -> LoopResult:
    done = subprocess.run(list(args), capture_output=True, text=True, check=True)
    return parse_loop(done.stdout)


# -- the CLI ---------------------------------------------------------------------------------


def cli_command(options: Sequence[str], command: Sequence[str]) -> List[str]:
    return [sys.executable, "-m", "ebpf_cuda", *options, "--", *command]


@dataclass
class CliRun:
    """One `python3 -m ebpf_cuda ... -- command` run."""

    stdout: str
    stderr: str
    returncode: int
    wall_s: float

    @property
    def lost(self) -> int:
        match = re.search(r"ebpf-cuda: (\d+) events lost", self.stderr)
        return int(match.group(1)) if match else 0


def run_cli(options: Sequence[str], command: Sequence[str], cpu: Optional[int] = None,
            timeout: float = 600, tree: Optional[Path] = None) -> CliRun:
    """Run the CLI (pinned to `cpu` when given) on `command`; raise when it fails. `tree`:
    another checkout's CLI (its folder comes first on sys.path), else this one's."""
    start = time.monotonic()
    done = subprocess.run(cli_command(options, command), capture_output=True, text=True,
                          cwd=str(tree or REPO), timeout=timeout, preexec_fn=_pin(cpu))
    run = CliRun(done.stdout, done.stderr, done.returncode, time.monotonic() - start)
    if done.returncode != 0:
        raise RuntimeError("ebpf-cuda %s failed (%d): %s" % (" ".join(options),
                                                              done.returncode, done.stderr))
    return run


def _pin(cpu: Optional[int]):
    if cpu is None or cpu < 0:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def cli_has(option: str) -> bool:
    """Whether the CLI in this tree accepts `option` (helpers add options while we measure)."""
    done = subprocess.run([sys.executable, "-m", "ebpf_cuda", "--help"], capture_output=True,
                          text=True, cwd=str(REPO))
    return re.search(r"(^|\s)%s[\s,=]" % re.escape(option), done.stdout) is not None


# -- bare counters ---------------------------------------------------------------------------


def counter_program(index: int) -> list:
    """counts[index] += 1 (atomic add into an array map): the least a probe can do."""
    return [
        asm.ld_map_value(R1, "counts", 8 * index), asm.mov(R2, 1),
        asm.atomic_add(DW, R1, 0, R2),
        asm.mov(R0, 0), asm.exit(),
    ]


class BareCounters:
    """Entry (and optionally return) counter probes on one function of a file."""

    def __init__(self, path: Path, symbol: str, retprobe: bool) -> None:
        self.counts = ArrayMap(16, 1, "bench_counts")
        offset = ElfFile(str(path)).symbol_offset(symbol)
        self.programs: List[Program] = []
        self.links: List[Link] = []
        for index, ret in enumerate([False, True] if retprobe else [False]):
            program = Program(counter_program(index), {"counts": self.counts},
                              name="bench_cnt%d" % index).load()
            self.programs.append(program)
            self.links.append(attach_uprobe(program, str(path), offset, retprobe=ret,
                                            what=symbol))

    def values(self) -> Tuple[int, int]:
        raw = self.counts[0]
        return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:16], "little")

    def close(self) -> None:
        for link in self.links:
            link.close()
        for program in self.programs:
            program.close()
        self.counts.close()

    def __enter__(self) -> "BareCounters":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- figures ---------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float]) -> str:
    """`median (min–max)` for a line of figures."""
    return "%.1f (%.1f-%.1f)" % (statistics.median(values), min(values), max(values))


def machine() -> str:
    """CPU model, cores, kernel and date: the header every benchmark prints."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d cores, Linux %s, Python %s, %s" % (
        model, os.cpu_count() or 0, platform.release(), platform.python_version(),
        time.strftime("%Y-%m-%d %H:%M"))


def need_root() -> None:
    if os.geteuid() != 0:
        sys.exit("needs root (CAP_BPF, CAP_PERFMON)")


def sample_peak(process: subprocess.Popen, keys: Sequence[str],
                tick: Optional[Callable[[Dict[str, int]], None]] = None,
                interval: float = 0.01) -> Dict[str, int]:
    """Peak of each of `keys` (/proc status fields, KiB) of `process`, sampled every
    `interval` until it ends; `tick(status)` is called at each sample (to stop it, say)."""
    peak: Dict[str, int] = {}
    while process.poll() is None:
        status = proc_status(process.pid, keys)
        if tick is not None:
            tick(status)
        for key, value in status.items():
            peak[key] = max(peak.get(key, 0), value)
        time.sleep(interval)
    return peak


def proc_status(pid: int, keys: Sequence[str]) -> Dict[str, int]:
    """Fields of /proc/PID/status in KiB (missing ones absent)."""
    values: Dict[str, int] = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    values[key] = int(rest.split()[0])
    except (OSError, ValueError):
        pass
    return values
