"""The GPU suite's shared pieces (scripts/gpu/run.sh and the checks it runs).

- Verdict lines: every check prints `PASS <check>/<part>: <the numbers compared>`,
  `FAIL <check>/<part>: <the mismatch>`, `SKIP <check>/<part>: <why>` (a framework not
  installed: never a PASS) or `INFO ...`; run.sh reads them from the check's output.
- The ground truth CUPTI gives through torch.profiler in the traced process itself
  (`cupti_from_profile`): the kernels that ran (name, grid, block), the launch and graph
  launch API calls, the copies and memsets. torch.profiler records the kernels of CuPy, JAX,
  numba and Triton of the same process too.
- Reading a JSON Lines trace: GPU launches counted once across the runtime and driver layers
  (a driver launch inside a runtime launch on the same thread is that launch), graph
  launches expanded into the kernels of their nodes, a launch's geometry and name.

No GPU, torch or tracer is needed to import this file. Its command line holds the small
verifications run.sh makes on files (and a self-test of the comparisons, which runs
anywhere):

    python3 scripts/gpu/gpucheck.py self-test
    python3 scripts/gpu/gpucheck.py driver-api TRACE.jsonl PROGRAM_STDOUT
    python3 scripts/gpu/gpucheck.py late-load TRACE.jsonl N
    python3 scripts/gpu/gpucheck.py timeline TIMELINE.json TRACE.jsonl
"""
import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

# The repository's ebpf_cuda, after whatever PYTHONPATH holds first (run.sh: the zipapp).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.append(REPO)

SKIP_STATUS = 77  # a check (or a traced target) that could not run here: SKIP, not PASS

# -- verdicts ---------------------------------------------------------------------------------


class Verdicts:
    """PASS/FAIL/SKIP/INFO lines of one check, printed as they come; `status()` is the exit
    status: 1 when any part failed, SKIP_STATUS when every part was skipped, else 0."""

    def __init__(self, check: str) -> None:
        self.check = check
        self.counts = Counter()

    def _say(self, word: str, part: str, detail: str) -> None:
        self.counts[word] += 1
        print("%s %s/%s: %s" % (word, self.check, part, detail), flush=True)

    def add(self, part: str, ok: bool, detail: str) -> bool:
        self._say("PASS" if ok else "FAIL", part, detail)
        return ok

    def skip(self, part: str, reason: str) -> None:
        self._say("SKIP", part, reason)

    def info(self, part: str, detail: str) -> None:
        print("INFO %s/%s: %s" % (self.check, part, detail), flush=True)

    def status(self) -> int:
        if self.counts["FAIL"]:
            return 1
        if self.counts["SKIP"] and not self.counts["PASS"]:
            return SKIP_STATUS
        return 0


def has_module(name: str) -> bool:
    """Whether `name` can be imported here (without importing it where avoidable)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def tracer_command() -> List[str]:
    """The tracer's command: $TRACER (run.sh sets it to `python3 ebpf-cuda.pyz`), else
    `python3 -m ebpf_cuda`."""
    import shlex

    return shlex.split(os.environ.get("TRACER") or "%s -m ebpf_cuda" % sys.executable)


_LOST = re.compile(r"ebpf-cuda: (\d+) (?:events|records \(entries and calls\)) lost")


def lost_in(stderr: str) -> int:
    """Events the tracer said it lost (its stderr), 0 if it said nothing."""
    found = _LOST.search(stderr or "")
    return int(found.group(1)) if found else 0


def tail(text: str, lines: int = 6) -> str:
    return " | ".join((text or "").strip().splitlines()[-lines:])


# -- CUPTI, through torch.profiler ------------------------------------------------------------

GRAPH_LAUNCH = re.compile(r"GraphLaunch")
LAUNCH_CALL = re.compile(r"Launch")


def cupti_from_chrome(events: Iterable[dict]) -> Dict[str, Any]:
    """The ground truth in a torch.profiler Chrome trace's events: `kernels` ([name, grid,
    block] for each kernel that ran), `launch_calls` (launch API calls by name, graph
    launches and host-function launches apart), `graph_launch_calls`, `copies`
    ({"gpu_memcpy": n, "gpu_memset": n})."""
    kernels, launches, graphs, copies = [], Counter(), Counter(), Counter()
    for event in events:
        category, name = event.get("cat", ""), event.get("name", "")
        if category == "kernel":
            args = event.get("args", {})
            kernels.append([name, args.get("grid"), args.get("block")])
        elif category in ("cuda_runtime", "cuda_driver"):
            if GRAPH_LAUNCH.search(name):
                graphs[name] += 1
            elif LAUNCH_CALL.search(name) and "Host" not in name:
                launches[name] += 1
        elif category in ("gpu_memcpy", "gpu_memset"):
            copies[category] += 1
    return {"kernels": kernels, "launch_calls": dict(launches),
            "graph_launch_calls": dict(graphs), "copies": dict(copies)}


def cupti_from_profile(prof) -> Dict[str, Any]:
    """cupti_from_chrome of a finished torch.profiler.profile (exported, read, removed)."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return cupti_from_chrome(trace["traceEvents"] if isinstance(trace, dict) else trace)


