"""Counts the GPU kernel launches in an ebpf-cuda JSON Lines trace and names them (issue 5).

    python3 scripts/gpu/compare_issue5.py TRACE.jsonl [--program-output OUT] [--name NAME]

Each successful GPU launch is counted once: a runtime launch (cudaLaunchKernel, cudaLaunchKernelExC,
cudaLaunchCooperativeKernel) that has a driver launch (cuLaunchKernel, cuLaunchKernelEx,
cuLaunchCooperativeKernel) nested inside it (same pid and tid, inside its time span) is the
driver launch; runtime launches with no nested driver launch count by themselves. Graph
launches are listed apart (their kernels are not seen one by one). Names come from the
`kernel` key the tracer adds, else from the names learned from cuModuleGetFunction,
cuLibraryGetKernel, cuKernelGetFunction and cuFuncGetName exit events.

With --program-output (the traced program's stdout), launches are counted inside its
`window_start=`/`window_end=` and compared with `profiler_kernels=` or `launches=` from it.
"""
import argparse
import json
from collections import Counter
from typing import Dict, List, Optional, Tuple

RUNTIME_LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel"}
DRIVER_LAUNCHES = {"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel"}
GRAPH_LAUNCHES = {"cudaGraphLaunch", "cuGraphLaunch"}
SLACK_S = 2e-6  # JSON times are float seconds: allow for rounding when nesting


def load_exits(path: str) -> List[dict]:
    exits = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                event = json.loads(line)
                if event.get("phase") == "exit":
                    exits.append(event)
    return exits


def span(event: dict) -> Tuple[float, float]:
    return event["ts"] - (event.get("duration_ns") or 0) / 1e9, event["ts"]


def learned_names(exits: List[dict]) -> Dict[Tuple[int, int], str]:
    """(pid, function or kernel handle) -> name, from the module/library exit events."""
    names: Dict[Tuple[int, int], str] = {}
    for event in exits:
        if event.get("ret") != 0:
            continue
        pid, api = event["pid"], event["api"]
        if api == "cuModuleGetFunction" and event.get("name"):
            names[(pid, event["function"])] = event["name"]
        elif api == "cuLibraryGetKernel" and event.get("name"):
            names[(pid, event["kernel"])] = event["name"]
        elif api == "cuFuncGetName" and event.get("name"):
            names[(pid, event["args"]["function"])] = event["name"]
        elif api == "cuKernelGetFunction":
            name = names.get((pid, event["args"]["kernel"]))
            if name:
                names[(pid, event["function"])] = name
    return names


def gpu_launches(exits: List[dict]) -> Tuple[List[dict], int]:
    """(one event per GPU launch, runtime launches that had a driver launch nested)."""
    driver = [e for e in exits if e["api"] in DRIVER_LAUNCHES]
    by_thread: Dict[Tuple[int, int], List[dict]] = {}
    for event in driver:
        by_thread.setdefault((event["pid"], event["tid"]), []).append(event)
    launches, covered = list(driver), 0
    for event in exits:
        if event["api"] not in RUNTIME_LAUNCHES:
            continue
        start, end = span(event)
        inner = [d for d in by_thread.get((event["pid"], event["tid"]), [])
                 if span(d)[0] >= start - SLACK_S and span(d)[1] <= end + SLACK_S]
        if inner:
            covered += 1
            for d in inner:  # a driver launch may carry no name where the runtime one has one
                d.setdefault("kernel", event.get("kernel"))
        else:
            launches.append(event)
    return launches, covered


def name_of(event: dict, names: Dict[Tuple[int, int], str]) -> Optional[str]:
    if event.get("kernel"):
        return event["kernel"]
    func = event.get("args", {}).get("func")
    return names.get((event["pid"], func)) if func is not None else None


def read_program_output(path: str) -> Dict[str, str]:
    values = {}
    with open(path) as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep and " " not in key:
                values[key] = value
    return values


def report(path: str, title: str, program: Dict[str, str]) -> int:
    exits = load_exits(path)
    names = learned_names(exits)
    launches, covered = gpu_launches(exits)
    graphs = [e for e in exits if e["api"] in GRAPH_LAUNCHES]
    window = None
    if "window_start" in program and "window_end" in program:
        window = (float(program["window_start"]), float(program["window_end"]))
        launches = [e for e in launches if window[0] <= e["ts"] <= window[1]]
        graphs = [e for e in graphs if window[0] <= e["ts"] <= window[1]]
    failed = sum(1 for e in launches if e.get("ret") != 0)
    launches = [e for e in launches if e.get("ret") == 0]  # a failed launch runs nothing
    by_api = Counter(e["api"] for e in launches)
    named = Counter(name_of(e, names) or "?" for e in launches)
    print("== %s: %s" % (title, path))
    print("exit events: %d; apis seen: %s" % (len(exits), ", ".join(
        "%s=%d" % kv for kv in sorted(Counter(e["api"] for e in exits).items()))))
    if window:
        print("window: %.6f .. %.6f (%.3f s)" % (window[0], window[1], window[1] - window[0]))
    print("GPU launches seen by the tracer: %d (%s); runtime launches with a nested driver "
          "launch: %d; failed launches (not counted): %d" % (
              len(launches), ", ".join("%s=%d" % kv for kv in sorted(by_api.items())),
              covered, failed))
    print("graph launches: %d" % len(graphs))
    print("names resolved: %d of %d" % (len(launches) - named.get("?", 0), len(launches)))
    for name, count in named.most_common(40):
        print("  %6d  %s" % (count, name))
    expected = program.get("profiler_kernels") or program.get("launches")
    status = 0
    if expected is not None:
        source = "profiler (CUPTI) kernels" if "profiler_kernels" in program else "program"
        print("%s: %s; tracer: %d; difference: %+d" % (
            source, expected, len(launches), len(launches) - int(expected)))
        if "profiler_launch_calls" in program:
            print("profiler launch API calls: %s" % program["profiler_launch_calls"])
        if "profiler_kernel_names" in program:
            theirs = Counter(json.loads(program["profiler_kernel_names"]))
            print("profiler kernel names (%d distinct):" % len(theirs))
            for name, count in theirs.most_common(40):
                print("  %6d  %s" % (count, name))
        status = 0 if len(launches) == int(expected) else 1
    if program.get("kernel"):
        hits = named.get(program["kernel"], 0)
        print("program's kernel %s: %d launches named so" % (program["kernel"], hits))
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--program-output", help="the traced program's stdout")
    parser.add_argument("--name", default="trace")
    args = parser.parse_args()
    program = read_program_output(args.program_output) if args.program_output else {}
    return report(args.trace, args.name, program)


if __name__ == "__main__":
    raise SystemExit(main())
