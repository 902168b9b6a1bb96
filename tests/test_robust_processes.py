"""Processes come and go while tracing.

What is traced, precisely (docs/robustness.md says the same):
- `-d PID`: the probes carry the kernel's pid filter; the tracer ends by itself soon after the
  process is gone (zombie or reaped), after draining.
- `-- COMMAND` (default, following children): probes are attached for every process and events
  are kept when they come from the command's process tree (learned from /proc). Children made
  by fork are traced; the command's own exec of another image is traced (same process).
- `-- COMMAND` with `--no-follow`: the kernel filters on the command's PID: its threads and the
  images it execs are traced, its children are not.
- `-p LIB` alone: system-wide; a probe on a file fires in every process that maps that file,
  including processes that load it with dlopen after tracing began.
- A library replaced on disk (a new file renamed over the old name, i.e. a new inode): the
  probes stay on the old inode, so processes that still map the old file keep being traced and
  processes that load the new file are not; the tracer goes on undisturbed.
"""
import os
import shutil

import pytest

from test_robust_support import (Workload, exits, json_events, links_on, run_cli, start_cli,
                                 stop, wait_for)

pytestmark = pytest.mark.kernel


def test_pid_target_exits_while_traced(root, robust, tmp_path):
    lib, prog = robust
    out = tmp_path / "trace.jsonl"
    target = Workload([prog, "bursts"])
    try:
        tracer = start_cli(["-d", target.pid, "--json", "-o", out, "--functions", "cudaMemcpy"])
        target.calls(500)
        assert target.finish() == 0
        _, stderr = tracer.communicate(timeout=15)  # ends on its own
        assert tracer.returncode == 0, stderr
        assert "Traceback" not in stderr
        assert len(exits(json_events(out))) == 500
        wait_for(lambda: links_on(lib) == [], what="the probes to go away")
    finally:
        target.kill()


def test_pid_that_never_existed(root):
    with open("/proc/sys/kernel/pid_max") as f:
        never = int(f.read()) + 1  # above the kernel's limit: no process can have it
    done = run_cli(["-d", never])
    assert done.returncode == 11, done.stderr
    assert len(done.stderr.splitlines()) == 1 and str(never) in done.stderr


def test_short_lived_command(root, robust, tmp_path):
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_cli(["--json", "-o", out, "--functions", "cudaMemcpy", "--", prog, "threads", 1, 1])
    assert done.returncode == 0, done.stderr
    assert len(exits(json_events(out))) == 1


def test_command_that_fails_passes_its_status(root, robust, tmp_path):
    _, prog = robust
    done = run_cli(["-o", tmp_path / "t", "--", prog, "no-such-mode"])
    assert done.returncode == 2  # robust_load's usage error status
    assert "Traceback" not in done.stderr


def _fork_counts(events):
    counts = {}
    for e in exits(events):
        counts[e["pid"]] = counts.get(e["pid"], 0) + 1
    return counts


def _pid_of(stdout: str, who: str) -> int:
    line = next(line for line in stdout.splitlines() if line.startswith(who + " pid="))
    return int(line.split("=", 1)[1])


def test_children_are_followed_by_default(root, robust, tmp_path):
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_cli(["--json", "-o", out, "--functions", "cudaMemcpy", "--", prog, "fork", 300,
                    200])
    assert done.returncode == 0, done.stderr
    counts = _fork_counts(json_events(out))
    assert counts == {_pid_of(done.stdout, "child"): 300, _pid_of(done.stdout, "parent"): 200}


def test_no_follow_traces_only_the_command_process(root, robust, tmp_path):
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_cli(["--no-follow", "--json", "-o", out, "--functions", "cudaMemcpy", "--", prog,
                    "fork", 300, 200])
    assert done.returncode == 0, done.stderr
    assert _fork_counts(json_events(out)) == {_pid_of(done.stdout, "parent"): 200}