def kernel_key(name: Optional[str], grid, block) -> Tuple[Optional[str], tuple, tuple]:
    return (name or None, tuple(grid or ()), tuple(block or ()))


def cupti_kernels(truth: Dict[str, Any]) -> Counter:
    return Counter(kernel_key(*k) for k in truth["kernels"])


# -- traces -----------------------------------------------------------------------------------

LAUNCH_API = re.compile(r"^cu(da)?Launch(Cooperative)?Kernel")
SLACK_S = 2e-6  # JSON times are float seconds: allow for rounding when nesting


def load_events(path: str) -> List[dict]:
    events = []
    with open(path) as f:
        for line in f:
            if line.startswith("{") and '"type":"gpu_' not in line:  # (calls only)
                events.append(json.loads(line))
    return events


def exits_of(events: Iterable[dict], pid: Optional[int] = None,
             window: Optional[Tuple[float, float]] = None) -> List[dict]:
    """Exit events (of `pid`, ending inside `window` when given)."""
    found = []
    for e in events:
        if e.get("phase") != "exit" or (pid is not None and e.get("pid") != pid):
            continue
        if window is not None and not window[0] <= e["ts"] <= window[1]:
            continue
        found.append(e)
    return found


def is_launch(api: str) -> bool:
    return bool(LAUNCH_API.match(api))


def geometry(args: dict) -> Tuple[tuple, tuple]:
    """(grid, block) of a launch's arguments (dim3 `grid`/`block`, or gridX..blockZ)."""
    if "grid" in args:
        return tuple(args.get("grid") or ()), tuple(args.get("block") or ())
    return ((args.get("gridX"), args.get("gridY"), args.get("gridZ")),
            (args.get("blockX"), args.get("blockY"), args.get("blockZ")))


def named(name: Optional[str]) -> bool:
    """A real kernel name (not missing, not the `[kernel launched from F]` hint)."""
    return bool(name) and not name.startswith("[kernel launched from")


def _span(event: dict) -> Tuple[float, float]:
    return event["ts"] - (event.get("duration_ns") or 0) / 1e9, event["ts"]


def gpu_launches(exits: Sequence[dict]) -> List[dict]:
    """One event per GPU launch: a driver launch; a runtime launch only where no driver
    launch ran inside it (same pid and tid, inside its time span). A driver launch without a
    name takes the name of the runtime launch around it."""
    driver = [e for e in exits if is_launch(e["api"]) and not e["api"].startswith("cuda")]
    by_thread: Dict[Tuple[int, int], List[dict]] = {}
    for event in driver:
        by_thread.setdefault((event["pid"], event["tid"]), []).append(event)
    launches = list(driver)
    for event in exits:
        if not (is_launch(event["api"]) and event["api"].startswith("cuda")):
            continue
        start, end = _span(event)
        inner = [d for d in by_thread.get((event["pid"], event["tid"]), [])
                 if _span(d)[0] >= start - SLACK_S and _span(d)[1] <= end + SLACK_S]
        if inner:
            for d in inner:
                if not d.get("kernel") and event.get("kernel"):
                    d["kernel"] = event["kernel"]
        else:
            launches.append(event)
    return launches


def flat_nodes(nodes: Iterable[dict]) -> Iterable[dict]:
    for node in nodes:
        if node.get("type") == "graph":
            yield from flat_nodes(node.get("nodes") or [])
        else:
            yield node


