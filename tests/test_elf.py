"""elf.py on real files: NVIDIA's libcudart.so.12, gcc-built PIE/non-PIE/shifted/stripped
files, an nvcc static binary when nvcc exists, and broken files of every kind."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpf_cuda.elf import ElfFile, base_name, demangle, open_elf, read_function_symbols
from ebpf_cuda.errors import ElfError, NoCudaSymbolsError, SymbolNotFoundError

NATIVE = Path(__file__).parent / "native"
CUDART = Path("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cuda_runtime"
              "/lib/libcudart.so.12")
RUNTIME_FUNCTIONS = ["cudaMalloc", "cudaLaunchKernel", "cudaMemcpy", "cudaFree", "cudaGetDevice",
                     "cudaStreamCreate", "cudaMemcpyAsync", "cudaDeviceSynchronize",
                     "cudaMallocManaged", "cudaEventRecord"]
MANGLED = "_Z6vecAddPKfS0_Pfi"


def gcc(*args: str) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    subprocess.run(["gcc", "-O2", "-g", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(name, source, *flags) -> path, compiled once per module."""
    outdir = tmp_path_factory.mktemp("elf")
    built = {}

    def _build(name: str, source: str, *flags: str) -> Path:
        if name not in built:
            out = outdir / name
            gcc("-o", str(out), str(NATIVE / source), *flags)
            built[name] = out
        return built[name]

    return _build


def section_offset(path: Path, vaddr: int) -> int:
    """File offset of `vaddr` computed independently, from section headers (pyelftools)."""
    with open(path, "rb") as stream:
        for sec in ELFFile(stream).iter_sections():
            if sec["sh_addr"] <= vaddr < sec["sh_addr"] + sec["sh_size"] and \
                    sec["sh_type"] != "SHT_NOBITS" and sec["sh_addr"]:
                return vaddr - sec["sh_addr"] + sec["sh_offset"]
    raise AssertionError("no section holds 0x%x" % vaddr)


