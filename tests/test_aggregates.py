"""In-kernel aggregation (--summary alone) gives the same counts and totals as the full
event stream: both are produced by the same return probe in one run, from the same times."""
import math
import statistics
from collections import Counter, defaultdict

import pytest

from ebpf_cuda.spec import apis
from ebpf_cuda.decode.aggregates import FunctionStats
from ebpf_cuda.decode.operations import byte_count
from ebpf_cuda.tracer import Tracer
from fakecuda import build_fake_cuda
from helpers import run_cli

pytestmark = pytest.mark.kernel

OPS = ["loop:500:malloc:4000", "memcpy:4000:1", "memcpy:100:2", "memcpy:50:2", "memcpy:7:3",
       "memset:0:4096", "memsetasync:1:64:0x5", "memcpy2d:100:3:1",
       "setdevice:7", "setdevice:9", "setdevice:1", "malloc:0x20000000000",
       "launch:4,1,1:256,1,1", "launch:4,1,1:256,1,1", "launch:8,2,1:32,4,1:64",
       "launch:1,1,1:2000,1,1", "loop:300:getdevice", "streamcreate", "free"]


@pytest.fixture(scope="module")
def both(cc):
    lib, prog = build_fake_cuda(cc)
    with Tracer(command=[str(prog), *OPS], library=[str(lib)], aggregate=True,
                everything=True) as tracer:
        exits = [e for e in tracer.events() if e.phase == "exit"]
        aggregates = tracer.aggregates()
        assert tracer.stats()["lost"] == 0
    return exits, aggregates


def test_per_function_counts_times_errors_and_bytes_match(both):
    exits, aggregates = both
    expected = defaultdict(lambda: FunctionStats("", None))
    for e in exits:
        kind = {"HostToHost": 0, "HostToDevice": 1, "DeviceToHost": 2, "DeviceToDevice": 3,
                "Default": 4}.get(e.args.get("kind")) if "kind" in e.args else None
        f = expected[(e.api, kind)]
        f.count += 1
        f.total_ns += e.duration_ns
        f.min_ns = e.duration_ns if not f.min_ns else min(f.min_ns, e.duration_ns)
        f.max_ns = max(f.max_ns, e.duration_ns)
        f.errors += e.ret != 0
        # bytes: the row's declared size fields (2D copies: width x height)
        f.bytes += (byte_count(apis.BY_NAME[e.api], e.args) or 0) if e.ret == 0 else 0
        f.sumsq += e.duration_ns ** 2
        f.histogram[int(math.log2(e.duration_ns))] += 1
    got = {(f.api, f.kind): f for f in aggregates.functions}
    assert set(got) == set(expected)
    for key, want in expected.items():
        have = got[key]
        assert (have.count, have.total_ns, have.min_ns, have.max_ns, have.errors, have.bytes,
                have.sumsq, have.histogram) == (
            want.count, want.total_ns, want.min_ns, want.max_ns, want.errors, want.bytes,
            want.sumsq, want.histogram), key
    assert got[("cudaMalloc", None)].count == 501
    assert got[("cudaMemcpy", 2)].bytes == 150
    assert got[("cudaMemcpy2D", 1)].bytes == 300
    assert got[("cudaMemset", None)].bytes == 4096
    assert got[("cudaGetDevice", None)].count == 300


def test_errors_by_function_and_code_match(both):
    exits, aggregates = both
    assert aggregates.errors == Counter((e.api, e.ret) for e in exits if e.ret)
    assert aggregates.errors[("cudaSetDevice", 101)] == 2
    assert aggregates.errors[("cudaMalloc", 2)] == 1


def test_launches_by_geometry_match(both):
    exits, aggregates = both
    # successful launches only, as the event summary counts them (block 2000 fails)
    launches = Counter((e.pid, e.args["grid"], e.args["block"], e.args["smem"])
                       for e in exits if e.api == "cudaLaunchKernel" and e.ret == 0)
    got = Counter()
    for pid, api, cells, count, total in aggregates.launches:
        grid = (cells[1] & 0xFFFFFFFF, cells[1] >> 32, cells[2])
        block = (cells[3] & 0xFFFFFFFF, cells[3] >> 32, cells[4])
        got[(pid, grid, block, cells[6])] += count
    assert got == launches
    assert sum(launches.values()) == 3


