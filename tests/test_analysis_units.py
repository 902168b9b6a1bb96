"""The analysis logic on hand-made events: statistics, summary tables, leak tracking, stacks
and kernel naming in this very process (no probes)."""
import ctypes
import json
import os
import re
import statistics
import subprocess
from pathlib import Path

import pytest

from ebpf_cuda.spec import apis
from ebpf_cuda.analysis import (ALLOCATORS, FREES, AddressResolver, Frame, KernelNamer,
                                LeakTracker, Summary, copy_operation, format_leaks, percentile,
                                stats)
from ebpf_cuda.analysis._table import clock
from ebpf_cuda.analysis.memory import DOUBLE_FREE, MISMATCHED_FREE, UNKNOWN_FREE, format_stack
from ebpf_cuda.decode.events import ENTER, EXIT
from helpers import event

NATIVE = Path(__file__).parent / "native"
PID = 4242


def ev(api, args=None, ret=0, duration=1000, outs=None, ts=1.0, pid=PID, tid=None, stack_id=0,
       phase=EXIT):
    ret_name = "cudaSuccess" if ret == 0 else "error%d" % ret
    return event(api, phase, args, ts=ts, ts_ns=int(ts * 1e9), pid=pid, tid=tid or pid,
                 ret=ret, ret_name=ret_name, duration_ns=duration, outs=dict(outs or {}),
                 stack_id=stack_id)


def malloc(ptr, size, ret=0, api="cudaMalloc", **kw):
    return ev(api, {"size": size}, ret, outs={"ptr": ptr} if ret == 0 else {}, **kw)


def free(ptr, api="cudaFree", ret=0, **kw):
    return ev(api, {"ptr": ptr}, ret, **kw)


# ---- statistics -------------------------------------------------------------------------

@pytest.mark.parametrize("values", [[5], [1, 2], [3, 1, 2], [10, 1, 7, 7, 2, 100], list(range(1, 101))])
def test_stats_are_exact(values):
    s = stats(values)
    assert s.count == len(values) and s.total == sum(values)
    assert s.median == statistics.median(values)
    assert s.minimum == min(values) and s.maximum == max(values)
    assert s.mean == pytest.approx(statistics.mean(values))
    expected_sd = statistics.stdev(values) if len(values) > 1 else 0.0
    assert s.stdev == pytest.approx(expected_sd)


def test_percentiles_interpolate_between_ranks():
    ordered = list(range(1, 101))  # 1..100
    assert percentile(ordered, 50) == 50.5
    assert percentile(ordered, 95) == pytest.approx(95.05)
    assert percentile(ordered, 99) == pytest.approx(99.01)
    assert percentile(ordered, 100) == 100 and percentile(ordered, 0) == 1
    assert percentile([7], 99) == 7


# ---- summary ----------------------------------------------------------------------------

def _summary_events():
    return [
        malloc(0x1000, 4096, duration=3000),
        malloc(0x2000, 1 << 41, ret=2, duration=1000),
        ev("cudaMemcpy", {"size": 2_000_000, "kind": "HostToDevice"}, duration=1_000_000),
        ev("cudaMemcpy", {"size": 4_000_000, "kind": "HostToDevice"}, duration=1_000_000),
        ev("cudaMemcpy", {"size": 1_000_000, "kind": "DeviceToHost"}, duration=500_000),
        ev("cudaMemcpy", {"size": 8, "kind": 7}, ret=21, duration=100),
        ev("cudaMemcpyAsync", {"size": 3_000_000, "kind": "DeviceToDevice", "stream": 0},
           duration=2000),
        ev("cudaLaunchKernel", {"func": 0xAAA, "grid": (4, 1, 1), "block": (256, 1, 1),
                                "smem": 0, "stream": 0}, duration=4000),
        ev("cudaLaunchKernel", {"func": 0xAAA, "grid": (4, 1, 1), "block": (256, 1, 1),
                                "smem": 0, "stream": 0}, duration=6000),
        ev("cudaLaunchKernel", {"func": 0xBBB, "grid": (8, 2, 1), "block": (32, 8, 1),
                                "smem": 1024, "stream": 0x5000}, duration=5000),
        ev("cudaLaunchKernel", {"func": 0xBBB, "grid": (1, 1, 1), "block": (2048, 1, 1),
                                "smem": 0, "stream": 0}, ret=9, duration=1000),
        free(0x1000, duration=2000),
        ev("cudaFree", {"ptr": 0x1000}, phase=ENTER),  # enter events are not calls
    ]


