"""The pump (pump.py): while the reader is busy with one batch for long (a large library's
first scan, here a consumer that computes for a second), a second thread moves the ring's
records into a spool, in order, so that a program calling flat out loses nothing."""
import time

import pytest

from ebpf_cuda import pump as pump_module
from ebpf_cuda.pump import Pump
from ebpf_cuda.spec import record
from ebpf_cuda.tracer import Tracer
from test_robust_support import Workload, wait_for


def _frames(first: int, count: int) -> bytes:
    """`count` frames whose exit times are first, first + 1, ... (a record's order)."""
    out = []
    for k in range(first, first + count):
        body = bytearray(record.SIZE)
        body[record.TS_EXIT:record.TS_EXIT + 8] = k.to_bytes(8, "little")
        out.append(bytes(8) + bytes(body))
    return b"".join(out)


def _order(frames: bytes):
    return record.frame_column(frames, record.TS_EXIT, "Q")


def test_what_the_pump_took_comes_first_and_in_order(monkeypatch):
    monkeypatch.setattr(pump_module, "PUMP_S", 0.001)
    ring = [_frames(k * 10, 10) for k in range(30)]
    pump = Pump(lambda: ring.pop(0) if ring else b"")
    seen = []
    try:
        first = pump.frames()
        seen += _order(first)
        with pump.busy():  # (a long batch: the pump empties the "ring" meanwhile)
            wait_for(lambda: not ring, what="the pump to take the ring's batches", timeout=10)
        assert pump.waiting
        while True:
            frames = pump.frames()
            if not frames:
                break
            seen += _order(frames)
    finally:
        pump.stop()
        pump.discard()
    assert seen == list(range(300)) and not pump.waiting and pump.dropped == 0


def test_a_short_batch_leaves_the_ring_to_the_reader(monkeypatch):
    monkeypatch.setattr(pump_module, "PUMP_S", 0.05)
    reads = []
    pump = Pump(lambda: reads.append(1) or b"")
    try:
        for _ in range(20):
            with pump.busy():
                pass
        time.sleep(0.2)
    finally:
        pump.stop()
    assert reads == [] and not pump.waiting


@pytest.mark.kernel
@pytest.mark.parametrize("pumped", [True, False], ids=["pumped", "not-pumped"])
def test_a_reader_busy_for_seconds_loses_nothing(root, robust, monkeypatch, pumped):
    """200,000 calls flat out while the first batch's consumer computes for two seconds: the
    4 MiB ring holds ~25,000. Pumped, every call arrives; with the pump held off (its look
    after 1,000 s) the ring overflows: the test tells the two apart."""
    if not pumped:
        monkeypatch.setattr(pump_module, "PUMP_S", 1000.0)
    lib, prog = robust
    calls = 200000
    seen = 0
    with Tracer(library=[str(lib)], functions=["cudaMemcpy"],
                command=[str(prog), "threads", "1", str(calls)]) as tracer:
        for frames in tracer.frames():
            if seen == 0:
                end = time.monotonic() + 2.0
                while time.monotonic() < end:  # (holding the interpreter, as a scan does)
                    sum(range(1000))
            seen += record.call_count(frames)
        lost = tracer.stats()["lost"]
    if pumped:
        assert (seen, lost) == (calls, 0)
    else:
        assert lost > 0 and seen + lost == calls


@pytest.mark.kernel
def test_attached_to_a_running_process_a_busy_reader_loses_nothing(root, robust):
    """The case the pump was made for (`-d PID` to a program already running, which then
    calls flat out while the reader is busy): a burst of 200,000 calls asked of a workload
    running before the tracer, the first batch's consumer busy for two seconds."""
    lib, prog = robust
    calls = 200000
    target = Workload([prog, "bursts"])
    seen = 0
    try:
        with Tracer(library=[str(lib)], functions=["cudaMemcpy"], pid=target.pid) as tracer:
            tracer.start()
            target.proc.stdin.write("%d\n" % calls)
            target.proc.stdin.flush()
            deadline = time.monotonic() + 120
            for frames in tracer.frames(timeout=120):
                if seen == 0:
                    end = time.monotonic() + 2.0
                    while time.monotonic() < end:  # (holding the interpreter)
                        sum(range(1000))
                seen += record.call_count(frames)
                if seen >= calls or time.monotonic() > deadline:
                    tracer.stop()
            lost = tracer.stats()["lost"]
        answer = target.proc.stdout.readline().strip()
        assert answer == "done %d total=%d" % (calls, calls), answer
        assert (seen, lost) == (calls, 0)
        assert target.finish() == 0
    finally:
        target.kill()


@pytest.mark.kernel
def test_drops_after_the_last_drains_end_are_not_losses(root, robust):
    """Stopped while the reader is busy, the last drain reads the pump's backlog up to where
    the producers were, while a program calling flat out goes on and fills the ring: what
    the ring drops then would lie past that end, read by no one, and is no loss (it was
    said as tens of thousands lost "with the ring buffer full")."""
    lib, prog = robust
    target = Workload([prog, "bursts"])
    seen, held = 0, 0
    try:
        with Tracer(library=[str(lib)], functions=["cudaMemcpy"], pid=target.pid) as tracer:
            tracer.start()
            target.proc.stdin.write("%d\n" % 50000000)  # (flat out past the end of the test)
            target.proc.stdin.flush()
            for frames in tracer.frames(timeout=120):
                if held < 2:  # the first batch, and the last drain's first
                    held += 1
                    end = time.monotonic() + 2.0
                    while time.monotonic() < end:  # (holding the interpreter)
                        sum(range(1000))
                    tracer.stop()
                seen += record.call_count(frames)
            dropped, losses = tracer.stats()["lost"], tracer.losses()
    finally:
        target.kill()
    assert held == 2 and seen > 25000  # (more than the 4 MiB ring holds: the pump's)
    assert dropped > 0  # the ring filled while the last drain read the backlog
    assert losses.ring_full == 0 and losses.total == 0, losses.sentence()
