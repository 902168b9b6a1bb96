"""Every launch once (issue 40): a launch that reaches a second probed entry point of its
library on the same thread (a `_ptsz` export calling the plain one, or jumping to it) is one
launch, in the records and in the in-kernel sums. tests/native/forwarding_driver.c has both
shapes; the checks below confirm it does (its machine code), then trace it with real probes."""
import subprocess
from collections import Counter

import pytest

from fakecuda_driver import LIB_FLAGS, SONAME
from helpers import run_cli, trace_command

pytestmark = pytest.mark.kernel
N = 50


@pytest.fixture(scope="module")
def forwarding(cc):
    folder = cc.outdir / "forwarding"
    folder.mkdir(exist_ok=True)
    lib = cc.shared("forwarding_driver.c", "forwarding/" + SONAME, extra=list(LIB_FLAGS))
    prog = cc.executable("forwarding_prog.c", "forwarding/forwarding_prog",
                         extra=["-L", str(folder), "-l:" + SONAME, "-Wl,-rpath," + str(folder)])
    return lib, prog


def _body(lib, function: str) -> str:
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)],
                             capture_output=True, text=True, check=True).stdout
    start = listing.index("<%s>:" % function)
    return listing[start:listing.index("\n\n", start)]


def test_the_stand_in_has_both_shapes(forwarding):
    lib, _ = forwarding
    called = _body(lib, "cuLaunchKernelEx_ptsz")
    assert "call" in called and "<cuLaunchKernelEx@plt>" in called
    jumped = _body(lib, "cuLaunchKernel_ptsz")
    assert "call" not in jumped and "jmp" in jumped and "<cuLaunchKernel@plt>" in jumped


def test_each_launch_is_recorded_once(root, forwarding):
    lib, prog = forwarding
    events, _, tracer = trace_command([prog, N], library=[str(lib)],
                                      functions=["cuLaunchKernelEx", "cuLaunchKernel"])
    exits = [e for e in events if e.phase == "exit"]
    assert Counter(e.api for e in exits) == {"cuLaunchKernelEx": 2 * N, "cuLaunchKernel": 2 * N}
    assert Counter(e.args["func"] for e in exits) == {0x1000: N, 0x2000: N, 0x3000: N,
                                                      0x4000: N}
    assert all(e.ret == 0 for e in exits)
    assert tracer.stats_at_end == {"lost": 0, "unpaired": 0, "too_deep": 0, "entries_lost": 0}


def test_the_in_kernel_sums_count_each_launch_once(root, forwarding):
    from ebpf_cuda import TraceConfig, Tracer

    lib, prog = forwarding
    config = TraceConfig(command=[str(prog), str(N)], library=[str(lib)], aggregate=True,
                         emit=False, functions=["cuLaunchKernelEx", "cuLaunchKernel"])
    with Tracer(config) as tracer:
        for _ in tracer.events(timeout=30):
            pass
        counts = Counter()
        for function in tracer.aggregates().functions:
            counts[function.api] += function.count
    assert counts == {"cuLaunchKernelEx": 2 * N, "cuLaunchKernel": 2 * N}


def test_the_summary_counts_each_launch_once(root, forwarding):
    lib, prog = forwarding
    done = run_cli("-p", lib, "--functions", "cuLaunchKernelEx,cuLaunchKernel", "--summary",
                   "--", prog, N)
    assert done.returncode == 0, done.stderr
    api_sum = done.stdout[:done.stdout.index("Duration Percentiles")].splitlines()
    rows = {line.split()[-1]: line.split() for line in api_sum
            if line.rstrip().endswith(("cuLaunchKernelEx", "cuLaunchKernel"))}
    assert rows["cuLaunchKernelEx"][2] == str(2 * N) and rows["cuLaunchKernel"][2] == str(2 * N)
    launches = done.stdout[done.stdout.index("Kernel Launches"):].splitlines()
    by_kernel = {line.split()[-1]: line.split()[0] for line in launches if "0x" in line}
    assert by_kernel == {"0x1000": str(N), "0x2000": str(N), "0x3000": str(N), "0x4000": str(N)}


def test_the_monitor_counts_each_launch_once_when_it_takes_every_return(root, forwarding):
    """The monitor taking every return (--return-sampling 1, or a kernel without uprobe
    sessions) counts launches at return, after the twin is known: once each."""
    assert _monitor_totals(forwarding, sample_returns=1) == {"cuLaunchKernelEx": 2 * N,
                                                             "cuLaunchKernel": 2 * N}


def test_the_monitor_counts_each_launch_once_when_it_samples_returns(root, forwarding):
    """With sampled returns (uprobe sessions) the monitor counts launches at entry, before
    any return could tell a twin: the `_ptsz` sites mark where they were entered, and the
    plain entry their call or jump reaches is not counted (probes/calls.py, _twin_gate)."""
    from ebpf_cuda.bpf import features

    if features.session_is_return_id() is None:
        pytest.skip("this kernel has no uprobe sessions: no sampled returns")
    assert _monitor_totals(forwarding, sample_returns=64) == {"cuLaunchKernelEx": 2 * N,
                                                              "cuLaunchKernel": 2 * N}


def _monitor_totals(forwarding, sample_returns: int) -> Counter:
    import subprocess as sp

    from monitor_support import running_monitor, settle

    lib, prog = forwarding
    with running_monitor(paths=(str(lib),), sample_returns=sample_returns) as monitor:
        sp.run([str(prog), str(N)], check=True, capture_output=True)
        settle(monitor)
        totals = Counter()
        for (comm, api, _), count in monitor.launch_totals().items():
            if comm == "forwarding_prog":
                totals[api] += count
    return totals


def test_the_timeline_and_a_saved_trace_show_each_launch_once(root, forwarding, tmp_path):
    import json

    lib, prog = forwarding
    timeline, saved = tmp_path / "t.json", tmp_path / "t.ebpfcuda"
    done = run_cli("-p", lib, "--functions", "cuLaunchKernelEx,cuLaunchKernel", "--trace-out",
                   timeline, "--save", saved, "--json", "-o", tmp_path / "t.jsonl", "--", prog, N)
    assert done.returncode == 0, done.stderr
    slices = [e for e in json.loads(timeline.read_text())
              if e.get("ph") == "X" and e.get("name") in ("cuLaunchKernelEx", "cuLaunchKernel")]
    assert Counter(e["name"] for e in slices) == {"cuLaunchKernelEx": 2 * N,
                                                  "cuLaunchKernel": 2 * N}
    report = run_cli("report", "--json", saved)
    assert report.returncode == 0, report.stderr
    exits = [json.loads(line) for line in report.stdout.splitlines()
             if line.startswith("{") and '"phase":"exit"' in line]
    assert Counter(e["api"] for e in exits) == {"cuLaunchKernelEx": 2 * N, "cuLaunchKernel": 2 * N}
