"""Kernel names read from the registration code in the file (registrations.py): the pairs
nvcc's start-up code registers (host function → device name), and the `__cudaGetKernel`
handle each CUDA 13 launch site passes. Checked on real nvcc output (unstripped and
stripped) and, through real probes, on a stripped stand-in program attached to after it
fetched its handles."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ebpf_cuda.targets import registrations
from test_attach_names import attach_during

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
KERNELS_CU = r"""
#include <cstdio>
__global__ void vec_add(const float* a, float* b, int n) { int i = threadIdx.x; if (i < n) b[i] += a[i]; }
template <typename T> __global__ void scale(T* x, T s) { x[threadIdx.x] *= s; }
namespace ns { __global__ void other_kernel_with_a_long_name(double* p) { p[0] = 1; } }
int main() {
  float *a = 0, *b = 0; double* d = 0;
  vec_add<<<1, 32>>>(a, b, 32);
  scale<float><<<1, 32>>>(b, 2.0f);
  scale<int><<<1, 32>>>((int*)b, 2);
  ns::other_kernel_with_a_long_name<<<1, 1>>>(d);
  printf("%d\n", (int)cudaDeviceSynchronize());
}
"""
DEVICE_NAMES = {"_Z7vec_addPKfPfi", "_Z5scaleIfEvPT_S0_", "_Z5scaleIiEvPT_S0_",
                "_ZN2ns29other_kernel_with_a_long_nameEPd"}


@pytest.fixture(scope="module")
def nvcc_program(tmp_path_factory):
    """A CUDA program built by nvcc (cudart linked statically, nvcc's default), and the
    same stripped of its symbol table."""
    if not os.path.exists(NVCC) or shutil.which("objdump") is None:
        pytest.skip("nvcc or objdump is not installed")
    folder = tmp_path_factory.mktemp("nvcc")
    (folder / "k.cu").write_text(KERNELS_CU)
    subprocess.run([NVCC, "-O2", "-o", str(folder / "k"), str(folder / "k.cu")], check=True,
                   timeout=300)
    shutil.copy(str(folder / "k"), str(folder / "k.stripped"))
    subprocess.run(["strip", str(folder / "k.stripped")], check=True)
    return folder / "k", folder / "k.stripped"


def _disassembly(path: Path) -> list:
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], check=True,
                          capture_output=True, text=True).stdout.splitlines()


def test_nvcc_registrations_name_each_host_function_with_or_without_symbols(nvcc_program):
    program, stripped = nvcc_program
    found = registrations.registered_kernels(str(program))
    assert set(found.values()) == DEVICE_NAMES
    # each address is the host function of that name (the symbol table says so)
    symbols = {}
    for line in _disassembly(program):
        header = re.match(r"([0-9a-f]+) <(\S+)>:$", line)
        if header:
            symbols[int(header.group(1), 16)] = header.group(2)
    assert {address: symbols[address] for address in found} == found
    assert registrations.registered_kernels(str(stripped)) == found


def test_nvcc_13_launch_sites_name_their_kernel_handles(nvcc_program):
    """Each `<<<...>>>` site launches with the cudaKernel_t its stub fetched once; the
    return address of the launch call names the kernel, also in the stripped file."""
    program, stripped = nvcc_program
    lines = _disassembly(program)
    expected, function = {}, None
    for i, line in enumerate(lines):
        header = re.match(r"[0-9a-f]+ <(\S+)>:$", line)
        if header:
            function = header.group(1)
        elif re.search(r"call\s+[0-9a-f]+ <__cudaLaunchKernel>", line):
            back = int(lines[i + 1].split(":")[0], 16)
            expected[back] = function
    assert len(expected) == 4
    for back, stub in expected.items():  # _Z30__device_stub__Z7vec_addPKfPfiPKfPfi
        kernel = registrations.launch_site_kernel(str(stripped), back)
        assert kernel in DEVICE_NAMES and "__device_stub__" + kernel[1:] in stub, (
            hex(back), stub, kernel)
        assert registrations.launch_site_kernel(str(program), back) == kernel
    assert registrations.launch_site_kernel(str(stripped), min(expected) - 7) is None


def test_files_without_registrations_name_nothing(tmp_path):
    assert registrations.registered_kernels(sys.executable) == {}
    assert registrations.registered_kernels(str(tmp_path / "missing")) == {}
    (tmp_path / "junk").write_bytes(b"\x7fELF" + b"\0" * 60)
    assert registrations.registered_kernels(str(tmp_path / "junk")) == {}


@pytest.fixture(scope="module")
def stripped_app(cc, fake):
    lib, _ = fake
    folder = str(Path(lib).resolve().parent)
    app = cc.executable("registered_app.c", "registered_app",
                        extra=["-L", folder, "-l:" + Path(lib).name, "-Wl,-rpath," + folder])
    stripped = app.with_name("registered_app.stripped")
    shutil.copy(str(app), str(stripped))
    subprocess.run(["strip", str(stripped)], check=True)
    return lib, stripped


def test_the_stand_in_app_registers_its_three_kernels(stripped_app):
    _, app = stripped_app
    found = registrations.registrations(str(app))
    assert sorted(found.kernels.values()) == ["_Z5saxpyPf", "_Z5scalePd", "_Z6legacyPi"]
    assert sorted(found.kernels[host] for host in found.handles.values()) == [
        "_Z5saxpyPf", "_Z5scalePd"]


@pytest.mark.kernel
def test_attached_later_a_stripped_program_has_every_launch_named(root, stripped_app, tmp_path):
    """The program fetched its handles and registered its kernels before the trace began;
    its file has no symbols: every launch is still named, by its registration."""
    lib, app = stripped_app
    out = tmp_path / "t.jsonl"
    # (the program registers at once and launches every 10 ms until it is ended)
    status, stderr = attach_during([app, "100000"], ["-p", lib, "--functions",
                                                     "cudaLaunchKernel"], out)
    tracer = subprocess.CompletedProcess([], status)
    assert tracer.returncode == 0, stderr
    launches = [json.loads(line) for line in out.read_text().splitlines()]
    launches = [e for e in launches if e["phase"] == "exit"]
    assert len(launches) > 30  # (the tracer's start takes its time on a loaded machine)
    by_grid = {(e["args"]["grid"][0], e.get("kernel")) for e in launches}
    assert by_grid == {(2, "saxpy(float*)"), (4, "scale(double*)"), (1, "legacy(int*)")}
    assert "not named" not in stderr


def test_a_file_is_read_in_chunks_and_names_where_they_lie(stripped_app, monkeypatch):
    """The registrations of a file come from its code read in chunks (here of 64 bytes)
    and its names read where they lie, never a section whole (a framework's .text, .rodata
    and .nv_fatbin are hundreds of MB: the tracer's VmHWM was 422 MB attached to a PyTorch
    loop): the same registrations as read in one piece."""
    from test_elf import _ReadSpy

    _, app = stripped_app
    whole = registrations._read(str(app), open(str(app), "rb"))
    assert len(whole.kernels) == 3 and len(whole.handles) == 2
    monkeypatch.setattr(registrations, "_CHUNK", 64)
    monkeypatch.setattr(registrations, "_NAME_READ", 16)
    spy = _ReadSpy()
    monkeypatch.setattr(registrations, "open", spy, raising=False)
    registrations._cache.clear()
    found = registrations.registrations(str(app))
    assert (found.kernels, found.handles) == (whole.kernels, whole.handles)
    with open(str(app), "rb") as stream:
        from elftools.elf.elffile import ELFFile

        elf = ELFFile(stream)
        text = elf.get_section_by_name(".text")["sh_size"]
        # The ELF's own header tables are read whole (elf_raw.ElfTables); nothing else is
        tables = {elf["e_phnum"] * elf["e_phentsize"], elf["e_shnum"] * elf["e_shentsize"],
                  elf.get_section(elf["e_shstrndx"])["sh_size"]}
    assert text > 4 * 256 and text not in tables
    assert max(n for n in spy.sizes if n not in tables) <= 256  # (no read near .text's size)


def test_kept_registrations_are_sorted_arrays_and_names_are_read_when_asked(stripped_app,
                                                                           tmp_path):
    """A framework's file registers ~25,000 kernels, kept while the trace runs: each is kept
    as its hostFun and where its name lies (16 bytes), the name read in the file when asked;
    a file changed since it was read names nothing (its registrations are read anew)."""
    _, app = stripped_app
    copy = tmp_path / "app"
    shutil.copy(str(app), str(copy))
    found = registrations.registrations(str(copy))
    assert isinstance(found.kernels, registrations.KernelNames)
    assert isinstance(found.handles, registrations.Table)
    names = dict(found.kernels.items())
    assert sorted(names.values()) == ["_Z5saxpyPf", "_Z5scalePd", "_Z6legacyPi"]
    assert list(found.kernels) == sorted(names)  # (in address order)
    host = min(names)
    assert found.kernels.get(host) == names[host] and host in found.kernels
    assert found.kernels.get(host + 1) is None and "x" not in found.kernels
    assert {h: found.kernels[v] for h, v in found.handles.items()} == {
        h: names[v] for h, v in dict(found.handles).items()}
    with open(str(copy), "ab") as f:
        f.write(b"\0")  # (the file changed: its size and time)
    assert found.kernels.get(host) is None
    assert registrations.registrations(str(copy)).kernels == names  # (read anew)


def test_a_table_is_a_mapping_of_ints():
    pairs = {5: 10, -3: 7, (1 << 62) + 1: 0, 0: 2}
    table = registrations.Table(pairs)
    assert table == pairs and dict(table) == pairs and len(table) == 4
    assert list(table) == sorted(pairs)
    assert table[-3] == 7 and table.get(4) is None and table.get(1 << 70) is None
    assert 0 in table and 6 not in table and "5" not in table and None not in table
    with pytest.raises(KeyError):
        table[6]
    assert registrations.Table({}) == {} and not registrations.Table({})