def _names(event, address):
    return {0xAAA: "vecAdd(float const*, float const*, float*, int)"}.get(address)


def test_summary_tables_exact():
    summary = Summary(namer=_names)
    summary.add(_summary_events())
    assert summary.api_table() == "\n".join([
        " ** CUDA API Summary (cuda_api_sum):",
        "",
        " Time (%)  Total Time (ns)  Num Calls   Avg (ns)   Med (ns)  Min (ns)   Max (ns)  StdDev (ns)  Name",
        " --------  ---------------  ---------  ---------  ---------  --------  ---------  -----------  ----------------",
        "     99.0        2,500,100          4  625,025.0  750,000.0       100  1,000,000    478,670.0  cudaMemcpy",
        "      0.6           16,000          4    4,000.0    4,500.0     1,000      6,000      2,160.2  cudaLaunchKernel",
        "      0.2            4,000          2    2,000.0    2,000.0     1,000      3,000      1,414.2  cudaMalloc",
        "      0.1            2,000          1    2,000.0    2,000.0     2,000      2,000          0.0  cudaFree",
        "      0.1            2,000          1    2,000.0    2,000.0     2,000      2,000          0.0  cudaMemcpyAsync",
    ])
    assert summary.memory_table() == "\n".join([
        " ** CUDA Memory Operation Summary by Size (cuda_gpu_mem_size_sum):",
        "",
        " Total (MB)  Count  Avg (MB)  Med (MB)  Min (MB)  Max (MB)  StdDev (MB)  Operation",
        " ----------  -----  --------  --------  --------  --------  -----------  ------------------------------",
        "      6.000      2     3.000     3.000     2.000     4.000        1.414  [CUDA memcpy Host-to-Device]",
        "      3.000      1     3.000     3.000     3.000     3.000        0.000  [CUDA memcpy Device-to-Device]",
        "      1.000      1     1.000     1.000     1.000     1.000        0.000  [CUDA memcpy Device-to-Host]",
    ])
    # Asynchronous copies have no bandwidth: the call returns before the bytes move.
    assert summary.bandwidth_table() == "\n".join([
        " ** Synchronous Copy Bandwidth (bytes / call duration):",
        "",
        " Count  Total (MB)  Total Time (ns)  Bandwidth (GB/s)  Med Call (GB/s)  Operation",
        " -----  ----------  ---------------  ----------------  ---------------  ----------------------------",
        "     1       1.000          500,000             2.000            2.000  [CUDA memcpy Device-to-Host]",
        "     2       6.000        2,000,000             3.000            3.000  [CUDA memcpy Host-to-Device]",
    ])
    assert summary.error_table() == "\n".join([
        " ** CUDA API Errors:",
        "",
        " Count  Code  Error    Name",
        " -----  ----  -------  ----------------",
        "     1     9  error9   cudaLaunchKernel",
        "     1     2  error2   cudaMalloc",
        "     1    21  error21  cudaMemcpy",
    ])
    assert summary.kernel_table() == "\n".join([
        " ** Kernel Launches:",
        "",
        " Launches  Grid     Block      Smem (bytes)  Kernel",
        " --------  -------  ---------  ------------  -----------------------------------------------",
        "        2  (4,1,1)  (256,1,1)             0  vecAdd(float const*, float const*, float*, int)",
        "        1  (8,2,1)  (32,8,1)          1,024  0xbbb",
    ])
    percentiles = summary.percentile_table().splitlines()
    assert percentiles[4] == ("         4  750,000.0  1,000,000.0  1,000,000.0  1,000,000  "
                              "cudaMemcpy")
    assert percentiles[5] == ("         4    4,500.0      5,850.0      5,970.0      6,000  "
                              "cudaLaunchKernel")
    assert summary.report().count(" ** ") == 6


def test_summary_asks_the_namer_once_per_process_and_address():
    asked = []
    summary = Summary(namer=lambda event, address: asked.append((event.pid, address)))
    summary.add(_summary_events() * 3)
    assert sorted(asked) == [(PID, 0xAAA), (PID, 0xBBB)]


