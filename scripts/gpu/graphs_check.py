"""Issue 17 on one GPU: CUDA graphs seen node by node, checked against CUPTI.

    python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz
    python3 scripts/gpu/graphs_check.py "python3 ebpf-cuda.pyz" "$OUT" [CASE...]  (as root)

Two targets (this file with --target CASE DIR), each run untraced and traced:
- `cudagraph`: a 3-layer MLP captured with torch.cuda.CUDAGraph (warm-up on a side stream,
  as PyTorch's documentation does it), then 50 replays, each after copying a new input into
  the static input;
- `compile`: the same model under torch.compile(mode="reduce-overhead") (CUDA graph trees),
  called 100 times; the last 80 calls are the window (the first ones warm up and record).
In the window, torch.profiler (CUPTI) records every kernel that ran (name, grid, block) and
every memcpy/memset; the target writes them, the window's wall-clock bounds and a checksum
of its outputs to DIR/CASE.json.

The traced run (`--json -o DIR/CASE.jsonl --summary`) is checked: the kernels the window's
graph launches expanded into (their `nodes`, child graphs too; with both layers, those of
cuGraphLaunch, inside cudaGraphLaunch), plus the eager launches of the window (not
`captured`), equal CUPTI's kernels as a multiset of (name, grid, block); memcpy and memset
nodes, plus the eager copies and memsets of the window, are counted against CUPTI's; the
captured launches, the graph launches whose nodes are unknown and the --summary kernel table
are reported; the checksums of the traced and the untraced run must be equal. Also: which graph rows of the table the host's libcudart and
libcuda export. Results: one JSON object per line in $OUT/graphs_check.jsonl (also printed).
"""
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter

REPLAYS = 50
# The default set probes launches in the driver only (it sees every launch).
DRIVER_LAUNCHES = ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel")
CALLS, WARMUP_CALLS = 100, 20


# ---- the targets ------------------------------------------------------------------------

def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 256)).cuda().eval()


def _profiled(prof):
    """CUPTI's kernels (name, grid, block) and memcpy/memset counts of a finished profile."""
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    kernels, copies = [], Counter()
    for e in events:
        cat = e.get("cat", "")
        if cat == "kernel":
            args = e.get("args", {})
            kernels.append([e["name"], args.get("grid"), args.get("block")])
        elif cat in ("gpu_memcpy", "gpu_memset"):
            copies[cat] += 1
    return kernels, dict(copies)


