"""Freed memory given back to the system, for a tracer that runs for days.

When a process goes, what the tracer kept of it (its kernel names above all: name_store.py)
is freed, but glibc's allocator keeps freed pages resident in its heaps for reuse: after a
process with 30,000 long kernel names, ~4 MB of the monitor's resident set stayed. glibc's
`malloc_trim(0)` hands the free pages of every heap back (madvise); where there is none
(musl), nothing is done.
"""
import ctypes
from typing import Callable, List, Optional

_found: List[Optional[Callable[[int], int]]] = []  # (looked up once, at the first trim)


def trim() -> None:
    """Give the allocator's free pages back to the system, where the C library can."""
    if not _found:
        try:
            function = ctypes.CDLL(None).malloc_trim
            function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
            _found.append(function)
        except (AttributeError, OSError):
            _found.append(None)
    if _found[0] is not None:
        _found[0](0)
