"""Where calls in flight wait for their return: task-local storage (the fast path) and the
LRU hash map kernels without task storage get. Both must pair every call the same way."""
import os

import pytest

from ebpf_cuda.spec import layout
from ebpf_cuda.bpf import maps as maps_module
from ebpf_cuda.errors import KernelError
from ebpf_cuda.tracer import Tracer
from fakecuda import build_fake_cuda

pytestmark = pytest.mark.kernel

OPS = ["malloc:4000", "memcpy:4000:1", "launch:4,1,1:256,1,1", "setdevice:7", "free",
       "threads:3:200:malloc:64"]


def _trace(cc):
    lib, prog = build_fake_cuda(cc)
    with Tracer(command=[str(prog), *OPS], library=[str(lib)]) as tracer:
        exits = [e for e in tracer.events() if e.phase == "exit"]
        return set(tracer.session.maps), exits, tracer.stats()


def _check(exits, stats):
    assert stats == {"lost": 0, "unpaired": 0, "too_deep": 0, "entries_lost": 0}
    assert [e.api for e in exits[:5]] == ["cudaMalloc", "cudaMemcpy", "cudaLaunchKernel",
                                          "cudaSetDevice", "cudaFree"]
    assert exits[0].args == {"size": 4000} and exits[0].outs == {"ptr": 0x7F0000000000}
    assert exits[3].ret_name == "cudaErrorInvalidDevice"
    assert len(exits) == 5 + 600 and all(e.duration_ns > 0 for e in exits)


def test_task_storage_is_used_where_the_kernel_has_it(root, cc):
    maps, exits, stats = _trace(cc)
    if os.path.exists("/sys/kernel/btf/vmlinux"):  # task storage needs the kernel's BTF
        assert layout.TASKS in maps and layout.INFLIGHT not in maps
    _check(exits, stats)


def test_the_hash_map_fallback_pairs_calls_the_same_way(root, cc, monkeypatch):
    def no_task_storage(*args, **kwargs):
        raise KernelError("task storage unavailable (simulated)")

    monkeypatch.setattr(maps_module, "TaskStorageMap", no_task_storage)
    maps, exits, stats = _trace(cc)
    assert layout.INFLIGHT in maps and layout.TASKS not in maps
    _check(exits, stats)
