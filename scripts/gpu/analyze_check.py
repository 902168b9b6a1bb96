"""Issue 38 on the GPU host: `--analyze` on PyTorch training loops with planted problems.

    python3 scripts/gpu/analyze_check.py [--out DIR] [--tracer "python3 ebpf-cuda.pyz"]
                                         [--steps 20]
    python3 scripts/gpu/analyze_check.py self-test        (no GPU, torch or tracer)

As root, with the tracer importable (run.sh's `analyze` sets PYTHONPATH to the zipapp and
TRACER). Prints one PASS/FAIL line per check (SKIP, status 77, without torch or a GPU) and
writes DIR/analyze_check.json; exit status 0 when every check passed.

The loop (written to DIR/loop.py; its lines tagged `# TAG name`, so the check knows them):
an MLP trained with SGD (fixed seed). Variants, each traced with
`TRACER --py-stacks --analyze --json -o /dev/null` (the analysis' JSON records on stdout):
- `planted` (width 4096, batch 2048: the GPU is busy): each step copies its batch from
  pageable host memory with `non_blocking=True` (TAG pageable), reads the loss with `.item()`
  (TAG item) and calls `torch.cuda.empty_cache()` (TAG churn: the next step's tensors come
  from cudaMalloc again). Checks: steps found = the loop's iterations; the findings are
  exactly sync-in-step at the item line, pageable-copy at the pageable line and alloc-churn
  with the churn line among its sites, once each (the autograd thread's churn merged into
  the Python thread's finding); the saved trace analysed offline gives the same records.
- `eager`, `graphs`, `compile`, `pending` (width 256, batch 64, 8 layers: launch-bound):
  the same step without the planted problems, its batch copied from pinned memory into a
  static tensor (TAG input; the traced eager loop has no warm-up loop before it: its first
  step is the warm-up); `graphs` warms up 3 steps on a side stream, captures the step once
  with torch.cuda.graph (TAG capture) and replays it (TAG replay); `compile` runs the
  forward through torch.compile(model, mode="reduce-overhead") (TAG compiled), calling
  torch.compiler.cudagraph_mark_step_begin() before each call; `pending` the same without
  it (D35's loop: a forward with grad enabled and no backward leaves a backward pending,
  and cudagraph trees then warm up eagerly at every call, never replaying). Checks: steps =
  iterations in each; eager: a launch-bound finding; graphs: every step's mode `graph`,
  the replays attributed to the capture line, STEPS of them; compile: `warm-up` steps, one
  `capture` step, then steps replaying (`graph`, or `mixed` where cudagraph trees copy an
  input with a kernel), at least STEPS - 3 of them, the replays (at least STEPS - 2)
  attributed to the compiled call's line; pending: every step `eager`, no replay.
  Then the eager version's "graphs would save" range (at least: the
  launch calls; at most: the host time issuing them, each minus one graph launch) against
  the measured difference of the untraced step times (eager minus graphs, each loop timed
  by itself: wall time of STEPS steps after warm-up, synchronised at both ends): PASS when
  the measured difference lies in [0.5 x at least, 1.5 x at most] (the traced launches carry
  the probes' cost; the untraced difference also holds PyTorch's Python time between
  launches, which the upper figure includes).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpucheck import Verdicts, has_module, tail, tracer_command  # noqa: E402

LOOP = '''\
import sys, time
import torch
variant, steps, width, batch, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
    int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
dev = torch.device("cuda")
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width),
                                                  torch.nn.ReLU()) for _ in range(layers)])
model = model.to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x_host = torch.randn(batch, width)
x_pinned = x_host.pin_memory()
y = torch.randn(batch, width, device=dev)
static_x = torch.zeros(batch, width, device=dev)


def step(x):
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def timed(run):
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    run()
    torch.cuda.synchronize()
    print("loop: step_ns=%d" % ((time.perf_counter_ns() - start) // steps), flush=True)


def planted():
    for i in range(steps):
        x = x_host.to(dev, non_blocking=True)  # TAG pageable
        loss = step(x)
        value = loss.item()  # TAG item
        torch.cuda.empty_cache()  # TAG churn


def eager():
    for i in range(steps):
        static_x.copy_(x_pinned, non_blocking=True)  # TAG input
        step(static_x)


def graphs():
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # TAG capture
        step(static_x)

    def loop():
        for i in range(steps):
            static_x.copy_(x_pinned, non_blocking=True)
            graph.replay()  # TAG replay
    return loop


def compiled(pending=False):
    run = torch.compile(model, mode="reduce-overhead")
    # (a forward with grad enabled and no backward leaves its outputs' backward pending:
    # cudagraph trees then warm up at every call, eagerly, unless told each call is a new
    # step; D35 ran it so, `pending`)
    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)

    def loop():
        for i in range(steps):
            static_x.copy_(x_pinned, non_blocking=True)
            if mark is not None and not pending:
                mark()
            out = run(static_x)  # TAG compiled
    return loop


if variant == "planted":
    planted()
elif variant == "eager":
    if sys.argv[6:] == ["warm"]:  # (untraced timing: warmed up like the graphs' loop)
        for _ in range(3):
            step(static_x)
    timed(eager)
elif variant == "graphs":
    timed(graphs())
else:
    loop = compiled(pending=variant == "pending")
    timed(loop)
'''
BIG = ("4096", "2048", "4")
SMALL = ("256", "64", "8")
PLANTED_RULES = {"sync-in-step": "item", "pageable-copy": "pageable", "alloc-churn": "churn"}


def tags(text: str) -> Dict[str, int]:
    return {line.split("# TAG ")[1].strip(): number
            for number, line in enumerate(text.splitlines(), 1) if "# TAG " in line}


def records_of(stdout: str) -> List[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def step_ns(stdout: str) -> Optional[int]:
    for line in stdout.splitlines():
        if line.startswith("loop: step_ns="):
            return int(line.split("=")[1])
    return None


def at(path: str, line: int) -> str:
    return "%s:%d" % (path, line)


def judge_planted(v: Verdicts, records: List[dict], path: str, lines: Dict[str, int],
                  steps: int) -> None:
    """Steps = iterations; exactly the three planted findings, each at its line."""
    loops = [r for r in records if r["type"] == "steps"]
    v.add("planted steps", [r["steps"] for r in loops][:1] == [steps],
          "steps found %s (loop iterations %d)" % ([r["steps"] for r in loops], steps))
    found = [r for r in records if r["type"] == "finding"]
    rules = sorted(f["rule"] for f in found)  # (one each: threads' findings merge)
    v.add("planted findings", rules == sorted(PLANTED_RULES),
          "found %s, planted %s" % (rules, sorted(PLANTED_RULES)))
    for rule, tag in sorted(PLANTED_RULES.items()):
        places = [(place, f["evidence"]) for f in found if f["rule"] == rule
                  for place in [f["where"].get("python") or ""] + list(f["where"].get("sites")
                                                                        or [])]
        hit = [p for p in places if p[0].startswith(at(path, lines[tag]) + " ")]
        v.add("planted %s" % rule, bool(hit), "planted at line %d; found at %s; evidence %s"
              % (lines[tag], [p[0] for p in places],
                 json.dumps(hit[0][1] if hit else None, sort_keys=True)))


def judge_graphs(v: Verdicts, name: str, records: List[dict], path: str, line: int,
                 steps: int, compiled: bool) -> None:
    """Steps = iterations; every step `graph` (torch.cuda.graph: warm-up and capture come
    before the loop), or (torch.compile, cudagraph trees) `warm-up` steps, one `capture`
    step, then steps replaying (`graph`, or `mixed` where an input is copied by a kernel);
    the replays attributed to the capturing line (the compiled call's for torch.compile:
    every replay but the first call's and the recording's)."""
    loops = [r for r in records if r["type"] == "steps"]
    modes = loops[0]["modes"] if loops else []
    v.add("%s steps" % name, len(modes) == steps, "steps found %d (iterations %d)"
          % (len(modes), steps))
    lead = 0
    while compiled and lead < len(modes) and modes[lead] == "warm-up":
        lead += 1
    if compiled:
        right = lead >= 1 and modes[lead:lead + 1] == ["capture"]
        lead += 1
    else:
        right = True
    replaying = ("graph", "mixed") if compiled else ("graph",)
    right = right and len(modes[lead:]) >= steps - 3 and all(m in replaying
                                                             for m in modes[lead:])
    v.add("%s modes" % name, bool(right), "modes %s (expected %s)" % (
        modes, "warm-up..., capture, then graph" if compiled else "graph in every step"))
    replays = [r for r in records if r["type"] == "graph_replays"]
    ours = [r for r in replays if r["captured_at"].startswith(at(path, line) + " ")]
    expected = steps - 2 if compiled else steps
    v.add("%s replays" % name, bool(ours) and sum(r["replays"] for r in ours) >= expected,
          "replays by capture site %s; capture line %d, %d replays expected"
          % ([(r["captured_at"], r["replays"]) for r in replays], line, expected))


def judge_pending(v: Verdicts, records: List[dict], steps: int) -> None:
    """D35's compiled loop, whose calls never leave cudagraph trees' warm-up: steps =
    iterations, each `eager`, no graph replayed."""
    loops = [r for r in records if r["type"] == "steps"]
    modes = loops[0]["modes"] if loops else []
    v.add("pending steps", len(modes) == steps and set(modes) == {"eager"},
          "modes %s (iterations %d, each eager)" % (modes, steps))
    replays = [r for r in records if r["type"] == "graph_replays"]
    v.add("pending replays", not replays, "graph replays %s (none expected)" % replays)


def judge_saving(v: Verdicts, eager: List[dict], eager_ns: Optional[int],
                 graph_ns: Optional[int]) -> Dict[str, Any]:
    """The eager loop's launch-bound finding and its saving against the measured one."""
    bound = [f for f in eager if f["type"] == "finding" and f["rule"] == "launch-bound"]
    v.add("eager launch-bound", len(bound) == 1,
          "findings %s" % [f["rule"] for f in eager if f["type"] == "finding"])
    if not bound or eager_ns is None or graph_ns is None:
        return {}
    evidence = bound[0]["evidence"]
    low = evidence["graphs_would_save_ns_per_step"]
    high = evidence["graphs_would_save_at_most_ns_per_step"]
    measured = eager_ns - graph_ns
    v.add("graphs would save", 0.5 * low <= measured <= 1.5 * high,
          "estimate %d..%d ns a step; measured untraced step %d ns eager, %d ns graphs: "
          "%d ns saved" % (low, high, eager_ns, graph_ns, measured))
    return {"estimate_ns": [low, high], "measured_ns": measured, "eager_ns": eager_ns,
            "graphs_ns": graph_ns}


