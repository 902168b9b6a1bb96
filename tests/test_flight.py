"""The flight recorder: a stand-in that runs out of memory leaves a dump holding the calls
of the last SECONDS (not those before) that `ebpf-cuda report` reads and that names its
trigger; SIGUSR1 asks for one; the on-disk ring's bookkeeping (pure logic)."""
import contextlib
import errno
import json
import os
import re
import resource
import signal
import time

import pytest

from ebpf_cuda.spec import record
from ebpf_cuda.spec.apis import FN_ID
from ebpf_cuda.monitor.flight import (FlightOptions, FlightRecorder, FrameRing, TRIGGER_FAMILIES,
                                      parse_trigger_errors, read_trigger)
from ebpf_cuda.errors import UsageError
from ebpf_cuda.decode.events import EXIT
from ebpf_cuda.output.savefile import load
from helpers import run_cli
from records import pack_frame
from monitor_support import Held, MonitorCli, parse_metrics, scrape, value

WINDOW_S = 1.5
# Old calls, a pause longer than the window, then the recent ones and two out-of-memory
# returns in a row (the second is within SECONDS of the first dump: no second dump).
OPS = ["setdevice:0", "sleep:200", "loop:30:malloc:64", "sleep:2500", "loop:7:memcpy:100:1",
       "launch:4,1,1:256,1,1", "malloc:0x20000000000", "malloc:0x20000000000", "sleep:300"]


@pytest.mark.kernel
def test_an_out_of_memory_return_dumps_the_last_seconds(tmp_path, prog, lib):
    cli = MonitorCli("-p", lib, "--flight-recorder", WINDOW_S, "--flight-dir", tmp_path,
                     "--prometheus", "127.0.0.1:0")
    try:
        held = Held(prog, OPS).go()
        held.wait()
        line = cli.wait_for("flight recorder: ")
        dump = re.search(r"written to (\S+) \(", line).group(1)
        assert "-cudaErrorMemoryAllocation-" in dump
        assert "cudaMalloc returned cudaErrorMemoryAllocation in cuda_driver_pro (pid %d)" \
            % held.pid in line
        time.sleep(1)
        samples = parse_metrics(scrape(cli.metrics_port)[1])
        assert value(samples, "ebpf_cuda_flight_dumps_total", trigger="error") == 1
        assert value(samples, "ebpf_cuda_flight_triggers_skipped_total", reason="recent") == 1
        assert value(samples, "ebpf_cuda_events_lost_total") == 0
        cli.proc.send_signal(signal.SIGUSR1)
        asked = re.search(r"written to (\S+) \(asked for by SIGUSR1\)",
                          cli.wait_for("(asked for by SIGUSR1)")).group(1)
    finally:
        assert cli.stop() == 0, cli.lines

    trigger = read_trigger(dump)
    assert (trigger["kind"], trigger["api"], trigger["ret"], trigger["pid"]) == (
        "error", "cudaMalloc", 2, held.pid)
    assert trigger["window_s"] == WINDOW_S and trigger["calls"] == 10
    shown = run_cli("report", "--json", dump)
    assert shown.returncode == 0, shown.stderr
    assert ("ebpf-cuda: flight-recorder dump: cudaMalloc returned cudaErrorMemoryAllocation "
            "in cuda_driver_pro (pid %d); the 1.5s before it" % held.pid) in shown.stderr
    exits = [e for e in map(json.loads, shown.stdout.splitlines()) if e["phase"] == "exit"]
    # the recent calls only (the 30 small mallocs are older than the window), through the
    # second out-of-memory return, read in the same batch
    assert [e["api"] for e in exits] == ["cudaMemcpy"] * 7 + ["cudaLaunchKernel"] + \
        ["cudaMalloc"] * 2
    assert exits[7]["kernel"] == "vec_add_kernel"
    assert [e["ret_name"] for e in exits[-2:]] == ["cudaErrorMemoryAllocation"] * 2
    assert read_trigger(asked)["kind"] == "signal"


