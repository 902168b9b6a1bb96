"""Exact accounting under load: every call is seen once, with its own thread, or counted lost.

The workload (tests/native/robust_load.c) has T threads each make N calls
cudaMemcpy(dst = tid, src = seq, count = seq, kind = 0) as fast as they can. A complete call is
one ring record (written at return, the enter event is synthesized from it), so calls are
counted by exit events, and each exit event must carry its own thread's id both as the event's
tid (taken at return) and as `dst` (taken at entry): entry and return were paired correctly.
"""
import collections
import time

import pytest

from ebpf_cuda.tracer import Tracer
from test_robust_support import exits, json_events, lost_from_stderr, run_cli, start_cli, stop

pytestmark = pytest.mark.kernel


def trace_threads(prog, threads: int, per_thread: int, ring_size: int):
    """(events by tid {tid: [seq, ...]}, records seen, stats, target pid, exit status)."""
    by_tid = collections.defaultdict(list)
    seen = 0
    with Tracer(functions=["cudaMemcpy"], command=[str(prog), "threads", str(threads),
                                                   str(per_thread)],
                ring_size=ring_size) as tracer:
        decode = tracer.decoder.decode_frames
        for frames in tracer.frames():
            for event in decode(frames):  # raises DecodeError for any bad record
                if event.phase != "exit":
                    continue
                seen += 1
                assert event.pid == tracer.child_pid
                assert event.args["dst"] == event.tid, "entry and return of different threads"
                assert event.args["src"] == event.args["size"]
                assert event.ret == 0 and event.duration_ns >= 0
                by_tid[event.tid].append(event.args["size"])
        stats = tracer.stats()
        status = tracer.exit_status
    return by_tid, seen, stats, status


def assert_no_duplicates(by_tid, per_thread: int) -> None:
    for tid, seqs in by_tid.items():
        assert len(seqs) == len(set(seqs)), "thread %d: a call was reported twice" % tid
        assert max(seqs) < per_thread


def test_million_calls_16_threads_seen_plus_lost_is_made(root, robust):
    """Over a million calls from 16 threads with the default ring: whatever the reader keeps up
    with is seen, the rest is counted by the probes; the sum is exact."""
    _, prog = robust
    threads, per_thread = 16, 62500
    by_tid, seen, stats, status = trace_threads(prog, threads, per_thread, 8 << 20)
    assert status == 0
    assert seen + stats["lost"] == threads * per_thread == 1000000
    assert stats["unpaired"] == 0
    assert len(by_tid) <= threads
    assert_no_duplicates(by_tid, per_thread)


def test_every_call_seen_with_a_big_enough_ring(root, robust):
    """With room for every record, nothing is lost: each thread's calls 0..N-1 all arrive."""
    _, prog = robust
    threads, per_thread = 16, 5000
    by_tid, seen, stats, status = trace_threads(prog, threads, per_thread, 32 << 20)
    assert status == 0 and stats == {"lost": 0, "unpaired": 0, "too_deep": 0, "entries_lost": 0}
    assert seen == threads * per_thread
    assert len(by_tid) == threads
    for seqs in by_tid.values():
        assert sorted(seqs) == list(range(per_thread))


def test_tiny_ring_tracer_counts_losses_exactly(root, robust):
    _, prog = robust
    threads, per_thread = 16, 10000
    by_tid, seen, stats, status = trace_threads(prog, threads, per_thread, 4096)
    assert status == 0
    assert stats["lost"] > 0, "a 4 KiB ring should overflow at this rate"
    assert seen + stats["lost"] == threads * per_thread
    assert_no_duplicates(by_tid, per_thread)


def test_tiny_ring_cli_reports_losses_exactly(root, robust, tmp_path):
    _, prog = robust
    threads, per_thread = 16, 10000
    out = tmp_path / "trace.jsonl"
    done = run_cli(["--ring-size", "4096", "--json", "-o", out, "--functions", "cudaMemcpy", "--",
                    prog, "threads", threads, per_thread])
    assert done.returncode == 0, done.stderr
    assert "made=%d" % (threads * per_thread) in done.stdout
    lost = lost_from_stderr(done.stderr)
    assert lost > 0
    calls = exits(json_events(out))
    assert all(e["args"]["dst"] == e["tid"] for e in calls)
    assert len(calls) + lost == threads * per_thread


def _calls_by_thread(path) -> dict:
    by_tid = collections.defaultdict(list)
    for event in exits(json_events(path)):
        assert event["args"]["dst"] == event["tid"], "entry and return of different threads"
        by_tid[event["tid"]].append(event["args"]["size"])
    return {tid: sorted(seqs) for tid, seqs in by_tid.items()}


def test_spooled_lines_equal_direct_lines(root, robust, tmp_path):
    """JSON lines written behind the reader through the spool (the default) and as the ring
    is read (--spool-size 0) carry the same calls, every one of them."""
    _, prog = robust
    threads, per_thread = 4, 5000
    found = {}
    for spool in ("2G", "0"):
        out = tmp_path / ("spool-%s.jsonl" % spool)
        done = run_cli(["--spool-size", spool, "--ring-size", "32M", "--json", "-o", out,
                        "--functions", "cudaMemcpy", "--", prog, "threads", threads,
                        per_thread])
        assert done.returncode == 0, done.stderr
        assert lost_from_stderr(done.stderr) == 0
        found[spool] = _calls_by_thread(out)
        assert len(found[spool]) == threads
        assert all(seqs == list(range(per_thread)) for seqs in found[spool].values())
    assert sorted(found["2G"].values()) == sorted(found["0"].values())


def test_spool_too_small_drops_and_counts(root, robust, tmp_path):
    """A spool of one byte holds no batch: every call is dropped there, and counted."""
    _, prog = robust
    threads, per_thread = 4, 2000
    out = tmp_path / "trace.txt"
    done = run_cli(["--spool-size", "1", "--ring-size", "32M", "-o", out, "--functions",
                    "cudaMemcpy", "--", prog, "threads", threads, per_thread])
    assert done.returncode == 0, done.stderr
    assert lost_from_stderr(done.stderr) == threads * per_thread
    assert "%d past the spool's 1 bytes (try --spool-size)" % (threads * per_thread) \
        in done.stderr
    assert "cudaMemcpy" not in out.read_text()


def _nice(pid: int, tid: int) -> int:
    with open("/proc/%d/task/%d/stat" % (pid, tid)) as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19: nice


def test_the_reader_runs_at_a_higher_priority(root, robust, tmp_path):
    """The CLI's reader thread (its main thread) runs at nice -10, so a program with more
    busy threads than cores cannot starve it; the traced command keeps the ordinary one."""
    _, prog = robust
    tracer = start_cli(["-o", tmp_path / "t.txt", "--functions", "cudaMemcpy", "--", prog,
                        "rate", 1000, 2])
    try:
        deadline = time.monotonic() + 5
        while _nice(tracer.pid, tracer.pid) != -10 and time.monotonic() < deadline:
            time.sleep(0.05)
        reader = _nice(tracer.pid, tracer.pid)
        children = [int(c) for c in open("/proc/%d/task/%d/children" % (tracer.pid, tracer.pid))
                    .read().split()]
        command = [_nice(c, c) for c in children]
    finally:
        stop(tracer)
    assert reader == -10
    assert command == [0]