def test_summary_alone_uses_the_kernel_and_only_name_lookups_travel(cc):
    lib, prog = build_fake_cuda(cc)
    with Tracer(command=[str(prog), "loop:200:malloc:64", "getkernel", "launch:4,1,1:256,1,1",
                         "loop:300:launchhandle:2:32"],
                library=[str(lib)], aggregate=True, emit=False) as tracer:
        apis = Counter(e.api for e in tracer.events() if e.phase == "exit")
        aggregates = tracer.aggregates()
    counts = {f.api: f.count for f in aggregates.functions}
    assert apis == {"__cudaGetKernel": 1}  # records only for calls that teach kernel names
    assert counts == {"cudaMalloc": 200, "__cudaGetKernel": 1, "cudaLaunchKernel": 301}
    assert sorted(n for _pid, _api, _cells, n, _ns in aggregates.launches) == [1, 300]


def test_cli_summary_alone_prints_aggregate_tables(cc):
    lib, prog = build_fake_cuda(cc)
    out = run_cli("--summary", "-p", lib, "--", prog, "loop:300:malloc:64", "setdevice:9")
    assert out.returncode == 0, out.stderr
    assert "in-kernel aggregates" in out.stdout
    malloc_row = next(line for line in out.stdout.splitlines() if line.endswith(" cudaMalloc"))
    assert malloc_row.split()[2] == "300"
    assert "   1   101  cudaErrorInvalidDevice  cudaSetDevice" in out.stdout
    assert "[ENTER]" not in out.stdout


def test_cli_summary_alone_names_kernels_from_the_kernel_counts(cc):
    lib, prog = build_fake_cuda(cc)
    out = run_cli("--summary", "-p", lib, "--", prog, "getkernel", "loop:500:launchhandle:2:32",
                  "launch:4,1,1:256,1,1", "sleep:200")
    assert out.returncode == 0, out.stderr
    kernels = out.stdout.split("** Kernel Launches:")[1]
    assert "     500  (2,1,1)  (32,1,1)              0  vec_add_kernel" in kernels
    assert "       1  (4,1,1)  (256,1,1)             0  vec_add_kernel" in kernels


def test_summary_alone_counts_a_layered_copy_once(cc):
    from ebpf_cuda.analysis.kernel_summary import aggregate_tables
    from fakecuda_driver import build_layered_runtime

    layered, driver, prog = build_layered_runtime(cc)
    with Tracer(command=[str(prog), "malloc:4096", "memcpy:4096:1", "memcpy:4096:1",
                         "memcpy:100:2"], library=[str(layered), str(driver)],
                aggregate=True, emit=False) as tracer:
        list(tracer.events())
        agg = tracer.aggregates()
    counts = Counter()
    for f in agg.functions:
        counts[f.api] += f.count
    assert counts["cudaMemcpy"] == 3 and counts["cuMemcpyHtoD_v2"] == 2  # both layers seen
    memory = aggregate_tables(agg)[2]
    rows = {line.split()[-1]: line.split()[:2] for line in memory.splitlines()[4:]}
    assert rows["Host-to-Device]"] == ["0.008", "2"]
    assert rows["Device-to-Host]"] == ["0.000", "1"]


def test_standard_deviations_match_the_events_to_the_nanosecond(both):
    """Formerly the squares were of 64 ns units and the mean was not: calls of ~1 us with a
    spread of ~100 ns came out as ~0.0."""
    from ebpf_cuda.analysis.kernel_summary import _merge_kinds, stdev_ns

    exits, aggregates = both
    durations = defaultdict(list)
    for e in exits:
        durations[e.api].append(e.duration_ns)
    merged = {f.api: f for f in _merge_kinds(aggregates.functions)}
    for api, values in durations.items():
        want = statistics.stdev(values) if len(values) > 1 else 0.0
        assert stdev_ns(merged[api]) == pytest.approx(want, abs=0.01), api
    assert stdev_ns(merged["cudaMalloc"]) > 0


