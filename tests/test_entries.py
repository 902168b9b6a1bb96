"""--entries: each call's entry is sent when it happens (for calls that block), and the
complete call still arrives at return, without a second enter line."""
import subprocess
import sys

from fakecuda import build_fake_cuda


def test_entries_give_one_enter_and_one_exit_per_call(root, cc):
    lib, prog = build_fake_cuda(cc)
    done = subprocess.run([sys.executable, "-m", "ebpf_cuda", "-t", "--entries", "-p", str(lib),
                           "--", str(prog), "malloc:64", "setdevice:7", "free"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [line.split()[2:4] for line in done.stdout.splitlines() if "[E" in line]
    assert lines == [["cudaMalloc", "[ENTER]"], ["cudaMalloc", "[EXIT]"],
                     ["cudaSetDevice", "[ENTER]"], ["cudaSetDevice", "[EXIT]"],
                     ["cudaFree", "[ENTER]"], ["cudaFree", "[EXIT]"]]
