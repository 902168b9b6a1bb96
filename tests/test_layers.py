"""Both layers at once: a runtime (the layered stand-in libcudart) calling the driver (the
stand-in libcuda), traced together; choosing a layer (`api`, function patterns); memory
correlation of allocations with their frees; and the children of a traced command.
"""
import os
import shutil
from typing import Dict, List, Tuple

import pytest

from ebpf_cuda.spec import apis
from ebpf_cuda.decode.events import Event
from fakecuda import build_fake_cuda
from fakecuda_driver import (build_fake_driver, build_layered_runtime, device_ptr, exits,
                             host_ptr)
from helpers import trace_command

pytestmark = pytest.mark.kernel

try:
    from ebpf_cuda.analysis.memory import LeakTracker
except ImportError:  # written by another helper; the memory tests wait for it
    LeakTracker = None

# Runtime op → the driver functions the layered runtime calls inside it, in order.
LAYERED_OPS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("malloc:4000", ("cuInit", "cuDevicePrimaryCtxRetain", "cuMemAlloc_v2")),
    ("memcpy:4000:1", ("cuMemcpyHtoD_v2",)),
    ("memcpy:64:2", ("cuMemcpyDtoH_v2",)),
    ("memcpy:64:3", ("cuMemcpyDtoD_v2",)),
    ("memcpyasync:64:4:0x5", ("cuMemcpyAsync",)),
    ("memset:1:64", ("cuMemsetD8_v2",)),
    ("memsetasync:2:64:0x5", ("cuMemsetD8Async",)),
    ("launch:2,1,1:64,1,1:256:0x5", ("cuLaunchKernel",)),
    ("launchex:4,2,1:32,2,1:16:0x6", ("cuLaunchKernelEx",)),
    ("mallocasync:128:0x5", ("cuMemAllocAsync",)),
    ("freeasync:last:0x5", ("cuMemFreeAsync",)),
    ("mallochost:64", ("cuMemHostAlloc",)),
    ("freehost", ()),
    ("getdevicecount", ()),
    ("devsync", ("cuCtxSynchronize",)),
    ("streamsync:0x5", ("cuStreamSynchronize",)),
    ("eventsync:0xe000", ("cuEventSynchronize",)),
    ("graphlaunch:0x7000:0x5", ("cuGraphLaunch",)),
    ("free:@0", ("cuMemFree_v2",)),
)


@pytest.fixture(scope="module")
def layered(cc):
    return build_layered_runtime(cc)


@pytest.fixture(scope="module")
def both(layered):
    """The layered program traced with both layers' default rows, named (so that the
    runtime's launches are probed too), libraries found from it (NCCL's rows left out: a
    libnccl installed on the machine would be probed too)."""
    _, _, prog = layered
    return trace_command([prog, *(op for op, _ in LAYERED_OPS)],
                         functions=[api.name for api in apis.TABLE
                                    if api.default and api.library != apis.NCCL])


def test_default_set_probes_launches_in_the_driver_only(root, layered):
    """With both layers and the default set, each launch is seen once, by the driver;
    --all (or naming them) adds the runtime's launch functions."""
    lib, _, prog = layered
    ops = [op for op, _ in LAYERED_OPS]
    events, calls, tracer = trace_command([prog, *ops])
    assert tracer.exit_status == 0 and len(calls) == len(ops)
    probed = {a.api for a in tracer.attachments}
    assert {"cuLaunchKernel", "cuLaunchKernelEx", "cudaMalloc", "cudaMemcpy"} <= probed
    assert not probed & {"cudaLaunchKernel", "cudaLaunchKernelExC",
                         "cudaLaunchCooperativeKernel"}
    launches = [e.api for e in exits(events) if apis.BY_NAME[e.api].category == "launch"]
    assert launches == ["cuLaunchKernel", "cuLaunchKernelEx"]
    events, _, tracer = trace_command([prog, *ops], everything=True)
    launches = [e.api for e in exits(events) if apis.BY_NAME[e.api].category == "launch"]
    assert sorted(launches) == ["cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernel",
                                "cudaLaunchKernelExC"]


def _span(event: Event) -> Tuple[int, int]:
    return event.ts_ns - event.duration_ns, event.ts_ns