def test_standard_deviation_of_durations_around_100_ns():
    """Durations of 100 ns +- 50 (what PyTorch's fast calls take), through the reading of the
    SUMSQ cell and the table's arithmetic: right to well below a nanosecond."""
    import random

    from ebpf_cuda.decode.aggregates import AGG_VALUE, HIST_BUCKETS, read_aggregates
    from ebpf_cuda.analysis.kernel_summary import stdev_ns

    rng = random.Random(7)
    values = [rng.randint(50, 150) for _ in range(10_000)]
    cell = (len(values), sum(values), min(values), max(values), 0, 0,
            sum(v * v for v in values)) + (0,) * HIST_BUCKETS
    class Cells(dict):
        def __getitem__(self, index):
            return [AGG_VALUE.pack(*(cell if index == 0 else (0,) * (7 + HIST_BUCKETS)))]

    agg = read_aggregates(Cells(), {}, {})
    (f,) = agg.functions
    assert stdev_ns(f) == pytest.approx(statistics.stdev(values), abs=0.01)
    assert 25 < stdev_ns(f) < 35


def _kernel_sum_of_squares(durations, start=0):
    """Run the return probe's SUMSQ arithmetic (aggregates._sum_of_squares) in the kernel on
    each duration in turn (a socket filter run with BPF_PROG_TEST_RUN on a map cell holding
    the duration and the SUMSQ cell); the decoded sum of squares."""
    import ctypes
    import struct

    from ebpf_cuda import asm, syscalls
    from ebpf_cuda.decode.aggregates import sum_of_squares
    from ebpf_cuda.probes.aggregates import AGG_VALUE, SUMSQ, _floor_log2, _sum_of_squares
    from ebpf_cuda.asm import DW, FP, R0, R1, R2, R8, R9, W, Helper
    from ebpf_cuda.bpf.maps import ArrayMap
    from ebpf_cuda.bpf.programs import Program

    cell = ArrayMap(AGG_VALUE.size, 1, name="sumsq_test")
    prog = [asm.st(W, FP, -4, 0), asm.ld_map(R1, "cell"), asm.mov(R2, FP), asm.add(R2, -4),
            asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "out"), asm.mov(R9, R0),
            asm.ldx(DW, R8, R9, 0)] + _floor_log2() + _sum_of_squares() + [
            asm.Label("out"), asm.mov(R0, 0), asm.exit()]
    program = Program(prog, {"cell": cell}, name="sumsq_test", prog_type=1)  # socket filter
    program.load()
    packet = ctypes.create_string_buffer(64)
    sumsq = start
    try:
        for duration in durations:
            value = bytearray(AGG_VALUE.size)
            struct.pack_into("<Q", value, 0, duration)
            struct.pack_into("<Q", value, SUMSQ, sumsq)
            cell[0] = bytes(value)
            attr = ctypes.create_string_buffer(80)
            struct.pack_into("<IIIIQ", attr, 0, program.fd, 0, len(packet), 0,
                             ctypes.addressof(packet))
            struct.pack_into("<I", attr, 32, 1)  # repeat
            syscalls.bpf(10, attr, "BPF_PROG_TEST_RUN")
            sumsq = struct.unpack_from("<Q", cell[0], SUMSQ)[0]
    finally:
        program.close()
        cell.close()
    return sum_of_squares(sumsq), sumsq


def test_the_kernel_sums_squares_exactly_and_never_overflows():
    from ebpf_cuda.decode.aggregates import SUMSQ_EXP_AT, sum_of_squares

    small = [95, 150, 1234, 50, 0, 1, 999_999]
    total, raw = _kernel_sum_of_squares(small)
    assert total == sum(d * d for d in small) and raw >> SUMSQ_EXP_AT == 0  # exact
    # A 3 s call (its square is past 2^58) and a sum that crosses 2^58: scaled, not wrapped.
    long = [3_000_000_000, 1000, 2 ** 40, 5]
    total, raw = _kernel_sum_of_squares(long)
    assert total == pytest.approx(sum(d * d for d in long), rel=1e-6)
    assert raw >> SUMSQ_EXP_AT > 0
    near = (1 << SUMSQ_EXP_AT) - 10
    total, raw = _kernel_sum_of_squares([1000, 2000], start=near)
    assert raw >> SUMSQ_EXP_AT == 1
    assert total == pytest.approx(sum_of_squares(near) + 1000 ** 2 + 2000 ** 2, rel=1e-12)