def target(case: str, outdir: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = _model()
    inputs = [torch.randn(64, 512, device="cuda") for _ in range(CALLS)]  # (seeded)
    with torch.no_grad():
        if case == "cudagraph":
            static_x = inputs[0].clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(static_x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_y = model(static_x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                start = time.time()
                for i in range(REPLAYS):
                    static_x.copy_(inputs[i])  # (a copy, not a kernel)
                    graph.replay()
                torch.cuda.synchronize()
                end = time.time()
            checksum = float(static_y.double().sum().item())
        else:
            compiled = torch.compile(model, mode="reduce-overhead")
            for i in range(WARMUP_CALLS):
                compiled(inputs[i])
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                start = time.time()
                for i in range(WARMUP_CALLS, CALLS):
                    last = compiled(inputs[i])
                torch.cuda.synchronize()
                end = time.time()
            checksum = float(last.double().sum().item())
    kernels, copies = _profiled(prof)
    with open(os.path.join(outdir, case + ".json"), "w") as f:
        json.dump({"case": case, "window_start": start, "window_end": end, "checksum": checksum,
                   "cupti_kernels": kernels, "cupti_copies": copies,
                   "torch": torch.__version__, "cuda": torch.version.cuda}, f)


# ---- checking a trace -----------------------------------------------------------------------

def _flat(nodes):
    for node in nodes:
        if node.get("type") == "graph":
            yield from _flat(node.get("nodes") or [])
        else:
            yield node


def _eager_copies(exits) -> Counter:
    """memcpy/memset operations the window ran outside graphs (not captured), each once: a
    driver copy inside a runtime copy on the same thread is that runtime copy. CUPTI records
    these too (e.g. the cudagraph case's `static_x.copy_()` before each replay)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    from ebpf_cuda.spec.apis import BY_NAME, Role

    ops = [e for e in exits if e.get("ret") == 0 and not e.get("captured")
           and BY_NAME.get(e["api"]) is not None
           and BY_NAME[e["api"]].role in (Role.COPY, Role.MEMSET)]
    spans = [(e["tid"], e["ts"] - e["duration_ns"] / 1e9, e["ts"]) for e in ops
             if not BY_NAME[e["api"]].driver]
    found = Counter()
    for e in ops:
        start = e["ts"] - e["duration_ns"] / 1e9
        if BY_NAME[e["api"]].driver and any(tid == e["tid"] and s <= start and e["ts"] <= t
                                            for tid, s, t in spans):
            continue  # (the runtime call around it counts)
        found["memcpy" if BY_NAME[e["api"]].role == Role.COPY else "memset"] += 1
    return found


def check_trace(path: str, truth: dict) -> dict:
    """The window's expanded graph kernels and eager launches against CUPTI's kernels."""
    start, end = truth["window_start"], truth["window_end"]
    events = [json.loads(line) for line in open(path)]
    exits = [e for e in events if e["phase"] == "exit" and start <= e["ts"] <= end]
    graph_launches = [e for e in exits if e["api"] in ("cuGraphLaunch", "cudaGraphLaunch")
                      and e.get("ret") == 0]
    driver = [e for e in graph_launches if e["api"] == "cuGraphLaunch"]
    counted = driver or graph_launches  # (both layers: cuGraphLaunch is the same launch)
    ours, copies, unknown = Counter(), Counter(), 0
    for e in counted:
        if e.get("nodes") is None:
            unknown += 1
            continue
        for node in _flat(e["nodes"]):
            if node["type"] == "kernel":
                ours[(node.get("kernel"), tuple(node["grid"]), tuple(node["block"]))] += 1
            else:
                copies[node["type"]] += 1
    eager = [e for e in exits if e["api"] in DRIVER_LAUNCHES and e.get("ret") == 0
             and not e.get("captured")]
    for e in eager:
        ours[(e.get("kernel"), tuple(e["args"]["grid"]), tuple(e["args"]["block"]))] += 1
    eager_copies = _eager_copies(exits)
    cupti = Counter((k[0], tuple(k[1] or ()), tuple(k[2] or ())) for k in truth["cupti_kernels"])
    missing, extra = cupti - ours, ours - cupti
    return {"check": truth["case"], "graph_launches_in_window": len(counted),
            "graph_launch_events_in_window": len(graph_launches),
            "nodes_unknown": unknown, "eager_launches_in_window": len(eager),
            "kernels_ours": sum(ours.values()), "kernels_cupti": sum(cupti.values()),
            "kernels_equal": ours == cupti,
            "cupti_not_ours": [[*k, n] for k, n in missing.most_common(10)],
            "ours_not_cupti": [[*k, n] for k, n in extra.most_common(10)],
            "unnamed_ours": sum(n for k, n in ours.items() if not k[0]),
            "copy_nodes": dict(copies), "cupti_copies": truth["cupti_copies"],
            "eager_copies": dict(eager_copies),
            "copies_equal": {"gpu_" + k: n for k, n in (copies + eager_copies).items()}
            == truth["cupti_copies"],
            "captured_launches_whole_run": sum(1 for e in events if e["phase"] == "exit"
                                               and e.get("captured")),
            "graph_launches_whole_run": sum(1 for e in events if e["phase"] == "exit"
                                            and e["api"] in ("cuGraphLaunch",
                                                             "cudaGraphLaunch")),
            "instantiations": Counter(e["api"] for e in events if e["phase"] == "exit"
                                      and "Instantiate" in e["api"])}


def exports(pyz: str, libs) -> dict:
    """Which graph rows of the table each library exports (the tracer's own ELF reader)."""
    code = ("import sys, json; sys.path.insert(0, %r)\n"
            "from ebpf_cuda.spec import apis\nfrom ebpf_cuda.targets.elf import open_elf\n"
            "rows = {a.library: [] for a in apis.TABLE}\n"
            "for a in apis.TABLE:\n"
            "    if a.category == 'graph' or a.role in ('event-record', 'stream-wait'):\n"
            "        rows[a.library] += list(a.symbols)\n"
            "out = {}\n"
            "for lib in %r:\n"
            "    kind = 'driver' if 'libcuda.so' in lib else 'runtime'\n"
            "    have = open_elf(lib).has_any(rows[kind])\n"
            "    out[lib] = {'missing': [s for s in rows[kind] if s not in have],\n"
            "                'present': sorted(have)}\n"
            "print(json.dumps(out))" % (pyz, list(libs)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-2000:]}


def _libraries() -> list:
    """The libcudart torch loads and the driver's libcuda, by a process that loads them."""
    code = ("import torch; torch.zeros(1, device='cuda')\n"
            "libs = set()\n"
            "for line in open('/proc/self/maps'):\n"
            "    path = line.split()[-1]\n"
            "    if '/libcudart.so' in path or '/libcuda.so' in path:\n"
            "        libs.add(path)\n"
            "print('\\n'.join(sorted(libs)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    return [line for line in done.stdout.splitlines() if line.startswith("/")]


def main() -> int:
    if sys.argv[1] == "--target":
        target(sys.argv[2], sys.argv[3])
        return 0
    tracer, outdir = shlex.split(sys.argv[1]), sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    results = []

    def emit(obj):
        results.append(obj)
        print(json.dumps(obj), flush=True)

    for case in sys.argv[3:] or ("cudagraph", "compile"):  # (cases named after OUT: those)
        target_cmd = [sys.executable, os.path.abspath(__file__), "--target", case, outdir]
        done = subprocess.run(target_cmd, capture_output=True, text=True, timeout=900)
        untraced = json.load(open(os.path.join(outdir, case + ".json")))
        emit({"run": case + " untraced", "exit": done.returncode, "stderr": done.stderr[-1500:],
              "cupti_kernels": len(untraced["cupti_kernels"]),
              "torch": untraced["torch"], "cuda": untraced["cuda"]})
        trace = os.path.join(outdir, case + ".jsonl")
        done = subprocess.run(tracer + ["--json", "-o", trace, "--summary", "--"] + target_cmd,
                              capture_output=True, text=True, timeout=900)
        traced = json.load(open(os.path.join(outdir, case + ".json")))
        table = done.stdout[done.stdout.find(" ** Kernel Launches"):]
        emit({"run": case + " traced", "exit": done.returncode, "stderr": done.stderr[-3000:],
              "kernel_table": table[:6000]})
        emit({"same_results_traced_and_untraced": traced["checksum"] == untraced["checksum"],
              "checksums": [untraced["checksum"], traced["checksum"]], "case": case})
        emit(check_trace(trace, traced))
        os.unlink(trace)  # (large; the checks above say what it held)
    pyz = next((p for p in tracer if p.endswith(".pyz")), None)
    if pyz is not None:
        emit({"exports": exports(os.path.abspath(pyz), _libraries())})
    with open(os.path.join(outdir, "graphs_check.jsonl"), "w") as f:
        for obj in results:
            f.write(json.dumps(obj) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
