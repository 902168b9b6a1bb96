"""Start-up time: from spawning the tracer to the traced command's first instruction.

The tracer holds its command until every probe is attached, so the command's first act (a
tiny C program printing CLOCK_REALTIME, bench/native/stamp.c) happens after attachment:

    start-up = stamp's wall clock - the wall clock just before the tracer was spawned

Measured for `python3 -m ebpf_cuda -p LIB -- stamp` with the default function set on the
stand-in runtime and, when the nvidia-cuda-runtime-cu12 wheel is installed, NVIDIA's
libcudart.so.12 (a real symbol table), also with --all; for reference the bare interpreter
(`python3 -c pass` spawn to exit) and importing the CLI; and bpftrace with an equivalent script
(uprobe + uretprobe on the eleven seed functions, printf per call) when it is installed.
BCC is tried too (it needs kernel headers to compile its C; reported when missing).
Median of RUNS runs each. Needs root and gcc.

    sudo python3 bench/startup.py [--runs 7]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

from fakecuda import SEED_FUNCTIONS, wheel_libcudart  # noqa: E402

_STAMP = re.compile(r"stamp realtime=(\d+\.\d+)")


def time_to_stamp(argv: List[str], cwd: Optional[str] = None) -> float:
    """Seconds from just before spawning `argv` to the stamp it prints (via the command)."""
    start = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)
    match = _STAMP.search(done.stdout)
    if match is None:
        raise RuntimeError("%s printed no stamp (rc %d): %s" % (argv[0], done.returncode,
                                                                 done.stderr[-500:]))
    return float(match.group(1)) - start


def time_to_exit(argv: List[str]) -> float:
    start = time.time()
    subprocess.run(argv, capture_output=True, check=True, cwd=str(common.REPO))
    return time.time() - start


def bpftrace_script(lib: str) -> str:
    probes = []
    for fn in SEED_FUNCTIONS:
        probes.append('uprobe:%s:%s { printf("%s enter\\n"); }' % (lib, fn, fn))
        probes.append('uretprobe:%s:%s { printf("%s exit %%d\\n", retval); }' % (lib, fn, fn))
    return "\n".join(probes)


BCC_PROGRAM = """
import subprocess, sys
from bcc import BPF
lib, stamp = sys.argv[1], sys.argv[2]
fns = sys.argv[3:]
text = "int on_enter(void *ctx) { bpf_trace_printk(\\"enter\\\\n\\"); return 0; }\\n" \\
       "int on_exit(void *ctx) { bpf_trace_printk(\\"exit\\\\n\\"); return 0; }\\n"
b = BPF(text=text)
for fn in fns:
    b.attach_uprobe(name=lib, sym=fn, fn_name="on_enter")
    b.attach_uretprobe(name=lib, sym=fn, fn_name="on_exit")
