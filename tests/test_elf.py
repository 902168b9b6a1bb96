"""elf.py on real files: NVIDIA's libcudart.so.12, gcc-built PIE/non-PIE/shifted/stripped
files, an nvcc static binary when nvcc exists, and broken files of every kind; the file
structure (dynamic tags, build id, no section table, extended section numbering), read with
struct by elf_raw.py, checked against pyelftools' own full iteration and binutils."""
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpf_cuda.targets.elf import ElfFile, base_name, demangle, open_elf, read_function_symbols
from ebpf_cuda.errors import ElfError, NoCudaSymbolsError, SymbolNotFoundError
from fakecuda import wheel_libcudart
from helpers import gcc, pyelftools_tags

NATIVE = Path(__file__).parent / "native"
CUDART = wheel_libcudart()  # None where nvidia-cuda-runtime-cu12 is not installed
RUNTIME_FUNCTIONS = ["cudaMalloc", "cudaLaunchKernel", "cudaMemcpy", "cudaFree", "cudaGetDevice",
                     "cudaStreamCreate", "cudaMemcpyAsync", "cudaDeviceSynchronize",
                     "cudaMallocManaged", "cudaEventRecord"]
MANGLED = "_Z6vecAddPKfS0_Pfi"


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
    if CUDART is None:
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


def test_defines_any_scans_for_the_names_alone(cudart, build):
    """defines_any (a library looked at once) agrees with has_any, without a table of every
    function: data objects, undefined names and names that are the tail of another's are
    not functions it defines; local functions are."""
    path = str(build("markers", "elf_markers.c", "-Wl,--unresolved-symbols=ignore-all"))
    names = ["cudaMalloc", "cudaFree", "cudaGetDevice", "cudaLaunchKernel",
             "my_cudaLaunchKernel", "main"]
    fresh = ElfFile(path)
    assert fresh.defines_any(names) == {"cudaGetDevice", "my_cudaLaunchKernel", "main"}
    assert fresh._by_name is None  # (no table of every function made)
    assert ElfFile(path).has_any(names) == fresh.defines_any(names)
    wanted = RUNTIME_FUNCTIONS + ["cudaMalloc@@libcudart.so.12", "nope"]
    scanned = ElfFile(cudart.path).defines_any(wanted)
    assert scanned == cudart.has_any(wanted) == set(wanted) - {"nope"}


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
        ElfFile(str(bad), allow_stripped=True).defines_any(["cudaMalloc"])
        elf.symbol_offset("cudaMalloc")
    except ElfError:
        pass


def test_suggestions_stay_fast_on_huge_similar_tables():
    import time

    from ebpf_cuda.targets.elf import suggest
    names = ["_ZN5torch4cuda6kernel%dEv_impl_%d" % (i % 977, i) for i in range(200000)]
    names.append("cudaLaunchKernel")
    start = time.perf_counter()
    assert suggest("cudaLaunchKernal", names)[0] == "cudaLaunchKernel"
    assert suggest("_ZN5torch4cuda6kernel5Ev_impl_5x", names)[0] == \
        "_ZN5torch4cuda6kernel5Ev_impl_5"
    assert time.perf_counter() - start < 5


# ---- what pyelftools reads: dynamic tags, notes, extended numbering -----------------------

def _pyelftools_tags(path: Path):
    """(needed, soname, rpath, runpath) through pyelftools' own, full iteration."""
    with open(path, "rb") as stream:
        return pyelftools_tags([section for section in ELFFile(stream).iter_sections()
                                if section["sh_type"] == "SHT_DYNAMIC"])


@pytest.mark.parametrize("flags", [("-Wl,--disable-new-dtags,-rpath,/opt/a:/opt/b",),
                                   ("-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib:/opt/c",)])
def test_dynamic_tags_match_pyelftools(build, flags):
    path = build("libtags%d.so" % len(flags[0]), "elf_fakecudart.c", "-shared", "-fPIC",
                 "-Wl,-soname,libtags.so.1", "-lm", "-Wl,--no-as-needed", *flags)
    elf = ElfFile(str(path))
    assert (elf.needed, elf.soname, elf.rpath, elf.runpath) == _pyelftools_tags(path)
    assert elf.soname == "libtags.so.1" and "libc.so.6" in elf.needed
    assert (elf.rpath or elf.runpath) in (["/opt/a", "/opt/b"], ["$ORIGIN/lib", "/opt/c"])
    assert bool(elf.runpath) == ("enable-new-dtags" in flags[0])