def run_traced(tracer: List[str], folder: str, variant: str, sizes: Sequence[str],
               steps: int, save: Optional[str] = None) -> Tuple[int, List[dict], str]:
    command = tracer + ["--py-stacks", "--analyze", "--json", "-o", os.devnull]
    if save:
        command += ["--save", save]
    done = subprocess.run(command + ["--", sys.executable, os.path.join(folder, "loop.py"),
                                     variant, str(steps), *sizes],
                          capture_output=True, text=True, timeout=600)
    return done.returncode, records_of(done.stdout), done.stderr


def run_untraced(folder: str, variant: str, steps: int) -> Optional[int]:
    done = subprocess.run([sys.executable, os.path.join(folder, "loop.py"), variant,
                           str(steps), *SMALL, "warm"], capture_output=True, text=True,
                          timeout=600)
    return step_ns(done.stdout) if done.returncode == 0 else None


def check(v: Verdicts, folder: str, tracer: List[str], steps: int) -> Dict[str, Any]:
    path = os.path.join(folder, "loop.py")
    with open(path, "w") as f:
        f.write(LOOP)
    lines = tags(LOOP)
    result: Dict[str, Any] = {"lines": lines}
    saved = os.path.join(folder, "planted.ebpfcuda")
    rc, planted, err = run_traced(tracer, folder, "planted", BIG, steps, save=saved)
    v.add("planted run", rc == 0, "exit %d %s" % (rc, tail(err)))
    judge_planted(v, planted, path, lines, steps)
    again = subprocess.run(tracer + ["analyze", "--json", saved], capture_output=True,
                           text=True, timeout=600)
    v.add("planted offline", records_of(again.stdout) == planted,
          "ebpf-cuda analyze of the saved trace: %d records, live %d"
          % (len(records_of(again.stdout)), len(planted)))
    result["planted"] = planted
    variants = {}
    for name in ("eager", "graphs", "compile", "pending"):
        rc, records, err = run_traced(tracer, folder, name, SMALL, steps,
                                      save=os.path.join(folder, name + ".ebpfcuda"))
        v.add("%s run" % name, rc == 0, "exit %d %s" % (rc, tail(err)))
        variants[name] = records
        v.info("%s findings" % name, json.dumps([f for f in records
                                                 if f["type"] == "finding"])[:2000])
    loops = [r for r in variants["eager"] if r["type"] == "steps"]
    v.add("eager steps", [r["steps"] for r in loops][:1] == [steps],
          "steps found %s (iterations %d)" % ([r["steps"] for r in loops], steps))
    judge_graphs(v, "graphs", variants["graphs"], path, lines["capture"], steps, False)
    judge_graphs(v, "compile", variants["compile"], path, lines["compiled"], steps, True)
    judge_pending(v, variants["pending"], steps)
    result.update(variants)
    result["saving"] = judge_saving(v, variants["eager"], run_untraced(folder, "eager", steps),
                                    run_untraced(folder, "graphs", steps))
    return result


