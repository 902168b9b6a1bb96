"""End to end through the Python API: real probes on the stand-in libcudart, real programs.

The driver program prints what it passed and got back for every call; the tracer's events
must say exactly the same, in the same order.
"""
import os
import tempfile
import threading
import time
from typing import List, Sequence, Tuple

import pytest

from ebpf_cuda.decode.events import ENTER, EXIT, Event
from ebpf_cuda.tracer import Tracer
from fakecuda import (EVENT_BASE, SEED_FUNCTIONS, STREAM_BASE, Call,
                      device_ptr, parse_output)
from helpers import stdout_to, trace_command
from kernel_fds import bpf_link_types, perf_links

pytestmark = pytest.mark.kernel

COMM = "cuda_driver_prog"[:15]
KIND_NAMES = {0: "HostToHost", 1: "HostToDevice", 2: "DeviceToHost", 3: "DeviceToDevice",
              4: "Default"}
RET_NAMES = {0: "cudaSuccess", 2: "cudaErrorMemoryAllocation", 9: "cudaErrorInvalidConfiguration",
             101: "cudaErrorInvalidDevice"}
HUGE = 2 * (1 << 40)

# Every one of the eleven functions, with successes and the failures the stand-in documents.
ELEVEN_OPS = (
    "malloc:4000", "malloc:%d" % HUGE, "memcpy:4000:1", "memcpy:64:2", "streamcreate",
    "streamsync", "eventcreate", "eventrecord:last:@0", "eventsync",
    "launch:4,1,1:256,1,1", "launch:2,3,4:8,8,2:1024:@0", "launch:1:2000", "getdevice",
    "setdevice:1", "getdevice", "setdevice:7", "free",
)


def _pairs(events: Sequence[Event]) -> List[Tuple[Event, Event]]:
    """(enter, exit) of each call, checking that events come as enter-then-exit pairs."""
    assert len(events) % 2 == 0
    pairs = list(zip(events[::2], events[1::2]))
    for enter, exit_ in pairs:
        assert (enter.phase, exit_.phase) == (ENTER, EXIT)
        assert (exit_.api, exit_.pid, exit_.tid, exit_.args) == (enter.api, enter.pid,
                                                                  enter.tid, enter.args)
    return pairs


def expected_args(call: Call) -> dict:
    """The arguments a call's enter event must carry, from the driver's own line."""
    f, num = call.fields, call.number
    if call.fn == "cudaMalloc":
        return {"size": num("size")}
    if call.fn == "cudaFree":
        return {"ptr": num("ptr")}
    if call.fn == "cudaMemcpy":
        return {"dst": num("dst"), "src": num("src"), "size": num("count"),
                "kind": KIND_NAMES[num("kind")]}
    if call.fn == "cudaLaunchKernel":
        def dims(text):
            return tuple(int(x) for x in text.split(","))
        return {"func": num("func"), "grid": dims(f["grid"]), "block": dims(f["block"]),
                "smem": num("smem"), "stream": num("stream")}
    if call.fn in ("cudaStreamSynchronize",):
        return {"stream": num("stream")}
    if call.fn == "cudaEventRecord":
        return {"event": num("event"), "stream": num("stream")}
    if call.fn == "cudaEventSynchronize":
        return {"event": num("event")}
    if call.fn == "cudaSetDevice":
        return {"device": num("device")}
    assert call.fn in ("cudaStreamCreate", "cudaEventCreate", "cudaGetDevice"), call.fn
    return {}


OUT_NAMES = {"cudaMalloc": "ptr", "cudaStreamCreate": "stream", "cudaEventCreate": "event",
             "cudaGetDevice": "device"}


def expected_outs(call: Call) -> dict:
    """Out-parameters an exit event must carry: read only when the call succeeded."""
    name = OUT_NAMES.get(call.fn)
    if name is None or call.ret != 0:
        return {}
    return {name: call.out}


@pytest.fixture(scope="module")
def eleven(fake):
    """One traced run of the driver program calling all eleven functions."""
    lib, prog = fake
    events, calls, tracer = trace_command([prog, *ELEVEN_OPS], library=[str(lib)],
                                          functions=list(SEED_FUNCTIONS))
    return events, calls, tracer