def traced_work(exits: Sequence[dict]) -> Dict[str, Any]:
    """What a trace says ran (its exit events, already cut to a window and a process):
    `launches` (eager GPU launches that succeeded and were not captured into a graph),
    `kernels` (Counter of kernel_key: the eager launches' and the graph launches' nodes),
    `graph_launches` (counted at the driver layer when both layers are there; their events
    in `graph_events`),
    `nodes_unknown` (graph launches whose nodes the trace does not know), `copy_nodes`
    (Counter of memcpy/memset nodes), `unnamed`, `failed`, `captured`, `by_api`."""
    every = gpu_launches(exits)
    failed = [e for e in every if e.get("ret") != 0]
    captured = [e for e in every if e.get("ret") == 0 and e.get("captured")]
    launches = [e for e in every if e.get("ret") == 0 and not e.get("captured")]
    kernels: Counter = Counter()
    unnamed = 0
    for e in launches:
        grid, block = geometry(e["args"])
        kernels[kernel_key(e.get("kernel") if named(e.get("kernel")) else None, grid,
                           block)] += 1
        unnamed += not named(e.get("kernel"))
    graph_events = [e for e in exits if GRAPH_LAUNCH.search(e["api"]) and e.get("ret") == 0]
    driver = [e for e in graph_events if not e["api"].startswith("cuda")]
    counted = driver or graph_events  # (both layers: cuGraphLaunch is the same launch)
    unknown, copy_nodes = 0, Counter()
    for e in counted:
        if e.get("nodes") is None:
            unknown += 1
            continue
        for node in flat_nodes(e["nodes"]):
            if node.get("type") == "kernel":
                name = node.get("kernel") if named(node.get("kernel")) else None
                kernels[kernel_key(name, node.get("grid"), node.get("block"))] += 1
                unnamed += name is None
            else:
                copy_nodes[node.get("type")] += 1
    return {"launches": launches, "kernels": kernels, "graph_launches": len(counted),
            "graph_events": counted,
            "nodes_unknown": unknown, "copy_nodes": copy_nodes, "unnamed": unnamed,
            "failed": len(failed), "captured": len(captured),
            "by_api": Counter(e["api"] for e in launches)}


def multiset_difference(ours: Counter, theirs: Counter, most: int = 5) -> str:
    """The two sides of a multiset mismatch, shortest first, as text ("" when equal)."""
    if ours == theirs:
        return ""
    missing, extra = theirs - ours, ours - theirs

    def show(counter):
        return "; ".join("%dx %s grid %s block %s" % (n, k[0] or "(unnamed)", list(k[1]),
                                                     list(k[2]))
                         for k, n in counter.most_common(most)) or "-"
    return "CUPTI's, not the tracer's (%d): %s || the tracer's, not CUPTI's (%d): %s" % (
        sum(missing.values()), show(missing), sum(extra.values()), show(extra))


def compare_with_cupti(work: Dict[str, Any], truth: Dict[str, Any]) -> List[Tuple[str, bool,
                                                                                   str]]:
    """(part, ok, detail) of issue 40's comparison: launches equal CUPTI's launch calls,
    graph launches its graph launch calls, every launch named, the kernels (name, grid,
    block) equal as multisets."""
    theirs = cupti_kernels(truth)
    cupti_launches = sum(truth["launch_calls"].values())
    cupti_graphs = sum(truth["graph_launch_calls"].values())
    ours_launches = len(work["launches"])
    parts = [("launches", ours_launches == cupti_launches
              and work["graph_launches"] == cupti_graphs,
              "tracer %d launches (%s), %d graph launches; CUPTI %d launch calls (%s), %d graph "
              "launch calls" % (ours_launches, _counts(work["by_api"]), work["graph_launches"],
                                cupti_launches, _counts(truth["launch_calls"]), cupti_graphs)),
             ("named", work["unnamed"] == 0 and work["nodes_unknown"] == 0
              and sum(work["kernels"].values()) > 0,
              "%d of %d kernels named%s" % (sum(work["kernels"].values()) - work["unnamed"],
                                            sum(work["kernels"].values()),
                                            "; %d graph launches with unknown nodes"
                                            % work["nodes_unknown"] if work["nodes_unknown"]
                                            else ""))]
    difference = multiset_difference(work["kernels"], theirs)
    parts.append(("kernels", not difference and sum(theirs.values()) > 0,
                  "%d kernels (%d distinct names) = CUPTI's %d, names and geometry equal"
                  % (sum(theirs.values()), len({k[0] for k in theirs}),
                     sum(theirs.values())) if not difference and theirs
                  else "CUPTI recorded no kernel: no ground truth" if not theirs
                  else "tracer %d, CUPTI %d: %s" % (sum(work["kernels"].values()),
                                                   sum(theirs.values()), difference)))
    return parts