def test_summary_of_nothing():
    text = Summary().report()
    assert "(no completed calls)" in text and "(no kernel launches)" in text


def test_driver_launch_geometry_and_memset_elements():
    summary = Summary()
    summary.add([
        ev("cuLaunchKernel", {"func": 0x99, "gridX": 2, "gridY": 3, "gridZ": 1, "blockX": 64,
                              "blockY": 1, "blockZ": 1, "smem": 0, "stream": 0}),
        ev("cuMemsetD32_v2", {"ptr": 1, "value": 0, "count": 250_000}),
        ev("cuMemcpyHtoD_v2", {"dst": 1, "src": 2, "size": 1_000_000}),
    ])
    assert "(2,3,1)  (64,1,1)" in summary.kernel_table()
    memory = summary.memory_table()
    assert "1.000      1     1.000     1.000     1.000     1.000        0.000  [CUDA memset]" \
        in memory
    assert "[CUDA memcpy Host-to-Device]" in memory


@pytest.mark.parametrize("api,args,operation", [
    ("cudaMemcpy", {"kind": "HostToDevice"}, "[CUDA memcpy Host-to-Device]"),
    ("cudaMemcpy", {"kind": "DeviceToHost"}, "[CUDA memcpy Device-to-Host]"),
    ("cudaMemcpy", {"kind": "DeviceToDevice"}, "[CUDA memcpy Device-to-Device]"),
    ("cudaMemcpy", {"kind": "HostToHost"}, "[CUDA memcpy Host-to-Host]"),
    ("cudaMemcpyPeer", {}, "[CUDA memcpy Peer-to-Peer]"),
    ("cuMemcpyDtoH_v2", {}, "[CUDA memcpy Device-to-Host]"),
    ("cudaMemset", {}, "[CUDA memset]"),
    ("cudaMalloc", {}, None),
])
def test_copy_operations(api, args, operation):
    assert copy_operation(ev(api, args)) == operation


# ---- leaks ------------------------------------------------------------------------------

def test_allocations_matched_with_frees_and_misuse_flagged():
    seen = []
    tracker = LeakTracker(on_warning=seen.append)
    events = [malloc(0x1000, 100, ts=1.0), malloc(0x2000, 200, ts=2.0),
              malloc(0, 1 << 41, ret=2, ts=2.5),       # failed: nothing live
              malloc(0, 0, ts=2.6),                    # zero bytes: NULL, nothing live
              free(0x1000, ts=3.0), free(0x1000, ts=4.0),   # double free
              free(0xdead, ts=5.0),                    # unknown pointer
              free(0, ts=5.5)]                         # freeing NULL does nothing
    raised = tracker.feed_all(events)
    assert [w.kind for w in raised] == [DOUBLE_FREE, UNKNOWN_FREE]
    assert seen == raised  # reported as they happened
    assert str(raised[0]) == ("double free: cudaFree(0x1000) in pid 4242: 100 bytes from "
                              "cudaMalloc, already freed by cudaFree")
    assert str(raised[1]) == "free of an unknown pointer: cudaFree(0xdead) in pid 4242"
    assert [(a.ptr, a.size) for a in tracker.leaks()] == [(0x2000, 200)]
    assert tracker.timeline == [(1.0, PID, 100), (2.0, PID, 300), (3.0, PID, 200)]
    assert tracker.live_bytes(PID) == 200 and tracker.peak_bytes(PID) == 300


def test_a_failed_free_keeps_the_allocation_but_double_free_is_still_flagged():
    tracker = LeakTracker()
    tracker.feed_all([malloc(0x1000, 64), free(0x1000, ret=1)])
    assert len(tracker.leaks()) == 1 and not tracker.warnings
    tracker.feed_all([free(0x1000), free(0x1000, ret=1)])
    assert not tracker.leaks() and [w.kind for w in tracker.warnings] == [DOUBLE_FREE]


def test_a_reused_address_is_a_new_allocation():
    tracker = LeakTracker()
    tracker.feed_all([malloc(0x1000, 64), free(0x1000), malloc(0x1000, 32), free(0x1000)])
    assert not tracker.warnings and not tracker.leaks() and tracker.allocations == 2