def test_driver_program_did_what_the_ops_say(eleven):
    _, calls, tracer = eleven
    assert tracer.exit_status == 0
    assert [c.fn for c in calls] == [
        "cudaMalloc", "cudaMalloc", "cudaMemcpy", "cudaMemcpy", "cudaStreamCreate",
        "cudaStreamSynchronize", "cudaEventCreate", "cudaEventRecord", "cudaEventSynchronize",
        "cudaLaunchKernel", "cudaLaunchKernel", "cudaLaunchKernel", "cudaGetDevice",
        "cudaSetDevice", "cudaGetDevice", "cudaSetDevice", "cudaFree"]
    assert {c.fn for c in calls} == set(OUT_NAMES) | {
        "cudaFree", "cudaMemcpy", "cudaLaunchKernel", "cudaStreamSynchronize",
        "cudaEventRecord", "cudaEventSynchronize", "cudaSetDevice"}


def test_every_call_is_an_enter_then_an_exit_in_program_order(root, eleven):
    events, calls, tracer = eleven
    pairs = _pairs(events)
    assert [enter.api for enter, _ in pairs] == [c.fn for c in calls]
    assert tracer.stats_at_end == {"lost": 0, "unpaired": 0, "too_deep": 0, "entries_lost": 0}


def test_arguments_are_exactly_what_the_program_passed(root, eleven):
    events, calls, _ = eleven
    for (enter, _), call in zip(_pairs(events), calls):
        assert enter.args == expected_args(call), call


def test_out_parameters_and_return_names(root, eleven):
    events, calls, _ = eleven
    for (_, exit_), call in zip(_pairs(events), calls):
        assert exit_.ret == call.ret, call
        assert exit_.ret_name == RET_NAMES[call.ret], call
        assert exit_.outs == expected_outs(call), call
        assert exit_.faults == ()


def test_known_values_of_the_stand_in(root, eleven):
    """The values themselves, not only agreement with the program."""
    events, _, _ = eleven
    exits = [e for e in events if e.phase == EXIT]
    by_api = {}
    for e in exits:
        by_api.setdefault(e.api, []).append(e)
    ok, huge = by_api["cudaMalloc"]
    assert (ok.args, ok.ret_name, ok.outs) == ({"size": 4000}, "cudaSuccess",
                                               {"ptr": device_ptr(0)})
    assert (huge.args, huge.ret, huge.ret_name, huge.outs) == (
        {"size": HUGE}, 2, "cudaErrorMemoryAllocation", {})
    h2d, d2h = by_api["cudaMemcpy"]
    assert (h2d.args["dst"], h2d.args["size"], h2d.args["kind"]) == (device_ptr(0), 4000,
                                                                     "HostToDevice")
    assert (d2h.args["src"], d2h.args["size"], d2h.args["kind"]) == (device_ptr(0), 64,
                                                                     "DeviceToHost")
    assert by_api["cudaStreamCreate"][0].outs == {"stream": STREAM_BASE}
    assert by_api["cudaStreamSynchronize"][0].args == {"stream": STREAM_BASE}
    assert by_api["cudaEventCreate"][0].outs == {"event": EVENT_BASE}
    assert by_api["cudaEventRecord"][0].args == {"event": EVENT_BASE, "stream": STREAM_BASE}
    assert by_api["cudaEventSynchronize"][0].args == {"event": EVENT_BASE}
    plain, full, too_big = by_api["cudaLaunchKernel"]
    assert (plain.args["grid"], plain.args["block"], plain.args["smem"],
            plain.args["stream"]) == ((4, 1, 1), (256, 1, 1), 0, 0)
    assert (full.args["grid"], full.args["block"], full.args["smem"],
            full.args["stream"]) == ((2, 3, 4), (8, 8, 2), 1024, STREAM_BASE)
    assert plain.args["func"] == full.args["func"] != 0
    assert (plain.ret_name, full.ret_name) == ("cudaSuccess", "cudaSuccess")
    assert too_big.args["block"] == (2000, 1, 1)
    assert too_big.ret_name == "cudaErrorInvalidConfiguration"
    assert [e.outs for e in by_api["cudaGetDevice"]] == [{"device": 0}, {"device": 1}]
    assert [(e.args, e.ret_name) for e in by_api["cudaSetDevice"]] == [
        ({"device": 1}, "cudaSuccess"), ({"device": 7}, "cudaErrorInvalidDevice")]
    assert by_api["cudaFree"][0].args == {"ptr": device_ptr(0)}