def test_dynamic_tags_of_system_files_match_pyelftools():
    for path in (Path("/usr/bin/python3"), CUDART):
        if path is not None and path.exists():
            elf = ElfFile(str(path.resolve()), allow_stripped=True)
            assert (elf.needed, elf.soname, elf.rpath, elf.runpath) == \
                _pyelftools_tags(path.resolve()), path


def test_build_id_is_the_gnu_note(build, tmp_path):
    path = build("libbuildid.so", "elf_fakecudart.c", "-shared", "-fPIC", "-Wl,--build-id=sha1")
    with open(path, "rb") as stream:
        note = ELFFile(stream).get_section_by_name(".note.gnu.build-id")
        expected = next(n["n_desc"] for n in note.iter_notes())
    assert len(expected) == 40 and ElfFile(str(path)).build_id == expected
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True).stdout
        assert "Build ID: " + expected in out
    bare = build("libnobuildid.so", "elf_fakecudart.c", "-shared", "-fPIC", "-Wl,--build-id=none")
    assert ElfFile(str(bare)).build_id is None


def _without_section_table(data: bytes) -> bytes:
    """The file as sstrip leaves it: no section headers (e_shoff, e_shnum, e_shstrndx 0)."""
    damaged = bytearray(data)
    damaged[40:48] = bytes(8)
    damaged[60:64] = bytes(4)
    return bytes(damaged)


def test_no_section_table_reads_the_dynamic_segment(build, tmp_path):
    """The loader needs no section headers; dependencies come from PT_DYNAMIC then."""
    lib = build("libfake.so", "elf_fakecudart.c", "-shared", "-fPIC")
    expected = ElfFile(str(lib))
    bare = tmp_path / "libnosections.so"
    bare.write_bytes(_without_section_table(lib.read_bytes()))
    elf = ElfFile(str(bare), allow_stripped=True)
    assert elf.needed == expected.needed and elf.needed
    assert elf.segments == expected.segments
    assert elf.build_id == expected.build_id  # from the PT_NOTE segment
    with pytest.raises(ElfError, match="is stripped"):
        ElfFile(str(bare))


def test_extended_section_numbering(build, tmp_path):
    """Past 0xff00 sections, e_shnum is 0 and e_shstrndx SHN_XINDEX; section 0's sh_size
    and sh_link hold the real ones (pyelftools follows them)."""
    lib = build("libfake.so", "elf_fakecudart.c", "-shared", "-fPIC")
    data = bytearray(lib.read_bytes())
    shoff, = struct.unpack_from("<Q", data, 40)
    shnum, shstrndx = struct.unpack_from("<HH", data, 60)
    struct.pack_into("<Q", data, shoff + 32, shnum)  # section 0's sh_size
    struct.pack_into("<I", data, shoff + 40, shstrndx)  # section 0's sh_link
    struct.pack_into("<HH", data, 60, 0, 0xFFFF)
    extended = tmp_path / "libextended.so"
    extended.write_bytes(bytes(data))
    elf, plain = ElfFile(str(extended)), ElfFile(str(lib))
    assert elf.function_symbols() == plain.function_symbols()
    assert elf.needed == plain.needed and elf.symbol_offset("cudaMalloc") == \
        plain.symbol_offset("cudaMalloc")


@pytest.mark.parametrize("what,edit,message", [
    ("section table past the end", lambda d: struct.pack_into("<Q", d, 40, len(d)),
     "section header table runs past the end"),
    ("program header entries too small", lambda d: struct.pack_into("<H", d, 54, 8),
     "program header entries of 8 bytes"),
    ("unknown class", lambda d: d.__setitem__(4, 9), "unknown class 9"),
    ("unknown byte order", lambda d: d.__setitem__(5, 7), "unknown byte order 7"),
    ("big-endian", lambda d: d.__setitem__(5, 2), "big-endian"),
    ("section header string table index huge", lambda d: struct.pack_into("<H", d, 62, 0xfff0),
     "corrupted ELF file"),
])
def test_damaged_headers_are_one_line_elf_errors(build, tmp_path, what, edit, message):
    data = bytearray(build("libfake.so", "elf_fakecudart.c", "-shared", "-fPIC").read_bytes())
    edit(data)
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(ElfError, match=message) as info:
        ElfFile(str(bad))
    assert "\n" not in str(info.value) and str(bad) in str(info.value)