def _nested(outer: Event, events: List[Event]) -> List[Event]:
    start, end = _span(outer)
    return [e for e in events if e is not outer and e.tid == outer.tid
            and start <= _span(e)[0] and _span(e)[1] <= end]


def test_both_libraries_are_probed(root, both, layered):
    lib, driver, _ = layered
    _, calls, tracer = both
    assert tracer.exit_status == 0 and len(calls) == len(LAYERED_OPS)
    paths = {a.path for a in tracer.attachments}
    assert paths == {os.path.realpath(lib), os.path.realpath(driver)}
    for attachment in tracer.attachments:
        row = apis.BY_NAME[attachment.api]
        assert (attachment.path == os.path.realpath(driver)) == row.driver


def test_each_runtime_call_shows_its_driver_calls_nested_inside(root, both):
    events, calls, tracer = both
    done = exits(events)
    runtime = [e for e in done if not apis.BY_NAME[e.api].driver]
    driver = [e for e in done if apis.BY_NAME[e.api].driver]
    assert [e.api for e in runtime] == [c.fn for c in calls]
    inside = [tuple(e.api for e in _nested(r, driver)) for r in runtime]
    assert inside == [expected for _, expected in LAYERED_OPS]
    assert sum(len(x) for x in inside) == len(driver)  # no driver call outside a runtime one
    for outer in runtime:
        for inner in _nested(outer, driver):
            assert (inner.pid, inner.tid) == (outer.pid, outer.tid) == (tracer.child_pid,) * 2
            assert inner.duration_ns < outer.duration_ns
    assert tracer.stats_at_end == {"lost": 0, "unpaired": 0, "too_deep": 0, "entries_lost": 0}


def test_nested_driver_calls_carry_the_runtime_arguments(root, both):
    events, calls, _ = both
    done = exits(events)
    by: Dict[str, List[Event]] = {}
    for e in done:
        by.setdefault(e.api, []).append(e)
    (malloc,), (alloc,) = by["cudaMalloc"], by["cuMemAlloc_v2"]
    assert malloc.outs == alloc.outs == {"ptr": device_ptr(0)}
    assert alloc.args == {"size": 4000}
    (launch,), (cu_launch,) = by["cudaLaunchKernel"], by["cuLaunchKernel"]
    assert cu_launch.args == {"func": launch.args["func"], "grid": (2, 1, 1),
                              "block": (64, 1, 1), "smem": 256, "stream": 0x5}
    (ex,), (cu_ex,) = by["cudaLaunchKernelExC"], by["cuLaunchKernelEx"]
    assert {k: ex.args[k] for k in ("grid", "block", "smem", "stream", "func")} == {
        k: cu_ex.args[k] for k in ("grid", "block", "smem", "stream", "func")} == {
        "grid": (4, 2, 1), "block": (32, 2, 1), "smem": 16, "stream": 0x6,
        "func": launch.args["func"]}
    (host,), (cu_host,) = by["cudaMallocHost"], by["cuMemHostAlloc"]
    assert host.outs == cu_host.outs == {"ptr": host_ptr(0)}
    assert (cu_host.args, cu_host.ret_name, host.ret_name) == (
        {"size": 64, "flags": 0}, "CUDA_SUCCESS", "cudaSuccess")


@pytest.mark.parametrize("api", ["runtime", "driver"])
def test_api_selects_one_layer(root, layered, api):
    lib, driver, prog = layered
    events, calls, tracer = trace_command([prog, *(op for op, _ in LAYERED_OPS)], api=api)
    want_driver = api == "driver"
    assert {a.path for a in tracer.attachments} == {
        os.path.realpath(driver if want_driver else lib)}
    assert all(apis.BY_NAME[a.api].driver == want_driver for a in tracer.attachments)
    if want_driver:
        expected = [fn for _, nested in LAYERED_OPS for fn in nested]
    else:
        expected = [c.fn for c in calls]
    assert [e.api for e in exits(events)] == expected