@pytest.mark.kernel
def test_a_full_flight_dir_costs_the_calls_it_refuses_counted_not_the_monitor(
        tmp_path, prog, lib):
    """The flight folder is a 128 KiB tmpfs (of the monitor's own mount namespace): 3,000
    calls do not fit. The monitor says so once, counts what was refused, goes on counting
    every call, and a dump it cannot write is counted as failed."""
    small = tmp_path / "small"
    small.mkdir()
    mount = ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs -o size=128k none "%s" && exec "$@"' % small, "sh"]
    cli = MonitorCli("-p", lib, "--flight-recorder", 30, "--flight-dir", small,
                     "--prometheus", "127.0.0.1:0", prefix=mount)
    try:
        Held(prog, ["setdevice:0", "loop:3000:malloc:16"]).go().wait()
        assert "No space left on device" in cli.wait_for("cannot keep calls in %s" % small)
        cli.proc.send_signal(signal.SIGUSR1)
        assert "No space left on device" in cli.wait_for("flight recorder: cannot write")
        deadline = time.monotonic() + 30
        while True:
            samples = parse_metrics(scrape(cli.metrics_port)[1])
            calls = value(samples, "ebpf_cuda_api_calls_total", api="cudaMalloc")
            if calls == 3000 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        assert cli.stop() == 0, cli.lines
    assert calls == 3000
    refused = value(samples, "ebpf_cuda_events_lost_total", cause="flight_recorder_unwritten")
    # (its 3,001 calls, less what fitted: a batch is kept or refused whole)
    assert 3001 - 128 * 1024 // record.FRAME_SIZE <= refused <= 3001
    assert value(samples, "ebpf_cuda_flight_triggers_skipped_total", reason="failed") == 1
    assert value(samples, "ebpf_cuda_flight_dumps_total") == 0
    assert len([line for line in cli.lines if "cannot keep calls" in line]) == 1


# -- pure logic -----------------------------------------------------------------------------

def frame(fn_id: int, enter_ns: int, exit_ns: int, ret: int = 0) -> bytes:
    """A complete call of process 7."""
    return pack_frame(fn_id, enter_ns, ret=ret, exit_ts=exit_ns, pid=7)


def test_the_ring_lets_old_batches_go_and_counts_young_ones_overwritten(tmp_path):
    ring = FrameRing(str(tmp_path), record.FRAME_SIZE * 4, seconds=10.0)
    s = 10 ** 9

    def put(count: int, at: int) -> None:
        ring.put(frame(0, at * s, at * s) * count, at * s, at * s)

    put(2, 1)  # [0, 2)
    put(1, 2)  # [2, 3)
    assert ring.overwritten == 0
    put(2, 3)  # does not fit at 3: wraps to 0, over the first batch, still young
    assert ring.overwritten == 2
    put(2, 4)  # [2, 4), over the second
    assert ring.overwritten == 3
    assert len(b"".join(ring.since(0))) == 4 * record.FRAME_SIZE
    put(5, 5)  # bigger than the whole ring
    assert ring.overwritten == 8
    put(1, 20)  # the others are older than the window: let go, not counted
    assert ring.overwritten == 8
    assert record.frame_column(b"".join(ring.since(0)), record.TS_EXIT, "Q") == [20 * s]
    ring.close()


def test_since_keeps_only_the_frames_of_the_window(tmp_path):
    ring = FrameRing(str(tmp_path), 1 << 20, seconds=10.0)
    frames = b"".join(frame(0, t, t + 5) for t in (100, 200, 300, 400))
    ring.put(frames, 105, 405)
    kept = b"".join(ring.since(250))
    assert record.frame_column(kept, record.TS_EXIT, "Q") == [305, 405]
    ring.close()


class _Tracer:
    """What the recorder needs of a tracer, for triggers without a trace."""

    def __init__(self) -> None:
        from ebpf_cuda.spec.apis import TABLE
        from ebpf_cuda.decode.events import Decoder
        from ebpf_cuda.decode.names import KernelNamer

        self.apis_table = TABLE
        self.decoder = Decoder(TABLE)
        self.names = KernelNamer()
        self.lost = 0  # (the probes' counters: records the ring could not take)

    def stats(self) -> dict:
        return {"lost": self.lost, "unpaired": 0, "too_deep": 0, "entries_lost": 0}