def _memory_rows(text):
    """{operation: (MB, count)} of a memory table (event or in-kernel)."""
    rows = {}
    for line in text.splitlines()[4:]:
        cells = line.split()
        rows[line[line.index("["):]] = (cells[0], cells[1])
    return rows


def test_summary_alone_counts_direct_driver_calls_as_the_event_summary_does(cc):
    """Runtime memsets and copies (each carried out by a driver call inside it) next to
    direct driver ones (cuBLAS's own static runtime calls libcuda so): formerly the in-kernel
    table dropped every driver call once a runtime one was seen (PyTorch: 23 memsets where
    CUPTI and the event summary count 46)."""
    from ebpf_cuda.analysis import Summary
    from ebpf_cuda.analysis.kernel_summary import aggregate_tables
    from fakecuda_driver import build_fake_driver, build_layered_runtime

    layered, driver, prog = build_layered_runtime(cc)
    _, cu_prog = build_fake_driver(cc)
    runtime_ops = ["malloc:4096", "memcpy:4096:1", "memcpy:100:2", "memset:0:4096",
                   "memsetasync:1:64:0x5", "memcpyasync:64:1:0x5", "free"]
    driver_ops = ["init", "malloc:8192", "memsetd32:0:1024", "memsetd32async:7:16",
                  "htod:512", "dtoh:32", "memcpy:8", "free"]
    script = "%s %s >/dev/null; %s %s >/dev/null" % (prog, " ".join(runtime_ops), cu_prog,
                                                      " ".join(driver_ops))
    with Tracer(command=["sh", "-c", script], library=[str(layered), str(driver)],
                aggregate=True) as tracer:
        events = list(tracer.events())
        agg = tracer.aggregates()
    summary = Summary()
    summary.add(events)
    event_rows = _memory_rows(summary.memory_table())
    kernel_rows = _memory_rows(aggregate_tables(agg)[2])
    assert kernel_rows == event_rows
    assert event_rows["[CUDA memset]"] == ("0.008", "4")  # 4096 + 64 + 4096 + 64 bytes
    assert event_rows["[CUDA memcpy Host-to-Device]"] == ("0.005", "3")  # 4096 + 64 + 512
    assert event_rows["[CUDA memcpy Device-to-Host]"] == ("0.000", "2")
    assert event_rows["[CUDA memcpy Default (unified addressing)]"] == ("0.000", "1")
    bandwidth = aggregate_tables(agg)[3]
    counts = {line[line.index("["):]: line.split()[0] for line in bandwidth.splitlines()[4:]}
    assert counts == {"[CUDA memcpy Host-to-Device]": "2", "[CUDA memcpy Device-to-Host]": "2",
                      "[CUDA memcpy Default (unified addressing)]": "1"}


def test_owned_slots_are_read_from_the_arrays_values():
    from ebpf_cuda.spec import layout
    from ebpf_cuda.decode.aggregates import owned_slots

    values = bytearray(layout.LAUNCH_SLOT.size * 8192)  # (the map's values in index order)
    layout.LAUNCH_SLOT.pack_into(values, 24 * 1, 7 << 32 | 1234, 0xABC, 5)
    layout.LAUNCH_SLOT.pack_into(values, 24 * 8191, 3 << 32 | 99, 0xDEF, 0)  # (claimed)
    layout.LAUNCH_SLOT.pack_into(values, 24 * 2, 0, 0xEEE, 9)  # (no owner: free)
    assert owned_slots(bytes(values)) == [(1, 1234, 7, 0xABC, 5), (8191, 99, 3, 0xDEF, 0)]
