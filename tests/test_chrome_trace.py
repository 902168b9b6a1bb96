"""Chrome trace-event output: structure (parsed back with json), counters, markers, streaming
in constant memory, and a real trace of the stand-in runtime."""
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest

from ebpf_cuda.decode.events import ENTER, EXIT, Event
from ebpf_cuda.output.chrome_trace import ChromeTraceWriter, write_chrome_trace
from helpers import event

REPO = Path(__file__).resolve().parent.parent
DEV = 0x7F0000000000


def call(api: str, args: dict, ts_ns: int, duration_ns: int = 500, ret: int = 0,
         outs: dict = None, pid: int = 100, tid: int = 100, comm: str = "app") -> List[Event]:
    """The enter and exit events of one complete call, as the decoder yields them."""
    ret_name = "cudaSuccess" if ret == 0 else "cudaErrorInvalidValue"
    return [event(api, ENTER, args, ts_ns=ts_ns, pid=pid, tid=tid, comm=comm),
            event(api, EXIT, args, ts_ns=ts_ns + duration_ns, pid=pid, tid=tid, comm=comm,
                  ret=ret, ret_name=ret_name, duration_ns=duration_ns, outs=dict(outs or {}))]


def sample_events() -> List[Event]:
    """Two allocations, two copies, a launch, a free, a double free, a failure; one leak."""
    events = []
    events += call("cudaMalloc", {"size": 4000}, 1_000_000, outs={"ptr": DEV})
    events += call("cudaMalloc", {"size": 100}, 2_000_000, outs={"ptr": DEV + 0x100000},
                   tid=101)
    events += call("cudaMemcpy", {"dst": DEV, "src": 0x1000, "size": 4000,
                                  "kind": "HostToDevice"}, 3_000_000, duration_ns=2000)
    events += call("cudaMemcpy", {"dst": 0x1000, "src": DEV, "size": 10,
                                  "kind": "DeviceToHost"}, 4_000_000)
    events += call("cudaLaunchKernel", {"func": 0x4010, "grid": (2, 1, 1), "block": (64, 1, 1),
                                        "smem": 0, "stream": 0}, 5_000_000)
    events += call("cudaFree", {"ptr": DEV}, 6_000_000)
    events += call("cudaFree", {"ptr": DEV}, 7_000_000)
    events += call("cudaSetDevice", {"device": 5}, 8_000_000, ret=101)
    return events


def render(events, namer=None) -> list:
    stream = io.StringIO()
    stream.close = lambda: None  # keep the text readable after the writer closes it
    write_chrome_trace(events, stream, namer=namer, batch=3)
    return json.loads(stream.getvalue())


def of(trace, ph, name=None):
    return [e for e in trace if e["ph"] == ph and (name is None or e["name"] == name)]


def test_output_is_a_json_array_with_tracks_per_process_and_thread():
    trace = render(sample_events())
    names = {(e["name"], e["tid"], e["args"]["name"]) for e in of(trace, "M")}
    assert names == {("process_name", 100, "app (100)"), ("thread_name", 100, "app 100"),
                     ("thread_name", 101, "app 101")}
    for e in trace:
        assert isinstance(e["pid"], int) and e["ph"] in "MXCi"
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float))


def test_each_call_is_a_complete_slice_in_microseconds():
    trace = render(sample_events())
    slices = of(trace, "X")
    assert [s["name"] for s in slices] == ["cudaMalloc", "cudaMalloc", "cudaMemcpy", "cudaMemcpy",
                                           "cudaLaunchKernel", "cudaFree", "cudaFree",
                                           "cudaSetDevice"]
    first = slices[0]
    assert first["ts"] == 1000.0 and first["dur"] == 0.5 and first["cat"] == "memory"
    assert first["args"] == {"size": 4000, "return": "cudaSuccess", "ptr": hex(DEV)}
    copy = slices[2]
    assert copy["args"]["size"] == 4000 and copy["args"]["kind"] == "HostToDevice"
    assert copy["dur"] == 2.0
    assert slices[-1]["args"]["return"] == "cudaErrorInvalidValue"


def test_kernel_launch_is_named_by_the_namer_and_has_its_geometry():
    trace = render(sample_events(), namer=lambda ev, addr: "vec_add" if addr == 0x4010 else None)
    launch = of(trace, "X", "vec_add")[0]
    assert launch["args"]["grid"] == [2, 1, 1] and launch["args"]["block"] == [64, 1, 1]
    assert launch["args"]["kernel"] == "vec_add" and launch["args"]["func"] == "0x4010"
    assert of(render(sample_events()), "X", "cudaLaunchKernel")