def test_reading_a_file_imports_no_pyelftools():
    """The structure is read with struct (elf_raw.py): pyelftools' import was 26-28 ms of
    every start. (A whole trace start: test_start_imports.py.)"""
    code = ("import sys, ebpf_cuda.targets.elf, ebpf_cuda.targets.discovery\n"
            "elf = ebpf_cuda.targets.elf.ElfFile(sys.executable, allow_stripped=True)\n"
            "print(len(elf.segments) > 0, len(elf.needed) > 0)\n"
            "print(any(m.startswith('elftools') for m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(Path(__file__).resolve().parent.parent))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False"]


# ---- large libraries: read in chunks, no table of every function -------------------------

class _ReadSpy:
    """open() for the modules under test: every read's size is noted (a whole table read at
    once would show as one large read)."""

    def __init__(self) -> None:
        self.sizes = []

    def __call__(self, path, mode="r", *args, **kwargs):
        stream = open(path, mode, *args, **kwargs)
        spy = self

        class Stream:
            def read(self, size=-1):
                data = stream.read(size)
                spy.sizes.append(len(data))
                return data

            def readinto(self, buffer):
                count = stream.readinto(buffer)
                spy.sizes.append(count)
                return count

            def __getattr__(self, name):
                return getattr(stream, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                stream.close()

        return Stream()


def test_names_and_addresses_are_found_in_chunks_without_a_table_of_every_function(
        tmp_path, monkeypatch):
    """Looking a few names up and naming addresses read the symbol and string tables in
    chunks (here of about 1 KB) and make no table of every function (a framework's library
    has ~10^6 symbols: the tracer's VmHWM was 374-422 MB with JAX and PyTorch on the GPU
    host); the answers are the whole table's."""
    from ebpf_cuda.targets import elf as elf_module
    from ebpf_cuda.targets import elf_symbols

    count = 3000
    source = tmp_path / "many.c"
    source.write_text("".join("%sint fn_%d(int x) { return x * %d + %d; }\n"
                              % ("static " if i % 3 == 0 else "", i, i + 2, i)
                              for i in range(count))
                      + "int (*keep[])(int) = {%s};\n" % ", ".join(
                          "fn_%d" % i for i in range(0, count, 3))
                      + "__attribute__((weak)) int weak_one(int x) { return x - 1; }\n")
    lib = tmp_path / "libmany.so"
    gcc("-O1", "-shared", "-fPIC", "-o", str(lib), str(source))
    full = ElfFile(str(lib)).function_symbols()  # (the whole table, as before)
    assert len(full) > count
    monkeypatch.setattr(elf_symbols, "_STRINGS_CHUNK", 1024)
    monkeypatch.setattr(elf_symbols, "_SYMBOLS_CHUNK", 40 * 24)
    monkeypatch.setattr(elf_symbols, "_SORT_BLOCK", 256)
    monkeypatch.setattr(elf_symbols, "_NAME_READ", 16)
    monkeypatch.setattr(elf_module, "WHOLE_TABLE_LIMIT", 0)  # (a large library's way)
    spy = _ReadSpy()
    monkeypatch.setattr(elf_module, "open", spy, raising=False)
    monkeypatch.setattr(elf_symbols, "open", spy, raising=False)
    elf = ElfFile(str(lib))
    wanted = ["fn_1", "fn_2999", "fn_3", "weak_one", "cudaMalloc"]
    assert elf.has_any(wanted) == set(wanted) - {"cudaMalloc"}
    assert {n: elf.symbol_offset(n) for n in wanted[:4]} == {
        n: elf.vaddr_to_offset(full[n].value) for n in wanted[:4]}
    by_start = {}
    for sym in full.values():
        by_start.setdefault(sym.value, []).append(sym)
    for start, syms in by_start.items():
        names = {sym.name for sym in syms}
        assert elf.symbolize(start) in names
        if len(syms) == 1 and syms[0].size > 1:
            assert elf.function_at(start + syms[0].size - 1) == (syms[0].name, start)
    assert elf._by_name is None  # (no table of every function was made)
    longest = max(len(name) for name in full) + 1
    assert spy.sizes and max(spy.sizes) <= 1024 + longest