print(subprocess.run([stamp], capture_output=True, text=True).stdout, end="")
"""


def bcc_python() -> Optional[str]:
    """An interpreter that can import bcc (Debian's python3-bpfcc is for /usr/bin/python3)."""
    for python in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(python) and subprocess.run(
                [python, "-c", "import bcc"], capture_output=True).returncode == 0:
            return python
    return None


def measure(runs: int, label: str, once) -> Optional[List[float]]:
    values = []
    try:
        for _ in range(runs):
            values.append(once() * 1000)
    except (RuntimeError, subprocess.SubprocessError, OSError) as err:
        print("%-44s failed: %s" % (label, str(err).strip().splitlines()[-1][:200]))
        return None
    print("%-44s %8.1f ms  (min %.1f, max %.1f)" % (label, common.median(values), min(values),
                                                    max(values)), flush=True)
    return values


def phases(lib: str, stamp: str, everything: bool) -> Dict[str, float]:
    """ms spent in each step of Tracer.start() (in this process, imports already done);
    `attach` is the sum of the link creations, which run within load_programs (as each
    program is loaded) or, with --no-follow, after fork_command."""
    from ebpf_cuda.tracer import Tracer
    tracer = Tracer(library=[lib], command=[stamp], everything=everything)
    spent: Dict[str, float] = {}
    for step in ("_find_targets", "_create_maps", "_load_programs", "_fork_command",
                 "_attach"):
        def timed(*a, _step=step, _real=getattr(tracer, step), **k):
            t0 = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                name = _step.strip("_")
                spent[name] = spent.get(name, 0.0) + (time.perf_counter() - t0) * 1000
        setattr(tracer, step, timed)
    t0 = time.perf_counter()
    with open(os.devnull, "w") as null:
        saved = os.dup(1)
        os.dup2(null.fileno(), 1)
        try:
            tracer.start()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    spent["start() total"] = (time.perf_counter() - t0) * 1000
    spent["probes attached"] = len(tracer.attachments)
    spent["programs"] = len({id(p) for p in tracer.programs.values()})
    tracer.close()
    return spent


def import_times(top: int = 6) -> List[str]:
    """The slowest imports of `import ebpf_cuda.cli` (python -X importtime, cumulative us)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import ebpf_cuda.cli"],
                          capture_output=True, text=True, cwd=str(common.REPO))
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    rows.sort(reverse=True)
    return ["%8.1f ms %s" % (us / 1000, name) for us, name in rows[:top]]


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    common.need_root()
    built = common.build()
    stamp = str(built.stamp)
    print("startup: %s" % common.machine())
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        # An installed package has its bytecode compiled (pip does it); without it every
        # start compiles every module again (~100 ms more here).
        print("PYTHONDONTWRITEBYTECODE was set: unset for these runs, bytecode written once")
    time_to_exit([sys.executable, "-c", "import ebpf_cuda.cli, ebpf_cuda.tracer"])
    print("median of %d runs, ms from spawn to the command's first instruction\n" % args.runs)
    results: Dict[str, Optional[List[float]]] = {}
    py = sys.executable
    results["python3 -c pass (spawn to exit)"] = measure(
        args.runs, "python3 -c pass (spawn to exit)", lambda: time_to_exit([py, "-c", "pass"]))
    results["import ebpf_cuda.cli (spawn to exit)"] = measure(
        args.runs, "import ebpf_cuda.cli (spawn to exit)",
        lambda: time_to_exit([py, "-c", "import ebpf_cuda.cli"]))
    libraries = [("stand-in", str(built.lib))]
    wheel = wheel_libcudart()
    if wheel is not None:
        libraries.append(("NVIDIA libcudart", str(wheel)))
    for name, lib in libraries:
        for extra, what in (([], "default set"), (["--all"], "--all")):
            label = "ebpf-cuda %s, %s" % (what, name)
            results[label] = measure(args.runs, label, lambda: time_to_stamp(
                common.cli_command(["-p", lib, *extra], [stamp]), cwd=str(common.REPO)))
    if shutil.which("bpftrace"):
        script = bpftrace_script(str(built.lib))
        label = "bpftrace, 11 seed functions x2, stand-in"
        results[label] = measure(args.runs, label, lambda: time_to_stamp(
            ["bpftrace", "-e", script, "-c", stamp]))
    else:
        print("bpftrace not installed (apt-get install -y bpftrace)")
    python = bcc_python()
    if python is None:
        print("BCC not importable (apt-get install -y python3-bpfcc)")
    else:
        with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
            f.write(BCC_PROGRAM)
            f.flush()
            label = "BCC, 11 seed functions x2, stand-in"
            results[label] = measure(args.runs, label, lambda: time_to_stamp(
                [python, f.name, str(built.lib), stamp, *SEED_FUNCTIONS]))
    print("\nwhere the time goes: Tracer.start() steps, in-process, ms (median of %d)" % args.runs)
    for name, lib in libraries:
        for everything in (False, True):
            runs = [phases(lib, stamp, everything) for _ in range(args.runs)]
            print("  %s%s: %s" % (name, " --all" if everything else "", ", ".join(
                "%s %.1f" % (k, common.median([r[k] for r in runs])) for k in runs[0])))
    print("slowest imports (cumulative):")
    for line in import_times():
        print("  " + line)
    default = results.get("ebpf-cuda default set, NVIDIA libcudart") or \
        results.get("ebpf-cuda default set, stand-in")
    if default:
        figure = common.median(default)
        print("\ntarget: start-up <= 80 ms: %s (%.0f ms)" % (
            "met" if figure <= 80 else "MISSED", figure))


if __name__ == "__main__":
    main(sys.argv[1:])