def test_counters_follow_live_memory_and_bytes_copied():
    trace = render(sample_events())
    live = [c["args"]["bytes"] for c in of(trace, "C", "live device memory")]
    assert live == [4000, 4100, 100]
    copied = [c["args"] for c in of(trace, "C", "bytes copied")]
    assert copied == [{"Host-to-Device": 4000}, {"Host-to-Device": 4000, "Device-to-Host": 10}]


def test_markers_for_errors_double_frees_and_leaks():
    trace = render(sample_events())
    markers = {e["name"]: e for e in of(trace, "i")}
    assert set(markers) == {"cudaErrorInvalidValue", "double free", "leak"}
    assert markers["cudaErrorInvalidValue"]["args"] == {"api": "cudaSetDevice", "ret": 101}
    assert markers["double free"]["args"]["ptr"] == hex(DEV)
    leak = markers["leak"]
    assert leak["args"]["size"] == 100 and leak["args"]["ptr"] == hex(DEV + 0x100000)
    assert leak["s"] == "p" and leak["ts"] == 8000.5  # at the process's last event


def test_entry_only_events_become_instant_markers():
    enter_only = [e for e in sample_events()[:4] if e.phase == ENTER]
    trace = render(enter_only)
    assert [(e["name"], e["ph"], e["cat"]) for e in trace if e["ph"] != "M"] == [
        ("cudaMalloc", "i", "enter"), ("cudaMalloc", "i", "enter")]


def test_stream_is_written_incrementally():
    stream = io.StringIO()
    writer = ChromeTraceWriter(stream)
    writer.header()
    writer.write(sample_events()[:2])
    partial = stream.getvalue()
    assert partial.startswith("[\n") and '"cudaMalloc"' in partial
    assert json.loads(partial + "]")  # everything so far is whole events


def test_empty_trace_is_an_empty_array():
    assert render([]) == []


def test_unknown_frees_and_failed_calls_change_no_memory():
    events = (call("cudaFree", {"ptr": DEV}, 1_000)  # allocated before tracing
              + call("cudaMalloc", {"size": 8}, 2_000, ret=2)
              + call("cudaFree", {"ptr": 0}, 3_000))
    trace = render(events)
    assert of(trace, "C") == [] and [e["name"] for e in of(trace, "i")] == [
        "cudaErrorInvalidValue"]


def test_both_layers_count_once_in_memory_and_copies():
    """cudaMalloc's cuMemAlloc_v2, cudaMemcpy's cuMemcpyHtoD_v2 and cudaFree's cuMemFree_v2
    run inside them on the same thread (and return first): one allocation, one copy, one
    free; freeing it again is one double free (its driver call inside it is not another)."""
    events = []
    for api, inner, args, outs, t in (
            ("cudaMalloc", "cuMemAlloc_v2", {"size": 4000}, {"ptr": DEV}, 1_000_000),
            ("cudaMemcpy", "cuMemcpyHtoD_v2", {"dst": DEV, "src": 0x1000, "size": 4000,
                                               "kind": "HostToDevice"}, {}, 2_000_000),
            ("cudaFree", "cuMemFree_v2", {"ptr": DEV}, {}, 3_000_000),
            ("cudaFree", "cuMemFree_v2", {"ptr": DEV}, {}, 4_000_000)):
        inner_args = {"ptr": DEV} if inner == "cuMemFree_v2" else dict(args)
        inner_args.pop("kind", None)
        events += [call(inner, inner_args, t + 100, duration_ns=300, outs=outs)[1],
                   call(api, args, t, duration_ns=500, outs=outs)[1]]
    trace = render(events)
    assert [c["args"]["bytes"] for c in of(trace, "C", "live device memory")] == [4000, 0]
    assert [c["args"] for c in of(trace, "C", "bytes copied")] == [{"Host-to-Device": 4000}]
    assert [(m["args"]["api"], m["ts"]) for m in of(trace, "i", "double free")] == [
        ("cudaFree", 4000.5)]  # an operation counts as its runtime call (--leaks too)


