"""AddressResolver.read_string: a string literal read from the file a read-only mapping
holds (kernel names the probe could not read), also once the file was replaced on disk."""
import os
import subprocess
import sys

from ebpf_cuda.targets.symbols import AddressResolver

CHILD = r'''
import mmap, sys, time
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
for line in open("/proc/self/maps"):
    if line.rstrip().endswith(sys.argv[1]):
        print(line.split("-")[0], flush=True)
        break
time.sleep(60)
'''


def _mapped(path: str):
    child = subprocess.Popen([sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE,
                             text=True)
    return child, int(child.stdout.readline(), 16)


def test_a_string_is_read_from_the_mapped_file(tmp_path):
    path = str(tmp_path / "names.bin")
    with open(path, "wb") as f:
        f.write(b"_Z6kernelv\0other\0" + b"\0" * 4096)
    child, start = _mapped(path)
    try:
        resolver = AddressResolver()
        assert resolver.read_string(child.pid, start, 64) == b"_Z6kernelv"
        assert resolver.read_string(child.pid, start + 11, 64) == b"other"
        assert resolver.read_string(child.pid, start + 11, 3) is None  # (no NUL within 3)
    finally:
        child.kill()
        child.wait()


def test_a_file_replaced_on_disk_is_read_as_the_process_maps_it(tmp_path):
    path = str(tmp_path / "names.bin")
    with open(path, "wb") as f:
        f.write(b"_Z3oldv\0" + b"\0" * 4096)
    child, start = _mapped(path)
    try:
        with open(path + ".new", "wb") as f:
            f.write(b"_Z3newv\0" + b"\0" * 4096)
        os.rename(path + ".new", path)  # (as a package upgrade replaces a library)
        assert AddressResolver().read_string(child.pid, start, 64) == b"_Z3oldv"
    finally:
        child.kill()
        child.wait()