def test_pointers_are_per_process():
    tracker = LeakTracker()
    tracker.feed_all([malloc(0x1000, 64, pid=1), free(0x1000, pid=2)])
    assert [w.kind for w in tracker.warnings] == [UNKNOWN_FREE]
    assert [a.pid for a in tracker.leaks()] == [1]


def test_each_allocation_is_freed_by_its_own_family():
    tracker = LeakTracker()
    tracker.feed_all([malloc(0x7e00, 4096, api="cudaMallocHost"), free(0x7e00, "cudaFree"),
                      malloc(0x7f00, 512, api="cudaMallocAsync"), free(0x7f00, "cudaFree"),
                      malloc(0x8000, 8, api="cudaMallocManaged"),
                      free(0x8000, "cudaFreeAsync")])
    assert [w.kind for w in tracker.warnings] == [MISMATCHED_FREE]
    assert str(tracker.warnings[0]) == ("mismatched free: cudaFree(0x7e00) in pid 4242 releases "
                                        "memory of cudaMallocHost (freed by cudaFreeHost)")


def test_pitch_allocation_size_is_pitch_times_height():
    tracker = LeakTracker()
    tracker.feed(ev("cudaMallocPitch", {"width": 1000, "height": 3},
                    outs={"ptr": 0x1000, "pitch": 1024}))
    assert tracker.leaks()[0].size == 3072


def test_new_allocators_plug_in_by_table():
    from ebpf_cuda.analysis import Allocator
    tracker = LeakTracker(allocators={"myAlloc": Allocator("out", ("n", "each"), ("myFree",))},
                          frees={"myFree": "p"})
    tracker.feed_all([ev("myAlloc", {"n": 4, "each": 8}, outs={"out": 0x10}),
                      ev("myFree", {"p": 0x10}), ev("myFree", {"p": 0x10})])
    assert [w.kind for w in tracker.warnings] == [DOUBLE_FREE] and tracker.allocations == 1


def test_allocator_table_agrees_with_the_function_table():
    """Every allocator or free the function table traces is read by the names it has there."""
    for name, allocator in ALLOCATORS.items():
        row = apis.BY_NAME.get(name)
        if row is None:
            continue
        fields = {a.name for a in row.args} | {o.name for o in row.outs}
        assert allocator.ptr in {o.name for o in row.outs}, name
        assert set(allocator.size) <= fields, name
        assert all(f in FREES for f in allocator.frees), name
    for name, arg in FREES.items():
        row = apis.BY_NAME.get(name)
        if row is not None:
            assert arg in {a.name for a in row.args}, name
    # (page-locking memory allocated before, cudaHostRegister, is no allocation: analyze's)
    pins = (apis.Role.HOST_REGISTER, apis.Role.HOST_UNREGISTER)
    traced = {row.name for row in apis.TABLE if row.category == "memory" and row.role not in pins}
    assert {"cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost"} <= traced
    assert traced <= set(ALLOCATORS) | set(FREES), traced - set(ALLOCATORS) - set(FREES)


def test_leak_report_exact():
    tracker = LeakTracker()
    tracker.feed_all([malloc(0x7f0000200000, 1 << 20, ts=100.25, tid=4243),
                      malloc(0x7f0000000000, 4096, ts=100.5)])
    assert format_leaks(tracker) == "\n".join([
        "Leaks: 2 of 2 allocations never freed, 1,052,672 bytes in 1 process",
        "  PID   TID  Pointer         Size (bytes)  Allocator   Time",
        " ----  ----  --------------  ------------  ----------  ---------------",
        " 4242  4243  0x7f0000200000     1,048,576  cudaMalloc  %s" % clock(100.25),
        " 4242  4242  0x7f0000000000         4,096  cudaMalloc  %s" % clock(100.5),
    ])
    tracker.feed_all([free(0x7f0000200000), free(0x7f0000000000)])
    assert format_leaks(tracker) == "Leaks: none (2 allocations, all freed)"


# ---- addresses, stacks, kernel names in this process -------------------------------------

@pytest.fixture(scope="module")
def kernels_lib(tmp_path_factory):
    """tests/native/kernels_lib.cpp built with g++ (not yet loaded)."""
    out = tmp_path_factory.mktemp("kernels") / "libkernels_unit.so"
    subprocess.run(["g++", "-O2", "-g", "-shared", "-fPIC", "-fno-omit-frame-pointer",
                    "-I", str(NATIVE), "-o", str(out), str(NATIVE / "kernels_lib.cpp"),
                    "-Wl,--unresolved-symbols=ignore-all"], check=True)
    return out