_BIG = textwrap.dedent("""
    import resource, sys, tempfile
    sys.path.insert(0, %r)
    from ebpf_cuda.decode.events import Event
    from ebpf_cuda.output.chrome_trace import write_chrome_trace

    def events(n):
        for i in range(n // 2):
            ptr = 0x7f0000000000 + (i // 2 %% 64) * 0x1000
            api, args, outs = (("cudaMalloc", {"size": 4096}, {"ptr": ptr}) if i %% 2 == 0
                               else ("cudaFree", {"ptr": ptr}, {}))
            ts, tid = 10 ** 12 + i * 1000, 100 + i %% 8
            yield Event(0.0, ts, 100, tid, "app", api, "enter", args)
            yield Event(0.0, ts + 500, 100, tid, "app", api, "exit", args, 0, "cudaSuccess",
                        500, outs)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryFile("w+") as out:
        write_chrome_trace(events(int(sys.argv[1])), out)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
""") % str(REPO)


def _rss_growth_kib(n: int) -> int:
    done = subprocess.run([sys.executable, "-c", _BIG, str(n)], capture_output=True, text=True,
                          check=True, timeout=120)
    return int(done.stdout)


def test_memory_stays_constant_as_events_grow():
    """200k events (≈5 s) grow the peak RSS by a few MB, no more than 50k events do: so 1M
    events stay within a few tens of MB."""
    small, large = _rss_growth_kib(50_000), _rss_growth_kib(200_000)
    assert large < 20 * 1024, large
    assert large - small < 4 * 1024, (small, large)


@pytest.mark.kernel
def test_real_trace_of_the_stand_in(root, cc, tmp_path):
    from fakecuda import build_fake_cuda, device_ptr
    from ebpf_cuda.tracer import Tracer

    _, prog = build_fake_cuda(cc)
    ops = ["malloc:4000", "malloc:100", "memcpy:4000:1", "launch:2,1,1:64", "free:@0",
           "free:@0", "setdevice:5"]
    with Tracer(command=[str(prog), *ops], functions=["cudaMalloc", "cudaFree", "cudaMemcpy",
                                                      "cudaLaunchKernel", "cudaSetDevice"]) as t:
        events = list(t.events(timeout=30))
    out = tmp_path / "trace.json"
    write_chrome_trace(events, open(out, "w"))
    trace = json.loads(out.read_text())
    slices = of(trace, "X")
    assert [s["name"] for s in slices] == ["cudaMalloc", "cudaMalloc", "cudaMemcpy",
                                           "cudaLaunchKernel", "cudaFree", "cudaFree",
                                           "cudaSetDevice"]
    assert all(s["pid"] == t.child_pid and s["dur"] > 0 for s in slices)
    assert slices[3]["args"]["grid"] == [2, 1, 1] and slices[3]["args"]["block"] == [64, 1, 1]
    assert [c["args"]["bytes"] for c in of(trace, "C", "live device memory")] == [4000, 4100, 100]
    assert {e["name"] for e in of(trace, "i")} == {"double free", "cudaErrorInvalidDevice",
                                                   "leak"}
    assert of(trace, "i", "leak")[0]["args"]["ptr"] == hex(device_ptr(1))


def test_a_communicator_track_is_renamed_when_its_rank_is_learned():
    """A split-off communicator: its id is known at once, its rank only once the program asks
    ncclCommUserRank; its track is named again then (the metadata's last name counts)."""
    comm = {"comm": 0x900, "comm_id": "abc123"}
    events = call("ncclAllReduce", dict(comm, count=4, seq=1), 1_000_000, pid=7, tid=8)
    events += call("ncclCommUserRank", dict(comm), 2_000_000, outs={"rank": 1}, pid=7, tid=8)
    events += call("ncclAllReduce", dict(comm, count=4, seq=2, rank=1, nranks=2), 3_000_000,
                   pid=7, tid=8)
    events += call("ncclGroupStart", {}, 4_000_000, pid=7, tid=8)
    trace = render(events)
    names = [(e["tid"], e["args"]["name"]) for e in of(trace, "M", "thread_name")
             if e["pid"] != 7]
    tid = names[0][0]
    assert names == [(tid, "NCCL comm abc123 (pid 7)"), (tid, "NCCL comm abc123 (rank 1/2)")]
    track = [(e["name"], e["ts"]) for e in of(trace, "X") if e["pid"] != 7]
    assert track == [("ncclAllReduce #1", 1000.0), ("ncclCommUserRank", 2000.0),
                     ("ncclAllReduce #2", 3000.0)]
    assert [e["name"] for e in of(trace, "X") if e["pid"] == 7] == [
        "ncclAllReduce", "ncclCommUserRank", "ncclAllReduce", "ncclGroupStart"]
