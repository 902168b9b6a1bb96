"""A trace's start imports no pyelftools (`elftools`): its import was 26-28 ms of every start
(docs/performance.md, issue 36's start-up row); the files are read with struct (elf_raw.py).
A text trace imports no `json` either (the kernel BTF's cache file is marshal's), no
`dataclasses` (~7 ms, and ~0.6 ms a class: value_class.py) and, at its exit, no analysis;
and no trace start imports click (~20 ms: its usual command lines are read by
cli/options.py).

Each case runs the real command with `PYTHONPROFILEIMPORTTIME=1` (python -X importtime: one
stderr line per module imported, whenever it is imported), traces the stand-in's driver
program through real probes and checks its calls were traced; then that the reader's own
modules show in the list (the check sees the start's imports) and no `elftools` module does.
"""
import re
import subprocess
from pathlib import Path
from typing import List

import pytest

from helpers import cli_argv, cli_env, run_cli
from monitor_support import MonitorCli

pytestmark = pytest.mark.kernel

IMPORTTIME = cli_env(PYTHONPROFILEIMPORTTIME="1")
_EVENT = re.compile(r"\b(cudaMalloc|cudaFree)\b.*\b(ENTER|EXIT)\b")


def imported(stderr_lines: List[str]) -> List[str]:
    """The modules `-X importtime` listed, in import order."""
    return [line.rsplit("|", 1)[1].strip() for line in stderr_lines
            if line.startswith("import time:") and line.count("|") == 2]


def assert_no_pyelftools(stderr_lines: List[str]) -> None:
    modules = imported(stderr_lines)
    assert "ebpf_cuda.targets.elf_raw" in modules, stderr_lines[-20:]
    assert [m for m in modules if m.split(".")[0] == "elftools"] == []


def events(path: Path) -> List[tuple]:
    return [m.groups() for m in map(_EVENT.search, path.read_text().splitlines()) if m]


TRACED = [("cudaMalloc", "ENTER"), ("cudaMalloc", "EXIT"), ("cudaFree", "ENTER"),
          ("cudaFree", "EXIT")]


@pytest.mark.parametrize("options", [
    [],  # the files found from the command (its DT_NEEDED, rpath, the loader's search)
    ["-p", "{lib}"],
    ["-p", "{lib}", "--summary"],
], ids=["found", "path", "summary"])
def test_a_trace_start_imports_no_pyelftools(root, lib, prog, tmp_path, options):
    out = tmp_path / "trace.txt"
    options = [o.format(lib=lib) for o in options]
    done = run_cli(*options, "-t", "-o", out, "--functions", "cudaMalloc,cudaFree", "--",
                   prog, "malloc:4000", "free", env=IMPORTTIME)
    assert done.returncode == 0, done.stderr[-2000:]
    assert events(out) == TRACED
    if "--summary" in options:
        assert re.search(r"cudaMalloc\s.*\b1\b", done.stdout), done.stdout
    assert_no_pyelftools(done.stderr.splitlines())
    assert [m for m in imported(done.stderr.splitlines()) if m.split(".")[0] == "click"] == []
    if "--summary" not in options:  # (nor what the text trace does not use: json's import
        # was the kernel BTF cache's; the GPU feed is for GPU samples, none here)
        modules = imported(done.stderr.splitlines())
        assert [m for m in modules if m.split(".")[0] in ("json", "dataclasses")
                or m.startswith(("ebpf_cuda.gpu.feed", "ebpf_cuda.analysis."))] == []


def test_a_pid_trace_imports_no_pyelftools(root, lib, prog, tmp_path):
    """`-d PID`: the process's mapped files (/proc/PID/maps) read while it waits."""
    driver = subprocess.Popen([str(prog), "--wait-stdin", "malloc:4000", "free"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(re.match(r"ready pid=(\d+)", driver.stdout.readline()).group(1))
        out = tmp_path / "trace.txt"
        tracer = subprocess.Popen(cli_argv("-t", "-o", out, "--functions",
                                           "cudaMalloc,cudaFree", "-d", pid),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, env=IMPORTTIME)
        lines = []
        for line in tracer.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith("ebpf-cuda: probing"):
                break
        driver.communicate("go\n", timeout=30)
        _, rest = tracer.communicate(timeout=30)
        lines += rest.splitlines()
        assert tracer.returncode == 0, lines[-20:]
    finally:
        for proc in (driver, locals().get("tracer")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert events(out) == TRACED
    assert_no_pyelftools(lines)


def test_the_monitors_start_imports_no_pyelftools(root, lib, prog):
    monitor = MonitorCli("-p", lib, env=IMPORTTIME)
    try:
        subprocess.run([str(prog), "malloc:4000", "free"], check=True, capture_output=True,
                       timeout=30)
    finally:
        status = monitor.stop()
    assert status == 0, monitor.lines[-20:]
    assert any(line.startswith("ebpf-cuda: stopped: 1 process") for line in monitor.lines), \
        monitor.lines[-5:]
    assert_no_pyelftools(monitor.lines)
