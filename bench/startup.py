"""Start-up time: from spawning the tracer to the traced command's first instruction.

The tracer holds its command until every probe is attached, so the command's first act (a
tiny C program printing CLOCK_REALTIME, bench/native/stamp.c) happens after attachment:

    start-up = stamp's wall clock - the wall clock just before the tracer was spawned

Measured for `python3 -m ebpf_cuda -p LIB -- stamp` (the installed package: this tree, with
its bytecode) with the default function set on the stand-in runtime and, when the
nvidia-cuda-runtime-cu12 wheel is installed, NVIDIA's libcudart.so.12 (a real symbol table),
also with --all; the one-file zipapp (`python3 -m ebpf_cuda.bundle`, run without PYTHONPATH,
as on a host where nothing is installed) run from the archive (its cache unwritable: every
module compiled at every start), cold (first run: unpacked into a fresh cache, bytecode
compiled) and warm (from its cache, also under `python3 -S`: without this interpreter's
`site`, which may import an editable install's finder and .pth files), and unpacked by hand
into a folder (`python3 DIR`); for reference the bare interpreter (`python3 -c pass` and
`python3 -S -c pass`, spawn to exit) and importing the CLI; and
bpftrace with an equivalent script (uprobe + uretprobe on the eleven seed functions, printf
per call) when it is installed. BCC is tried too (it needs kernel headers to compile its C;
reported when missing).

The cases run interleaved: RUNS rounds, each running every case once (the order rotated
from round to round), so that a noisy minute weighs on all of them alike. Median, min and
max of the RUNS runs of each. Needs root and gcc.

    sudo python3 bench/startup.py [--runs 9]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

from fakecuda import SEED_FUNCTIONS, wheel_libcudart  # noqa: E402

_STAMP = re.compile(r"stamp realtime=(\d+\.\d+)")


def time_to_stamp(argv: List[str], cwd: Optional[str] = None,
                  env: Optional[Dict[str, str]] = None) -> float:
    """Seconds from just before spawning `argv` to the stamp it prints (via the command)."""
    start = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120, env=env)
    match = _STAMP.search(done.stdout)
    if match is None:
        raise RuntimeError("%s printed no stamp (rc %d): %s" % (argv[0], done.returncode,
                                                                 done.stderr[-500:]))
    return float(match.group(1)) - start


def time_to_exit(argv: List[str], cwd: Optional[str] = None) -> float:
    start = time.time()
    subprocess.run(argv, capture_output=True, check=True, cwd=cwd or str(common.REPO))
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


Case = Tuple[str, Callable[[], float]]


def interleaved(runs: int, cases: List[Case]) -> Dict[str, Optional[List[float]]]:
    """ms of each case, `runs` rounds of every case once (order rotated each round); a case
    that fails once is reported and left out of the later rounds."""
    values: Dict[str, List[float]] = {label: [] for label, _ in cases}
    failed: Dict[str, str] = {}
    for round_index in range(runs):
        shift = round_index % len(cases)
        for label, once in cases[shift:] + cases[:shift]:
            if label in failed:
                continue
            try:
                values[label].append(once() * 1000)
            except (RuntimeError, subprocess.SubprocessError, OSError) as err:
                failed[label] = (str(err).strip().splitlines() or ["?"])[-1][:200]
    results: Dict[str, Optional[List[float]]] = {}
    for label, _ in cases:
        if label in failed:
            print("%-48s failed: %s" % (label, failed[label]))
            results[label] = None
        else:
            got = values[label]
            print("%-48s %8.1f ms  (min %.1f, max %.1f)" % (label, common.median(got), min(got),
                                                            max(got)), flush=True)
            results[label] = got
    return results


class Zipapp:
    """The one-file zipapp of this tree, its caches and an unpacked copy, in a temp folder."""

    def __init__(self, folder: Path, tree: Path = common.REPO) -> None:
        self.folder = folder
        folder.mkdir(exist_ok=True)
        self.pyz = folder / "ebpf-cuda.pyz"
        subprocess.run([sys.executable, "-m", "ebpf_cuda.bundle", "-o", str(self.pyz)],
                       check=True, capture_output=True, cwd=str(tree))
        self.unpacked = folder / "unpacked"
        with zipfile.ZipFile(str(self.pyz)) as archive:
            archive.extractall(str(self.unpacked))
        self.warm_cache = folder / "warm-cache"
        blocker = folder / "a-file"
        blocker.write_text("")
        self.no_cache = blocker / "cache"  # cannot be made: the zipapp runs from the archive
        self.cold_runs = 0

    def env(self, cache: Path) -> Dict[str, str]:
        """As on a host where nothing is installed: no PYTHONPATH."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["XDG_CACHE_HOME"] = str(cache)
        return env

    def run(self, cache: Path, options: List[str], command: List[str],
            target: Optional[Path] = None, flags: Tuple[str, ...] = ()) -> float:
        return time_to_stamp([sys.executable, *flags, str(target or self.pyz), *options, "--",
                              *command], cwd=str(self.folder), env=self.env(cache))

    def cold(self, options: List[str], command: List[str]) -> float:
        """A first run: a fresh, empty cache (removed afterwards)."""
        self.cold_runs += 1
        cache = self.folder / ("cold-%d" % self.cold_runs)
        try:
            return self.run(cache, options, command)
        finally:
            shutil.rmtree(str(cache), ignore_errors=True)