@pytest.mark.parametrize("follow", [[], ["--no-follow"]], ids=["follow", "no-follow"])
def test_exec_by_the_command_is_traced(root, robust, tmp_path, follow):
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_cli([*follow, "--json", "-o", out, "--functions", "cudaMemcpy", "--", prog,
                    "exec", 400])
    assert done.returncode == 0, done.stderr
    assert _fork_counts(json_events(out)) == {_pid_of(done.stdout, "exec"): 400}


def test_library_loaded_with_dlopen_after_tracing_began(root, robust, dlopener, tmp_path):
    lib, _ = robust
    out = tmp_path / "trace.jsonl"
    loader = Workload([dlopener, lib])  # running, but the library is not loaded yet
    try:
        tracer = start_cli(["-p", lib, "--json", "-o", out, "--functions", "cudaMemcpy"])
        assert loader.ask("open") == "opened"
        loader.calls(250)
        status, _, stderr = stop(tracer)
        assert status == 0, stderr
        assert _fork_counts(json_events(out)) == {loader.pid: 250}
        assert loader.finish() == 0
    finally:
        loader.kill()


def test_library_replaced_on_disk_while_tracing(root, robust, dlopener, tmp_path):
    lib, _ = robust
    copy = tmp_path / "lib" / "libcudart.so.12"
    copy.parent.mkdir()
    shutil.copy(lib, copy)
    out = tmp_path / "trace.jsonl"
    old_user = Workload([dlopener, copy])
    new_user = None
    try:
        assert old_user.ask("open") == "opened"
        tracer = start_cli(["-p", copy, "--json", "-o", out, "--functions", "cudaMemcpy"])
        old_inode = os.stat(copy).st_ino
        old_user.calls(100)
        staged = tmp_path / "lib" / "staged.so"
        shutil.copy(lib, staged)
        os.replace(staged, copy)  # what package managers do: a new inode under the old name
        assert os.stat(copy).st_ino != old_inode
        old_user.calls(100)
        new_user = Workload([dlopener, copy])
        assert new_user.ask("open") == "opened"
        new_user.calls(50)
        status, _, stderr = stop(tracer)
        assert status == 0 and "Traceback" not in stderr, stderr
        assert _fork_counts(json_events(out)) == {old_user.pid: 200}
        assert old_user.finish() == 0 and new_user.finish() == 0
    finally:
        old_user.kill()
        if new_user is not None:
            new_user.kill()


def test_unrelated_process_using_the_library_is_not_in_a_command_trace(root, robust, dlopener,
                                                                       tmp_path):
    """Following children attaches the probes for every process; events of processes outside
    the command's tree must still be left out."""
    lib, prog = robust
    out = tmp_path / "trace.jsonl"
    stranger = Workload([dlopener, lib])
    try:
        assert stranger.ask("open") == "opened"
        tracer = start_cli(["--json", "-o", out, "--functions", "cudaMemcpy", "--", prog,
                            "signal", 100, 0, 0])
        assert tracer.stdout.readline().startswith("done 100")
        stranger.calls(300)
        status, _, stderr = stop(tracer)
        assert status == 0, stderr
        counts = _fork_counts(json_events(out))
        assert stranger.pid not in counts
        assert sum(counts.values()) == 100
        assert stranger.finish() == 0
    finally:
        stranger.kill()


def test_short_lived_children_reaped_before_their_events_are_read(root, robust, tmp_path):
    lib, prog = robust
    out = tmp_path / "trace.jsonl"
    script = "%s threads 1 60000 & sleep 0.05; %s threads 1 10; %s threads 1 10; wait" % (
        prog, prog, prog)
    done = run_cli(["-p", lib, "--ring-size", "64M", "--json", "-o", out, "--functions",
                    "cudaMemcpy", "--", "sh", "-c", script])
    assert done.returncode == 0, done.stderr
    assert sum(_fork_counts(json_events(out)).values()) == 60020
