"""Freed memory given back to the system, for a tracer that runs for days.

When a process goes, what the tracer kept of it (its kernel names above all: name_store.py)
is freed, but glibc's allocator keeps freed pages resident in its heaps for reuse: after a
process with 30,000 long kernel names, ~4 MB of the monitor's resident set stayed. glibc's
`malloc_trim(0)` hands the free pages of every heap back (madvise); where there is none
(musl), nothing is done.

`for_long_runs()` sets glibc's allocator for a process that runs for days (the monitor):
a fixed mmap threshold, so that every large buffer (an ELF string table read whole, a
batch of map entries) is mapped on its own and unmapped when freed. By default glibc raises
the threshold to the size of the largest mapped buffer freed so far, and buffers below it
then come from the heap, whose freed pages mostly stay resident: on the GPU host the
monitor's heap held 12.8 MB free after a few PyTorch processes, 0.7 MB with the threshold
fixed (docs/gpu-results.md D29). And at most two arenas: each thread that allocates
otherwise may get an arena of its own that keeps its own free memory.
"""
import ctypes
from typing import Callable, List, Optional

_found: List[Optional[Callable[[int], int]]] = []  # (looked up once, at the first trim)
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # (mallopt's parameters, glibc's malloc.h)
MMAP_THRESHOLD = 128 << 10  # (glibc's own starting value, kept fixed)
ARENA_MAX = 2


def for_long_runs() -> bool:
    """Set the allocator for a process that runs for days (see above); False where the C
    library has no mallopt (musl) or refuses a setting. Process-wide: the monitor's command
    calls it, not the library (an embedding program keeps its own allocator's settings)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_ARENA_MAX, ARENA_MAX))


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
