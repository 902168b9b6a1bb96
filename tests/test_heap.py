"""heap.py on this machine's glibc: `for_long_runs` keeps the mmap threshold fixed, so a
large buffer allocated after a larger one was freed is still mapped on its own (by default
glibc has raised the threshold by then and takes it from the heap, whose freed pages stay)."""
import subprocess
import sys

import pytest

PROGRAM = r"""
import ctypes, sys
from ebpf_cuda.monitor import heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "long":
    assert heap.for_long_runs()
big = bytearray(8 << 20)  # mapped on its own (above any threshold), then freed
del big
before = libc.mallinfo2()
buffer = bytearray(1 << 20)  # 1 MiB: mapped, or from the heap?
after = libc.mallinfo2()
print(after.hblkhd - before.hblkhd >= 1 << 20, after.arena - before.arena >= 1 << 20)
"""


def _run(mode: str) -> str:
    return subprocess.run([sys.executable, "-c", PROGRAM, mode], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.split()


def test_large_buffers_stay_mapped_on_their_own():
    try:
        import ctypes

        ctypes.CDLL(None).mallinfo2
    except AttributeError:
        pytest.skip("this C library has no mallinfo2 (glibc 2.33+)")
    assert _run("default") == ["False", "True"]  # (glibc's raised threshold: the heap)
    assert _run("long") == ["True", "False"]