def phases(lib: str, stamp: str, everything: bool) -> Dict[str, float]:
    """ms spent in each step of Tracer.start() (in this process, imports already done):
    the steps of its Session (session.py) that exist in this tree; `attach` is the sum of
    the link creations, which run within load_programs (as each program is loaded) or, with
    --no-follow, after fork_command."""
    from ebpf_cuda.tracer import Tracer
    tracer = Tracer(library=[lib], command=[stamp], everything=everything)
    spent: Dict[str, float] = {}

    def timed(name: str, real):
        def step(*a, **k):
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + (time.perf_counter() - t0) * 1000
        return step

    session = getattr(tracer, "session", tracer)  # before session.py: the Tracer's own
    for step in ("_find_targets", "_create_maps", "_load_programs", "_fork_command",
                 "_attach"):
        if hasattr(session, step):
            setattr(session, step, timed(step.strip("_"), getattr(session, step)))
    module = sys.modules[type(session).__module__]
    find_targets = getattr(module, "find_targets", None)
    if find_targets is not None:
        module.find_targets = timed("find_targets", find_targets)
    t0 = time.perf_counter()
    with open(os.devnull, "w") as null:
        saved = os.dup(1)
        os.dup2(null.fileno(), 1)
        try:
            tracer.start()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            if find_targets is not None:
                module.find_targets = find_targets
    spent["start() total"] = (time.perf_counter() - t0) * 1000
    spent["probes attached"] = len(tracer.attachments)
    spent["programs"] = len({id(p) for p in tracer.programs.values()})
    tracer.close()
    return spent


def venv_cases(venv: Path, stand_in: str, stamp: str) -> List[Case]:
    """The start-up of a regular install (`pip install .` in `venv`), from a folder that
    holds no checkout, and that interpreter's own start beside it."""
    py, where = str(venv / "bin" / "python3"), tempfile.gettempdir()
    command = [py, "-m", "ebpf_cuda", "-p", stand_in, "--", stamp]
    time_to_stamp(command, cwd=where)  # (its program cache written: warm from now)
    return [
        ("venv: python3 -c pass (spawn to exit)", lambda: time_to_exit([py, "-c", "pass"])),
        ("venv: installed, default set, stand-in",
         lambda: time_to_stamp(command, cwd=where)),
    ]


def baseline_cases(tree: Path, folder: Path, stand_in: str, stamp: str) -> List[Case]:
    """The same start-ups from another checkout (`--baseline`): its package imported from
    its own folder (the current directory comes first on sys.path), its own zipapp."""
    zipapp = Zipapp(folder, tree)
    zipapp.run(zipapp.warm_cache, ["-p", stand_in], [stamp])  # unpacks it: warm from now
    cli = "ebpf_cuda.cli.main" if (tree / "ebpf_cuda" / "cli" / "main.py").exists() else \
        "ebpf_cuda.cli"
    py = sys.executable
    return [
        ("baseline: import %s (spawn to exit)" % cli,
         lambda: time_to_exit([py, "-c", "import " + cli], cwd=str(tree))),
        ("baseline: installed, default set, stand-in", lambda: time_to_stamp(
            common.cli_command(["-p", stand_in], [stamp]), cwd=str(tree))),
        ("baseline: zipapp, warm (from its cache)",
         lambda: zipapp.run(zipapp.warm_cache, ["-p", stand_in], [stamp])),
        ("baseline: zipapp, warm, python3 -S (no site)",
         lambda: zipapp.run(zipapp.warm_cache, ["-p", stand_in], [stamp], flags=("-S",))),
        ("baseline: zipapp, cold (first run: unpack + compile)",
         lambda: zipapp.cold(["-p", stand_in], [stamp])),
    ]


GATHER = """
import sys
from ebpf_cuda.probes.cache import ProgramCache
store = ProgramCache()
store._new = {"another configuration %d" % i: (bytes(2150), [(16 + 8 * (i % 9), "events")])
              for i in range(int(sys.argv[1]))}
store.save()
"""


