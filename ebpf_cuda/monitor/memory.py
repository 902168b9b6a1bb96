"""The device memory each process holds, from the records of its allocations and frees (the
monitor's `ebpf_cuda_device_memory_bytes` gauge).
"""
from typing import Dict, Set

from ..decode.events import EXIT
from ..decode.operations import event_bytes
from ..spec import apis
from ..spec.apis import TABLE


class DeviceMemory:
    """The device memory each process holds: what its traced allocations returned and its
    frees have not released (their records travel the ring: allocations are rare). Memory
    allocated before the monitor started is not known; freeing it changes nothing. A runtime
    allocation and the driver allocation inside it return one pointer: counted once."""

    def __init__(self) -> None:
        self._live: Dict[int, Dict[int, int]] = {}  # pid -> {pointer: bytes}
        self.fn_ids: Set[int] = {i for i, api in enumerate(TABLE) if api.memory == apis.DEVICE
                                 and api.role in (apis.Role.ALLOC, apis.Role.FREE)}

    def add(self, events) -> None:
        for event in events:
            if event.phase != EXIT or event.ret != 0:
                continue
            api = apis.BY_NAME.get(event.api)
            if api is None or api.memory != apis.DEVICE:
                continue
            if api.role == apis.Role.ALLOC:
                pointer, size = event.outs.get(api.ptr), event_bytes(event)
                if pointer and size is not None:
                    self._live.setdefault(event.pid, {})[pointer] = size
            elif api.role == apis.Role.FREE:
                self._live.get(event.pid, {}).pop(event.args.get(api.ptr), None)

    def held(self, pid: int) -> int:
        return sum(self._live.get(pid, {}).values())

    def forget(self, pid: int) -> None:
        self._live.pop(pid, None)