def test_triggers_by_error_and_latency(tmp_path):
    said = []
    options = FlightOptions(1.0, str(tmp_path), parse_trigger_errors("oom"),
                            latency_ns=50_000_000)
    recorder = FlightRecorder(options, _Tracer(), log=said.append)
    sync, malloc = FN_ID["cudaStreamSynchronize"], FN_ID["cudaMalloc"]
    recorder.put(frame(sync, 0, 10_000_000) + frame(malloc, 1, 2, ret=1))  # neither
    assert not recorder.paths
    recorder.put(frame(malloc, 5, 9, ret=(0xFFFF << 32) | 2))  # 32-bit return values
    assert len(recorder.paths) == 1 and read_trigger(recorder.paths[0])["error"] == \
        "cudaErrorMemoryAllocation"
    late = 3 * 10 ** 9  # (past the window: the next trigger may dump)
    recorder.put(frame(sync, late, late + 60_000_000))
    trigger = read_trigger(recorder.paths[1])
    assert (trigger["kind"], trigger["api"], trigger["duration_ns"]) == (
        "latency", "cudaStreamSynchronize", 60_000_000)
    assert trigger["calls"] == 1  # the window holds only the slow call
    assert "cudaStreamSynchronize took 60.000 ms in app (pid 7)" in said[-1]
    recorder.close()


def test_trigger_error_words():
    assert parse_trigger_errors("oom,illegal-address") == frozenset(
        TRIGGER_FAMILIES["oom"] + TRIGGER_FAMILIES["illegal-address"])
    assert parse_trigger_errors("719,CUDA_ERROR_LAUNCH_TIMEOUT,cudaErrorLaunchFailure") == \
        frozenset({719, 702})
    assert parse_trigger_errors("none") == frozenset()
    with pytest.raises(UsageError):
        parse_trigger_errors("oops")


@contextlib.contextmanager
def file_size_limit(size: int):
    """Writes past `size` bytes fail with EFBIG, standing in for a full disk (ENOSPC)."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, old_limit[1]))
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def calls(count: int, start_ns: int) -> bytes:
    return b"".join(frame(FN_ID["cudaMemcpy"], start_ns + k, start_ns + k + 1)
                    for k in range(count))


def test_calls_the_disk_refuses_are_counted_said_once_and_in_the_next_dump(tmp_path):
    said, tracer = [], _Tracer()
    recorder = FlightRecorder(FlightOptions(0.5, str(tmp_path)), tracer, log=said.append)
    size = len(frame(0, 0, 0))
    tracer.lost = 2  # (before the window: not its loss)
    recorder.poll()
    time.sleep(0.6)
    now = time.monotonic_ns()
    with file_size_limit(4 * size):
        recorder.put(calls(3, now))
        recorder.put(calls(2, now + 100))  # (would end past 4 frames: refused)
        recorder.put(calls(3, now + 200))  # (refused too: said once)
    assert (recorder.ring.unwritten, recorder.ring.error) == (5, os.strerror(errno.EFBIG))
    assert [line for line in said if "cannot keep calls" in line] == [
        "flight recorder: cannot keep calls in %s: %s (those not kept are counted: "
        'ebpf_cuda_events_lost_total{cause="flight_recorder_unwritten"})'
        % (tmp_path, os.strerror(errno.EFBIG))]
    tracer.lost = 9  # (7 records the ring buffer could not take meanwhile)
    recorder.request("SIGUSR1")
    recorder.poll()
    saved = load(recorder.paths[0])
    assert len([e for batch in saved.batches() for e in batch if e.phase == EXIT]) == 3
    lost = saved.losses
    assert (lost.ring_full, lost.dropped) == (7, {"the flight recorder": (
        5, "5 refused by the disk: %s" % os.strerror(errno.EFBIG))})
    assert lost.sentence() == ("12 events lost: 7 with the ring buffer full (try --ring-size), "
                               "5 dropped by the flight recorder (5 refused by the disk: %s)"
                               % os.strerror(errno.EFBIG))
    recorder.close()


def test_a_dump_that_cannot_be_written_leaves_no_file_and_holds_no_trigger_back(tmp_path):
    said = []
    recorder = FlightRecorder(FlightOptions(1.0, str(tmp_path), parse_trigger_errors("oom")),
                              _Tracer(), log=said.append)
    recorder.put(calls(200, 0))
    oom = frame(FN_ID["cudaMalloc"], 500, 600, ret=2)
    with file_size_limit(4096):  # (the ring's file is past it already: it refuses the call)
        recorder.put(oom)
    assert recorder.failed == 1 and not recorder.paths and recorder.ring.unwritten == 1
    assert not [p for p in os.listdir(str(tmp_path)) if p.startswith("flight-")]
    assert "cannot write" in said[-1]
    recorder.put(oom)  # (at once: the failed dump did not count as the last one)
    assert len(recorder.paths) == 1 and recorder.suppressed == 0
    assert read_trigger(recorder.paths[0])["calls"] == 201
    assert load(recorder.paths[0]).losses.dropped["the flight recorder"][0] == 1
    recorder.close()
