"""Run the zipapp with a memory report on demand (where an always-on monitor's memory goes).

    python3 memory_profile.py PYZ monitor ARGS...

On each SIGUSR2 it appends one JSON line to $OUT/memory_profile.jsonl: the resident set
(VmRSS, RssAnon, RssFile), glibc's heap totals (mallinfo2: bytes the arenas hold, in use,
free), CPython's small-object allocator (sys._debugmallocstats: arenas and their free
bytes) and, where MEMORY_PROFILE_FRAMES=N is set (tracemalloc with N frames: it costs
memory of its own, so RSS figures of such a run are not the monitor's), the top allocation
sites and what grew since the previous report. Diagnostic only: the monitor's figures come
from runs without it.
"""
import ctypes
import json
import os
import re
import runpy
import signal
import sys
import tempfile
import tracemalloc

OUT = os.environ.get("OUT", "/tmp")
_previous = None


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _status() -> dict:
    with open("/proc/self/status") as f:
        text = f.read()
    return {key: int(re.search(key + r":\s+(\d+)", text).group(1))
            for key in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}


def _mallinfo() -> dict:
    try:
        function = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return {}
    function.restype = MallInfo2
    info = function()
    return {"heap_kib": info.arena // 1024, "mmapped_kib": info.hblkhd // 1024,
            "in_use_kib": info.uordblks // 1024, "free_kib": info.fordblks // 1024,
            "top_free_kib": info.keepcost // 1024}


def _pymalloc() -> dict:
    """The totals of sys._debugmallocstats (it writes to the C stderr)."""
    with tempfile.TemporaryFile("w+") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read()
    found = {}
    for key, pattern in (("arenas_allocated_now", r"# arenas allocated current\s*=\s*([\d,]+)"),
                         ("arenas_bytes", r"(\d[\d,]*) arenas \* \d+ bytes/arena\s*=\s*([\d,]+)"),
                         ("free_in_pools", r"# bytes in available blocks\s*=\s*([\d,]+)"),
                         ("free_pools", r"(\d+) unused pools \* \d+ bytes\s*=\s*([\d,]+)"),
                         ("allocated_blocks", r"# bytes in allocated blocks\s*=\s*([\d,]+)")):
        match = re.search(pattern, text)
        if match:
            found[key] = int(match.groups()[-1].replace(",", ""))
    return found


def _where(traceback) -> str:
    """Its frames, the allocating one first."""
    return " < ".join("%s:%d" % (f.filename.rsplit("/", 1)[-1], f.lineno)
                      for f in reversed(traceback))


def _sites(snapshot) -> dict:
    global _previous
    keep = snapshot.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    top = [(_where(s.traceback), s.size // 1024, s.count)
           for s in keep.statistics("traceback")[:25]]
    grew = []
    if _previous is not None:
        grew = [(_where(s.traceback), s.size_diff // 1024, s.count_diff)
                for s in keep.compare_to(_previous, "traceback")[:25]]
    _previous = keep
    return {"traced_kib": tracemalloc.get_traced_memory()[0] // 1024, "top_kib": top,
            "grew_kib": grew}


def report(signum=None, frame=None) -> None:
    record = {"status_kib": _status(), "malloc": _mallinfo(), "pymalloc": _pymalloc()}
    if tracemalloc.is_tracing():
        record.update(_sites(tracemalloc.take_snapshot()))
    with open(os.path.join(OUT, "memory_profile.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def main() -> None:
    frames = int(os.environ.get("MEMORY_PROFILE_FRAMES", "0"))
    if frames:
        tracemalloc.start(frames)
    signal.signal(signal.SIGUSR2, report)
    pyz = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, pyz)
    runpy.run_path(pyz, run_name="__main__")


if __name__ == "__main__":
    main()
