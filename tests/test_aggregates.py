"""In-kernel aggregation (--summary alone) gives the same counts and totals as the full
event stream: both are produced by the same return probe in one run, from the same times."""
import math
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from ebpf_cuda.aggregates import FunctionStats
from ebpf_cuda.tracer import Tracer
from fakecuda import build_fake_cuda

OPS = ["loop:500:malloc:4000", "memcpy:4000:1", "memcpy:100:2", "memcpy:50:2", "memcpy:7:3",
       "setdevice:7", "setdevice:9", "setdevice:1", "malloc:0x20000000000",
       "launch:4,1,1:256,1,1", "launch:4,1,1:256,1,1", "launch:8,2,1:32,4,1:64",
       "launch:1,1,1:2000,1,1", "loop:300:getdevice", "streamcreate", "free"]


@pytest.fixture(scope="module")
def both(cc, root_module):
    lib, prog = build_fake_cuda(cc)
    with Tracer(command=[str(prog), *OPS], library=[str(lib)], aggregate=True,
                everything=True) as tracer:
        exits = [e for e in tracer.events() if e.phase == "exit"]
        aggregates = tracer.aggregates()
        assert tracer.stats()["lost"] == 0
    return exits, aggregates


@pytest.fixture(scope="module")
def root_module():
    import os
    if os.geteuid() != 0:
        pytest.skip("needs root")


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
        f.bytes += e.args.get("size", 0) if e.ret == 0 else 0
        f.histogram[int(math.log2(e.duration_ns))] += 1
    got = {(f.api, f.kind): f for f in aggregates.functions}
    assert set(got) == set(expected)
    for key, want in expected.items():
        have = got[key]
        assert (have.count, have.total_ns, have.min_ns, have.max_ns, have.errors, have.bytes,
                have.histogram) == (want.count, want.total_ns, want.min_ns, want.max_ns,
                                    want.errors, want.bytes, want.histogram), key
    assert got[("cudaMalloc", None)].count == 501
    assert got[("cudaMemcpy", 2)].bytes == 150
    assert got[("cudaGetDevice", None)].count == 300


def test_errors_by_function_and_code_match(both):
    exits, aggregates = both
    assert aggregates.errors == Counter((e.api, e.ret) for e in exits if e.ret)
    assert aggregates.errors[("cudaSetDevice", 101)] == 2
    assert aggregates.errors[("cudaMalloc", 2)] == 1


def test_launches_by_geometry_match(both):
    exits, aggregates = both
    launches = Counter((e.pid, e.args["grid"], e.args["block"], e.args["smem"])
                       for e in exits if e.api == "cudaLaunchKernel")
    got = Counter()
    for pid, api, cells, count, total in aggregates.launches:
        grid = (cells[1] & 0xFFFFFFFF, cells[1] >> 32, cells[2])
        block = (cells[3] & 0xFFFFFFFF, cells[3] >> 32, cells[4])
        got[(pid, grid, block, cells[6])] += count
    assert got == launches
    assert sum(launches.values()) == 4


def test_summary_alone_uses_the_kernel_and_only_name_lookups_travel(cc, root_module):
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


def test_cli_summary_alone_prints_aggregate_tables(cc, root_module):
    lib, prog = build_fake_cuda(cc)
    out = subprocess.run([sys.executable, "-m", "ebpf_cuda", "--summary", "-p", str(lib), "--",
                          str(prog), "loop:300:malloc:64", "setdevice:9"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "in-kernel aggregates" in out.stdout
    malloc_row = next(line for line in out.stdout.splitlines() if line.endswith(" cudaMalloc"))
    assert malloc_row.split()[2] == "300"
    assert "   1   101  cudaErrorInvalidDevice  cudaSetDevice" in out.stdout
    assert "[ENTER]" not in out.stdout


def test_cli_summary_alone_names_kernels_from_the_kernel_counts(cc, root_module):
    lib, prog = build_fake_cuda(cc)
    out = subprocess.run([sys.executable, "-m", "ebpf_cuda", "--summary", "-p", str(lib), "--",
                          str(prog), "getkernel", "loop:500:launchhandle:2:32",
                          "launch:4,1,1:256,1,1", "sleep:200"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    kernels = out.stdout.split("** Kernel Launches:")[1]
    assert "     500  (2,1,1)  (32,1,1)              0  vec_add_kernel" in kernels
    assert "       1  (4,1,1)  (256,1,1)             0  vec_add_kernel" in kernels


def test_summary_alone_counts_a_layered_copy_once(cc, root_module):
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