def objdump_bytes(path: Path, vaddr: int, count: int = 8) -> bytes:
    """The first bytes of the instructions objdump shows at `vaddr`."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump is not installed")
    out = subprocess.run(["objdump", "-d", "--start-address=%#x" % vaddr,
                          "--stop-address=%#x" % (vaddr + count), str(path)],
                         capture_output=True, text=True, check=True).stdout
    hexes = []
    for line in out.splitlines():
        match = re.match(r"\s*[0-9a-f]+:\s+((?:[0-9a-f]{2} )+)", line)
        if match:
            hexes += match.group(1).split()
    return bytes(int(h, 16) for h in hexes)[:count]


def nm_dynamic(path: Path):
    if shutil.which("nm") is None:
        pytest.skip("nm is not installed")
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True,
                         text=True, check=True).stdout
    table = {}
    for line in out.split("\n"):
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWi":
            table[base_name(parts[2])] = int(parts[0], 16)
    return table


# ---- the real CUDA runtime ------------------------------------------------------------------

@pytest.fixture(scope="module")
def cudart() -> ElfFile:
    if not CUDART.exists():
        pytest.skip("nvidia-cuda-runtime-cu12 is not installed")
    return ElfFile(str(CUDART))


def test_cudart_offsets_equal_st_value_and_nm(cudart):
    nm = nm_dynamic(CUDART)
    assert cudart.segments[0].vaddr == cudart.segments[0].offset == 0
    for name in RUNTIME_FUNCTIONS:
        offset = cudart.symbol_offset(name)
        assert offset == cudart.symbol_address(name) == nm[name], name
    assert cudart.soname == "libcudart.so.12"


def test_cudart_versioned_names_match_base_name(cudart):
    assert cudart.symbol_offset("cudaMalloc@@libcudart.so.12") == cudart.symbol_offset("cudaMalloc")
    assert cudart.defines("cudaFree@libcudart.so.12")


def test_bulk_reader_agrees_with_pyelftools(cudart):
    with open(CUDART, "rb") as stream:
        dynsym = ELFFile(stream).get_section_by_name(".dynsym")
        expected = {s.name: s["st_value"] for s in dynsym.iter_symbols()
                    if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"}
    assert {n: s.value for n, s in cudart.function_symbols().items()} == expected
    assert len(expected) > 300


def test_typo_suggests_the_real_name(cudart):
    with pytest.raises(SymbolNotFoundError) as info:
        cudart.symbol_offset("cudaMaloc")
    assert info.value.suggestions[0] == "cudaMalloc"
    assert "cudaMaloc" in str(info.value) and "did you mean cudaMalloc" in str(info.value)


def test_has_any_and_require_any(cudart, build):
    assert cudart.has_any(["cudaMalloc", "nope", "cudaFree"]) == {"cudaMalloc", "cudaFree"}
    plain = ElfFile(str(build("funcs_pie", "elf_funcs.c")))
    assert plain.has_any(RUNTIME_FUNCTIONS) == set()
    with pytest.raises(NoCudaSymbolsError, match="defines none of the 10 functions"):
        plain.require_any(RUNTIME_FUNCTIONS)
    assert cudart.require_any(["cudaMalloc", "x"]) == {"cudaMalloc"}


def test_symbolize_inside_cudart_function(cudart):
    sym = cudart.function_symbols()["cudaMemcpy"]
    assert cudart.symbolize(sym.value) == "cudaMemcpy"
    assert cudart.symbolize(sym.value + sym.size - 1) == "cudaMemcpy"
    assert cudart.symbolize_offset(cudart.symbol_offset("cudaMemcpy") + 1) == "cudaMemcpy"


# ---- gcc-built layouts ---------------------------------------------------------------------

@pytest.mark.parametrize("name,flags", [
    ("funcs_pie", ("-pie", "-fPIE")),
    ("funcs_nopie", ("-no-pie", "-fno-pie")),
    ("funcs_static", ("-static",)),
])
def test_executables_offsets_match_sections_and_bytes(build, name, flags):
    try:
        path = build(name, "elf_funcs.c", *flags)
    except subprocess.CalledProcessError:
        pytest.skip("gcc cannot build %s" % name)
    elf = ElfFile(str(path))
    assert elf.is_pie == (name == "funcs_pie")
    for func in ("main", MANGLED, "local_helper", "elf_exported"):
        vaddr, offset = elf.symbol_address(func), elf.symbol_offset(func)
        assert offset == section_offset(path, vaddr)
        assert elf.read_at(offset, 8) == objdump_bytes(path, vaddr)
    if name != "funcs_pie":
        assert elf.symbol_address("main") != elf.symbol_offset("main")


@pytest.mark.parametrize("flags", [("-Wl,-Ttext-segment=0x10000000",),
                                   ("-Wl,--section-start=.text=0x345000",)])
def test_shared_library_with_vaddr_not_offset(build, flags):
    path = build("libshift%d.so" % len(flags[0]), "elf_fakecudart.c", "-shared", "-fPIC", *flags)
    elf = ElfFile(str(path))
    for func in ("cudaMalloc", "cudaFree", "cudaLaunchKernel"):
        vaddr, offset = elf.symbol_address(func), elf.symbol_offset(func)
        assert vaddr != offset
        assert offset == section_offset(path, vaddr) == elf.vaddr_to_offset(vaddr)
        assert elf.offset_to_vaddr(offset) == vaddr
        assert elf.read_at(offset, 8) == objdump_bytes(path, vaddr)
    assert elf.functions()["cudaMalloc"] == elf.symbol_offset("cudaMalloc")


def test_symbolize_and_demangle_mangled_kernel(build):
    elf = ElfFile(str(build("funcs_pie", "elf_funcs.c", "-pie", "-fPIE")))
    sym = elf.function_symbols()[MANGLED]
    assert sym.size > 0
    for address in (sym.value, sym.value + 1, sym.value + sym.size - 1):
        assert elf.symbolize(address) == MANGLED
    assert elf.symbolize(sym.value + sym.size) != MANGLED
    assert elf.symbolize(0) is None
    assert demangle(MANGLED) == "vecAdd(float const*, float const*, float*, int)"
    assert demangle("main") == "main" and demangle("_Znot-valid") == "_Znot-valid"


def test_local_symbols_of_symtab_are_found(build):
    elf = ElfFile(str(build("funcs_pie", "elf_funcs.c", "-pie", "-fPIE")))
    assert elf.has_symtab
    assert elf.function_symbols()["local_helper"].bind == 0  # STB_LOCAL


def test_nvcc_static_binary_resolves_cudart_and_kernel_stub(tmp_path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        pytest.skip("nvcc is not installed")
    source = tmp_path / "k.cu"
    source.write_text("__global__ void vecAdd(const float*a,const float*b,float*c,int n)"
                      "{int i=threadIdx.x; if(i<n)c[i]=a[i]+b[i];}\n"
                      "int main(){float*d; cudaMalloc(&d,16); vecAdd<<<1,1>>>(d,d,d,1);"
                      " return 0;}\n")
    exe = tmp_path / "k"
    try:
        subprocess.run([nvcc, "-o", str(exe), str(source)], check=True, capture_output=True,
                       timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        pytest.skip("nvcc cannot build here")
    elf = ElfFile(str(exe))
    for func in ("cudaMalloc", "cudaLaunchKernel", "cudaFree"):
        assert elf.symbol_offset(func) == section_offset(exe, elf.symbol_address(func))
    stub = elf.symbol_address(MANGLED)
    assert demangle(elf.symbolize(stub + 2)) == "vecAdd(float const*, float const*, float*, int)"


# ---- broken files --------------------------------------------------------------------------

def test_missing_path(tmp_path):
    with pytest.raises(ElfError, match="no such file"):
        ElfFile(str(tmp_path / "absent.so"))


def test_directory(tmp_path):
    with pytest.raises(ElfError, match="is a directory"):
        ElfFile(str(tmp_path))


def test_not_elf(tmp_path):
    text = tmp_path / "script.sh"
    text.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(ElfError, match="is not an ELF file"):
        ElfFile(str(text))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(ElfError, match="is not an ELF file"):
        ElfFile(str(empty))


@pytest.mark.parametrize("length", [4, 30, 100, 5000])
def test_truncated(build, tmp_path, length):
    data = build("funcs_pie", "elf_funcs.c", "-pie", "-fPIE").read_bytes()
    cut = tmp_path / "cut"
    cut.write_bytes(data[:length])
    with pytest.raises(ElfError, match="truncated"):
        ElfFile(str(cut))


def test_stripped(build, tmp_path):
    if shutil.which("strip") is None:
        pytest.skip("strip is not installed")
    copy = tmp_path / "stripped"
    shutil.copy(build("funcs_pie", "elf_funcs.c", "-pie", "-fPIE"), copy)
    subprocess.run(["strip", str(copy)], check=True)
    with pytest.raises(ElfError, match="is stripped"):
        ElfFile(str(copy))
    assert ElfFile(str(copy), allow_stripped=True).needed == ["libc.so.6"]


def test_stripped_shared_library_keeps_exports(build, tmp_path):
    copy = tmp_path / "libstripped.so"
    shutil.copy(build("libfake.so", "elf_fakecudart.c", "-shared", "-fPIC"), copy)
    subprocess.run(["strip", str(copy)], check=True)
    elf = ElfFile(str(copy))
    assert not elf.has_symtab and elf.defines("cudaMalloc")


def test_32bit_object(tmp_path):
    source = tmp_path / "s.c"
    source.write_text("int f(int x) { return x + 1; }\n")
    obj = tmp_path / "s32.o"
    try:
        gcc("-m32", "-c", "-o", str(obj), str(source))
    except subprocess.CalledProcessError:
        pytest.skip("gcc -m32 is not available")
    with pytest.raises(ElfError, match="32-bit"):
        ElfFile(str(obj))


def test_flipped_class_and_machine(build, tmp_path):
    data = bytearray(build("funcs_pie", "elf_funcs.c", "-pie", "-fPIE").read_bytes())
    as32 = tmp_path / "as32"
    as32.write_bytes(bytes(data[:4]) + b"\x01" + bytes(data[5:]))
    with pytest.raises(ElfError, match="32-bit"):
        ElfFile(str(as32))
    foreign = tmp_path / "foreign"
    foreign.write_bytes(bytes(data[:18]) + (183 if os.uname().machine == "x86_64" else 62)
                        .to_bytes(2, "little") + bytes(data[20:]))
    with pytest.raises(ElfError, match="AArch64|x86-64"):
        ElfFile(str(foreign))


def test_object_file_is_refused(tmp_path):
    source = tmp_path / "o.c"
    source.write_text("int f(int x) { return x + 1; }\n")
    gcc("-c", "-o", str(tmp_path / "o.o"), str(source))
    with pytest.raises(ElfError, match="relocatable object"):
        ElfFile(str(tmp_path / "o.o"))


def test_unreadable_symbol_entry_size_is_an_elf_error(tmp_path):
    data = tmp_path / "d"
    data.write_bytes(b"\0" * 64)
    with open(data, "rb") as stream, pytest.raises(ElfError):
        read_function_symbols(stream, 0, 64, 16, 0, 0)


def test_open_elf_caches_by_inode_and_mtime(build, tmp_path):
    src = build("libfake.so", "elf_fakecudart.c", "-shared", "-fPIC")
    copy = tmp_path / "libcopy.so"
    shutil.copy(src, copy)
    first = open_elf(str(copy))
    assert open_elf(str(copy)) is first
    os.utime(copy, ns=(1, 1))
    assert open_elf(str(copy)) is not first


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 20000), st.integers(0, 255)), min_size=1,
                      max_size=12),
       cut=st.one_of(st.none(), st.integers(0, 20000)))
def test_corrupted_files_raise_only_elf_errors(build, tmp_path, edits, cut):
    data = bytearray(build("libfake.so", "elf_fakecudart.c", "-shared", "-fPIC").read_bytes())
    for position, value in edits:
        if position < len(data):
            data[position] = value
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(data[:cut] if cut is not None else data))
    try:
        elf = ElfFile(str(bad), allow_stripped=True)
        elf.functions()
        elf.symbolize(0x1100)
        elf.has_any(["cudaMalloc"])
        elf.symbol_offset("cudaMalloc")
    except ElfError:
        pass


def test_suggestions_stay_fast_on_huge_similar_tables():
    import time

    from ebpf_cuda.elf import suggest
    names = ["_ZN5torch4cuda6kernel%dEv_impl_%d" % (i % 977, i) for i in range(200000)]
    names.append("cudaLaunchKernel")
    start = time.perf_counter()
    assert suggest("cudaLaunchKernal", names)[0] == "cudaLaunchKernel"
    assert suggest("_ZN5torch4cuda6kernel5Ev_impl_5x", names)[0] == \
        "_ZN5torch4cuda6kernel5Ev_impl_5"
    assert time.perf_counter() - start < 5
