"""discovery.py with real processes and files: /proc maps, a stand-in libcudart.so.12 found
through RUNPATH, LD_LIBRARY_PATH and in a running process, the real wheel's libcudart."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ebpf_cuda.targets import discovery
from ebpf_cuda.targets.elf import ElfFile
from ebpf_cuda.errors import ElfError, ProcessError
from fakecuda import wheel_libcudart
from helpers import gcc

NATIVE = Path(__file__).parent / "native"
WHEEL_CUDART = wheel_libcudart()  # None where nvidia-cuda-runtime-cu12 is not installed


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """A stand-in libcudart.so.12 (with .text at a vaddr far from its file offset) in its own
    folder, a PIE app finding it by RUNPATH, and one that needs LD_LIBRARY_PATH."""
    root = tmp_path_factory.mktemp("discovery")
    libdir = root / "cudalib"
    libdir.mkdir()
    lib = libdir / "libcudart.so.12"
    gcc("-shared", "-fPIC", "-Wl,-soname,libcudart.so.12",
        "-Wl,--section-start=.text=0x345000", "-o", str(lib), str(NATIVE / "elf_fakecudart.c"))
    with_runpath = root / "app_runpath"
    gcc("-pie", "-fPIE", "-o", str(with_runpath), str(NATIVE / "elf_app.c"), str(lib),
        "-Wl,--enable-new-dtags,-rpath," + str(libdir))
    plain = root / "app_plain"
    gcc("-pie", "-fPIE", "-o", str(plain), str(NATIVE / "elf_app.c"), str(lib))
    static = root / "app_static_cudart"
    gcc("-o", str(static), str(NATIVE / "elf_app.c"), str(NATIVE / "elf_fakecudart.c"))
    return {"root": root, "libdir": libdir, "lib": lib, "runpath": with_runpath,
            "plain": plain, "static": static}


def start(app: Path, **env: str) -> subprocess.Popen:
    proc = subprocess.Popen([str(app)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, **env))
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=10)
    proc.stdout.close()


# ---- /proc ---------------------------------------------------------------------------------

def test_self_maps_hold_python_and_libc():
    maps = discovery.process_mappings(os.getpid())
    paths = {m.path for m in maps}
    assert any(os.path.basename(p).startswith("libc.so") or "libc-" in p for p in paths)
    assert "[stack]" in paths
    exe = os.path.realpath(sys.executable)
    assert any(m.is_file and os.path.realpath(m.path) == exe for m in maps)
    for m in maps:
        assert m.start < m.end and len(m.perms) == 4


def test_maps_line_with_spaces_and_deleted():
    line = "7f00-7f10 r-xp 00001000 08:01 1234   /tmp/my lib.so (deleted)\n"
    m = discovery.parse_maps_line(line)
    assert (m.start, m.end, m.perms, m.offset, m.inode, m.path) == \
        (0x7F00, 0x7F10, "r-xp", 0x1000, 1234, "/tmp/my lib.so")
    assert discovery.parse_maps_line("garbage") is None


def test_dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(ProcessError, match="no process with PID %d" % proc.pid):
        discovery.process_mappings(proc.pid)
    with pytest.raises(ProcessError, match="no process with PID"):
        discovery.libraries_in_process(proc.pid)
    with pytest.raises(ProcessError):
        discovery.process_mappings(-3)


# ---- running processes ---------------------------------------------------------------------

def test_running_process_maps_fake_cudart_and_addresses_round_trip(fake):
    proc = start(fake["runpath"])
    try:
        marker, alloc, _ = proc.stdout.readline().split()
        pid = proc.pid
        assert discovery.libraries_in_process(pid) == [os.path.realpath(fake["lib"])]
        assert discovery.driver_libraries_in_process(pid) == []

        app = ElfFile(str(fake["runpath"]))
        path, vaddr = discovery.address_to_file(pid, int(marker, 16))
        assert os.path.realpath(path) == os.path.realpath(fake["runpath"])
        assert vaddr == app.symbol_address("elf_marker")
        bias = discovery.load_bias(pid, str(fake["runpath"]))
        assert bias != 0 and bias + vaddr == int(marker, 16)

        lib = ElfFile(str(fake["lib"]))
        path, vaddr = discovery.address_to_file(pid, int(alloc, 16))
        assert os.path.realpath(path) == os.path.realpath(fake["lib"])
        assert vaddr == lib.symbol_address("cudaMalloc")
        assert lib.symbolize(vaddr) == "cudaMalloc"
        assert discovery.load_bias(pid, str(fake["lib"])) + vaddr == int(alloc, 16)
        with pytest.raises(ProcessError, match="not in a file mapped"):
            discovery.address_to_file(pid, 8)
    finally:
        stop(proc)


def test_running_process_via_ld_library_path(fake):
    proc = start(fake["plain"], LD_LIBRARY_PATH=str(fake["libdir"]))
    try:
        proc.stdout.readline()
        assert discovery.libraries_in_process(proc.pid) == [os.path.realpath(fake["lib"])]
    finally:
        stop(proc)


def test_running_static_cudart_executable(fake):
    proc = start(fake["static"])
    try:
        proc.stdout.readline()
        assert discovery.libraries_in_process(proc.pid) == [os.path.realpath(fake["static"])]
        assert discovery.libraries_in_process(proc.pid, include_static=False) == []
    finally:
        stop(proc)


# ---- static cudart -------------------------------------------------------------------------

def test_is_static_cudart(fake, tmp_path):
    assert discovery.is_static_cudart(str(fake["static"]))
    assert not discovery.is_static_cudart(str(fake["runpath"]))  # only imports cudaMalloc
    assert not discovery.is_static_cudart(sys.executable)
    assert not discovery.is_static_cudart(str(tmp_path / "missing"))
    assert not discovery.is_static_cudart(str(tmp_path))


def test_nvcc_binary_is_static_cudart(tmp_path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        pytest.skip("nvcc is not installed")
    source = tmp_path / "m.cu"
    source.write_text("int main(){void*p; return cudaMalloc(&p, 4) == 0 ? 0 : 1;}\n")
    try:
        subprocess.run([nvcc, "-o", str(tmp_path / "m"), str(source)], check=True,
                       capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        pytest.skip("nvcc cannot build here")
    assert discovery.is_static_cudart(str(tmp_path / "m"))
    assert discovery.libraries_for_command([str(tmp_path / "m")]) == \
        [os.path.realpath(tmp_path / "m")]


# ---- what a command loads ------------------------------------------------------------------

def test_command_finds_fake_cudart_through_runpath(fake, monkeypatch):
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert discovery.libraries_for_command([str(fake["runpath"]), "arg"]) == \
        [os.path.realpath(fake["lib"])]


def test_command_finds_fake_cudart_through_ld_library_path(fake, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake["libdir"]))
    assert discovery.libraries_for_command([str(fake["plain"])]) == \
        [os.path.realpath(fake["lib"])]


def test_command_through_path_and_static(fake, monkeypatch):
    monkeypatch.setenv("PATH", str(fake["root"]) + os.pathsep + os.environ["PATH"])
    assert discovery.libraries_for_command(["app_static_cudart"]) == \
        [os.path.realpath(fake["static"])]


def test_script_command_falls_back_to_search(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert discovery.libraries_for_command([str(script)]) == discovery.find_library()
    assert discovery.libraries_for_command(["python3", "x.py"]) == discovery.find_library()
    with pytest.raises(ElfError, match="no such file"):
        discovery.libraries_for_command(["no-such-program-xyz"])


def test_needed_libraries_of_python():
    needed = discovery.needed_libraries(sys.executable)
    assert any(os.path.basename(p).startswith("libc.so") for p in needed)
    assert all(os.path.isabs(p) for p in needed)


# ---- searching the machine -----------------------------------------------------------------

def test_find_library_finds_the_wheel():
    if WHEEL_CUDART is None:
        pytest.skip("nvidia-cuda-runtime-cu12 is not installed")
    found = discovery.find_library()
    assert os.path.realpath(WHEEL_CUDART) in found
    assert all(p == os.path.realpath(p) for p in found)
    inodes = [(os.stat(p).st_dev, os.stat(p).st_ino) for p in found]
    assert len(inodes) == len(set(inodes))


def test_find_library_extra_path_first_and_deduplicated(fake, tmp_path):
    link_dir = tmp_path / "links"
    link_dir.mkdir()
    (link_dir / "libcudart.so").symlink_to(fake["lib"])
    found = discovery.find_library("libcudart", extra_paths=[str(link_dir), str(fake["libdir"])])
    assert found[0] == os.path.realpath(fake["lib"])
    assert found.count(os.path.realpath(fake["lib"])) == 1


def test_find_library_skips_linker_scripts_and_foreign_files(tmp_path):
    (tmp_path / "libcudart.so").write_text("/* GNU ld script */ GROUP ( libcudart.so.12 )\n")
    assert str(tmp_path / "libcudart.so") not in discovery.find_library(
        "libcudart", extra_paths=[str(tmp_path)])


def test_find_library_through_cuda_home(fake, monkeypatch, tmp_path):
    home = tmp_path / "cuda"
    (home / "lib64").mkdir(parents=True)
    shutil.copy(fake["lib"], home / "lib64" / "libcudart.so.12")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert str((home / "lib64" / "libcudart.so.12").resolve()) in discovery.find_library()


def test_toolkit_libcudart_found_when_installed():
    toolkit = sorted(Path("/usr/local").glob("cuda*/lib*/libcudart.so.*"))
    if not toolkit:
        pytest.skip("no CUDA toolkit in /usr/local")
    found = discovery.find_library()
    assert os.path.realpath(toolkit[0]) in found


def test_ld_so_cache_parse_matches_ldconfig():
    program = shutil.which("ldconfig") or "/sbin/ldconfig"
    if not os.path.exists(program) or not os.path.exists("/etc/ld.so.cache"):
        pytest.skip("no ldconfig or loader cache")
    text = subprocess.run([program, "-p"], capture_output=True, text=True).stdout
    assert discovery.parse_ld_so_cache() == discovery.parse_ldconfig_output(text)


def test_ld_so_cache_garbage_is_empty(tmp_path):
    bad = tmp_path / "cache"
    bad.write_bytes(b"glibc-ld.so.cache1.1" + b"\xff" * 40)
    assert discovery.parse_ld_so_cache(str(bad)) == []
    assert discovery.parse_ld_so_cache(str(tmp_path / "missing")) == []


def test_find_driver_library_skips_stubs():
    for path in discovery.find_driver_library():
        assert "/stubs/" not in path
        assert os.path.basename(path).startswith("libcuda.so")