def test_durations_times_and_ids(root, eleven):
    events, _, tracer = eleven
    child = tracer.child_pid
    for enter, exit_ in _pairs(events):
        assert exit_.duration_ns > 0
        assert exit_.duration_ns == exit_.ts_ns - enter.ts_ns
        assert enter.duration_ns is None and enter.ret is None
        assert (enter.pid, enter.tid, exit_.pid, exit_.tid) == (child,) * 4
        assert enter.comm == exit_.comm == COMM
    stamps = [e.ts_ns for e in events]
    assert stamps == sorted(stamps)
    assert abs(events[0].ts - time.time()) < 120  # wall clock, not boot time


def test_first_call_of_the_command_is_seen(root, fake):
    lib, prog = fake
    events, calls, _ = trace_command([prog, "getdevice"], library=[str(lib)],
                                     functions=["cudaGetDevice"])
    assert [(e.api, e.phase) for e in events] == [("cudaGetDevice", ENTER),
                                                  ("cudaGetDevice", EXIT)]
    assert events[1].outs == {"device": 0} and len(calls) == 1


def _watch_threads(pid: int, seen: set, done: threading.Event) -> None:
    task = "/proc/%d/task" % pid
    while not done.is_set():
        try:
            seen.update(int(t) for t in os.listdir(task))
        except OSError:
            pass
        time.sleep(0.0005)


def test_threads_each_exit_pairs_with_its_enter(root, fake):
    """4 threads × N mallocs: every thread's calls carry its own tid, enter and exit alike,
    and the tids are exactly the program's threads (watched in /proc while it runs)."""
    lib, prog = fake
    nthreads, per_thread = 4, 20000
    tracer = Tracer(command=[str(prog), "threads:%d:%d:malloc:64" % (nthreads, per_thread)],
                    library=[str(lib)], functions=["cudaMalloc"], ring_size=32 << 20)
    seen: set = set()
    done = threading.Event()
    with tempfile.NamedTemporaryFile("r") as out:
        try:
            with stdout_to(out.name):
                tracer.start()
            watcher = threading.Thread(target=_watch_threads,
                                       args=(tracer.child_pid, seen, done))
            watcher.start()
            events = list(tracer.events(timeout=60))
            done.set()
            watcher.join()
            stats = tracer.stats()
        finally:
            done.set()
            tracer.close()
        calls = parse_output(out.read())
    pid = tracer.child_pid
    assert tracer.exit_status == 0 and stats["lost"] == 0
    assert calls[0].fields["errors"] == "0"
    pairs = _pairs(events)
    assert len(pairs) == nthreads * per_thread
    tids = {enter.tid for enter, _ in pairs}
    assert len(tids) == nthreads and pid not in tids
    assert tids == seen - {pid}
    for tid in tids:
        mine = [(enter, exit_) for enter, exit_ in pairs if enter.tid == tid]
        assert len(mine) == per_thread
        assert all(e.pid == x.pid == pid for e, x in mine)
        assert all(x.duration_ns > 0 and x.ret_name == "cudaSuccess" for _, x in mine)
        stamps = [e.ts_ns for pair in mine for e in pair]
        assert stamps == sorted(stamps)  # a thread's calls do not overlap
    # every allocation the stand-in handed out was seen once, by exactly one thread
    ptrs = sorted(x.outs["ptr"] for _, x in pairs)
    assert ptrs == [device_ptr(k) for k in range(nthreads * per_thread)]


