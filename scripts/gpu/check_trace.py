"""Reads an ebpf-cuda JSON Lines trace and reports how many kernel launches were named.

    python3 check_trace.py TRACE.jsonl [--maps MAPS] [--expect-kernel NAME ...]
        [--expect-copy KIND=BYTES ...] [--expect-leak BYTES ...] [--min-resolved FRACTION]

Prints the fraction of launches whose `kernel` key is set, the most launched kernels, the
summary tables and leaks recomputed from the trace by ebpf_cuda.analysis (the same classes the
live --summary/--leaks use). With --maps (a copy of the traced process's /proc/PID/maps),
unnamed launch addresses are located in their files. Exit status 1 when an expectation fails.
Needs PYTHONPATH to hold the repository (and pyelftools installed).
"""
import argparse
import collections
import json
import sys
from typing import Dict, List, Optional

from ebpf_cuda.analysis import AddressResolver, LeakTracker, ProcessMaps, Summary, format_leaks
from ebpf_cuda.spec.apis import BY_NAME
from ebpf_cuda.decode.events import EXIT, Event

_EVENT_KEYS = {"ts", "pid", "tid", "comm", "api", "phase", "args", "ret", "ret_name",
               "duration_ns", "faults", "kernel"}


def to_event(obj: dict) -> Event:
    """An `Event` from one JSON object (out-parameters are its other top-level keys)."""
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in obj["args"].items()}
    outs = {k: v for k, v in obj.items() if k not in _EVENT_KEYS}
    return Event(obj["ts"], int(obj["ts"] * 1e9), obj["pid"], obj["tid"], obj["comm"],
                 obj["api"], obj["phase"], args, obj.get("ret"), obj.get("ret_name"),
                 obj.get("duration_ns"), outs, tuple(obj.get("faults", ())))


def is_launch(obj: dict) -> bool:
    row = BY_NAME.get(obj["api"])
    return obj["phase"] == EXIT and row is not None and row.category == "launch"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="kernel-name coverage of an ebpf-cuda trace")
    parser.add_argument("trace")
    parser.add_argument("--maps", help="the traced process's /proc/PID/maps, saved")
    parser.add_argument("--expect-kernel", action="append", default=[], metavar="NAME")
    parser.add_argument("--expect-copy", action="append", default=[], metavar="KIND=BYTES",
                        help="total bytes of successful cudaMemcpy calls of a kind")
    parser.add_argument("--expect-leak", action="append", default=[], type=int, metavar="BYTES")
    parser.add_argument("--min-resolved", type=float, default=0.0, metavar="FRACTION")
    options = parser.parse_args(argv)

    with open(options.trace) as stream:
        objects = [json.loads(line) for line in stream if line.strip()]
        objects = [o for o in objects if "type" not in o]  # (the GPU's samples: not calls)
    launches = [o for o in objects if is_launch(o)]
    named = [o for o in launches if o.get("kernel")]
    fraction = len(named) / len(launches) if launches else 0.0
    print("%s: %d events, %d launches, %d named: %.1f%% resolved" % (
        options.trace, len(objects), len(launches), len(named), 100.0 * fraction))
    by_api = collections.Counter(o["api"] for o in launches)
    print("launches by function: %s" % ", ".join("%s %d" % kv for kv in by_api.most_common()))
    counts = collections.Counter(o.get("kernel") or "0x%x" % o["args"]["func"] for o in launches)
    for name, count in counts.most_common(15):
        print("  %6d  %s" % (count, name))
    if options.maps:
        _explain_unnamed(launches, options.maps)

    names: Dict[tuple, str] = {(o["pid"], o["args"]["func"]): o["kernel"] for o in named}
    events = [to_event(o) for o in objects]
    summary = Summary(namer=lambda event, func: names.get((event.pid, func)))
    summary.add(events)
    tracker = LeakTracker()
    warnings = tracker.feed_all(events)
    print()
    print(summary.report())
    print()
    print(format_leaks(tracker))
    for warning in warnings:
        print("warning: %s" % warning)
    return _check(options, fraction, set(names.values()), events, tracker)


def _explain_unnamed(launches: List[dict], maps_path: str) -> None:
    """Where the unnamed launch addresses lie (file + offset, nearest symbol)."""
    with open(maps_path) as stream:
        text = stream.read()
    resolver = AddressResolver()
    unnamed = collections.Counter((o["pid"], o["args"]["func"]) for o in launches
                                  if not o.get("kernel") and "func" in o["args"])
    for (pid, func), count in unnamed.most_common(10):
        resolver.use(ProcessMaps.parse(pid, text))
        frame = resolver.frame(pid, func)
        print("  unnamed 0x%x (%d launches): %s" % (func, count, frame or "not in a mapped file"))


def _check(options, fraction: float, names: set, events: List[Event],
           tracker: LeakTracker) -> int:
    failures = []
    if fraction < options.min_resolved:
        failures.append("%.1f%% of launches named, expected at least %.1f%%"
                        % (100 * fraction, 100 * options.min_resolved))
    failures += ["kernel %r never named" % k for k in options.expect_kernel if k not in names]
    for spec in options.expect_copy:
        kind, expected = spec.split("=")
        total = sum(e.args["size"] for e in events if e.phase == EXIT and e.ret == 0
                    and e.api == "cudaMemcpy" and e.args.get("kind") == kind)
        if total != int(expected):
            failures.append("cudaMemcpy %s: %d bytes, expected %s" % (kind, total, expected))
    leaked = sorted(a.size for a in tracker.leaks())
    if options.expect_leak and leaked != sorted(options.expect_leak):
        failures.append("leaks of %s bytes, expected %s" % (leaked, sorted(options.expect_leak)))
    for failure in failures:
        print("FAIL: %s" % failure)
    print("check_trace: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
