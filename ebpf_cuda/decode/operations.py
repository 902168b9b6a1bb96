"""What a call did, read from the roles of the function table (apis.Api.role & co.): the
memory operation of a copy or set, its bytes, its direction. Shared by the event summary
(summary.py), the in-kernel one (kernel_summary.py), the leak tracker and the HTML report,
so that every output names and counts an operation the same way.
"""
from typing import Any, Dict, Mapping, Optional, Tuple

from ..spec.apis import BY_NAME, Api, Direction, Role
from .events import Event

MB = 1000 * 1000  # nsys reports sizes in MB of 10^6 bytes
MEMSET = "[CUDA memset]"
# A direction as the tables show it (`[CUDA memcpy Host-to-Device]`).
LABELS: Dict[str, str] = {
    Direction.HTOH: "Host-to-Host", Direction.HTOD: "Host-to-Device",
    Direction.DTOH: "Device-to-Host", Direction.DTOD: "Device-to-Device",
    Direction.PEER: "Peer-to-Peer", Direction.DEFAULT: "Default (unified addressing)",
}
_COPY_PREFIX = "[CUDA memcpy "


def row(api: str) -> Optional[Api]:
    """The table row of a function name (None for names the table does not have)."""
    return BY_NAME.get(api)


def is_driver(api: str) -> bool:
    """A driver-API function (libcuda)."""
    found = BY_NAME.get(api)
    return found is not None and found.driver


def direction_of(api: Api, kind: Any = None) -> Optional[str]:
    """The Direction of a copy row; `kind`: the call's memcpy kind (a name) where the row
    takes its direction from that argument. None for rows that are no copies."""
    if api.role != Role.COPY:
        return None
    if api.direction == Direction.FROM_KIND:
        return Direction.DEFAULT if kind is None else str(kind)
    return api.direction


def operation_of(api: str, kind: Any = None) -> Optional[str]:
    """`[CUDA memcpy Host-to-Device]`, `[CUDA memset]`, ... of function `api` (with memcpy
    kind `kind`, a name, for rows that take it); None for calls that copy or set nothing."""
    found = BY_NAME.get(api)
    if found is None:
        return None
    if found.role == Role.MEMSET:
        return MEMSET
    direction = direction_of(found, kind)
    if direction is None:
        return None
    return "%s%s]" % (_COPY_PREFIX, LABELS.get(direction, direction))


def copy_label(operation: str) -> Optional[str]:
    """`Host-to-Device` of `[CUDA memcpy Host-to-Device]`; None for a memset."""
    if not operation.startswith(_COPY_PREFIX):
        return None
    return operation[len(_COPY_PREFIX):-1]


def copy_operation(event: Event) -> Optional[str]:
    """The memory operation of a copy or set event, else None."""
    return operation_of(event.api, event.args.get("kind"))


def byte_count(api: Api, values: Mapping[str, Any]) -> Optional[int]:
    """The bytes a call of `api` moves, sets or allocates: the product of its `size` fields
    (from `values`) times its element size; None when the row has none or one is missing."""
    if not api.size:
        return None
    total = api.elem_size
    for name in api.size:
        value = values.get(name)
        if not isinstance(value, int):
            return None
        total *= value
    return total


def event_bytes(event: Event) -> Optional[int]:
    """The bytes of an event: its row's `size` fields, from its arguments and out-parameters
    (cudaMallocPitch's pitch is one)."""
    found = BY_NAME.get(event.api)
    return None if found is None else byte_count(found, {**event.outs, **event.args})


def copy_bytes(event: Event) -> Optional[int]:
    """Bytes moved or set by a copy or set event (width × height for 2D ones, elements ×
    element size for the driver's memsets)."""
    found = BY_NAME.get(event.api)
    if found is None or found.role not in (Role.COPY, Role.MEMSET):
        return None
    return byte_count(found, event.args)


def is_synchronous_copy(event: Event) -> bool:
    """A copy whose call returns when the bytes have moved (not stream-ordered)."""
    found = BY_NAME.get(event.api)
    return found is not None and found.role == Role.COPY and not found.asynchronous


# Rows whose calls return only once the GPU has caught up (cudaStreamSynchronize & co.;
# flight.py's latency trigger reads the same category).
BLOCKING_CATEGORIES = ("sync",)


def blocks(api: Api) -> bool:
    """Whether a function's calls block their thread until the GPU is done: a synchronising
    row, or a synchronous copy."""
    return api.category in BLOCKING_CATEGORIES or (api.role == Role.COPY
                                                   and not api.asynchronous)


def is_blocking(event: Event) -> bool:
    """A call that blocks its thread until the GPU is done (see `blocks`)."""
    found = BY_NAME.get(event.api)
    return found is not None and blocks(found)


def is_launch(event: Event) -> bool:
    """A kernel launch (it carries the kernel as `func`)."""
    found = BY_NAME.get(event.api)
    return found is not None and found.role == Role.LAUNCH and "func" in event.args


Dim3 = Tuple[int, int, int]
Geometry = Tuple[Optional[Dim3], Optional[Dim3], Optional[int]]  # grid, block, shared memory


def launch_geometry(values: Mapping[str, Any]) -> Geometry:
    """(grid, block, smem) of a launch's arguments: dim3 values, or the driver's gridX...
    scalars (cuLaunchKernel's, where they are not already shown as dim3)."""
    grid, block = values.get("grid"), values.get("block")
    if grid is None and "gridX" in values:
        grid = (values["gridX"], values["gridY"], values["gridZ"])
        block = (values["blockX"], values["blockY"], values["blockZ"])
    return grid, block, values.get("smem")