def test_library_found_from_the_command_runpath(root, fake):
    lib, prog = fake
    events, calls, tracer = trace_command([prog, "malloc:4000"], functions=["cudaMalloc"])
    assert {a.path for a in tracer.attachments} == {os.path.realpath(lib)}
    assert [(e.api, e.phase) for e in events] == [("cudaMalloc", ENTER), ("cudaMalloc", EXIT)]
    assert events[1].outs == {"ptr": calls[0].out}


def test_no_return_probes_attaches_entry_probes_only(root, fake):
    lib, prog = fake
    functions = ["cudaMalloc", "cudaFree"]
    with Tracer(pid=os.getpid(), library=[str(lib)], functions=functions,
                return_probes=False) as tracer:
        assert tracer.attachments and not any(a.retprobe for a in tracer.attachments)
        assert {a.api for a in tracer.attachments} == set(functions)
        assert all(not retprobe for _, retprobe in tracer.programs)
        entry_only = bpf_link_types(os.getpid())
    with Tracer(pid=os.getpid(), library=[str(lib)], functions=functions) as tracer:
        assert sorted(a.retprobe for a in tracer.attachments) == [False, False, True, True]
        both = bpf_link_types(os.getpid())
    if not perf_links():  # (before 5.15: joined by ioctl, no links to count)
        return
    assert len(entry_only) == 2 and len(both) == 4
    assert not any(t.startswith("uretprobe") for t in entry_only)
    # (perf links: the type says nothing; 6.12 names return links uprobe_multi too)
    if "uretprobe_multi" in both:
        assert sorted(both) == ["uprobe_multi", "uprobe_multi",
                                "uretprobe_multi", "uretprobe_multi"]


def test_no_return_probes_gives_enter_events_only(root, fake):
    lib, prog = fake
    events, calls, _ = trace_command([prog, "malloc:4000", "setdevice:7", "free"],
                                     library=[str(lib)], functions=list(SEED_FUNCTIONS),
                                     return_probes=False)
    assert [(e.api, e.phase, e.args) for e in events] == [
        ("cudaMalloc", ENTER, {"size": 4000}), ("cudaSetDevice", ENTER, {"device": 7}),
        ("cudaFree", ENTER, {"ptr": calls[0].out})]
    assert all(e.ret is None and e.duration_ns is None for e in events)


def _programs_and_distinct(lib) -> Tuple[int, int]:
    """(probes, distinct programs) of a tracer on the stand-in's eleven functions."""
    tracer = Tracer(library=[str(lib)], functions=list(SEED_FUNCTIONS))
    tracer.start()
    try:
        return len(tracer.programs), len({id(p) for p in tracer.programs.values()})
    finally:
        tracer.close()


def test_shared_programs_and_per_function_programs_give_the_same_events(root, fake,
                                                                        monkeypatch):
    """With uprobe_multi (this kernel) functions of one shape share a program and get their
    id from the attach cookie; without it (older kernels: perf-event uprobes) each function
    has its own programs with a constant id. Both must report every call exactly."""
    from ebpf_cuda.bpf import uprobe
    if not uprobe.uprobe_multi_supported():
        pytest.skip("no uprobe_multi on this kernel")
    lib, prog = fake
    probes_, distinct = _programs_and_distinct(lib)
    assert probes_ == 2 * len(SEED_FUNCTIONS) and distinct < probes_
    for multi in (True, False):
        monkeypatch.setitem(uprobe.features._cache, "uprobe_multi", multi)
        if not multi:
            assert _programs_and_distinct(lib) == (probes_, probes_)
        events, calls, tracer = trace_command([prog, *ELEVEN_OPS], library=[str(lib)],
                                              functions=list(SEED_FUNCTIONS))
        pairs = _pairs(events)
        assert [enter.api for enter, _ in pairs] == [c.fn for c in calls]
        assert len(calls) == len(ELEVEN_OPS)
        for (enter, exit_), call in zip(pairs, calls):
            assert enter.args == expected_args(call), (multi, call)
            assert (exit_.ret, exit_.outs) == (call.ret, expected_outs(call)), (multi, call)
        assert tracer.stats_at_end == {"lost": 0, "unpaired": 0, "too_deep": 0, "entries_lost": 0}
