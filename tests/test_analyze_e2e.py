"""`--analyze` and `ebpf-cuda analyze` end to end: real probes on the stand-in libcudart
with its simulated device (FAKECUDA_DEVICE_US: launches queue device time, synchronising
calls wait for it), tracing tests/analyze/loops.py under --py-stacks. Each scenario has one
known problem at a marked line (`# <- NAME`): the finding names that line, with counts that
are the program's and times that are the trace's own (the JSON events of the same run); a
healthy loop gets no finding; steps equal the loop's iterations; a program without a loop
gets no steps. Every run is also saved and analysed offline: the same records."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from helpers import REPO, cli_argv, cli_env, need_root, run_cli, slowdown

pytestmark = pytest.mark.kernel

PROGRAM = REPO / "tests" / "analyze" / "loops.py"
STEPS = 6
DEVICE_US = 5000  # device time per launch (the stand-in's simulated device)
LINES = {}
for _number, _text in enumerate(PROGRAM.read_text().splitlines(), 1):
    if "# <- " in _text:
        LINES[_text.split("# <- ")[1].strip()] = _number


def at(name: str) -> str:
    """The finding's `python` of the marked line: `FILE:LINE FUNCTION`."""
    function = {"sync": "sync", "pageable": "pageable", "default": "default_stream",
                "error": "error"}[name]
    return "%s:%d %s" % (PROGRAM, LINES[name], function)


def trace(tmp_path: Path, lib: Path, scenario: str, launch_us: int = 0, *options: str,
          device_us: int = DEVICE_US):
    """(live records, exit events) of one scenario; the offline records checked equal."""
    need_root()
    events, saved = tmp_path / "events.jsonl", tmp_path / "run.ebpfcuda"
    env = cli_env(FAKECUDA_DEVICE_US=str(device_us), FAKECUDA_LAUNCH_US=str(launch_us))
    live = run_cli("--py-stacks", "--analyze", "--json", "-o", events, "--save", saved,
                   "-p", lib, *options, "--", sys.executable, PROGRAM, scenario, lib,
                   env=env, timeout=180)
    assert live.returncode == 0, live.stderr
    offline = run_cli("analyze", "--json", saved, *options)
    assert offline.returncode == 0, offline.stderr
    records = [json.loads(line) for line in live.stdout.splitlines() if line.startswith("{")]
    again = [json.loads(line) for line in offline.stdout.splitlines() if line]
    assert records == again  # live and offline: the same steps and findings
    calls = [json.loads(line) for line in events.read_text().splitlines()]
    return records, [e for e in calls if e["phase"] == "exit"]


def findings(records: List[dict]) -> List[dict]:
    return [r for r in records if r["type"] == "finding"]


def steps(records: List[dict]) -> List[dict]:
    return [r for r in records if r["type"] == "steps"]


def at_line(exits: List[dict], api: str, line: int) -> List[dict]:
    return [e for e in exits if e["api"] == api and e.get("py_stack")
            and e["py_stack"][0]["line"] == line]


def test_a_healthy_loop_gets_its_steps_and_no_finding(lib, tmp_path):
    records, _ = trace(tmp_path, lib, "healthy")
    loop, = steps(records)
    assert loop["steps"] == STEPS and loop["modes"] == ["eager"] * STEPS
    first = LINES["healthy"]  # the loop's three launch lines
    assert loop["where"] == "%s:%d-%d in healthy" % (PROGRAM, first, first + 2)
    assert findings(records) == []


