"""Attaching to a running process (-d PID): its driver handles were made before the trace
began, so their names cannot be learned from the calls that made them. The runtime launch
around each driver launch names it (a code address: the stub's symbol), and the driver's
handle takes that name; what stays unnamed is counted, with the reason, in one line."""
import json
import subprocess
import sys
import time

import pytest

from fakecuda_driver import build_layered_runtime
from helpers import cli_env, slowdown

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def layered(cc):
    return build_layered_runtime(cc)


def test_a_warmed_up_process_attached_later_has_its_launches_named(root, layered, tmp_path):
    runtime, driver, prog = layered
    # ~1.5 s of launches (longer on an emulated machine, where the tracer starts slowly)
    ops = ["launch:2:64", "sleep:10"] * _rounds()
    target = subprocess.Popen([str(prog), *ops], stdout=subprocess.DEVNULL)
    out = tmp_path / "t.jsonl"
    try:
        time.sleep(0.4)  # warmed up: its first launches ran untraced
        tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "--json", "-o", str(out),
                                   "-d", str(target.pid)], stderr=subprocess.PIPE, text=True,
                                  env=cli_env())
        _, stderr = tracer.communicate(timeout=60)  # ends with the process
    finally:
        target.kill()
        target.wait()
    assert tracer.returncode == 0, stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    runtime_launches = [e for e in events if e["api"] == "cudaLaunchKernel"
                        and e["phase"] == "exit"]
    driver_launches = [e for e in events if e["api"] == "cuLaunchKernel" and e["phase"] == "exit"]
    assert len(driver_launches) > 20
    # The probes go on one by one, so the first launches may be seen at one layer only. From
    # the moment both layers have been seen, each runtime launch holds exactly one driver
    # launch (a driver launch ends before the runtime launch around it).
    both = max(runtime_launches[0]["ts"], driver_launches[0]["ts"])
    assert (len([e for e in runtime_launches if e["ts"] > both])
            == len([e for e in driver_launches if e["ts"] >= both]))
    assert {e.get("kernel") for e in runtime_launches} == {"vec_add_kernel"}
    # The first driver launch may come in the batch before the runtime launch around it.
    assert {e.get("kernel") for e in driver_launches[1:]} == {"vec_add_kernel"}
    assert "not named" not in stderr


def _rounds() -> int:
    """Launch rounds of ~10 ms for a target that must outlive the tracer's start: 150 (1.5 s),
    more on an emulated machine (the kernel matrix's guests run Python 6-23 times slower)."""
    return int(150 * max(1.0, 2 * slowdown() - 1))


def _attach_later(lib, prog, ops, tmp_path):
    """Start `prog OPS`, attach `ebpf-cuda --json -p LIB -d PID` 0.4 s later, until it ends:
    (the tracer's exit status, its stderr, the exit events of cudaLaunchKernel)."""
    target = subprocess.Popen([str(prog), *ops], stdout=subprocess.DEVNULL)
    out = tmp_path / "t.jsonl"
    try:
        time.sleep(0.4)
        tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "--json", "-o", str(out),
                                   "-p", str(lib), "-d", str(target.pid)],
                                  stderr=subprocess.PIPE, text=True, env=cli_env())
        _, stderr = tracer.communicate(timeout=60)
    finally:
        target.kill()
        target.wait()
    events = [json.loads(line) for line in out.read_text().splitlines()]
    return tracer.returncode, stderr, [e for e in events if e["api"] == "cudaLaunchKernel"
                                       and e["phase"] == "exit"]


def test_a_kernel_handle_made_before_the_attach_is_named_by_its_stub(root, fake, tmp_path):
    """CUDA 13: nvcc's stub fetches the cudaKernel_t once (__cudaGetKernel), before the trace
    began, and launches with it: the launch's caller, __device_stub__<kernel>, names it."""
    lib, prog = fake
    status, stderr, launches = _attach_later(
        lib, prog, ["getkernel"] + ["stublaunch:2:64", "sleep:10"] * _rounds(), tmp_path)
    assert status == 0, stderr
    assert len(launches) > 20 and all(e["args"]["func"] >= 0x9000 for e in launches)
    assert {e.get("kernel") for e in launches} == {
        "vec_add_kernel(float const*, float const*, float*, int)"}
    assert "not named" not in stderr


def test_a_launch_site_without_a_stub_is_shown_as_a_hint_and_counted(root, fake, tmp_path):
    """When the stub was inlined into its caller (PyTorch's launchers), the launch site is
    known and the kernel is not: the launch shows the calling function, and the end line
    counts it as not named."""
    lib, prog = fake
    status, stderr, launches = _attach_later(
        lib, prog, ["getkernel"] + ["launchhandle:2:64", "sleep:10"] * (2 * _rounds()),
        tmp_path)
    assert status == 0, stderr
    assert len(launches) > 20
    assert {e.get("kernel") for e in launches} == {"[kernel launched from do_launch]"}
    assert ("not named: %d launches of 1 kernels made before the trace began, shown by the "
            "code that launched them" % len(launches)) in stderr
