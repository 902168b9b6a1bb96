"""--py-stacks end to end: real interpreters calling the real libcudart.so.12 through
ctypes, traced through real probes; each call's `py_stack` equals the stack the interpreter
itself gave at that call (traceback.extract_stack, with qualified names on 3.11+), file,
line and function, innermost frame down to the script's outermost one.

The target (tests/pystacks/target.py) calls from a nested function, a method, a generator
(list() calls it from C: 3.12+'s shim frame mid-stack), a lambda, a line inside a
multi-line expression, a second thread, an asyncio task and a 21-deep recursion.
"""
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fakecuda import wheel_libcudart
from helpers import REPO, cli_argv, cli_env, need_root, run_cli, slowdown

pytestmark = pytest.mark.kernel  # (real probes: root, and every kernel of the matrix)
PYENV = Path.home() / ".pyenv" / "versions"
INTERPRETERS = {
    "3.8": PYENV / "3.8.18" / "bin" / "python3.8",
    "3.9": PYENV / "3.9.18" / "bin" / "python3.9",
    "3.10": PYENV / "3.10.13" / "bin" / "python3.10",
    "3.11": PYENV / "3.11.7" / "bin" / "python3.11",
    "3.12": PYENV / "3.12.1" / "bin" / "python3.12",
    "3.13": PYENV / "3.13.0" / "bin" / "python3.13",
    "debian-3.11-static": Path("/usr/bin/python3"),
}
TARGET = REPO / "tests" / "pystacks" / "target.py"
CALLS = 10  # cudaGetDeviceCount calls the target makes


def _cudart() -> Path:
    lib = wheel_libcudart()
    if lib is None:
        pytest.skip("nvidia-cuda-runtime-cu12 is not installed")
    return Path(lib)


def _trace(python: Path, tmp_path: Path, *options: str):
    """(events of cudaGetDeviceCount's exits, the target's own record, the CLI's result)."""
    need_root()
    if not python.exists():
        pytest.skip("%s is not installed" % python)
    lib, truth, events = _cudart(), tmp_path / "truth.json", tmp_path / "events.json"
    result = run_cli("--json", "-o", events, "--py-stacks", "--functions", "cudaGetDeviceCount",
                     *options, "--", python, TARGET, lib, truth, timeout=120)
    assert result.returncode == 0, result.stderr
    exits = [e for e in map(json.loads, events.read_text().splitlines())
             if e["phase"] == "exit"]
    return exits, json.loads(truth.read_text()), result


@pytest.mark.parametrize("name", sorted(INTERPRETERS))
def test_every_call_carries_the_interpreters_own_stack(name, tmp_path):
    exits, truth, result = _trace(INTERPRETERS[name], tmp_path)
    assert len(truth) == CALLS and len(exits) == CALLS, (len(truth), len(exits))
    assert "without their Python stack" not in result.stderr, result.stderr
    for tid in {call["tid"] for call in truth}:
        seen = [e for e in exits if e["tid"] == tid]
        expected = [c["stack"] for c in truth if c["tid"] == tid]
        assert len(seen) == len(expected)
        for event, stack in zip(seen, expected):
            got = [[f["file"], f["line"], f["function"]] for f in event["py_stack"]]
            assert got == stack, (name, event["ts"])
    # what the constructs look like, so that a walk stopping early cannot pass
    innermost = [e["py_stack"][0]["function"] for e in exits]
    qualified = name not in ("3.8", "3.9", "3.10")
    assert innermost.count("nested.<locals>.inner" if qualified else "inner") == 2
    assert ("Model.forward" if qualified else "forward") in innermost
    assert innermost.count("generator") == 2 and innermost.count("task_body") == 2
    assert any(f.endswith("<lambda>") for f in innermost)
    deepest = max(exits, key=lambda e: len(e["py_stack"]))
    assert [f["function"] for f in deepest["py_stack"]].count("deep") == 21


