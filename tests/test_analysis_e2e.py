"""Kernel names, leaks and summaries end to end: `python3 -m ebpf_cuda` with real probes on the
stand-in libcudart, tracing C++ programs whose "kernels" have known (mangled) names, in a PIE
and a non-PIE executable and in a shared library (tests/native/kernels_app.cpp, kernels_lib.cpp).

Everything the program does is known (kernels_app.cpp's header lists it); durations are not,
so they are checked against the JSON events of the same run (totals, medians, extremes).
"""
import json
import re
import statistics
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from ebpf_cuda.analysis._table import clock
import helpers
from fakecuda import build_fake_cuda, device_ptr

pytestmark = pytest.mark.kernel

NATIVE = Path(__file__).parent / "native"

KERNELS = {
    "vecAdd": "vecAdd(float const*, float const*, float*, int)",
    "scale": "void nn::scale<float>(float*, float, int)",
    "saxpy": "saxpy(int, float, float const*, float*)",
    "hidden": "hidden_kernel(float*)",
    "relu": "relu_kernel",
}
# (kernel, grid, block, smem, stream) of each launch kernels_app makes, in order.
LAUNCHES = [("vecAdd", "(4,1,1)", "(256,1,1)", 0, "0x0")] + \
    [("scale", "(8,2,1)", "(32,8,1)", 1024, "0x5000")] * 2 + \
    [("saxpy", "(2,1,1)", "(128,1,1)", 0, "0x0")] * 3 + \
    [("hidden", "(1,1,1)", "(64,1,1)", 0, "0x0"), ("relu", "(1,1,1)", "(32,1,1)", 0, "0x0"),
     ("vecAdd", "(1,1,1)", "(2048,1,1)", 0, "0x0")]
CALLS = {"cudaMalloc": 4, "cudaMemcpy": 4, "cudaStreamCreate": 1, "cudaLaunchKernel": 9,
         "cudaFree": 4}
LEAKED = device_ptr(2)

KERNEL_TABLE = """\
 ** Kernel Launches:

 Launches  Grid     Block      Smem (bytes)  Kernel
 --------  -------  ---------  ------------  -----------------------------------------------
        3  (2,1,1)  (128,1,1)             0  saxpy(int, float, float const*, float*)
        2  (8,2,1)  (32,8,1)          1,024  void nn::scale<float>(float*, float, int)
        1  (1,1,1)  (64,1,1)              0  hidden_kernel(float*)
        1  (1,1,1)  (32,1,1)              0  relu_kernel
        1  (4,1,1)  (256,1,1)             0  vecAdd(float const*, float const*, float*, int)"""

ERROR_TABLE = """\
 ** CUDA API Errors:

 Count  Code  Error                          Name
 -----  ----  -----------------------------  ----------------
     1     9  cudaErrorInvalidConfiguration  cudaLaunchKernel
     1     2  cudaErrorMemoryAllocation      cudaMalloc"""

MEMORY_TABLE = """\
 ** CUDA Memory Operation Summary by Size (cuda_gpu_mem_size_sum):

 Total (MB)  Count  Avg (MB)  Med (MB)  Min (MB)  Max (MB)  StdDev (MB)  Operation
 ----------  -----  --------  --------  --------  --------  -----------  ------------------------------
      0.008      2     0.004     0.004     0.004     0.004        0.000  [CUDA memcpy Host-to-Device]
      0.001      1     0.001     0.001     0.001     0.001        0.000  [CUDA memcpy Device-to-Host]
      0.001      1     0.001     0.001     0.001     0.001        0.000  [CUDA memcpy Device-to-Device]"""


def _gxx(*args) -> None:
    subprocess.run(["g++", "-O2", "-g", "-fno-omit-frame-pointer", "-I", str(NATIVE), *args],
                   check=True)


@pytest.fixture(scope="module")
def programs(cc) -> Dict[str, Path]:
    """kernels_app as a PIE and a non-PIE executable, linked to the stand-in and libkernels."""
    lib, driver = build_fake_cuda(cc)
    folder = cc.outdir / "kernels"
    folder.mkdir(exist_ok=True)
    kernels = folder / "libkernels.so"
    if not kernels.exists():
        _gxx("-shared", "-fPIC", "-o", str(kernels), str(NATIVE / "kernels_lib.cpp"),
             "-L", str(lib.parent), "-l:" + lib.name)
    built = {"driver": driver}
    for variant, flags in (("pie", ["-fPIE", "-pie"]), ("nopie", ["-fno-pie", "-no-pie"])):
        out = folder / ("kernels_app_" + variant)
        if not out.exists():
            _gxx(*flags, "-o", str(out), str(NATIVE / "kernels_app.cpp"), "-L", str(folder),
                 "-lkernels", "-L", str(lib.parent), "-l:" + lib.name,
                 "-Wl,-rpath,%s:%s" % (folder, lib.parent))
        built[variant] = out
    return built


