"""An exec renews what is known of a process: a launch is named from the program that made it.

Two stand-in CUDA programs (tests/native/exec_app.c built twice, non-PIE) have their kernel's
host stub at the same address under different names (`alpha_kernel`, `beta_kernel`) and
register it under different device names (`_Z12alpha_kernelPf`, `_Z11beta_kernelPf`). The
first launches, then execs the second in the same process, which launches: every launch is
named after its own program, however late the reader (or the lines thread behind a spool)
gets to it: the exec tracepoint's times (ebpf_cuda/execs.py) tell each record's program.
"""
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

from ebpf_cuda.probes.execs import ExecWatcher
from helpers import cli_env, run_cli, trace_command

pytestmark = pytest.mark.kernel

ALPHA, BETA = "alpha_kernel", "beta_kernel"
REGISTERED = {ALPHA: "alpha_kernel(float*)", BETA: "beta_kernel(float*)"}  # demangled
A_LAUNCHES, B_LAUNCHES = 2, 3


@pytest.fixture(scope="module")
def programs(fake, cc) -> Tuple[Path, Path, Path]:
    """(stand-in libcudart, alpha, beta): the two programs laid out the same way."""
    lib, _ = fake
    folder = str(Path(lib).parent)
    built = []
    for kernel in (ALPHA, BETA):
        mangled = "_Z%d%sPf" % (len(kernel), kernel)
        built.append(cc.executable("exec_app.c", "exec_" + kernel, extra=[
            "-no-pie", "-DKERNEL=" + kernel, "-DMANGLED=" + mangled, "-L", folder,
            "-l:" + Path(lib).name, "-Wl,-rpath," + folder]))
    alpha, beta = built
    stubs = {_stub(path, kernel) for path, kernel in ((alpha, ALPHA), (beta, BETA))}
    assert len(stubs) == 1  # the same address: only the exec tells them apart
    return Path(lib), alpha, beta


def _stub(path: Path, kernel: str) -> int:
    symbols = subprocess.run(["nm", str(path)], capture_output=True, text=True).stdout
    (address,) = [int(line.split()[0], 16) for line in symbols.splitlines()
                  if line.endswith(" " + kernel)]
    return address


def _argv(alpha: Path, beta: Path, register: bool, sleep_ms: int = 0) -> List[str]:
    flags = (["--register"] if register else []) + (["--sleep-ms", str(sleep_ms)]
                                                    if sleep_ms else [])
    return [str(alpha), *flags, str(A_LAUNCHES), str(beta), *flags, str(B_LAUNCHES)]


def _json_launches(path: Path) -> List[Tuple[int, int, Optional[str]]]:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [(e["pid"], e["args"]["func"], e.get("kernel")) for e in events
            if e["phase"] == "exit" and e["api"] == "cudaLaunchKernel"]


def test_the_exec_tracepoint_times_each_exec_of_a_process(root):
    watcher = ExecWatcher()
    try:
        # (flushed: exec drops what a pipe's buffer holds unless PYTHONUNBUFFERED is set)
        child = subprocess.run([sys.executable, "-c", "import os, time; print(os.getpid(), "
                                "time.monotonic_ns(), flush=True); os.execv('/bin/sh', "
                                "['sh', '-c', 'exec /bin/true'])"], capture_output=True,
                               text=True)
        pid, before = map(int, child.stdout.split())
        times = watcher.times(pid)
        # python itself (exec'd by the fork), then sh, then true: three, in order
        assert len(times) == 3 and times == sorted(times) and before < times[1]
        assert watcher.times(pid, known=2) == times[2:]
        watcher.forget(pid)
        assert watcher.times(pid) == []
    finally:
        watcher.close()