def gather(tree: Path, entries: int) -> None:
    """Put `entries` programs of other configurations (each the size of a default trace's
    average) in `tree`'s program cache file, written by that tree's own code."""
    if entries:
        subprocess.run([sys.executable, "-c", GATHER, str(entries)], cwd=str(tree),
                       check=True, timeout=120)


def import_times(lib: str, stamp: str, top: int = 10, runs: int = 5) -> List[str]:
    """The slowest imports of a whole start, `python3 -m ebpf_cuda -p LIB -- stamp` (python
    -X importtime, cumulative): the CLI's and those made while starting; per
    module the least of `runs` starts, so that one noisy start does not rank it."""
    best: Dict[str, int] = {}
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "ebpf_cuda", "-p", lib,
                               "--", stamp], capture_output=True, text=True,
                              cwd=str(common.REPO))
        for line in done.stderr.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[1].strip().isdigit():
                name = parts[2].rstrip()
                best[name] = min(best.get(name, 1 << 62), int(parts[1]))
    rows = sorted(((us, name) for name, us in best.items()), reverse=True)
    return ["%8.1f ms %s" % (us / 1000, name) for us, name in rows[:top]]


def _no_site_env() -> Dict[str, str]:
    """The environment for `python3 -S` to import this tree and its dependencies: the
    folders holding click and elftools on PYTHONPATH, after the tree."""
    import click
    import elftools

    folders = [str(common.REPO)] + sorted({os.path.dirname(os.path.dirname(m.__file__))
                                           for m in (click, elftools)})
    return dict(os.environ, PYTHONPATH=os.pathsep.join(folders))


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--gathered", type=int, default=0, metavar="N",
                        help="each tree's program cache holds N entries of other trace "
                             "configurations beside the start's own (one that gathered a "
                             "test suite's configurations: ~1,000)")
    parser.add_argument("--venv", metavar="DIR",
                        help="a virtual environment where the package is installed as users "
                             "install it (`python3 -m venv DIR; DIR/bin/pip install .`: no "
                             "editable finder, none of this interpreter's .pth files): its "
                             "bare interpreter and its start-up run in the same rounds")
    parser.add_argument("--baseline", metavar="DIR",
                        help="another checkout (e.g. `git worktree add DIR COMMIT`) whose "
                             "import, installed and warm zipapp start-ups run in the same "
                             "rounds (a change's cost, measured side by side)")
    args = parser.parse_args(argv)
    common.need_root()
    built = common.build()
    stamp = str(built.stamp)
    print("startup: %s" % common.machine())
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        # An installed package has its bytecode compiled (pip does it); without it every
        # start compiles every module again (~100 ms more here).
        print("PYTHONDONTWRITEBYTECODE was set: unset for these runs, bytecode written once")
    time_to_exit([sys.executable, "-c", "import ebpf_cuda.cli.main, ebpf_cuda.tracer"])
    scratch = Path(tempfile.mkdtemp(prefix="ebpf-cuda-startup-"))
    stand_in = str(built.lib)
    # The installed starts' program cache: this run's own, not the user's (whose size
    # depends on what ran before), holding --gathered other configurations' programs.
    os.environ["XDG_CACHE_HOME"] = str(scratch / "user-cache")
    trees = [common.REPO] + ([Path(args.baseline).resolve()] if args.baseline else [])
    for tree in trees:
        gather(tree, args.gathered)
        time_to_stamp(common.cli_command(["-p", stand_in], [stamp]), cwd=str(tree))
    try:
        zipapp = Zipapp(scratch)
        zipapp.run(zipapp.warm_cache, ["-p", stand_in], [stamp])  # unpacks it: warm from now
        zipapp.run(zipapp.no_cache, ["-p", stand_in], [stamp], target=zipapp.unpacked)  # .pyc
    except BaseException:
        shutil.rmtree(str(scratch), ignore_errors=True)
        raise
    print("median of %d interleaved runs, ms from spawn to the command's first instruction "
          "(zipapp: %d KB)\n" % (args.runs, zipapp.pyz.stat().st_size // 1024))
    py = sys.executable
    cases: List[Case] = [
        ("python3 -c pass (spawn to exit)", lambda: time_to_exit([py, "-c", "pass"])),
        ("import ebpf_cuda.cli.main (spawn to exit)",
         lambda: time_to_exit([py, "-c", "import ebpf_cuda.cli.main"])),
        ("installed: ebpf-cuda default set, stand-in", lambda: time_to_stamp(
            common.cli_command(["-p", stand_in], [stamp]), cwd=str(common.REPO))),
        ("zipapp, from the archive (no cache)",
         lambda: zipapp.run(zipapp.no_cache, ["-p", stand_in], [stamp])),
        ("zipapp, cold (first run: unpack + compile)",
         lambda: zipapp.cold(["-p", stand_in], [stamp])),
        ("zipapp, warm (from its cache)",
         lambda: zipapp.run(zipapp.warm_cache, ["-p", stand_in], [stamp])),
        # This interpreter's `site` may import what a plain one would not (an editable
        # install's finder, .pth files): without it, the tool's own start-up.
        ("python3 -S -c pass (spawn to exit, no site)",
         lambda: time_to_exit([py, "-S", "-c", "pass"])),
        ("zipapp, warm, python3 -S (no site)",
         lambda: zipapp.run(zipapp.warm_cache, ["-p", stand_in], [stamp], flags=("-S",))),
        ("zipapp unpacked by hand (python3 DIR)",
         lambda: zipapp.run(zipapp.no_cache, ["-p", stand_in], [stamp],
                            target=zipapp.unpacked)),
        # The same without this interpreter's `site` (an editable install's finder and the
        # .pth files of this machine's site-packages: ~40 ms here), the package and its
        # dependencies found on PYTHONPATH: the tool's own start on a plain interpreter.
        ("installed, python3 -S (no site)", lambda: time_to_stamp(
            [py, "-S", "-m", "ebpf_cuda", "-p", stand_in, "--", stamp], cwd=str(common.REPO),
            env=_no_site_env())),
        ("installed: --all, stand-in", lambda: time_to_stamp(
            common.cli_command(["-p", stand_in, "--all"], [stamp]), cwd=str(common.REPO))),
    ]
    libraries = [("stand-in", stand_in)]
    wheel = wheel_libcudart()
    if wheel is not None:
        libraries.append(("NVIDIA libcudart", str(wheel)))
        for extra, what in (([], "default set"), (["--all"], "--all")):
            cases.append(("installed: %s, NVIDIA libcudart" % what,
                          lambda extra=extra: time_to_stamp(
                              common.cli_command(["-p", str(wheel), *extra], [stamp]),
                              cwd=str(common.REPO))))
    bcc_script = None
    if shutil.which("bpftrace"):
        script = bpftrace_script(stand_in)
        cases.append(("bpftrace, 11 seed functions x2, stand-in", lambda: time_to_stamp(
            ["bpftrace", "-e", script, "-c", stamp])))
    else:
        print("bpftrace not installed (apt-get install -y bpftrace)")
    python = bcc_python()
    if python is None:
        print("BCC not importable (apt-get install -y python3-bpfcc)")
    else:
        bcc_script = tempfile.NamedTemporaryFile("w", suffix=".py")
        bcc_script.write(BCC_PROGRAM)
        bcc_script.flush()
        cases.append(("BCC, 11 seed functions x2, stand-in", lambda: time_to_stamp(
            [python, bcc_script.name, stand_in, stamp, *SEED_FUNCTIONS])))
    if args.venv:
        cases += venv_cases(Path(args.venv), stand_in, stamp)
    if args.baseline:
        cases += baseline_cases(Path(args.baseline).resolve(), scratch / "baseline", stand_in,
                                stamp)
    try:
        results = interleaved(args.runs, cases)
    finally:
        if bcc_script is not None:
            bcc_script.close()
        shutil.rmtree(str(scratch), ignore_errors=True)
    print("\nwhere the time goes: Tracer.start() steps, in-process, ms (median of %d)" % args.runs)
    for name, lib in libraries:
        for everything in (False, True):
            runs = [phases(lib, stamp, everything) for _ in range(args.runs)]
            print("  %s%s: %s" % (name, " --all" if everything else "", ", ".join(
                "%s %.1f" % (k, common.median([r[k] for r in runs])) for k in runs[0])))
    print("slowest imports of a start (cumulative):")
    for line in import_times(stand_in, stamp):
        print("  " + line)
    baseline = results.get("python3 -c pass (spawn to exit)")
    print("\ntargets (medians; python3 -c pass %s ms in the same rounds):"
          % ("%.0f" % common.median(baseline) if baseline else "?"))
    for label, limit in (("installed: ebpf-cuda default set, stand-in", 150),
                         ("venv: installed, default set, stand-in", 150),
                         ("zipapp, warm (from its cache)", 150),
                         ("installed: ebpf-cuda default set, stand-in", 80)):
        got = results.get(label)
        if got:
            figure = common.median(got)
            print("  %s <= %d ms: %s (%.0f ms, min %.0f)" % (
                label, limit, "met" if figure <= limit else "MISSED", figure, min(got)))


if __name__ == "__main__":
    main(sys.argv[1:])
