"""CUDA graphs seen node by node, checked against CUPTI (issue 17; run.sh's `graphs`).

    python3 scripts/gpu/graphs_check.py [--out DIR] [CASE...]       (as root)

The tracer is $TRACER (run.sh: `python3 ebpf-cuda.pyz`), else `python3 -m ebpf_cuda`. Two
targets (this file with --target CASE DIR), each run untraced and traced:
- `cudagraph`: a 3-layer MLP captured with torch.cuda.CUDAGraph (warm-up on a side stream,
  as PyTorch's documentation does it), then 50 replays, each after copying a new input into
  the static input;
- `compile`: the same model under torch.compile(mode="reduce-overhead") (CUDA graph trees),
  called 100 times; the last 80 calls are the window (the first ones warm up and record).
In the window, torch.profiler (CUPTI) records every kernel that ran (name, grid, block) and
every memcpy/memset; the target writes them, the window's wall-clock bounds and a checksum
of its outputs to DIR/CASE.json.

Checks (one PASS/FAIL line each), on the traced run (`--json -o DIR/CASE.jsonl --summary`):
- kernels: the kernels the window's graph launches expanded into (their `nodes`, child
  graphs too; with both layers, those of cuGraphLaunch, inside cudaGraphLaunch), plus the
  eager launches of the window (not `captured`), equal CUPTI's kernels as a multiset of
  (name, grid, block); none unnamed, no graph launch with unknown nodes;
- copies: memcpy and memset nodes, plus the eager copies and memsets of the window, equal
  CUPTI's memcpy and memset counts;
- results: both runs exit 0 and the checksums of the traced and the untraced run are equal;
- (cudagraph) summary alone: `--summary` alone (in-kernel counts, the capture state kept in
  the kernel) prints the same kernel table, row for row, as the decoded `--summary` of the
  traced run (the same deterministic program; compile is left out: its autotuning's
  benchmark runs differ from run to run, D23).
Also (INFO): which graph rows of the table the host's libcudart and libcuda export. Results:
one JSON object per line in DIR/graphs_check.jsonl. Exit status 1 on any FAIL.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucheck  # noqa: E402

REPLAYS = 50
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
    truth = gpucheck.cupti_from_profile(prof)
    return truth["kernels"], truth["copies"]


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
                   "pid": os.getpid(),
                   "cupti_kernels": kernels, "cupti_copies": copies,
                   "torch": torch.__version__, "cuda": torch.version.cuda}, f)


# ---- checking a trace -----------------------------------------------------------------------

def _eager_copies(exits) -> Counter:
    """memcpy/memset operations the window ran outside graphs (not captured), each once: a
    driver copy inside a runtime copy on the same thread is that runtime copy. CUPTI records
    these too (e.g. the cudagraph case's `static_x.copy_()` before each replay)."""
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
    window = (truth["window_start"], truth["window_end"])
    events = gpucheck.load_events(path)
    exits = gpucheck.exits_of(events, truth.get("pid"), window)
    work = gpucheck.traced_work(exits)
    ours = work["kernels"]
    eager_copies = _eager_copies(exits)
    cupti = Counter(gpucheck.kernel_key(*k) for k in truth["cupti_kernels"])
    missing, extra = cupti - ours, ours - cupti
    copies = work["copy_nodes"]
    return {"check": truth["case"], "graph_launches_in_window": work["graph_launches"],
            "nodes_unknown": work["nodes_unknown"],
            "eager_launches_in_window": len(work["launches"]),
            "kernels_ours": sum(ours.values()), "kernels_cupti": sum(cupti.values()),
            "kernels_equal": ours == cupti and bool(cupti),
            "difference": gpucheck.multiset_difference(ours, cupti),
            "cupti_not_ours": [[*k, n] for k, n in missing.most_common(10)],
            "ours_not_cupti": [[*k, n] for k, n in extra.most_common(10)],
            "unnamed_ours": work["unnamed"],
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


def _run(command, timeout: float, env=None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env)
    except subprocess.TimeoutExpired as late:
        return subprocess.CompletedProcess(command, 124, str(late.stdout or ""),
                                           str(late.stderr or "") + "\n(timed out)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help="cudagraph, compile (default: "
                        "both)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/ebpf-cuda-graphs"))
    parser.add_argument("--timeout", type=float, default=600, help="s, per run")
    parser.add_argument("--target", nargs=2, metavar=("CASE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.target:
        target(*args.target)
        return 0
    tracer, outdir = gpucheck.tracer_command(), args.out
    os.makedirs(outdir, exist_ok=True)
    v = gpucheck.Verdicts("graphs")
    if not gpucheck.has_module("torch"):
        v.skip("all", "PyTorch not installed here")
        return v.status()
    results = []

    def emit(obj):
        results.append(obj)
        with open(os.path.join(outdir, "graphs_check.jsonl"), "a") as f:
            f.write(json.dumps(obj) + "\n")

    for case in args.cases or ("cudagraph", "compile"):
        if case == "compile" and not gpucheck.has_module("triton"):
            v.skip(case, "Triton (torch.compile's GPU backend) not installed here")
            continue
        target_cmd = [sys.executable, os.path.abspath(__file__), "--target", case, outdir]
        truth_path = os.path.join(outdir, case + ".json")
        if os.path.exists(truth_path):
            os.unlink(truth_path)
        done = _run(target_cmd, args.timeout)
        untraced = None
        if os.path.exists(truth_path):
            with open(truth_path) as f:
                untraced = json.load(f)
            os.unlink(truth_path)
        emit({"run": case + " untraced", "exit": done.returncode,
              "stderr": done.stderr[-1500:]})
        trace = os.path.join(outdir, case + ".jsonl")
        done = _run(tracer + ["--json", "-o", trace, "--summary", "--"] + target_cmd,
                    args.timeout)
        decoded_table = gpucheck.kernel_rows(done.stdout)
        traced = None
        if os.path.exists(truth_path):
            with open(truth_path) as f:
                traced = json.load(f)
        emit({"run": case + " traced", "exit": done.returncode, "stderr": done.stderr[-3000:],
              "kernel_table": done.stdout[done.stdout.find(" ** Kernel Launches"):][:6000]})
        if untraced is None or traced is None or not os.path.exists(trace):
            v.add("%s results" % case, False, "untraced run %s, traced run exited %d (%s)" % (
                "done" if untraced else "failed", done.returncode, gpucheck.tail(done.stderr)))
            continue
        v.info(case, "torch %s, CUDA %s" % (traced["torch"], traced["cuda"]))
        lost = gpucheck.lost_in(done.stderr)
        v.add("%s results" % case, done.returncode == 0
              and traced["checksum"] == untraced["checksum"],
              "checksum traced %r, untraced %r; traced run exited %d"
              % (traced["checksum"], untraced["checksum"], done.returncode))
        found = check_trace(trace, traced)
        emit(found)
        v.add("%s kernels" % case, found["kernels_equal"] and found["unnamed_ours"] == 0
              and found["nodes_unknown"] == 0 and not lost,
              "tracer %d kernels (%d graph launches expanded, %d eager launches), CUPTI %d; "
              "%d unnamed, %d graph launches with unknown nodes%s%s"
              % (found["kernels_ours"], found["graph_launches_in_window"],
                 found["eager_launches_in_window"], found["kernels_cupti"],
                 found["unnamed_ours"], found["nodes_unknown"],
                 "; lost %d events" % lost if lost else "",
                 "; " + found["difference"] if found["difference"] else ""))
        v.add("%s copies" % case, found["copies_equal"],
              "tracer: nodes %s + eager %s; CUPTI %s" % (found["copy_nodes"],
                                                         found["eager_copies"],
                                                         found["cupti_copies"]))
        os.unlink(trace)  # (large; the checks above say what it held)
        if case == "cudagraph":  # --summary alone: the kernel's counts, the same table
            done = _run(tracer + ["--summary", "--"] + target_cmd, args.timeout)
            alone = gpucheck.kernel_rows(done.stdout)
            differ = {k: (decoded_table.get(k), alone.get(k))
                      for k in set(decoded_table) | set(alone)
                      if decoded_table.get(k) != alone.get(k)}
            emit({"run": "cudagraph --summary alone", "exit": done.returncode,
                  "rows": len(alone), "differ": differ})
            v.add("cudagraph summary alone", done.returncode == 0 and bool(alone)
                  and not differ,
                  "%d kernel rows (launches, in graphs, captured: %s) alone, %d decoded%s"
                  % (len(alone), [sum(r[i] for r in alone.values()) for i in range(3)],
                     len(decoded_table), "; rows that differ (decoded, alone): %s"
                     % dict(list(differ.items())[:4]) if differ else ""))
    pyz = next((p for p in tracer if p.endswith(".pyz")), None)
    if pyz is not None:
        found = exports(os.path.abspath(pyz), _libraries())
        emit({"exports": found})
        v.info("exports", "; ".join("%s: %d graph rows missing%s" % (
            os.path.basename(lib), len(row.get("missing", [])),
            " (%s)" % ", ".join(row["missing"][:6]) if row.get("missing") else "")
            for lib, row in found.items() if isinstance(row, dict)))
    return v.status()


if __name__ == "__main__":
    raise SystemExit(main())