def self_test() -> int:
    """The judges on hand-made records: right ones pass, wrong ones fail."""
    lines = tags(LOOP)
    path = "/x/loop.py"

    def finding(rule: str, tag: str) -> dict:
        return {"type": "finding", "rule": rule, "evidence": {},
                "where": {"python": "%s:%d train" % (path, lines[tag])}}
    good = [{"type": "steps", "steps": 5}] + [finding(r, t) for r, t in PLANTED_RULES.items()]
    ok = Verdicts("self-test")
    judge_planted(ok, good, path, lines, 5)
    bad = Verdicts("self-test")
    judge_planted(bad, good[:-1] + [finding("alloc-churn", "item")], path, lines, 4)
    twice = Verdicts("self-test")  # a finding once per thread: a false duplicate
    judge_planted(twice, good + [finding("alloc-churn", "churn")], path, lines, 5)
    compiled = [{"type": "steps", "modes": ["warm-up", "capture"] + ["graph"] * 3},
                {"type": "graph_replays", "replays": 3,
                 "captured_at": "%s:%d compiled" % (path, lines["compiled"])}]
    judge_graphs(ok, "compile", compiled, path, lines["compiled"], 5, True)
    judge_graphs(bad, "graphs", compiled, path, lines["capture"], 5, False)
    judge_pending(ok, [{"type": "steps", "modes": ["eager"] * 5}], 5)
    judge_pending(bad, compiled, 5)
    # the bad cases: a wrong step count, churn at another line, a step not replaying in the
    # graphs loop, replays attributed to another line, a pending loop that replays (its
    # modes, its replays): six FAILs; the duplicate: one
    passed = ok.counts["FAIL"] == 0 and ok.counts["PASS"] == 10 and bad.counts["FAIL"] == 6 \
        and twice.counts["FAIL"] == 1
    print("self-test %s" % ("ok" if passed else "FAILED"))
    return 0 if passed else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=["self-test"])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--tracer", default=None, help="default: $TRACER, else python3 -m "
                        "ebpf_cuda")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    if args.command == "self-test":
        return self_test()
    v = Verdicts("analyze")
    if not has_module("torch"):
        v.skip("all", "torch is not installed")
        return v.status()
    import torch

    if not torch.cuda.is_available():
        v.skip("all", "no CUDA device")
        return v.status()
    folder = args.out or tempfile.mkdtemp(prefix="analyze-check-")
    os.makedirs(folder, exist_ok=True)
    tracer = args.tracer.split() if args.tracer else tracer_command()
    result = check(v, folder, tracer, args.steps)
    with open(os.path.join(folder, "analyze_check.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True, default=str)
    return v.status()


if __name__ == "__main__":
    sys.exit(main())