def _load(path):
    # Lazy binding: the library's cudaLaunchKernel is never called here, so never resolved.
    return ctypes.CDLL(str(path), mode=os.RTLD_LAZY | os.RTLD_LOCAL)


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


def test_namer_rereads_the_maps_for_a_library_opened_later(kernels_lib):
    namer = KernelNamer()
    namer.observe_pids([os.getpid()])  # first snapshot: library not mapped
    lib = _load(kernels_lib)
    saxpy = _address(lib._Z5saxpyifPKfPf)
    relu = _address(lib.relu_kernel)
    assert namer.name(os.getpid(), saxpy) == "saxpy(int, float, float const*, float*)"
    assert namer.name(os.getpid(), relu) == "relu_kernel"
    launch = ev("cudaLaunchKernel", {"func": saxpy}, pid=os.getpid())
    assert namer(launch, saxpy) == "saxpy(int, float, float const*, float*)"
    assert namer.name(os.getpid(), saxpy + 1) is None  # inside a function: not a kernel


def test_local_symbols_resolve_through_the_load_bias(kernels_lib):
    from ebpf_cuda.targets.elf import open_elf
    lib = _load(kernels_lib)
    elf = open_elf(str(kernels_lib))
    # The library's load bias, from a known exported function, applied to a local one.
    bias = _address(lib.relu_kernel) - elf.symbol_address("relu_kernel")
    hidden = bias + elf.symbol_address("_ZL13hidden_kernelPf")
    assert KernelNamer().name(os.getpid(), hidden) == "hidden_kernel(float*)"


def test_driver_launches_are_named_by_their_handle():
    namer = KernelNamer(probe_names=lambda pid, handle, when: "k%x" % handle)
    namer.learn([ev("cuModuleGetFunction", ret=0, outs={"function": 0x55})])
    launch = ev("cuLaunchKernel", {"func": 0x55})
    assert namer(launch, 0x55) == "k55"
    assert namer(ev("cuLaunchKernel", {"func": 0x56}), 0x56) is None
    assert KernelNamer()(launch, 0x55) is None


def test_unmapped_and_dead_processes_give_no_name():
    assert KernelNamer().name(os.getpid(), 0x10) is None
    assert KernelNamer().name(2 ** 22 + 12345, 0x400000) is None  # no such process


def test_stack_frames_symbolized(kernels_lib):
    lib = _load(kernels_lib)
    relu = _address(lib.relu_kernel)
    saxpy = _address(lib._Z5saxpyifPKfPf)
    resolver = AddressResolver()
    lines = format_stack(os.getpid(), [relu, saxpy + 5, 0x10], resolver)
    name = kernels_lib.name
    assert lines == ["      #0 relu_kernel+0x0 (%s)" % name,
                     "      #1 saxpy(int, float, float const*, float*)+0x5 (%s)" % name,
                     "      #2 0x10"]
    assert format_stack(os.getpid(), [], resolver) == ["      (no stack)"]
    frame = resolver.frame(os.getpid(), saxpy)
    assert frame == Frame("saxpy(int, float, float const*, float*)", 0, str(kernels_lib))


# ---- scripts/gpu/check_trace.py on a hand-made trace --------------------------------------