def test_function_patterns_select_rows_of_either_layer(root, layered):
    lib, driver, prog = layered
    events, _, tracer = trace_command([prog, *(op for op, _ in LAYERED_OPS)],
                                      functions=["cuMem*"])
    assert {a.path for a in tracer.attachments} == {os.path.realpath(driver)}
    assert {a.api for a in tracer.attachments} == {
        a.name for a in apis.TABLE if a.name.startswith("cuMem")}
    assert [e.api for e in exits(events)] == [
        "cuMemAlloc_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2",
        "cuMemcpyAsync", "cuMemsetD8_v2", "cuMemsetD8Async", "cuMemAllocAsync",
        "cuMemFreeAsync", "cuMemHostAlloc", "cuMemFree_v2"]
    events, _, tracer = trace_command([prog, *(op for op, _ in LAYERED_OPS)],
                                      functions=["cudaMalloc*", "cuLaunch*"])
    assert {a.api for a in tracer.attachments} == {
        "cudaMalloc", "cudaMallocManaged", "cudaMallocHost", "cudaMallocAsync",
        "cudaMallocPitch", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel"}
    assert [e.api for e in exits(events)] == ["cudaMalloc", "cuLaunchKernel",
                                               "cuLaunchKernelEx", "cudaMallocAsync",
                                               "cudaMallocHost"]


# ---- memory correlation --------------------------------------------------------------------

needs_memory = pytest.mark.skipif(LeakTracker is None,
                                  reason="ebpf_cuda.analysis.memory is not there yet")


@needs_memory
def test_runtime_allocations_are_matched_with_their_own_frees(root, cc):
    lib, prog = build_fake_cuda(cc)
    ops = ["malloc:4000", "mallocasync:128:0x5", "mallochost:64", "hostalloc:32:1",
           "freeasync:@1:0x5", "freehost:@0", "freehost:@1", "free:@0", "malloc:8"]
    events, _, _ = trace_command([prog, *ops], library=[str(lib)])
    tracker = LeakTracker()
    assert tracker.feed_all(events) == []
    freed = sorted(((a.api, a.freed_by) for a in tracker.freed.values()))
    assert freed == [("cudaHostAlloc", "cudaFreeHost"), ("cudaMalloc", "cudaFree"),
                     ("cudaMallocAsync", "cudaFreeAsync"), ("cudaMallocHost", "cudaFreeHost")]
    assert [(a.api, a.size) for a in tracker.leaks()] == [("cudaMalloc", 8)]


@needs_memory
def test_driver_allocations_are_matched_with_their_own_frees(root, cc):
    lib, prog = build_fake_driver(cc)
    ops = ["init", "malloc:4096", "mallocasync:256:0x51", "mallocmanaged:64:1",
           "free:@0", "freeasync:@1:0x51", "freeasyncptsz:@2:0x52", "hostalloc:512"]
    events, _, _ = trace_command([prog, *ops], library=[str(lib)])
    tracker = LeakTracker()
    assert tracker.feed_all(events) == []
    freed = sorted(((a.api, a.freed_by) for a in tracker.freed.values()))
    assert freed == [("cuMemAllocAsync", "cuMemFreeAsync"),
                     ("cuMemAllocManaged", "cuMemFreeAsync"), ("cuMemAlloc_v2", "cuMemFree_v2")]
    assert [(a.api, a.size, a.ptr) for a in tracker.leaks()] == [
        ("cuMemHostAlloc", 512, host_ptr(0))]


@needs_memory
@pytest.mark.parametrize("api", ["runtime", "driver"])
def test_one_layer_of_the_layered_stack_balances(root, layered, api):
    _, _, prog = layered
    events, _, _ = trace_command([prog, *(op for op, _ in LAYERED_OPS)], api=api)
    tracker = LeakTracker()
    assert tracker.feed_all(events) == []
    leaks = [(a.api, a.size) for a in tracker.leaks()]
    # the runtime's cudaFreeHost calls no driver function: seen from the driver, it leaks
    assert leaks == ([] if api == "runtime" else [("cuMemHostAlloc", 64)])


@needs_memory
def test_both_layers_count_each_allocation_once(root, both):
    """One cudaMalloc is one allocation even though the driver's cuMemAlloc_v2 inside it
    hands out the same pointer."""
    events, _, _ = both
    tracker = LeakTracker()
    warnings = tracker.feed_all(events)
    assert [str(w) for w in warnings] == []
    assert tracker.allocations == 3  # cudaMalloc, cudaMallocAsync, cudaMallocHost


# ---- children of the command ---------------------------------------------------------------

@pytest.fixture(scope="module")
def driver_prog(cc):
    return build_fake_driver(cc)


# The children stay alive a while after their calls: the tracer places a process in the
# command's tree from /proc when it decodes its first event (see the short-lived test below).
CHILD_OPS = ("init", "malloc:64", "fork:malloc:128+free+sleep:300",
             "spawn:init+malloc:256+free+sleep:300", "free:@0")
QUICK_OPS = ("init", "malloc:64", "fork:malloc:128+free", "spawn:init+malloc:256+free",
             "free:@0")


def _allocs(events: List[Event]) -> List[Tuple[int, int]]:
    return [(e.pid, e.args["size"]) for e in exits(events) if e.api == "cuMemAlloc_v2"]


def test_forked_and_execd_children_are_followed(root, driver_prog):
    lib, prog = driver_prog
    events, calls, tracer = trace_command([prog, *CHILD_OPS], library=[str(lib)])
    parent = tracer.child_pid
    pids = {c.fields["pid"] for c in calls}
    assert len(pids) == 3 and str(parent) in pids
    printed = [(int(c.fields["pid"]), c.fn) for c in calls]
    assert [(e.pid, e.api) for e in exits(events)] == printed
    assert sorted(size for _, size in _allocs(events)) == [64, 128, 256]
    assert {pid for pid, _ in _allocs(events)} == {int(p) for p in pids}


def test_children_are_not_followed_when_asked_not_to(root, driver_prog):
    lib, prog = driver_prog
    events, calls, tracer = trace_command([prog, *CHILD_OPS], library=[str(lib)],
                                          follow_children=False)
    parent = tracer.child_pid
    assert len({c.fields["pid"] for c in calls}) == 3
    assert [(e.pid, e.api) for e in exits(events)] == [
        (parent, "cuInit"), (parent, "cuMemAlloc_v2"), (parent, "cuMemFree_v2")]


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_grandchildren_under_a_shell_are_followed(root, driver_prog):
    """`sh -c` runs the program as a child (the `; true` keeps the shell from exec'ing it),
    which forks and spawns grandchildren of the traced command."""
    lib, prog = driver_prog
    script = "%s %s; true" % (prog, " ".join(CHILD_OPS))
    events, calls, tracer = trace_command(["sh", "-c", script], library=[str(lib)])
    shell = tracer.child_pid
    pids = {int(c.fields["pid"]) for c in calls}
    assert len(pids) == 3 and shell not in pids
    assert sorted(size for _, size in _allocs(events)) == [64, 128, 256]
    assert {e.pid for e in events} == pids
    events, calls, _ = trace_command(["sh", "-c", script], library=[str(lib)],
                                     follow_children=False)
    assert len(calls) == 8 and events == []


def test_short_lived_grandchildren_are_followed(root, driver_prog):
    lib, prog = driver_prog
    script = "%s %s; true" % (prog, " ".join(QUICK_OPS))
    for _ in range(5):
        events, calls, tracer = trace_command(["sh", "-c", script], library=[str(lib)])
        assert len(exits(events)) == len(calls) == 8, tracer.stats()


# ---- every analysis counts an operation once -------------------------------------------------

def test_summary_and_html_report_count_each_operation_once(root, both):
    """Each runtime copy, memset and launch above makes one driver call inside it: the
    summary and the HTML report (the same layering rule) count each operation once."""
    import io

    from ebpf_cuda.analysis import Summary
    from ebpf_cuda.output.html_report import HtmlReport

    events, _, _ = both
    summary = Summary()
    summary.add(events)
    memory = {line[line.index("["):]: line.split()[1]
              for line in summary.memory_table().splitlines()[4:]}
    assert memory == {"[CUDA memcpy Host-to-Device]": "1", "[CUDA memcpy Device-to-Host]": "1",
                      "[CUDA memcpy Device-to-Device]": "1", "[CUDA memset]": "2",
                      "[CUDA memcpy Default (unified addressing)]": "1"}
    assert sum(summary.launches.values()) == 2
    stream = io.StringIO()
    stream.close = lambda: None
    report = HtmlReport(stream)
    report.write(events)
    report.close()
    assert {d: row[:2] for d, row in report.copies.items()} == {
        "Host-to-Device": [1, 4000], "Device-to-Host": [1, 64], "Device-to-Device": [1, 64],
        "Default (unified addressing)": [1, 64]}
    assert sum(n for n, _ in report.kernels.values()) == 2
    assert (report.memory.allocations, report.memory.releases, report.memory.double_frees) == \
        (3, 3, 0)
