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
from helpers import cli_env

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def layered(cc):
    return build_layered_runtime(cc)


def attach_during(argv, tracer_args, out, seconds: float = 1.5):
    """Start `argv` (a target that runs until killed), attach `ebpf-cuda --json -o OUT
    TRACER_ARGS -d PID` 0.4 s later, let it trace `seconds` once its probes are on (its
    first line, however slowly it starts: emulated machines), then end the target; the
    tracer ends with it. (the tracer's exit status, its stderr)."""
    target = subprocess.Popen([str(a) for a in argv], stdout=subprocess.DEVNULL)
    tracer = None
    try:
        time.sleep(0.4)  # warmed up: its first launches ran untraced
        tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "--json", "-o", str(out),
                                   *tracer_args, "-d", str(target.pid)],
                                  stderr=subprocess.PIPE, text=True, env=cli_env())
        first = tracer.stderr.readline()  # "probing ...": the probes are on
        time.sleep(seconds)
    finally:
        target.kill()
        target.wait()
    rest = tracer.communicate(timeout=120)[1] if tracer is not None else ""
    return tracer.returncode, first + rest


FOREVER = 20000  # launch rounds of ~10 ms (~200 s): the target runs until the test ends it


def test_a_warmed_up_process_attached_later_has_its_launches_named(root, layered, tmp_path):
    runtime, driver, prog = layered
    out = tmp_path / "t.jsonl"
    status, stderr = attach_during([prog, *["launch:2:64", "sleep:10"] * FOREVER], [], out)
    tracer = subprocess.CompletedProcess([], status)
    assert tracer.returncode == 0, stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    runtime_launches = [e for e in events if e["api"] == "cudaLaunchKernel"
                        and e["phase"] == "exit"]
    driver_launches = [e for e in events if e["api"] == "cuLaunchKernel" and e["phase"] == "exit"]
    assert len(driver_launches) > 20
    assert runtime_launches, ("no runtime launch among %d events (%d driver launches)"
                              % (len(events), len(driver_launches)), stderr)
    # The probes go on one by one, so the first launches may be seen at one layer only. From
    # the moment both layers have been seen, each runtime launch holds exactly one driver
    # launch (a driver launch ends before the runtime launch around it).
    # (the target was killed: a last driver launch may have no runtime exit around it)
    both, end = max(runtime_launches[0]["ts"], driver_launches[0]["ts"]), runtime_launches[-1]["ts"]
    assert (len([e for e in runtime_launches if both < e["ts"] <= end])
            == len([e for e in driver_launches if both <= e["ts"] <= end]))
    assert {e.get("kernel") for e in runtime_launches} == {"vec_add_kernel"}
    # The first driver launch may come in the batch before the runtime launch around it.
    assert {e.get("kernel") for e in driver_launches[1:]} == {"vec_add_kernel"}
    assert "not named" not in stderr


def _attach_later(lib, prog, ops, tmp_path):
    """Attach (`attach_during`) to `prog OPS` repeated until killed: (the tracer's exit
    status, its stderr, the exit events of cudaLaunchKernel)."""
    out = tmp_path / "t.jsonl"
    status, stderr = attach_during([prog, *ops[:1], *ops[1:] * FOREVER], ["-p", lib], out)
    events = [json.loads(line) for line in out.read_text().splitlines()]
    return status, stderr, [e for e in events if e["api"] == "cudaLaunchKernel"
                            and e["phase"] == "exit"]


def test_a_kernel_handle_made_before_the_attach_is_named_by_its_stub(root, fake, tmp_path):
    """CUDA 13: nvcc's stub fetches the cudaKernel_t once (__cudaGetKernel), before the trace
    began, and launches with it: the launch's caller, __device_stub__<kernel>, names it."""
    lib, prog = fake
    status, stderr, launches = _attach_later(
        lib, prog, ["getkernel", "stublaunch:2:64", "sleep:10"], tmp_path)
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
        lib, prog, ["getkernel", "launchhandle:2:64", "sleep:10"], tmp_path)
    assert status == 0, stderr
    assert len(launches) > 20
    assert {e.get("kernel") for e in launches} == {"[kernel launched from do_launch]"}
    assert ("not named: %d launches of 1 kernels made before the trace began, shown by the "
            "code that launched them" % len(launches)) in stderr


def _probe_order(lines):
    """(function, 'uprobe' or 'uretprobe') in the order -v says the probes went on."""
    order = []
    for line in lines:
        words = line.split()
        if len(words) == 4 and words[0] in ("uprobe", "uretprobe") and words[2] == "at":
            order.append((words[1], words[0]))
    return order


@pytest.mark.parametrize("how", ["attach", "command"])
def test_each_return_probe_goes_on_before_its_entry(root, layered, tmp_path, how):
    """An entry that fires while its return probe is not on yet stays on its thread's stack
    of calls in flight; a later launch's entry took it for a launch of its own layer (a
    twin) and was never recorded: on the GPU host, attached to a PyTorch loop, no runtime
    launch was recorded at all. So every return probe goes on first."""
    runtime, driver, prog = layered
    out = tmp_path / "t.jsonl"
    if how == "attach":
        status, stderr = attach_during([prog, *["launch:2:64", "sleep:10"] * FOREVER], ["-v"],
                                       out, seconds=0.5)
    else:
        done = subprocess.run([sys.executable, "-m", "ebpf_cuda", "-v", "--json", "-o", str(out),
                               "--", str(prog), "launch:2:64"], capture_output=True, text=True,
                              env=cli_env(), timeout=120)
        status, stderr = done.returncode, done.stderr
    assert status == 0, stderr
    order = _probe_order(stderr.splitlines())
    entries = {name for name, kind in order if kind == "uprobe"}
    assert {"cudaLaunchKernel", "cuLaunchKernel"} <= entries if how == "attach" else entries
    for name in entries:
        assert order.index((name, "uretprobe")) < order.index((name, "uprobe")), name