def test_several_files_each_analysed_and_labelled(lib, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    trace(tmp_path / "a", lib, "sync")
    trace(tmp_path / "b", lib, "error")
    files = [str(tmp_path / name / "run.ebpfcuda") for name in "ab"]
    done = run_cli("analyze", "--json", *files)
    assert done.returncode == 0, done.stderr
    labelled = [(r["file"], r["type"], r.get("rule")) for r in map(json.loads,
                                                                   done.stdout.splitlines())]
    assert labelled == [(files[0], "steps", None), (files[0], "finding", "sync-in-step"),
                        (files[1], "steps", None), (files[1], "finding", "ignored-error")]


def test_no_loop_no_steps(lib, tmp_path):
    records, _ = trace(tmp_path, lib, "no_loop")
    assert records == []


def test_sync_in_step_names_its_line_and_waits(lib, tmp_path):
    records, exits = trace(tmp_path, lib, "sync")
    assert steps(records)[0]["steps"] == STEPS
    finding, = findings(records)
    assert finding["rule"] == "sync-in-step" and finding["where"]["python"] == at("sync")
    syncs = at_line(exits, "cudaStreamSynchronize", LINES["sync"])
    assert len(syncs) == STEPS
    steady = syncs[1:]  # (the first step is not steady)
    assert finding["evidence"]["calls"] == STEPS - 1 == finding["evidence"]["steps"]
    assert finding["evidence"]["waited_ns"] == sum(e["duration_ns"] for e in steady)
    # each sync returned only once its two launches' device time had passed since the first
    launches = [e for e in exits if e["api"] == "cudaLaunchKernel"]
    for number, event in enumerate(syncs):
        first = launches[2 * number]
        first_start = first["ts"] - first["duration_ns"] / 1e9
        assert event["ts"] - first_start >= 2 * DEVICE_US / 1e6


def test_wait_bounds_bracket_the_scripted_device_time(lib, tmp_path):
    from ebpf_cuda.analysis.analyzer import Analyzer
    from ebpf_cuda.output.savefile import load

    trace(tmp_path, lib, "sync")
    saved = load(str(tmp_path / "run.ebpfcuda"))
    analyzer = Analyzer(saved.namer)
    for batch in saved.batches():
        analyzer.write(batch)
    windows = analyzer.context().waits.windows
    assert len(windows) == STEPS and all(w.submits == 2 for w in windows)
    device = DEVICE_US * 1000  # per launch; the stand-in queues it from inside the call
    calls = analyzer.context().calls
    for window in windows:
        first, second = [c for c in calls if c.api == "cudaLaunchKernel"
                         and c.end_ns <= window.proof.start_ns][-2:]
        assert window.first_submit_ns == first.start_ns
        # the scripted completion lies between these (each launch queued at a time inside
        # its call, after what the stream had queued):
        earliest = first.start_ns + 2 * device
        latest = max(second.end_ns, first.end_ns + device) + device
        low, high = window.outstanding_bounds()
        assert high >= earliest - first.start_ns, (high, earliest - first.start_ns)
        assert low <= latest - first.start_ns, (low, latest - first.start_ns)
    # after each sync the stream is idle until the next step's first launch: the gaps over
    # IDLE_GAP_MIN_NS are those
    from ebpf_cuda.analysis.thresholds import IDLE_GAP_MIN_NS

    calls = analyzer.context().calls
    expected = [nxt.start_ns - call.end_ns for call, nxt in zip(calls, calls[1:])
                if call.api == "cudaStreamSynchronize" and nxt.api == "cudaLaunchKernel"
                and nxt.start_ns - call.end_ns >= IDLE_GAP_MIN_NS]
    assert [gap.ns for gap in analyzer.context().waits.gaps] == expected


def test_pageable_copy_but_not_pinned_or_registered_ones(lib, tmp_path):
    records, exits = trace(tmp_path, lib, "pageable")
    finding, = findings(records)
    assert finding["rule"] == "pageable-copy" and finding["where"]["python"] == at("pageable")
    copies = at_line(exits, "cudaMemcpyAsync", LINES["pageable"])
    assert finding["evidence"] == {"calls": STEPS, "bytes": STEPS << 20, "asynchronous": True,
                                   "call_ns": sum(e["duration_ns"] for e in copies)}


def test_the_html_report_has_the_findings(lib, tmp_path):
    page = tmp_path / "report.html"
    records, _ = trace(tmp_path, lib, "pageable", 0, "--report", str(page))
    text = page.read_text()  # (written live, then again offline)
    assert "Findings (--analyze)" in text and "pageable-copy" in text
    assert "%s:%d" % (PROGRAM, LINES["pageable"]) in text
    assert "Steps of thread" in text


def test_allocator_churn(lib, tmp_path):
    records, exits = trace(tmp_path, lib, "churn")
    finding, = findings(records)
    assert finding["rule"] == "alloc-churn"
    evidence = finding["evidence"]
    assert (evidence["allocations"], evidence["frees"]) == (STEPS - 1, STEPS - 1)
    assert evidence["bytes_allocated"] == (STEPS - 1) * (4 << 20)
    assert str(LINES["churn"]) in finding["where"]["python"]


def test_launch_bound_says_what_graphs_would_save(lib, tmp_path):
    # each launch spins 30 us on the host and queues 1 us of device time: the GPU keeps up
    records, exits = trace(tmp_path, lib, "launch_bound", 30, device_us=1)
    assert steps(records)[0]["steps"] == STEPS
    finding, = findings(records)
    assert finding["rule"] == "launch-bound"
    evidence = finding["evidence"]
    assert evidence["launches_per_step"] == 30
    assert finding["where"]["python"] == "%s:%d in launch_bound" % (PROGRAM, LINES["launches"])
    launches = [e for e in exits if e["api"] == "cudaLaunchKernel"]
    per_step = sorted(sum(e["duration_ns"] for e in launches[i:i + 30])
                      for i in range(30, len(launches), 30))  # the steady steps'
    assert evidence["launch_ns_per_step"] == per_step[len(per_step) // 2]
    assert evidence["launch_ns_per_step"] >= 30 * 30_000
    assert 0 < evidence["graphs_would_save_ns_per_step"] < evidence["launch_ns_per_step"] \
        <= evidence["graphs_would_save_at_most_ns_per_step"] + evidence["graph_launch_ns"]
    # the same loop whose GPU is far behind (2 ms a launch): not launch-bound
    records, _ = trace(tmp_path, lib, "launch_bound", 30, device_us=2000)
    assert findings(records) == []


def test_graph_replays_their_capture_and_the_step_that_fell_back(lib, tmp_path):
    records, exits = trace(tmp_path, lib, "graphs")
    loop, = steps(records)
    assert loop["steps"] == STEPS
    assert loop["modes"] == ["graph"] * 3 + ["eager"] + ["graph"] * 2
    finding, = findings(records)
    assert finding["rule"] == "graph-fallback"
    assert finding["evidence"]["fallback_steps"] == [3]
    replays, = [r for r in records if r["type"] == "graph_replays"]
    assert replays == {"type": "graph_replays", "replays": STEPS - 1,
                       "captured_at": "%s:%d graphs" % (PROGRAM, LINES["capture"])}
    assert finding["where"]["captured_at"] == ["%s:%d graphs" % (PROGRAM, LINES["capture"])]


def test_default_stream_memsets(lib, tmp_path):
    records, _ = trace(tmp_path, lib, "default_stream")
    finding, = findings(records)
    assert finding["rule"] == "default-stream-work" and finding["where"]["python"] == \
        at("default")
    assert finding["evidence"] == {"calls": STEPS, "bytes": STEPS << 20}


def test_errors_returned_and_ignored(lib, tmp_path):
    records, _ = trace(tmp_path, lib, "error")
    finding, = findings(records)
    assert finding["rule"] == "ignored-error" and finding["where"]["python"] == at("error")
    assert finding["evidence"] == {"calls": STEPS, "error": "cudaErrorInvalidMemcpyDirection",
                                   "ret": 21}


def test_the_text_report_shows_elapsed_times_and_bounds(lib, tmp_path):
    need_root()
    saved = tmp_path / "run.ebpfcuda"
    env = cli_env(FAKECUDA_DEVICE_US=str(DEVICE_US))
    live = run_cli("--py-stacks", "--analyze", "--save", saved, "-p", lib, "--",
                   sys.executable, PROGRAM, "timed", lib, env=env, timeout=180)
    assert live.returncode == 0, live.stderr
    offline = run_cli("analyze", saved)
    assert offline.returncode == 0, offline.stderr
    printed = float(live.stdout.split("elapsed_ms=")[1].split()[0])
    assert printed >= 4 * DEVICE_US / 1000  # the simulated device's interval: 4 launches
    report = offline.stdout
    assert "GPU-measured intervals" in report and "%.3f" % printed in report
    assert "Findings: 0" in report
    assert report in live.stdout  # the same report, live


def test_step_at_names_the_step(lib, tmp_path):
    records, _ = trace(tmp_path, lib, "step_function", 0, "--step-at", "train_step")
    assert steps(records)[0]["steps"] == STEPS  # each invocation of the function
    records, _ = trace(tmp_path, lib, "healthy", 0, "--step-at", "cudaLaunchKernel")
    assert steps(records)[0]["steps"] == 3 * STEPS


def test_analyze_on_attach(lib, tmp_path):
    """-d PID: the tracer attached to a running Python program before its loop."""
    need_root()
    env = cli_env(FAKECUDA_DEVICE_US=str(DEVICE_US))
    program = subprocess.Popen([sys.executable, str(PROGRAM), "attach_sync", str(lib)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=env)
    tracer = None
    try:
        assert program.stdout.readline().strip() == "ready"
        tracer = subprocess.Popen(cli_argv("-d", program.pid, "-p", lib, "--py-stacks",
                                           "--analyze", "--json", "-o", os.devnull),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env, cwd=str(REPO))
        for line in tracer.stderr:
            if line.startswith("ebpf-cuda: probing"):
                break
        # (calls made before the tracer has read the attached interpreter have no Python
        # stack: docs/usage.md, Python stacks; give it that time)
        time.sleep(1.0 * slowdown())
        program.stdin.write("go\n")
        program.stdin.close()
        assert program.wait(timeout=120) == 0
        out, err = tracer.communicate(timeout=120)
        assert tracer.returncode == 0, err
    finally:
        for proc in (program, tracer):
            if proc is not None and proc.poll() is None:
                proc.kill()
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert steps(records)[0]["steps"] == STEPS
    finding, = findings(records)
    assert finding["rule"] == "sync-in-step" and finding["where"]["python"] == \
        "%s:%d sync" % (PROGRAM, LINES["sync"])
    assert finding["evidence"]["calls"] == STEPS - 1
