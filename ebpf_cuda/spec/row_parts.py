"""The table's shorthand, shared by the rows_*.py modules (and meant for them only: the rest
of the package reads rows through `apis`): argument makers, the role fields of allocators,
frees, copies, memsets and launches, and the argument groups several libraries' rows share.
"""
from typing import Tuple

from .row import DRIVER, NCCL, RUNTIME, Arg, Direction, Kind, Role


def _a(name: str, kind: str, slot: int, show: bool = True) -> Arg:
    return Arg(name, kind, slot, show)


def _hidden(name: str, slot: int) -> Arg:
    return Arg(name, Kind.PTR, slot, show=False)


R, D, N = RUNTIME, DRIVER, NCCL
K = Kind
A = Direction


def _alloc(memory: str, size: Tuple[str, ...] = ("size",), asynchronous: bool = False) -> dict:
    return dict(role=Role.ALLOC, ptr="ptr", size=size, memory=memory, asynchronous=asynchronous)


def _free(memory: str, asynchronous: bool = False) -> dict:
    return dict(role=Role.FREE, ptr="ptr", memory=memory, asynchronous=asynchronous)


def _copy(direction: str, asynchronous: bool = False,
          size: Tuple[str, ...] = ("size",)) -> dict:
    return dict(role=Role.COPY, ptr="dst", size=size, direction=direction,
                asynchronous=asynchronous)


def _memset(asynchronous: bool = False, size: str = "size", elem_size: int = 1) -> dict:
    return dict(role=Role.MEMSET, ptr="ptr", size=(size,), elem_size=elem_size,
                asynchronous=asynchronous)


_LAUNCH = dict(role=Role.LAUNCH, asynchronous=True)
_CONFIG = Arg("config", K.LAUNCH_CONFIG, 0, deref=40)
_MEMCPY = (_a("dst", K.PTR, 0), _a("src", K.PTR, 1), _a("size", K.SIZE, 2))
