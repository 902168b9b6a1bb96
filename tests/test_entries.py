"""--entries: each call's entry is sent when it happens (for calls that block), and the
complete call still arrives at return, without a second enter line."""
import pytest

from fakecuda import build_fake_cuda
from helpers import run_cli

pytestmark = pytest.mark.kernel


def test_entries_give_one_enter_and_one_exit_per_call(root, cc):
    lib, prog = build_fake_cuda(cc)
    done = run_cli("-t", "--entries", "-p", lib, "--", prog, "malloc:64", "setdevice:7", "free")
    assert done.returncode == 0, done.stderr
    lines = [line.split()[2:4] for line in done.stdout.splitlines() if "[E" in line]
    assert lines == [["cudaMalloc", "[ENTER]"], ["cudaMalloc", "[EXIT]"],
                     ["cudaSetDevice", "[ENTER]"], ["cudaSetDevice", "[EXIT]"],
                     ["cudaFree", "[ENTER]"], ["cudaFree", "[EXIT]"]]
