"""The traced program is never harmed, and memory the tracer cannot read is reported, not fatal.

- The stand-in's driver program prints deterministic results (pointers included), so its output
  must be byte-for-byte the same with and without tracing, whatever is traced.
- robust_load's `badptrs` passes out-parameters that are NULL, unmapped, PROT_NONE, kernel,
  non-canonical, or straddle into a PROT_NONE page; the stub library returns success without
  touching them, so the return probe's probe_read_user fails: the event names the
  out-parameter in `faults` and everything else is intact. Huge sizes decode unchanged.
"""
import shutil
import subprocess

import pytest

from fakecuda import build_fake_cuda
from helpers import cli_env
from test_robust_support import CLI, json_events, run_cli

pytestmark = pytest.mark.kernel

OPS = ["malloc:4000", "malloc:1000", "mallochost:64", "memcpy:64:1", "memcpy:64:9", "free:@0",
       "streamcreate", "eventcreate", "eventrecord", "launch:2,1,1:32", "launchnull:1:1",
       "getdevice", "setdevice:1", "getdevice", "setdevice:7", "meminfo", "getdevicecount",
       "loop:2000:malloc:8", "threads:4:1000:getdevice", "freehost", "free", "getlasterror"]


@pytest.fixture(scope="module")
def driver(cc):
    return build_fake_cuda(cc)[1]


def untraced(argv) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60)


def fixed_layout(argv) -> subprocess.CompletedProcess:
    """Runs argv without address space randomization (the program prints some addresses of
    its own data), so that two runs print the same bytes."""
    if shutil.which("setarch") is None:
        pytest.skip("setarch is not installed")
    return subprocess.run(["setarch", "-R", *map(str, argv)], capture_output=True, text=True,
                          timeout=60, env=cli_env())


@pytest.mark.parametrize("options", [["--all"], ["--json", "--entries"],
                                     ["-r", "--all"], ["--stacks"]],
                         ids=["all", "json-entries", "no-returns", "stacks"])
def test_results_identical_with_and_without_tracing(root, driver, tmp_path, options):
    plain = fixed_layout([driver, *OPS])
    assert plain.returncode == 0, plain.stderr
    traced = fixed_layout([*CLI, *options, "-o", tmp_path / "trace", "--", driver, *OPS])
    if "No such option" in traced.stderr:
        pytest.skip("option not available: %s" % traced.stderr.splitlines()[-1])
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout
    assert (tmp_path / "trace").stat().st_size > 0


def _by_call(events):
    return [e for e in events if e["phase"] == "exit"]


def test_unreadable_out_parameters_are_marked_not_fatal(root, robust, tmp_path):
    _, prog = robust
    plain = untraced([prog, "badptrs"])
    out = tmp_path / "trace.jsonl"
    traced = run_cli(["--json", "-o", out, "--functions", "cudaGetDevice,cudaMalloc", "--",
                      prog, "badptrs"])
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout  # no call of the program was disturbed
    calls = _by_call(json_events(out))
    devices = [e for e in calls if e["api"] == "cudaGetDevice"]
    mallocs = [e for e in calls if e["api"] == "cudaMalloc"]
    assert len(devices) == 7 and len(mallocs) == 2
    assert all(e["ret"] == 0 for e in calls)
    for bad in devices[:6]:  # null, unmapped, no access, kernel, non-canonical, straddling
        assert bad["faults"] == ["device"] and "device" not in bad
    assert devices[6]["device"] == 7 and "faults" not in devices[6]
    assert mallocs[0]["args"]["size"] == 2 ** 64 - 1 and mallocs[0]["faults"] == ["ptr"]
    assert mallocs[1]["args"]["size"] == 2 ** 62 and mallocs[1]["ptr"] == 0x1234


def test_unreadable_out_parameters_in_text_output(root, robust, tmp_path):
    _, prog = robust
    traced = run_cli(["-o", tmp_path / "trace.txt", "--functions", "cudaGetDevice", "--",
                      prog, "badptrs"])
    assert traced.returncode == 0, traced.stderr
    text = (tmp_path / "trace.txt").read_text()
    assert text.count("[EXIT]") == 7
