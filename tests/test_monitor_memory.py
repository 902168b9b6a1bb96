"""The monitor's live device-memory gauge (`ebpf_cuda_device_memory_bytes`): what each
running process's traced allocations returned and its frees have not released, with real
probes on the stand-in runtime (in-kernel counting; the allocation records travel the
ring)."""
import pytest

from ebpf_cuda.monitor.memory import DeviceMemory
from helpers import event
from monitor_support import Held, running_monitor, settle

pytestmark = pytest.mark.kernel

GAUGE = "ebpf_cuda_device_memory_bytes"


def _held(monitor, pid: int):
    family = next(f for f in monitor.collect() if f.name == GAUGE)
    return {dict(labels)["pid"]: n for labels, n in family.samples}.get(str(pid))


def test_a_process_holds_what_it_allocated_and_did_not_free(lib, prog):
    with running_monitor(paths=(str(lib),)) as monitor:
        held = Held(prog, ["setdevice:0", "sleep:300", "malloc:4096", "malloc:1000",
                           "malloc:300", "free:@1", "malloc:0x20000000000",
                           "mallochost:512", "sleep:2500"]).go()
        try:
            import time

            time.sleep(1.2)  # (its calls made: it sleeps 2.5 s before it exits)
            settle(monitor)
            # 4096 + 300: the second allocation freed, the huge one failed, host memory
            # is no device memory
            assert _held(monitor, held.pid) == 4096 + 300
        finally:
            held.wait()
        settle(monitor)
        monitor.collect()  # (an exporter has seen its end: the process goes)
        settle(monitor)
        assert _held(monitor, held.pid) is None


def test_two_layers_return_one_pointer_counted_once():
    memory = DeviceMemory()
    runtime = event("cudaMalloc", args={"size": 64}, ret=0, outs={"ptr": 0x7000})
    driver = event("cuMemAlloc_v2", args={"size": 64}, ret=0, outs={"ptr": 0x7000})
    memory.add([runtime, driver])
    assert memory.held(4242) == 64
    memory.add([event("cudaFree", args={"ptr": 0x7000}, ret=0),
                event("cuMemFree_v2", args={"ptr": 0x7000}, ret=0)])
    assert memory.held(4242) == 0
    memory.add([event("cudaFree", args={"ptr": 0x9999}, ret=0)])  # (made before the start)
    assert memory.held(4242) == 0