def _counts(counter) -> str:
    return ", ".join("%s %d" % kv for kv in sorted(dict(counter).items())) or "none"


def kernel_rows(stdout: str) -> Dict[str, Tuple[int, int, int]]:
    """{row text after the counts: (launches, in graphs, captured)} of a --summary's kernel
    table (rows of the same text summed; without graphs the table has the launches alone)."""
    if " ** Kernel Launches" not in stdout:
        return {}
    part = stdout.split(" ** Kernel Launches", 1)[1].split("\n\n")[1]
    rows: Dict[str, Tuple[int, int, int]] = {}
    for line in part.splitlines()[2:]:
        cells = line.split()
        counts: List[int] = []
        while len(counts) < 3 and len(counts) < len(cells) - 1 \
                and cells[len(counts)].replace(",", "").isdigit():
            counts.append(int(cells[len(counts)].replace(",", "")))
        if not counts:
            break
        key = " ".join(cells[len(counts):])
        have = rows.get(key, (0, 0, 0))
        padded = (counts + [0, 0])[:3]
        rows[key] = (have[0] + padded[0], have[1] + padded[1], have[2] + padded[2])
    return rows


def torch_cudart() -> Optional[str]:
    """The libcudart a PyTorch process maps once CUDA is up (a child process asks)."""
    import subprocess

    code = ("import torch; torch.zeros(1, device='cuda')\n"
            "print(sorted({l.split()[-1] for l in open('/proc/self/maps') "
            "if '/libcudart.so' in l})[0])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else None


# -- small verifications for run.sh -----------------------------------------------------------

def check_driver_api(trace: str, program_output: str) -> int:
    """driver_check.cu traced from its start, against what it says it did (one line per
    step): its `<<<>>>`, cuLaunchKernel and cuLaunchKernelEx launches ran, named, with their
    geometry; the 2 launches of its stream capture were captured, not run; each of its graph
    launches ran the 2 captured kernels; its last line is `ok`."""
    v = Verdicts("driver-api")
    with open(program_output) as f:
        lines = f.read().splitlines()
    v.add("program", bool(lines) and lines[-1] == "ok",
          "the traced program's last line: %r" % (lines[-1] if lines else None))
    wanted_run, graphs, per_graph, ptx_run = Counter(), 0, 0, 0
    for line in lines:
        words = dict(w.partition("=")[::2] for w in line.split() if "=" in w)
        if line.startswith("launch ") and "count" in words:  # (add_one, <<<grid, 256>>>)
            add_one = ((int(words["grid"]), 1, 1), (int(words["block"]), 1, 1))
            wanted_run[add_one] += int(words["count"])
        elif line.startswith(("culaunch ", "culaunchex ")) and "count" in words:
            grid = tuple(int(x) for x in words["grid"].split(","))
            block = tuple(int(x) for x in words["block"].split(","))
            wanted_run[(grid, block)] += int(words["count"])
            ptx_run += int(words["count"])
        elif line.startswith("graph ") and "launches" in words:
            graphs, per_graph = int(words["launches"]), int(words["kernels_per_launch"])
    events = load_events(trace)
    pids = Counter(e["pid"] for e in events if e.get("phase") == "exit"
                   and is_launch(e["api"]))
    if not pids:
        v.add("launches", False, "no launch in the trace")
        return v.status()
    work = traced_work(exits_of(events, pids.most_common(1)[0][0]))
    v.add("launches", len(work["launches"]) == sum(wanted_run.values())
          and work["captured"] == 2 and work["failed"] == 0,
          "tracer %d launches run (%s), %d captured into the graph, %d failed; the program: "
          "%d run, 2 captured" % (len(work["launches"]), _counts(work["by_api"]),
                                  work["captured"], work["failed"],
                                  sum(wanted_run.values())))
    seen = Counter(geometry(e["args"]) for e in work["launches"])
    v.add("geometry", seen == wanted_run, "tracer %s; the program %s" % (
        sorted(seen.items()), sorted(wanted_run.items())))
    v.add("graphs", work["graph_launches"] == graphs and work["nodes_unknown"] == 0
          and sum(work["kernels"].values()) == sum(wanted_run.values()) + graphs * per_graph,
          "tracer %d graph launches (%d with unknown nodes), %d kernels in all; the program: "
          "%d graph launches of %d kernels, %d kernels in all"
          % (work["graph_launches"], work["nodes_unknown"], sum(work["kernels"].values()),
             graphs, per_graph, sum(wanted_run.values()) + graphs * per_graph))
    names = Counter()
    for (name, _, _), count in work["kernels"].items():
        names[name] += count
    add_ones = sum(n for name, n in names.items() if name and name.startswith("add_one"))
    ptx = sum(n for name, n in names.items()
              if name and "scale_kernel_with_a_rather_long" in name)
    wanted_add = sum(wanted_run.values()) - ptx_run + graphs * per_graph
    v.add("names", work["unnamed"] == 0 and add_ones == wanted_add and ptx == ptx_run,
          "%d unnamed; add_one %d (the program: %d, graph nodes included), the PTX kernel of "
          "cuModuleGetFunction %d (%d); names %s" % (work["unnamed"], add_ones, wanted_add,
                                                     ptx, ptx_run, dict(names)))
    return v.status()


def check_late_load(trace: str, n: int) -> int:
    """late_load/cupy_prog.py N traced: CuPy's runtime is linked into its own extension
    modules, loaded after the tracer started; N cudaMalloc (and CuPy's own few more), N
    cudaFree and N cudaDeviceSynchronize through cupy.cuda.runtime."""
    v = Verdicts("late-load")
    exits = Counter(e["api"] for e in load_events(trace) if e.get("phase") == "exit")
    v.add("cupy runtime calls", exits["cudaMalloc"] >= n and exits["cudaFree"] == n
          and exits["cudaDeviceSynchronize"] == n,
          "tracer cudaMalloc %d (the program %d, and CuPy's own), cudaFree %d (%d), "
          "cudaDeviceSynchronize %d (%d)" % (exits["cudaMalloc"], n, exits["cudaFree"], n,
                                             exits["cudaDeviceSynchronize"], n))
    return v.status()


def check_timeline(timeline: str, trace: str) -> int:
    """A Perfetto (Chrome trace) timeline and the JSON trace written by the same run: the
    timeline parses, has tracks (M), slices (X) and counters (C); its launch slices are the
    trace's launch exits, with the same kernel names."""
    v = Verdicts("zipapp")
    with open(timeline) as f:
        loaded = json.load(f)
    events = loaded["traceEvents"] if isinstance(loaded, dict) else loaded
    phases = Counter(e.get("ph") for e in events)
    v.add("timeline", phases["X"] > 0 and phases["M"] > 0 and phases["C"] > 0,
          "%d events by phase %s" % (len(events), dict(phases)))
    slices = Counter((e.get("args") or {}).get("kernel") for e in events
                     if e.get("ph") == "X" and e.get("cat") == "launch")
    exits = Counter(e.get("kernel") for e in load_events(trace)
                    if e.get("phase") == "exit" and is_launch(e["api"]))
    v.add("timeline launches", slices == exits and sum(slices.values()) > 0
          and None not in slices,
          "timeline %d launch slices (%d unnamed), JSON %d launch exits (%d unnamed)%s"
          % (sum(slices.values()), slices.get(None, 0), sum(exits.values()),
             exits.get(None, 0), "" if slices == exits else "; names differ: %s"
             % sorted(set(slices.items()) ^ set(exits.items()), key=str)[:6]))
    return v.status()


def self_test() -> int:
    """The comparisons on hand-made traces: equal ones pass, each kind of mismatch fails."""
    def launch(api, ts, kernel, grid=(4, 1, 1), block=(256, 1, 1), tid=1, dur=1000, **outs):
        event = {"ts": ts, "pid": 7, "tid": tid, "api": api, "phase": "exit", "ret": 0,
                 "duration_ns": dur, "args": {"func": 1, "grid": list(grid),
                                              "block": list(block)}}
        if kernel:
            event["kernel"] = kernel
        event.update(outs)
        return event

    truth = {"kernels": [["k1", [4, 1, 1], [256, 1, 1]], ["k2", [8, 1, 1], [128, 1, 1]],
                         ["k1", [4, 1, 1], [256, 1, 1]]],
             "launch_calls": {"cudaLaunchKernel": 1, "cuLaunchKernelEx": 1},
             "graph_launch_calls": {"cudaGraphLaunch": 1}, "copies": {}}
    graph = {"ts": 3.0, "pid": 7, "tid": 1, "api": "cuGraphLaunch", "phase": "exit", "ret": 0,
             "duration_ns": 10, "args": {},
             "nodes": [{"type": "kernel", "kernel": "k1", "grid": [4, 1, 1],
                        "block": [256, 1, 1]}, {"type": "memset", "size": 4}]}
    good = [launch("cudaLaunchKernel", 1.000002, "k1", dur=2000),
            launch("cuLaunchKernel", 1.000001, None, dur=500),  # (inside the runtime one)
            launch("cuLaunchKernelEx", 2.0, "k2", grid=(8, 1, 1), block=(128, 1, 1)),
            launch("cuLaunchKernel", 2.5, "k9", captured=True), graph]
    failures = []

    def expect(what, events, ok):
        parts = compare_with_cupti(traced_work([dict(e) for e in events]), truth)
        if all(p[1] for p in parts) != ok:
            failures.append("%s: %s" % (what, parts))

    expect("equal", good, True)
    expect("a launch missing", good[:2] + good[3:], False)
    expect("a launch unnamed", good[:2] + [launch("cuLaunchKernelEx", 2.0, None,
                                                  grid=(8, 1, 1), block=(128, 1, 1))] + good[3:],
           False)
    expect("another geometry", good[:2] + [launch("cuLaunchKernelEx", 2.0, "k2",
                                                  grid=(8, 2, 1), block=(128, 1, 1))] + good[3:],
           False)
    expect("another name", good[:2] + [launch("cuLaunchKernelEx", 2.0, "k3", grid=(8, 1, 1),
                                              block=(128, 1, 1))] + good[3:], False)
    expect("graph nodes unknown", good[:4] + [dict(graph, nodes=None)], False)
    expect("a failed launch is not a launch", good[:2] + [dict(good[2], ret=1)] + good[3:],
           False)
    chrome = cupti_from_chrome([
        {"cat": "kernel", "name": "k", "args": {"grid": [1, 1, 1], "block": [32, 1, 1]}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel"},
        {"cat": "cuda_driver", "name": "cuLaunchKernelEx"},
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch"},
        {"cat": "cuda_runtime", "name": "cudaLaunchHostFunc"},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoD"}])
    if chrome != {"kernels": [["k", [1, 1, 1], [32, 1, 1]]],
                  "launch_calls": {"cudaLaunchKernel": 1, "cuLaunchKernelEx": 1},
                  "graph_launch_calls": {"cudaGraphLaunch": 1}, "copies": {"gpu_memcpy": 1}}:
        failures.append("cupti_from_chrome: %s" % chrome)
    if lost_in("ebpf-cuda: 12 events lost: ring_full") != 12 or lost_in("fine") != 0:
        failures.append("lost_in")
    for failure in failures:
        print("self-test FAIL %s" % failure)
    print("gpucheck self-test: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("self-test")
    p = sub.add_parser("driver-api")
    p.add_argument("trace")
    p.add_argument("program_output")
    p = sub.add_parser("late-load")
    p.add_argument("trace")
    p.add_argument("n", type=int)
    p = sub.add_parser("timeline")
    p.add_argument("timeline")
    p.add_argument("trace")
    args = parser.parse_args(argv)
    if args.what == "self-test":
        return self_test()
    if args.what == "driver-api":
        return check_driver_api(args.trace, args.program_output)
    if args.what == "late-load":
        return check_late_load(args.trace, args.n)
    return check_timeline(args.timeline, args.trace)


if __name__ == "__main__":
    raise SystemExit(main())
