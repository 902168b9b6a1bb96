"""`--analyze` on training loops as PyTorch runs them (tests/analyze/graph_loops.py: the
stand-in PyTorch of tests/analyze/site-packages/faketorch.py on the stand-in libcudart),
through real probes: the loops of scripts/gpu/analyze_check.py that D35 got wrong.
- torch.cuda.graph: 3 warm-up steps (their backward on an autograd thread), one capture,
  then 20 replays: 20 steps, each `graph`, the replays attributed to the capture's line,
  the autograd thread's repeating warm-up named as such and no steps;
- torch.compile(mode="reduce-overhead"): a compile-time benchmark loop, a warm-up call,
  a recording call, then replays: 20 steps (`warm-up`, `capture`, 18 `graph`), the replays
  attributed to the compiled call's line; the same forward never leaving its warm-up (a
  pending backward, D35's workload): 20 `eager` steps, no replay;
- `empty_cache()` in every step while the autograd thread allocates: one alloc-churn finding
  naming both threads, its counts the two threads' summed.
Each run is also saved and analysed offline: the same records."""
import json
import sys
from pathlib import Path
from typing import List

import pytest

from helpers import REPO, cli_env, need_root, run_cli

pytestmark = pytest.mark.kernel

PROGRAM = REPO / "tests" / "analyze" / "graph_loops.py"
STEPS = 20
MIB = 1 << 20
LINES = {}
for _number, _text in enumerate(PROGRAM.read_text().splitlines(), 1):
    if "# <- " in _text:
        LINES[_text.split("# <- ")[1].strip()] = _number


def trace(tmp_path: Path, lib: Path, scenario: str):
    """(live records, exit events) of one scenario; the offline records checked equal."""
    need_root()
    events, saved = tmp_path / "events.jsonl", tmp_path / "run.ebpfcuda"
    live = run_cli("--py-stacks", "--analyze", "--json", "-o", events, "--save", saved,
                   "--ring-size", "32M", "-p", lib, "--", sys.executable, PROGRAM, scenario,
                   lib, env=cli_env(FAKECUDA_DEVICE_US="0"), timeout=180)
    assert live.returncode == 0, live.stderr
    # (the counts below are exact: a run that lost events, a starved reader on a loaded
    # machine, says so here rather than in a count)
    assert " lost" not in live.stderr, live.stderr
    offline = run_cli("analyze", "--json", saved)
    assert offline.returncode == 0, offline.stderr
    records = [json.loads(line) for line in live.stdout.splitlines() if line.startswith("{")]
    assert records == [json.loads(line) for line in offline.stdout.splitlines() if line]
    calls = [json.loads(line) for line in events.read_text().splitlines()]
    return records, [e for e in calls if e["phase"] == "exit"]


def of(records: List[dict], kind: str) -> List[dict]:
    return [r for r in records if r["type"] == kind]


def site(name: str, function: str) -> str:
    return "%s:%d %s" % (PROGRAM, LINES[name], function)


def test_cuda_graph_replays_are_the_steps_and_the_warm_up_is_named(lib, tmp_path):
    records, exits = trace(tmp_path, lib, "graphs")
    loop, = of(records, "steps")
    assert loop["steps"] == STEPS and loop["modes"] == ["graph"] * STEPS
    assert loop["where"] == "%s:%d-%d in graphs" % (PROGRAM, LINES["input"], LINES["replay"])
    assert loop["tid"] == loop["pid"]  # the Python thread's
    launches = [e for e in exits if e["api"] == "cudaGraphLaunch"]
    assert len(launches) == STEPS
    assert of(records, "graph_replays") == [{"type": "graph_replays", "replays": STEPS,
                                             "captured_at": site("capture", "graphs")}]
    # the autograd thread ran the warm-up steps' and the capture's backward passes only
    autograd = {e["tid"] for e in exits if e["tid"] != e["pid"]}
    warm, = of(records, "warm_up")
    assert {warm["tid"]} == autograd and warm["repeats"] >= 3
    assert of(records, "finding") == []


def test_compiled_loop_warm_up_capture_then_replays(lib, tmp_path):
    records, exits = trace(tmp_path, lib, "compiled")
    loop, = of(records, "steps")
    assert loop["steps"] == STEPS
    assert loop["modes"] == ["warm-up", "capture"] + ["graph"] * (STEPS - 2)
    replays = [e for e in exits if e["api"] == "cudaGraphLaunch"]
    assert len(replays) == STEPS - 1  # (the recording call replays at once)
    assert of(records, "graph_replays") == [{"type": "graph_replays", "replays": STEPS - 1,
                                             "captured_at": site("compiled", "compiled")}]
    assert of(records, "warm_up") == [] and of(records, "finding") == []


def test_compiled_loop_that_never_replays_is_eager(lib, tmp_path):
    records, exits = trace(tmp_path, lib, "pending")
    loop, = of(records, "steps")
    assert loop["steps"] == STEPS and loop["modes"] == ["eager"] * STEPS
    assert not [e for e in exits if e["api"] == "cudaGraphLaunch"]
    assert of(records, "graph_replays") == [] and of(records, "finding") == []


def test_one_finding_for_the_threads_of_one_loop(lib, tmp_path):
    records, exits = trace(tmp_path, lib, "threads")
    assert [r["steps"] for r in of(records, "steps")] == [STEPS, STEPS]
    churn, = [f for f in of(records, "finding") if f["rule"] == "alloc-churn"]
    pid = exits[0]["pid"]
    autograd, = {e["tid"] for e in exits if e["tid"] != e["pid"]}
    threads = ["%d/%d" % (pid, pid), "%d/%d" % (pid, autograd)]
    evidence = churn["evidence"]
    assert evidence["threads"] == threads == churn["where"]["thread"]
    # each steady step: the Python thread allocates the activations again and frees both
    # blocks (empty_cache), the autograd thread allocates its workspace again
    mine = {t: evidence["by_thread"][t] for t in threads}
    assert [(e["allocations"], e["frees"]) for e in mine.values()] == [
        (STEPS - 1, 2 * (STEPS - 1)), (STEPS - 1, 0)]
    assert (evidence["allocations"], evidence["frees"]) == (2 * (STEPS - 1), 2 * (STEPS - 1))
    assert evidence["bytes_allocated"] == 2 * (STEPS - 1) * 4 * MIB
    mallocs = [e for e in exits if e["api"] == "cudaMalloc"]
    per_thread = [sum(1 for e in mallocs if e["tid"] == tid) for tid in (pid, autograd)]
    # (set-up: graph_loops.LAYERS weights and biases, the static batch; then each step)
    assert per_thread == [2 * 8 + 1 + STEPS, STEPS]
    assert churn["where"]["python"] == "%s:%d-%d in threads" % (
        PROGRAM, LINES["churn"] - 1, LINES["churn"])
    assert evidence["call_ns"] == mine[threads[0]]["call_ns"] + mine[threads[1]]["call_ns"]