@pytest.mark.parametrize("output", ["json", "text"])
def test_each_launch_is_named_after_the_program_that_made_it(root, programs, tmp_path, output):
    """Registration names, through the CLI (the lines written behind a spool): exact, run
    after run, with two busy loops beside it."""
    lib, alpha, beta = programs
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for run in range(5):
            out = tmp_path / ("%d.%s" % (run, output))
            done = run_cli("-p", lib, "--json" if output == "json" else "-t", "-o", out,
                           "--", *_argv(alpha, beta, register=True))
            assert done.returncode == 0, done.stderr
            assert "not named" not in done.stderr
            if output == "json":
                names = [name for _, _, name in _json_launches(out)]
            else:
                names = [line.split("func=")[1].split(" grid=")[0]
                         for line in out.read_text().splitlines()
                         if "cudaLaunchKernel" in line and "[ENTER]" in line]
            assert names == [REGISTERED[ALPHA]] * A_LAUNCHES + [REGISTERED[BETA]] * B_LAUNCHES
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()


def test_decoded_events_and_the_names_store_agree(root, programs):
    """In process (events decoded for several outputs): the store answers by record time."""
    lib, alpha, beta = programs
    events, _, tracer = trace_command(_argv(alpha, beta, register=True), library=[str(lib)],
                                      functions=["__cudaRegisterFunction", "cudaLaunchKernel"])
    launches = [e for e in events if e.api == "cudaLaunchKernel" and e.phase == "exit"]
    assert len({(e.pid, e.args["func"]) for e in launches}) == 1  # one pid, one address
    names = [tracer.names(e, e.args["func"]) for e in launches]
    assert names == [REGISTERED[ALPHA]] * A_LAUNCHES + [REGISTERED[BETA]] * B_LAUNCHES
    registered = [e.outs["kernel_name"] for e in events
                  if e.api == "__cudaRegisterFunction" and e.phase == "exit"]
    assert registered == ["_Z12alpha_kernelPf", "_Z11beta_kernelPf"]
    # The process runs beta now: a name asked without a time is the current program's.
    assert tracer.names.name_for(launches[0].pid, "cudaLaunchKernel",
                                 launches[0].args["func"]) == REGISTERED[BETA]


def test_symbols_name_each_program_from_its_own_mappings(root, programs, tmp_path):
    """Without registration, names come from each program's symbols: the mappings of the
    first are kept as they were read, those of the second read after the exec."""
    lib, alpha, beta = programs
    out = tmp_path / "t.jsonl"
    done = run_cli("-p", lib, "--json", "-o", out, "--",
                   *_argv(alpha, beta, register=False, sleep_ms=300))
    assert done.returncode == 0, done.stderr
    assert [name for _, _, name in _json_launches(out)] == \
        [ALPHA] * A_LAUNCHES + [BETA] * B_LAUNCHES


def test_without_time_to_read_the_mappings_no_launch_is_misnamed(root, programs, tmp_path):
    """Programs that exec and exit at once, without registration: a launch whose program was
    gone before its mappings were read stays unnamed and is counted in the last line; none
    is ever named after the other program."""
    lib, alpha, beta = programs
    for run in range(5):
        out = tmp_path / ("%d.jsonl" % run)
        done = run_cli("-p", lib, "--json", "-o", out, "--",
                       *_argv(alpha, beta, register=False))
        assert done.returncode == 0, done.stderr
        names = [name for _, _, name in _json_launches(out)]
        assert len(names) == A_LAUNCHES + B_LAUNCHES
        assert set(names[:A_LAUNCHES]) <= {ALPHA, None}
        assert set(names[A_LAUNCHES:]) <= {BETA, None}
        counted = re.findall(r"(\d+) launches of \d+ kernels", done.stderr.split(
            "not named: ", 1)[-1]) if "not named: " in done.stderr else []
        # Each unnamed one is counted (a launch counted unnamed when read may be named by the
        # time the lines thread writes it: its program's mappings were read in between).
        assert sum(map(int, counted)) >= names.count(None)