def _check_trace_module():
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "scripts" / "gpu" / "check_trace.py"
    spec = importlib.util.spec_from_file_location("check_trace", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_trace_reports_resolution_and_locates_unnamed(tmp_path, capsys):
    libc = ctypes.CDLL(None)
    inside_printf = _address(libc.printf) + 1
    pid = os.getpid()

    def launch(func, kernel=None, ts=1.0):
        obj = {"ts": ts, "pid": pid, "tid": pid, "comm": "t", "api": "cudaLaunchKernel",
               "phase": "exit", "args": {"func": func, "grid": [4, 1, 1], "block": [256, 1, 1],
                                         "smem": 0, "stream": 0},
               "ret": 0, "ret_name": "cudaSuccess", "duration_ns": 1000}
        if kernel:
            obj["kernel"] = kernel
        return obj

    lines = [launch(0x1000, "vecAdd(float const*, float const*, float*, int)")] * 3 + \
        [launch(inside_printf),
         {"ts": 2.0, "pid": pid, "tid": pid, "comm": "t", "api": "cudaMalloc", "phase": "exit",
          "args": {"size": 64}, "ret": 0, "ret_name": "cudaSuccess", "duration_ns": 10,
          "ptr": 0x7f00},
         {"ts": 3.0, "pid": pid, "tid": pid, "comm": "t", "api": "cudaMemcpy", "phase": "exit",
          "args": {"dst": 1, "src": 2, "size": 100, "kind": "HostToDevice"}, "ret": 0,
          "ret_name": "cudaSuccess", "duration_ns": 10}]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    check = _check_trace_module()
    assert check.main([str(trace), "--maps", "/proc/self/maps", "--expect-leak", "64",
                       "--expect-copy", "HostToDevice=100"]) == 0
    out = capsys.readouterr().out
    assert "6 events, 4 launches, 3 named: 75.0% resolved" in out
    assert "       3  vecAdd(float const*, float const*, float*, int)" in out
    assert re.search(r"unnamed 0x%x \(1 launches\): \w*printf\+0x1 \(libc\.so\.6\)"
                     % inside_printf, out), out
    assert "Leaks: 1 of 1 allocations never freed, 64 bytes" in out
    assert check.main([str(trace), "--min-resolved", "0.9", "--expect-kernel", "nope"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: 75.0% of launches named" in out and "FAIL: kernel 'nope' never named" in out


# ---- roles from the function table, layers, in-kernel tables ----------------------------

def test_operations_come_from_the_table_roles():
    from ebpf_cuda.decode.operations import copy_bytes, event_bytes, is_synchronous_copy

    assert copy_operation(ev("cuMemcpyHtoDAsync_v2", {"size": 8})) == \
        "[CUDA memcpy Host-to-Device]"
    assert copy_operation(ev("cudaMemcpy2DAsync", {"kind": "DeviceToHost"})) == \
        "[CUDA memcpy Device-to-Host]"
    assert copy_operation(ev("cuMemsetD32Async", {"count": 4})) == "[CUDA memset]"
    assert copy_operation(ev("cuMemAlloc_v2", {"size": 4})) is None
    assert copy_operation(ev("notInTheTable", {"size": 4})) is None
    assert copy_bytes(ev("cuMemsetD32_v2", {"count": 250})) == 1000
    assert copy_bytes(ev("cudaMemcpy2D", {"width": 100, "height": 3})) == 300
    assert event_bytes(malloc(0x10, 64)) == 64
    assert event_bytes(ev("cudaMallocPitch", {"width": 1000, "height": 3},
                          outs={"pitch": 1024})) == 3072
    assert is_synchronous_copy(ev("cuMemcpyDtoH_v2")) and \
        not is_synchronous_copy(ev("cudaMemcpyAsync")) and not is_synchronous_copy(ev("cudaMemset"))


def _nested(outer, inner, start, ts=1.0, tid=None):
    """A runtime call and the driver call inside it (the inner one returns first)."""
    return [ev(inner[0], inner[1], outs=inner[2] if len(inner) > 2 else None, duration=500,
               ts=ts + start + 0.0000007, tid=tid),
            ev(outer[0], outer[1], outs=outer[2] if len(outer) > 2 else None, duration=2000,
               ts=ts + start + 0.000001, tid=tid)]


def test_a_copy_through_both_layers_counts_once_and_a_direct_driver_copy_counts():
    summary = Summary()
    summary.add(_nested(("cudaMemcpy", {"size": 4000, "kind": "HostToDevice"}),
                        ("cuMemcpyHtoD_v2", {"size": 4000}), 0.0)
                + [ev("cuMemcpyHtoD_v2", {"size": 96}, ts=1.5)])
    memory = summary.memory_table()
    assert "0.004      2" in memory and memory.count("[CUDA memcpy") == 1


def test_long_kernel_names_are_cut_in_the_table():
    from ebpf_cuda.analysis.summary import KERNEL_NAME_WIDTH

    name = "void at::native::vectorized_elementwise_kernel<4, " + "x" * 1000 + ">(int)"
    summary = Summary(namer=lambda event, address: name)
    summary.add([ev("cudaLaunchKernel", {"func": 0xAAA, "grid": (4, 1, 1),
                                         "block": (256, 1, 1), "smem": 0, "stream": 0})])
    lines = summary.kernel_table().splitlines()
    assert max(len(line) for line in lines) < KERNEL_NAME_WIDTH + 50
    assert lines[-1].endswith("...") and lines[-1].split("  ")[-1].startswith("void at::native")
    assert summary.kernel_names()[(PID, 0xAAA)] == name  # whole where names are kept


def test_leak_tracker_counts_allocations_frees_and_double_frees_once_across_layers():
    events = (_nested(("cudaMalloc", {"size": 64}, {"ptr": 0x10}),
                      ("cuMemAlloc_v2", {"size": 64}, {"ptr": 0x10}), 0.0)
              + _nested(("cudaFree", {"ptr": 0x10}), ("cuMemFree_v2", {"ptr": 0x10}), 0.1)
              + _nested(("cudaFree", {"ptr": 0x10}), ("cuMemFree_v2", {"ptr": 0x10}), 0.2))
    tracker = LeakTracker()
    raised = tracker.feed_all(events)
    assert [w.kind for w in raised] == [DOUBLE_FREE]
    assert (tracker.allocations, tracker.releases, tracker.double_frees) == (1, 1, 1)
    assert tracker.pids() == [PID]


def _stats(api, kind=None, count=1, errors=0, nbytes=0, total=1000):
    from ebpf_cuda.decode.aggregates import FunctionStats

    f = FunctionStats(api, kind)
    f.add_cpu((count, total, 1, total, errors, nbytes, 0) + (0,) * 40)
    return f


def test_in_kernel_copies_count_runtime_calls_and_the_driver_calls_beyond_them():
    from ebpf_cuda.analysis.kernel_summary import layered_operations

    HTOD, DEFAULT = "[CUDA memcpy Host-to-Device]", "[CUDA memcpy Default (unified addressing)]"
    ops = layered_operations([
        _stats("cudaMemcpy", 1, count=2, nbytes=8000),  # 2 HtoD, each through cuMemcpyHtoD_v2
        _stats("cuMemcpyHtoD_v2", count=3, nbytes=8096),  # ... and one direct of 96 bytes
        _stats("cudaMemcpyAsync", 1, count=1, nbytes=64),  # through cuMemcpyAsync (Default)
        _stats("cuMemcpyAsync", count=1, nbytes=64),
        _stats("cudaMemsetAsync", count=2, errors=1, nbytes=10),  # one failed: no driver call
        _stats("cuMemsetD32Async", count=3, nbytes=10 + 400),  # 1 nested + 2 direct
    ])
    assert ops[(HTOD, False)][:2] == (3, 8096)
    assert ops[(HTOD, True)][:2] == (1, 64)
    assert (DEFAULT, True) not in ops
    assert ops[("[CUDA memset]", True)][:2] == (3, 410)


def test_in_kernel_launch_geometry_is_decoded_from_the_counted_cells():
    from ebpf_cuda.decode.aggregates import Aggregates
    from ebpf_cuda.analysis.kernel_summary import launches

    cells = [0] * 10
    cells[0], cells[1], cells[2], cells[3], cells[4], cells[6] = \
        0xAAA, 4 | 1 << 32, 1, 256 | 1 << 32, 1, 64
    cu = [0x55, 2, 3, 1, 64, 1, 1, 0, 0, 0]
    agg = Aggregates([], {}, [(PID, "cudaLaunchKernel", tuple(cells), 3, 0),
                              (PID, "cuLaunchKernel", tuple(cu), 2, 0)])
    # with driver launches seen, runtime launches are theirs (every one makes a driver one)
    assert [(l.api, l.func, l.geometry, l.count) for l in launches(agg)] == [
        ("cuLaunchKernel", 0x55, ((2, 3, 1), (64, 1, 1), 0), 2)]
    agg.launches.pop()
    assert [(l.func, l.geometry, l.count) for l in launches(agg)] == [
        (0xAAA, ((4, 1, 1), (256, 1, 1), 64), 3)]
    summary = Summary(namer=_names)
    text = summary.report(agg)
    assert "       3  (4,1,1)  (256,1,1)            64  0xaaa" in text
