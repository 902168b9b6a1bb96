"""The flight recorder: a stand-in that runs out of memory leaves a dump holding the calls
of the last SECONDS (not those before) that `ebpf-cuda report` reads and that names its
trigger; SIGUSR1 asks for one; the on-disk ring's bookkeeping (pure logic)."""
import json
import re
import signal
import struct
import time

import pytest

from ebpf_cuda import record
from ebpf_cuda.apis import FN_ID
from ebpf_cuda.flight import (FlightOptions, FlightRecorder, FrameRing, TRIGGER_FAMILIES,
                              parse_trigger_errors, read_trigger)
from ebpf_cuda.errors import UsageError
from helpers import run_cli
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


# -- pure logic -----------------------------------------------------------------------------

def frame(fn_id: int, enter_ns: int, exit_ns: int, ret: int = 0, pid: int = 7) -> bytes:
    payload = record.LAYOUT.pack(enter_ns, exit_ns, pid, pid, fn_id, record.PHASE_CALL, 0, 0,
                                 b"app", *[0] * record.ARG_CELLS, ret,
                                 *[0] * record.OUT_CELLS, 0)
    return struct.pack("<II", len(payload), 0) + payload


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
        from ebpf_cuda.apis import TABLE
        from ebpf_cuda.events import Decoder
        from ebpf_cuda.names import KernelNamer

        self.apis_table = TABLE
        self.decoder = Decoder(TABLE)
        self.names = KernelNamer()


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