def test_in_a_pid_namespace_the_execs_are_those_of_its_pids(programs, tmp_path):
    """The tracer in a PID namespace of its own: records carry the namespace's pids, and so
    do the exec times (execs.py reads them with bpf_get_ns_current_pid_tgid)."""
    import shutil

    from helpers import REPO, cli_argv

    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    lib, alpha, beta = programs
    out = tmp_path / "ns.jsonl"
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc"] + [
        str(a) for a in cli_argv("-p", lib, "--json", "-o", out, "--",
                                 *_argv(alpha, beta, register=True))],
        capture_output=True, text=True, timeout=120, env=cli_env(), cwd=str(REPO),
        stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    launches = _json_launches(out)
    assert launches[0][0] < 100  # a pid of the namespace (its first processes)
    assert [name for _, _, name in launches] == \
        [REGISTERED[ALPHA]] * A_LAUNCHES + [REGISTERED[BETA]] * B_LAUNCHES


def test_the_summary_counts_each_program_s_kernel_apart(root, programs):
    lib, alpha, beta = programs
    done = run_cli("-p", lib, "--json", "-o", "/dev/null", "--summary", "--",
                   *_argv(alpha, beta, register=True))
    assert done.returncode == 0, done.stderr
    table = done.stdout.split(" ** Kernel Launches:", 1)[1].split("\n\n")[1].splitlines()[2:]
    assert sorted((int(line.split()[0]), line.split()[-1]) for line in table) == [
        (A_LAUNCHES, REGISTERED[ALPHA]), (B_LAUNCHES, REGISTERED[BETA])]


def test_the_summary_alone_counts_by_process_and_address_as_the_readme_says(root, programs):
    """--summary alone (in-kernel counts by process and address, README "Limitations"): the
    two programs' launches are one row, named after the program the process ran last."""
    lib, alpha, beta = programs
    done = run_cli("-p", lib, "--summary", "--", *_argv(alpha, beta, register=True))
    assert done.returncode == 0, done.stderr
    table = done.stdout.split(" ** Kernel Launches:", 1)[1].split("\n\n")[1].splitlines()[2:]
    assert [(int(line.split()[0]), line.split()[-1]) for line in table] == [
        (A_LAUNCHES + B_LAUNCHES, REGISTERED[BETA])]


def test_an_exec_of_a_traced_thread_sends_a_hello_record(root, programs):
    """The exec tracepoint wakes the reader with a hello record (no event) of a thread that
    made traced calls, timed after the exec: the new program's mappings are read while it
    runs. The fork of the command, exec'd before any traced call, sends none."""
    from ebpf_cuda.spec import record
    from ebpf_cuda.probes.loader import LOADER_MARK
    from ebpf_cuda.tracer import Tracer

    lib, alpha, beta = programs
    hellos, launches = [], []
    with Tracer(functions=["cudaLaunchKernel"], library=[str(lib)],
                command=_argv(alpha, beta, register=False)) as tracer:
        for frames in tracer.frames():
            ids = record.frame_column(frames, record.FN_ID, "H")
            pids = record.frame_column(frames, record.PID_TGID + 4, "I")
            times = record.frame_column(frames, record.TS_ENTER, "Q")
            marks = record.frame_column(frames, record.ARGS, "Q")
            hellos += [(pid, ts) for fn, pid, ts, mark in zip(ids, pids, times, marks)
                       if fn == record.HELLO_FN and mark != LOADER_MARK]
            launches += [ts for fn, ts in zip(ids, times) if fn != record.HELLO_FN]
        pid = tracer.child_pid
        execs = tracer.session.exec_times(pid)
    assert len(execs) == 2  # the command's fork exec'd alpha, alpha exec'd beta
    assert [p for p, _ in hellos] == [pid, pid]  # alpha's first call, then beta's exec
    at_exec = hellos[1][1]
    assert launches[A_LAUNCHES - 1] < execs[1] < at_exec < launches[A_LAUNCHES]