def test_text_lines_end_with_the_innermost_frame(tmp_path):
    python = INTERPRETERS["3.12"]
    need_root()
    if not python.exists():
        pytest.skip("no Python 3.12")
    lib, truth, out = _cudart(), tmp_path / "truth.json", tmp_path / "trace.txt"
    result = run_cli("-o", out, "--py-stacks", "--functions", "cudaGetDeviceCount", "--",
                     python, TARGET, lib, truth, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [ln for ln in out.read_text().splitlines() if "cudaGetDeviceCount" in ln]
    assert len(lines) == 2 * CALLS
    model = [ln for ln in lines if ln.endswith("(Model.forward)")]
    assert len(model) == 2  # its enter and exit lines
    assert model[0].endswith(" at %s:%d (Model.forward)" % (TARGET, _line_of("def forward") + 1))


def _line_of(text: str) -> int:
    for number, line in enumerate(TARGET.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(text)


def test_summary_counts_calls_by_python_line(tmp_path):
    python = INTERPRETERS["debian-3.11-static"]
    need_root()
    lib, truth = _cudart(), tmp_path / "truth.json"
    result = run_cli("--summary", "--py-stacks", "--functions", "cudaGetDeviceCount", "--",
                     python, TARGET, lib, truth, timeout=120)
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("by Python Line", 1)[1]
    rows = {}
    for line in table.splitlines()[3:]:
        if "target.py:" in line:
            where = line.split()[-2]  # "file:line function"
            rows[int(where.rsplit(":", 1)[1])] = int(line.split()[2])
    assert rows[_line_of("def inner") + 1] == 2  # nested() runs in two threads
    assert rows[_line_of("def forward") + 1] == 1
    assert sum(rows.values()) == CALLS


def test_a_saved_trace_keeps_the_stacks(tmp_path):
    python = INTERPRETERS["3.13"]
    need_root()
    if not python.exists():
        pytest.skip("no Python 3.13")
    lib, truth, saved = _cudart(), tmp_path / "truth.json", tmp_path / "run.ebpfcuda"
    result = run_cli("--save", saved, "--py-stacks", "--functions", "cudaGetDeviceCount", "--",
                     python, TARGET, lib, truth, timeout=120)
    assert result.returncode == 0, result.stderr
    replay = run_cli("report", "--json", saved)
    assert replay.returncode == 0, replay.stderr
    exits = [e for e in map(json.loads, replay.stdout.splitlines()) if e["phase"] == "exit"]
    expected = json.loads(truth.read_text())
    assert len(exits) == CALLS
    main_tid = expected[0]["tid"]
    got = [[[f["file"], f["line"], f["function"]] for f in e["py_stack"]]
           for e in exits if e["tid"] == main_tid]
    assert got == [c["stack"] for c in expected if c["tid"] == main_tid]


def test_an_interpreter_it_does_not_know_gets_no_stack_and_one_warning(tmp_path):
    python = PYENV / "3.7.16" / "bin" / "python3.7"
    need_root()
    if not python.exists():
        pytest.skip("no Python 3.7")
    lib, events = _cudart(), tmp_path / "events.json"
    script = tmp_path / "old.py"
    script.write_text("import ctypes, sys\nlib = ctypes.CDLL(sys.argv[1])\n"
                      "for i in range(3):\n    lib.cudaGetDeviceCount(ctypes.byref(ctypes.c_int()))\n")
    result = run_cli("--json", "-o", events, "--py-stacks", "--functions", "cudaGetDeviceCount",
                     "--", python, script, lib, timeout=120)
    assert result.returncode == 0, result.stderr
    exits = [e for e in map(json.loads, events.read_text().splitlines()) if e["phase"] == "exit"]
    assert len(exits) == 3 and not any("py_stack" in e for e in exits)
    warnings = [ln for ln in result.stderr.splitlines() if "no Python stacks" in ln]
    assert len(warnings) == 1 and "3.7" in warnings[0], result.stderr


def test_attached_to_a_running_process(tmp_path):
    """-d: the interpreter is read at the start; the calls after carry their stacks. The
    target runs until the tracer has traced 2 s after its probes went on (its first line,
    however slowly it starts: emulated machines), then ends."""
    python = INTERPRETERS["3.10"]
    need_root()
    if not python.exists():
        pytest.skip("no Python 3.10")
    lib, events, ready = _cudart(), tmp_path / "events.json", tmp_path / "ready"
    script = tmp_path / "loop.py"
    script.write_text(
        "import ctypes, sys, time, os\nlib = ctypes.CDLL(sys.argv[1])\n"
        "def step():\n    lib.cudaGetDeviceCount(ctypes.byref(ctypes.c_int()))\n"
        "open(sys.argv[2], 'w').close()\n"
        "end = time.time() + 600\n"
        "while time.time() < end:\n    step()\n    time.sleep(0.01)\n")
    target = subprocess.Popen([str(python), str(script), str(lib), str(ready)])
    tracer = None
    try:
        while not ready.exists():
            assert target.poll() is None
            time.sleep(0.01)
        tracer = subprocess.Popen(cli_argv("--json", "-o", events, "--py-stacks", "--functions",
                                           "cudaGetDeviceCount", "-d", target.pid),
                                  stderr=subprocess.PIPE, text=True, env=cli_env())
        first = tracer.stderr.readline()  # "probing ...": the probes are on
        time.sleep(2.0 * slowdown())
    finally:
        target.kill()
        target.wait()
    stderr = first + (tracer.communicate(timeout=120)[1] if tracer is not None else "")
    exits = [e for e in map(json.loads, events.read_text().splitlines()) if e["phase"] == "exit"]
    # (calls in the moment between the probes going on and the interpreter being read have
    # none, and are counted: every call after the first with a stack has one)
    first_with = next((i for i, e in enumerate(exits) if "py_stack" in e), None)
    assert first_with is not None and len(exits) - first_with > 20, stderr
    for event in exits[first_with:]:
        assert [(f["line"], f["function"]) for f in event["py_stack"]] == [(4, "step"),
                                                                         (8, "<module>")]


def test_leaks_show_where_python_allocated(lib, tmp_path):
    """--leaks --py-stacks: each allocation never freed is listed with its Python stack
    (the stand-in runtime hands out real-looking pointers; 2 of 3 are never freed)."""
    python = INTERPRETERS["debian-3.11-static"]
    need_root()
    script = tmp_path / "leaky.py"
    script.write_text(
        "import ctypes, sys\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "def alloc(size):\n"
        "    p = ctypes.c_void_p()\n"
        "    lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size))\n"
        "    return p\n"
        "def keep():\n"
        "    return [alloc(4096), alloc(8192)]\n"
        "kept = keep()\n"
        "lib.cudaFree(alloc(100))\n")
    result = run_cli("--leaks", "--py-stacks", "--functions", "cudaMalloc,cudaFree", "-p", lib, "--",
                     python, script, lib, timeout=120)
    assert result.returncode == 0, result.stderr
    report = result.stdout
    assert report.count("py#0 %s:5 alloc" % script) == 2, report
    assert report.count("py#1 %s:8 keep" % script) == 2, report
    assert report.count("py#2 %s:9 <module>" % script) == 2, report
    assert ":10 <module>" not in report  # (the freed one)


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not installed (apt-get install "
                    "-y golang-go; .ci/run installs it): nothing reads the profile")
def test_the_pprof_profile_is_keyed_by_python_lines(tmp_path):
    """--pprof-out --py-stacks: each sample's stack continues below the CUDA function with
    the Python frames, function, file and line (read back by `go tool pprof -raw`)."""
    python = INTERPRETERS["debian-3.11-static"]
    need_root()
    lib, truth, profile = _cudart(), tmp_path / "truth.json", tmp_path / "cuda.pb.gz"
    result = run_cli("--pprof-out", profile, "--py-stacks", "--functions", "cudaGetDeviceCount",
                     "--", python, TARGET, lib, truth, timeout=120)
    assert result.returncode == 0, result.stderr
    raw = subprocess.run(["go", "tool", "pprof", "-raw", str(profile)], capture_output=True,
                         text=True, timeout=120)
    assert raw.returncode == 0, raw.stderr
    forward = "Model.forward %s:%d" % (TARGET, _line_of("def forward") + 1)
    inner = "nested.<locals>.inner %s:%d" % (TARGET, _line_of("def inner") + 1)
    assert forward in raw.stdout and inner in raw.stdout, raw.stdout
    # 10 calls, each counted once: the calls sample type sums to 10 over the samples
    samples = raw.stdout.split("Samples:", 1)[1].split("Locations", 1)[0]
    counts = [int(line.split()[0]) for line in samples.splitlines()[2:] if line.strip()
              and line.split()[0].isdigit()]
    assert sum(counts) == CALLS, samples


def test_the_timeline_and_the_html_report_show_the_stacks(tmp_path):
    python = INTERPRETERS["debian-3.11-static"]
    need_root()
    lib, truth = _cudart(), tmp_path / "truth.json"
    timeline, page = tmp_path / "t.json", tmp_path / "r.html"
    result = run_cli("--trace-out", timeline, "--report", page, "--py-stacks", "--functions",
                     "cudaGetDeviceCount", "--", python, TARGET, lib, truth, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(timeline.read_text())
    slices = [e for e in (data["traceEvents"] if isinstance(data, dict) else data)
              if e.get("ph") == "X" and e.get("name") == "cudaGetDeviceCount"]
    assert len(slices) == CALLS
    forward = "%s:%d Model.forward" % (TARGET, _line_of("def forward") + 1)
    assert [s["args"]["py_stack"][0] for s in slices].count(forward) == 1
    # (the second thread's one call starts at threading's bootstrap, the others at the script)
    assert [s["args"]["py_stack"][-1].endswith(" <module>") for s in slices].count(True) == 9
    html = page.read_text()
    assert "by Python line" in html and forward.split(" ")[0] in html


def test_in_a_pid_namespace_of_its_own(tmp_path):
    """The tracer in a PID namespace (a container's): the probes' pids, the interpreter's
    registration and /proc agree on the namespace's numbers; every call has its stack."""
    python = INTERPRETERS["debian-3.11-static"]
    need_root()
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    lib, truth, events = _cudart(), tmp_path / "truth.json", tmp_path / "events.json"
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc"] + [
        str(a) for a in cli_argv("--json", "-o", events, "--py-stacks", "--functions",
                                 "cudaGetDeviceCount", "--", python, TARGET, lib, truth)],
        capture_output=True, text=True, timeout=120, env=cli_env(), cwd=str(REPO),
        stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    exits = [e for e in map(json.loads, events.read_text().splitlines()) if e["phase"] == "exit"]
    assert len(exits) == CALLS and exits[0]["pid"] < 100  # (a pid of the namespace)
    expected = json.loads(truth.read_text())
    main_tid = exits[0]["tid"]
    got = [[[f["file"], f["line"], f["function"]] for f in e["py_stack"]]
           for e in exits if e["tid"] == main_tid]
    assert got == [c["stack"] for c in expected if c["stack"][-1][2] == "<module>"]
