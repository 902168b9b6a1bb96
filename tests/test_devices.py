"""Each event's device (devices.py): the thread's current device as the traced calls set
it, an explicit device argument, an NCCL communicator's device."""
from ebpf_cuda.decode.devices import DeviceTracker
from helpers import event


def _run(tracker, *calls):
    """Events (api, tid, args, outs, ret) in order; their devices."""
    events = []
    for api, tid, args, outs, ret in calls:
        e = event(api, args=dict(args), ret=ret)
        e.tid, e.outs = tid, dict(outs)
        events.append(e)
    tracker.annotate(events)
    return [e.device for e in events]


def test_the_runtime_device_is_per_thread_and_zero_from_the_start():
    devices = _run(DeviceTracker(from_start=True),
                   ("cudaMalloc", 1, {"size": 8}, {}, 0),
                   ("cudaSetDevice", 1, {"device": 3}, {}, 0),
                   ("cudaMalloc", 1, {"size": 8}, {}, 0),
                   ("cudaMalloc", 2, {"size": 8}, {}, 0),  # another thread: still 0
                   ("cudaSetDevice", 1, {"device": 9}, {}, 101),  # failed: stays 3
                   ("cuMemAlloc_v2", 1, {"size": 8}, {}, 0))
    assert devices == [0, 3, 3, 0, 9, 3]  # (a call naming a device targets it)


def test_attached_later_a_thread_has_no_device_until_it_sets_or_asks_one():
    devices = _run(DeviceTracker(from_start=False),
                   ("cudaMalloc", 1, {"size": 8}, {}, 0),
                   ("cudaSetDevice", 1, {"device": 1}, {}, 0),
                   ("cudaMalloc", 1, {"size": 8}, {}, 0),
                   ("cudaMalloc", 2, {"size": 8}, {}, 0),
                   ("cudaGetDevice", 2, {}, {"device": 6}, 0),  # (with --all: it tells)
                   ("cudaMalloc", 2, {"size": 8}, {}, 0))
    assert devices == [None, 1, 1, None, None, 6]


def test_driver_contexts_carry_their_device_through_set_push_and_pop():
    devices = _run(DeviceTracker(from_start=True),
                   ("cuDevicePrimaryCtxRetain", 1, {"device": 2}, {"ctx": 0xC000}, 0),
                   ("cuCtxCreate_v2", 1, {"flags": 0, "device": 1}, {"ctx": 0xC001}, 0),
                   ("cuMemAlloc_v2", 1, {"size": 8}, {}, 0),  # the new context is current
                   ("cuCtxPushCurrent_v2", 1, {"ctx": 0xC000}, {}, 0),
                   ("cuMemAlloc_v2", 1, {"size": 8}, {}, 0),
                   ("cuCtxPopCurrent_v2", 1, {}, {"ctx": 0xC000}, 0),
                   ("cuMemAlloc_v2", 1, {"size": 8}, {}, 0),
                   ("cuCtxSetCurrent", 1, {"ctx": 0xC000}, {}, 0),
                   ("cuMemAlloc_v2", 1, {"size": 8}, {}, 0),
                   ("cuCtxSetCurrent", 1, {"ctx": 0}, {}, 0),  # unbound: no device
                   ("cuMemAlloc_v2", 1, {"size": 8}, {}, 0))
    assert devices == [2, 1, 1, 1, 2, 2, 1, 1, 2, 2, None]  # (a call is on the device before it)


def test_a_context_set_current_before_its_device_is_told_gets_it_once_told():
    """CUDA's runtime makes its primary context current (cuCtxSetCurrent), then retains it
    where the probes see it (D34, docs/gpu-results.md: PyTorch's and Triton's launches had
    no device): the thread's calls after the retain are on its device."""
    devices = _run(DeviceTracker(from_start=True),
                   ("cuCtxSetCurrent", 1, {"ctx": 0xC000}, {}, 0),
                   ("cuLaunchKernel", 1, {"func": 0x10}, {}, 0),  # not known yet
                   ("cuDevicePrimaryCtxRetain", 1, {"device": 1}, {"ctx": 0xC000}, 0),
                   ("cuLaunchKernel", 1, {"func": 0x10}, {}, 0),
                   ("cuCtxPushCurrent_v2", 2, {"ctx": 0xC000}, {}, 0),  # another thread
                   ("cuLaunchKernel", 2, {"func": 0x10}, {}, 0),
                   ("cuCtxSetCurrent", 2, {"ctx": 0xC009}, {}, 0),  # never told
                   ("cuLaunchKernel", 2, {"func": 0x10}, {}, 0))
    assert devices == [0, None, 1, 1, 0, 1, 1, None]