# Only what the programs call: fewer probes make tracing start and end faster.
FUNCTIONS = ("--functions", ",".join(CALLS))


def run_cli(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python3 -m ebpf_cuda ARGS` (with --functions FUNCTIONS unless it is "--all-default")."""
    if args[0] == "--all-default":
        args = args[1:]
    else:
        args = FUNCTIONS + args
    done = helpers.run_cli(*args, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


def _is_pie(path: Path) -> bool:
    from ebpf_cuda.targets.elf import open_elf
    return open_elf(str(path)).is_pie


def test_launch_geometry_and_stream_in_text(programs):
    done = run_cli("-t", "--", programs["driver"], "streamcreate", "launch:4:256",
                   "launch:8,4,2:16,8,2:2048:@0", "sleep:300")
    enters = [line.split("[ENTER] ", 1)[1] for line in done.stdout.splitlines()
              if "cudaLaunchKernel" in line and "[ENTER]" in line]
    assert enters == [
        "func=vec_add_kernel grid=(4,1,1) block=(256,1,1) smem=0 stream=0x0",
        "func=vec_add_kernel grid=(8,4,2) block=(16,8,2) smem=2048 stream=0x5000",
    ]


@pytest.mark.parametrize("variant", ["pie", "nopie"])
def test_kernel_names_in_text_and_json(programs, variant, tmp_path):
    assert _is_pie(programs[variant]) == (variant == "pie")
    done = run_cli("-t", "--", programs[variant])
    enters = [line.split("[ENTER] ", 1)[1] for line in done.stdout.splitlines()
              if "cudaLaunchKernel" in line and "[ENTER]" in line]
    assert enters == ["func=%s grid=%s block=%s smem=%d stream=%s" % (
        KERNELS[k], grid, block, smem, stream) for k, grid, block, smem, stream in LAUNCHES]

    trace = tmp_path / "trace.jsonl"
    run_cli("--json", "-o", trace, "--", programs[variant])
    launches = [e for e in map(json.loads, trace.read_text().splitlines())
                if e["api"] == "cudaLaunchKernel" and e["phase"] == "exit"]
    assert [e["kernel"] for e in launches] == [KERNELS[k] for k, *_ in LAUNCHES]
    assert all("kernel" not in e for e in map(json.loads, trace.read_text().splitlines())
               if e["api"] != "cudaLaunchKernel")


def _section(text: str, title: str) -> str:
    start = text.index(" ** " + title)
    end = text.find("\n\n", text.index("\n\n", start) + 2)  # after the title's blank line
    return text[start:] if end < 0 else text[start:end]


def _api_rows(table: str) -> Dict[str, List[str]]:
    return {line.split()[-1]: line.split() for line in table.splitlines()[4:]}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize("variant", ["pie", "nopie"])
def test_summary_leaks_and_stacks(programs, variant, tmp_path):
    trace = tmp_path / "trace.jsonl"
    saved = tmp_path / "run.ebpfcuda"
    done = run_cli("--summary", "--leaks", "--stacks", "--json", "-o", trace, "--save", saved,
                   "--", programs[variant])
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    exits = [e for e in events if e["phase"] == "exit"]
    pid = exits[0]["pid"]
    report = done.stdout[done.stdout.index(" ** CUDA API Summary"):]

    # Warnings as they happened, on stderr.
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "ebpf-cuda: warning: double free: cudaFree(0x%x) in pid %d: 8192 bytes from "
        "cudaMalloc, already freed by cudaFree" % (device_ptr(1), pid),
        "ebpf-cuda: warning: free of an unknown pointer: cudaFree(0xdead0000) in pid %d" % pid,
    ]

    # API table: counts exact; times are those of the JSON events of the same run.
    rows = _api_rows(_section(report, "CUDA API Summary"))
    assert {name: int(row[2]) for name, row in rows.items()} == CALLS
    grand = sum(e["duration_ns"] for e in exits)
    for name, row in rows.items():
        durations = [e["duration_ns"] for e in exits if e["api"] == name]
        percent, total, _, avg, med, low, high, sd = map(_number, row[:8])
        assert total == sum(durations)
        assert (low, high) == (min(durations), max(durations))
        assert med == pytest.approx(statistics.median(durations), abs=0.0501)
        assert avg == pytest.approx(statistics.mean(durations), abs=0.0501)
        expected_sd = statistics.stdev(durations) if len(durations) > 1 else 0.0
        assert sd == pytest.approx(expected_sd, abs=0.0501)
        assert percent == pytest.approx(100.0 * total / grand, abs=0.0501)
        assert low <= med <= high
    totals = [_number(row[1]) for row in rows.values()]
    assert totals == sorted(totals, reverse=True)

    assert _section(report, "CUDA Memory Operation Summary") == MEMORY_TABLE
    assert _section(report, "CUDA API Errors") == ERROR_TABLE
    assert _section(report, "Kernel Launches") == KERNEL_TABLE
    bandwidth = _section(report, "Synchronous Copy Bandwidth").splitlines()[4:]
    assert [line.split()[0] + " " + line.split()[-1] for line in bandwidth] == [
        "1 Device-to-Device]", "1 Device-to-Host]", "2 Host-to-Device]"]
    copies = [e for e in exits if e["api"] == "cudaMemcpy"]
    h2d = [e for e in copies if e["args"]["kind"] == "HostToDevice"]
    assert _number(bandwidth[2].split()[2]) == sum(e["duration_ns"] for e in h2d)
    assert _number(bandwidth[2].split()[3]) == pytest.approx(
        8192 / sum(e["duration_ns"] for e in h2d), abs=0.0006)

    # The leak: exact, with the allocating call stack.
    leak_event = next(e for e in exits if e["api"] == "cudaMalloc" and e.get("ptr") == LEAKED)
    leaks = report[report.index("Leaks:"):].splitlines()
    name = programs[variant].name
    assert leaks[:4] == [
        "Leaks: 1 of 3 allocations never freed, 1,048,576 bytes in 1 process",
        " %s  %s  Pointer         Size (bytes)  Allocator   Time" % (
            "PID".rjust(len(str(pid))), "TID".rjust(len(str(pid)))),
        " %s  %s  --------------  ------------  ----------  ---------------" % (
            "-" * max(3, len(str(pid))), "-" * max(3, len(str(pid)))),
        " %d  %d  0x%x     1,048,576  cudaMalloc  %s" % (pid, leak_event["tid"], LEAKED,
                                                       clock(leak_event["ts"])),
    ]
    assert re.fullmatch(r"      #0 make_scratch\(unsigned long\)\+0x[0-9a-f]+ \(%s\)" % name,
                        leaks[4]), leaks[4]
    assert re.fullmatch(r"      #1 main\+0x[0-9a-f]+ \(%s\)" % name, leaks[5]), leaks[5]
    # the saved trace keeps the stacks symbolized: `report --leaks` shows the same frames
    again = helpers.run_cli("report", "--leaks", saved)
    assert again.returncode == 0, again.stderr
    offline = again.stdout[again.stdout.index("Leaks:"):].splitlines()
    assert offline[:len(leaks)] == leaks


def test_summary_alone_prints_no_event_lines(programs):
    done = run_cli("--all-default", "--summary", "--", programs["pie"])
    out = done.stdout
    assert "[ENTER]" not in out and "[EXIT]" not in out and "TIME " not in out
    assert out.count(" ** ") == 6 and "Leaks" not in out
    assert "warning" not in done.stderr  # no leak checking asked for


def test_leaks_alone_reports_without_stacks(programs):
    done = run_cli("--leaks", "--", programs["nopie"])
    report = done.stdout[done.stdout.index("Leaks:"):].splitlines()
    assert len(report) == 4 and "#0" not in done.stdout and "[ENTER]" not in done.stdout
    assert report[3].split()[2:5] == ["0x%x" % LEAKED, "1,048,576", "cudaMalloc"]
    assert len([line for line in done.stderr.splitlines() if "warning" in line]) == 2


def test_json_to_stdout_keeps_reports_on_stderr(programs):
    done = run_cli("--json", "--leaks", "--", programs["pie"])
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2 * sum(CALLS.values())
    assert "Leaks: 1 of 3 allocations never freed" in done.stderr
    assert "Leaks" not in done.stdout
