"""Run a Python program (the tracer's zipapp or a script) under tracemalloc and write where
its Python heap stood at its peak: a diagnostic for the `memory` check.

    python3 scripts/gpu/heap_profile.py --report FILE -- PROGRAM.pyz|SCRIPT [ARG ...]

A thread samples the traced memory every 50 ms; at each new peak (1 MiB above the last one
reported) it takes a snapshot and rewrites FILE: the peak, the process's RssAnon/RssFile
then, its 10 largest mappings, and the 40 largest allocation sites (grouped by the innermost 6 frames) with their
sizes and counts. FILE is rewritten at every new peak, so it holds the peak's picture
however the program ends (os._exit included). Allocations outside Python's allocators (the
ring's mapping, ctypes buffers in C, libraries' own heaps) are not in it: the RSS lines
show the difference.
"""
import argparse
import os
import runpy
import sys
import threading
import time
import tracemalloc

FRAMES = 6
TOP = 40


def _rss() -> str:
    try:
        with open("/proc/self/status") as f:
            return " ".join(line.split(":")[0] + " " + line.split(":")[1].strip()
                            for line in f if line.startswith(("VmHWM", "RssAnon", "RssFile")))
    except OSError:
        return "?"


def mappings(pid: object = "self", count: int = 10) -> list:
    """The `count` mappings of a process with the most resident KiB (smaps)."""
    rows, row = [], None
    try:
        with open("/proc/%s/smaps" % pid) as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    row = [line.split(None, 5)[-1].strip() if len(line.split()) > 5 else "[anon]",
                           0, 0]
                    rows.append(row)
                elif row is not None and line.startswith(("Rss:", "Anonymous:")):
                    row[1 if line.startswith("Rss:") else 2] = int(line.split()[1])
    except OSError:
        return []
    rows.sort(key=lambda r: -r[1])
    return ["mapping: Rss %6d KiB, anonymous %6d KiB  %s" % (r[1], r[2], r[0])
            for r in rows[:count]]


def _write(path: str, current: int, peak: int) -> None:
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)])
    stats = snapshot.statistics("traceback")
    lines = ["traced now %.1f MiB (peak %.1f MiB); %s" % (current / 2**20, peak / 2**20, _rss())]
    lines += ["  " + line for line in mappings()]
    for stat in stats[:TOP]:  # (frames as file:line: no source read, no linecache growth)
        lines.append("%8.1f KiB %8d blocks  %s" % (
            stat.size / 1024, stat.count,
            " <- ".join("%s:%d" % (frame.filename.rsplit("/", 2)[-1] if "/" in frame.filename
                                   else frame.filename, frame.lineno)
                        for frame in reversed(stat.traceback))))
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


def _sampler(path: str) -> None:
    reported = 0
    while True:
        time.sleep(0.05)
        current, peak = tracemalloc.get_traced_memory()
        if current > reported + 2**20:
            reported = current
            try:
                _write(path, current, peak)
            except Exception as err:  # (a diagnostic: never stop the program)
                print("heap_profile: %s" % err, file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", required=True)
    parser.add_argument("program")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    tracemalloc.start(FRAMES)
    threading.Thread(target=_sampler, args=(args.report,), daemon=True).start()
    sys.argv = [args.program] + args.args
    if args.program.endswith(".pyz"):
        sys.path.insert(0, args.program)
    runpy.run_path(args.program, run_name="__main__")


if __name__ == "__main__":
    main()
