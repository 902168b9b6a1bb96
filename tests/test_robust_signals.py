"""Stopping the tracer: nothing produced before the stop is lost, and the target is unharmed.

- `-- COMMAND`: SIGINT/SIGTERM to the tracer go to the command; the tracer keeps reading until
  the command has ended, then drains the ring; the command's exit status becomes its own.
- `-d PID`: SIGINT/SIGTERM stop the tracer after it drained every record already written. The
  workload makes a burst of calls and says so; the signal is sent the moment it does, while the
  tracer is still far behind, so the drain is what delivers most of them.
- SIGKILL: the kernel drops the probes with the tracer's file descriptors; the target keeps
  running (even a call in flight through a return probe returns normally).
"""
import os
import signal
import time

import pytest

from test_robust_support import (Workload, exits, json_events, links_on, lost_from_stderr,
                                 read_line, start_cli, stop, wait_for)

pytestmark = pytest.mark.kernel


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_command_gets_the_signal_and_every_event_is_kept(root, robust, tmp_path, sig):
    lib, prog = robust
    out = tmp_path / "trace.jsonl"
    tracer = start_cli(["--json", "-o", out, "--ring-size", "32M", "--functions", "cudaMemcpy",
                        "--", prog, "signal", 20000, 5000, 42])
    line = read_line(tracer.stdout, 30)
    assert line.startswith("done 20000"), line
    status, stdout, stderr = stop(tracer, sig)  # the tracer is still reading the burst
    assert "after 5000 sig=%d" % sig in stdout, "the command did not get the signal"
    assert status == 42, stderr  # the command's exit status passes through
    assert lost_from_stderr(stderr) == 0
    assert "Traceback" not in stderr
    calls = exits(json_events(out))
    assert len(calls) == 25000  # the 5000 made after the signal too: read until the end
    assert links_on(lib) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_pid_trace_drains_everything_made_before_the_signal(root, robust, tmp_path, sig):
    lib, prog = robust
    out = tmp_path / "trace.jsonl"
    target = Workload([prog, "bursts"])
    try:
        tracer = start_cli(["-d", target.pid, "--json", "-o", out, "--ring-size", "32M",
                            "--functions", "cudaMemcpy"])
        target.calls(50000)
        status, _, stderr = stop(tracer, sig)
        assert status == 0, stderr
        assert lost_from_stderr(stderr) == 0 and "Traceback" not in stderr
        calls = exits(json_events(out))
        assert len(calls) == 50000
        assert {e["pid"] for e in calls} == {target.pid}
        assert sorted(e["args"]["size"] for e in calls) == list(range(50000))
        target.calls(1000)  # untraced now, and unharmed
        assert target.finish() == 0
    finally:
        target.kill()


def test_sigkill_leaves_no_probe_and_the_target_runs_on(root, robust, tmp_path):
    lib, prog = robust
    target = Workload([prog, "bursts"])
    try:
        tracer = start_cli(["-d", target.pid, "--json", "-o", tmp_path / "t.jsonl",
                            "--functions", "cudaMemcpy"])
        assert len(links_on(lib)) >= 2  # entry and return probes are in the kernel
        target.calls(1000)
        # Kill the tracer in the middle of a long burst: calls are in flight through the
        # return probe's trampoline when the probes go away.
        target.proc.stdin.write("3000000\n")
        target.proc.stdin.flush()
        time.sleep(0.3)
        tracer.kill()
        tracer.wait(10)
        answer = read_line(target.proc.stdout, 120).strip()
        assert answer == "done 3000000 total=3001000", answer
        wait_for(lambda: links_on(lib) == [], what="the probes to go away")
        target.calls(100000)
        assert target.finish() == 0  # every call returned cudaSuccess
    finally:
        target.kill()


def test_interrupt_while_spooled_lines_are_written_stops_and_counts(root, robust, tmp_path):
    """The command has ended and its lines are still being written (the output is a FIFO
    nobody reads yet, so they wait in the spool): an interrupt stops the writing, and the
    lines written plus the events counted lost are every call."""
    _, prog = robust
    calls = 300000
    fifo = tmp_path / "lines.jsonl"
    os.mkfifo(fifo)
    pipe = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the tracer open it; read later
    try:
        tracer = start_cli(["--json", "-o", fifo, "--ring-size", "32M", "--functions",
                            "cudaMemcpy", "--", prog, "threads", 1, calls])
        deadline = time.monotonic() + 60
        while "still spooled" not in read_line(tracer.stderr, 60):
            assert time.monotonic() < deadline, "no word of the spooled events"
        tracer.send_signal(signal.SIGINT)
        os.set_blocking(pipe, True)
        with os.fdopen(pipe, "rb", closefd=False) as lines:
            written = sum(1 for line in lines if b'"phase":"exit"' in line)
        _, stderr = tracer.communicate(timeout=60)
        status = tracer.returncode
    finally:
        os.close(pipe)
    assert status == 0, stderr
    assert "not written: interrupted" in stderr
    lost = lost_from_stderr(stderr)
    assert 0 < lost and written + lost == calls