def test_nccl_calls_are_on_their_communicators_device():
    devices = _run(DeviceTracker(from_start=True),
                   ("cudaSetDevice", 1, {"device": 5}, {}, 0),
                   ("ncclCommInitRank", 1, {"nranks": 2, "rank": 0}, {"comm": 0xAA}, 0),
                   ("cudaSetDevice", 1, {"device": 0}, {}, 0),
                   ("ncclAllReduce", 1, {"comm": 0xAA, "count": 4}, {}, 0),
                   ("ncclAllReduce", 1, {"comm": 0xBB, "count": 4, "device": 7}, {}, 0),
                   ("ncclAllReduce", 1, {"comm": 0xCC, "count": 4}, {}, 0))
    assert devices == [5, 5, 0, 5, 7, 0]


def test_forget_drops_a_process():
    tracker = DeviceTracker(from_start=False)
    _run(tracker, ("cudaSetDevice", 1, {"device": 4}, {}, 0))
    assert tracker.current(4242, 1) == 4  # (helpers.event's pid)
    tracker.forget(4242)
    assert tracker.current(4242, 1) is None


# -- through real probes ----------------------------------------------------------------------

import json  # noqa: E402

import pytest  # noqa: E402

from fakecuda_driver import build_fake_driver  # noqa: E402
from helpers import run_cli  # noqa: E402

# primary context of device 1 (@0); a new context on device 0, made current (@1); then
# cuCtxSetCurrent / cuCtxPushCurrent / cuCtxPopCurrent between them, an allocation after each
DRIVER_OPS = ["init", "primaryctx:1", "ctxcreate:0:0", "malloc:64", "setctx:@0", "malloc:64",
              "pushctx:@1", "malloc:64", "popctx", "malloc:64"]
ALLOCATION_DEVICES = [0, 1, 0, 1]


@pytest.fixture(scope="module")
def driver(cc):
    return build_fake_driver(cc)


def _allocation_devices(objects):
    return [o.get("device") for o in objects
            if o["api"] == "cuMemAlloc_v2" and o["phase"] == "exit"]


@pytest.mark.kernel
def test_json_lines_live_and_from_a_saved_trace_carry_each_calls_device(root, driver,
                                                                        tmp_path):
    lib, prog = driver
    live = run_cli("--json", "-p", str(lib), "--", str(prog), *DRIVER_OPS)
    assert live.returncode == 0, live.stderr
    objects = [json.loads(line) for line in live.stdout.splitlines() if line.startswith("{")]
    assert _allocation_devices(objects) == ALLOCATION_DEVICES
    assert {o.get("device") for o in objects if o["api"] == "cuInit"} == {0}  # (from start)
    made = {o["api"]: o.get("device") for o in objects if o["phase"] == "exit"}
    assert made["cuDevicePrimaryCtxRetain"] == 1 and made["cuCtxCreate_v2"] == 0
    saved = tmp_path / "run.ebpfcuda"
    done = run_cli("--save", str(saved), "-p", str(lib), "--", str(prog), *DRIVER_OPS)
    assert done.returncode == 0, done.stderr
    again = run_cli("report", "--json", str(saved))
    assert again.returncode == 0, again.stderr
    replayed = [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
    assert _allocation_devices(replayed) == ALLOCATION_DEVICES
    assert [o.get("device") for o in replayed] == [o.get("device") for o in objects]


@pytest.mark.kernel
def test_the_summary_by_device_counts_each_gpus_calls(root, driver, tmp_path):
    lib, prog = driver
    done = run_cli("--summary", "--by-device", "-p", str(lib), "--", str(prog), *DRIVER_OPS)
    assert done.returncode == 0, done.stderr
    parts = done.stdout.split(" ==== ")
    titles = [part.split(" ====")[0] for part in parts[1:]]
    assert titles == ["Device 0", "Device 1"]

    def allocations(part):
        rows = [line.split() for line in part.split(" ** ")[1].splitlines()
                if line.split()[-1:] == ["cuMemAlloc_v2"]]
        return int(rows[0][2]) if rows else 0

    assert [allocations(part) for part in parts[1:]] == [2, 2]
    refused = run_cli("--by-device", "-p", str(lib), "--", str(prog), "init")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "--summary" in refused.stderr and "--by-device" in refused.stderr
