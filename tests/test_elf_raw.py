"""elf_raw.py's struct readers (and what ElfHeaders, the loader's _r_debug look-up and the
Python interpreter's reader make of them) against pyelftools' answers on real files: NVIDIA's
libcudart.so.12 (the pip wheel) and libcudart.so.13 (the toolkit) where installed, the
stand-in runtime and its driver program, the driver program stripped, /bin/true, this
Python, the dynamic loader, and a library without its section table. Same ELF header,
program headers, section headers and names, symbol tables, function symbols and their
uprobe offsets, dynamic tags, build id. pyelftools stays a test dependency only here: a
start no longer imports it (test_start_imports.py)."""
import glob
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest
from elftools.elf import enums
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpf_cuda.errors import ElfError
from ebpf_cuda.targets import elf_raw, loaders, python_layouts, registrations
from ebpf_cuda.targets.elf import ElfFile
from ebpf_cuda.targets.elf_symbols import base_name
from fakecuda import wheel_libcudart
from helpers import pyelftools_tags


def _numbers(prefix: str) -> Dict[str, int]:
    """Every pyelftools enum name of `prefix` (ENUM_P_TYPE, ENUM_SH_TYPE, ...) -> its value."""
    table: Dict[str, int] = {}
    for name in dir(enums):
        if name.startswith(prefix):
            table.update((k, v) for k, v in getattr(enums, name).items() if isinstance(v, int))
    return table


P_TYPES, SH_TYPES = _numbers("ENUM_P_TYPE"), _numbers("ENUM_SH_TYPE")
E_TYPES, MACHINES = _numbers("ENUM_E_TYPE"), _numbers("ENUM_E_MACHINE")


def _value(value, names: Dict[str, int]) -> int:
    return names[value] if isinstance(value, str) else int(value)


def _system_files() -> List[Path]:
    found = [wheel_libcudart()] + [Path(p) for p in sorted(glob.glob(
        "/usr/local/cuda*/lib64/libcudart.so.1[0-9]"))[:1]]
    found += [Path(shutil.which("true") or "/bin/true"), Path(sys.executable),
              Path(loaders.own_loader() or "/lib64/ld-linux-x86-64.so.2")]
    return [p.resolve() for p in found if p is not None and p.exists()]


@pytest.fixture(scope="module")
def files(fake, tmp_path_factory) -> List[Path]:
    """The real files of this machine, the stand-in and its program, the program stripped
    (no .symtab, only .dynsym)."""
    lib, prog = fake
    stripped = tmp_path_factory.mktemp("raw") / "prog-stripped"
    shutil.copy(prog, stripped)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True)
    return _system_files() + [Path(lib), Path(prog), stripped]


def _each(files: List[Path]):
    for path in files:
        with open(path, "rb") as stream:
            yield path, elf_raw.ElfTables(stream), ELFFile(stream)


def test_the_files_include_the_real_runtimes(files):
    """(What the comparisons below read: at least the stand-ins and /bin/true here.)"""
    names = {p.name for p in files}
    assert {"libcudart.so.12", "prog-stripped", "cuda_driver_prog"} <= names
    assert len(files) >= 5


def test_header_and_program_headers_match_pyelftools(files):
    for path, raw, elf in _each(files):
        header = raw.header
        assert (header.e_type, header.e_machine) == (
            _value(elf["e_type"], E_TYPES), _value(elf["e_machine"], MACHINES)), path
        for field in ("e_entry", "e_phoff", "e_shoff", "e_flags", "e_phentsize", "e_phnum",
                      "e_shentsize", "e_shnum", "e_shstrndx"):
            assert getattr(header, field) == elf[field], (path, field)
        expected = [(_value(s["p_type"], P_TYPES), s["p_flags"], s["p_offset"], s["p_vaddr"],
                     s["p_paddr"], s["p_filesz"], s["p_memsz"], s["p_align"])
                    for s in elf.iter_segments()]
        assert [tuple(s) for s in raw.segments] == expected, path
        assert len(expected) == elf.num_segments() > 0


def test_section_headers_and_names_match_pyelftools(files):
    for path, raw, elf in _each(files):
        expected = list(elf.iter_sections())
        assert len(raw.sections) == len(expected) == elf.num_sections() > 0, path
        for mine, theirs in zip(raw.sections, expected):
            assert (mine.sh_name, mine.sh_type, mine.sh_flags, mine.sh_addr, mine.sh_offset,
                    mine.sh_size, mine.sh_link, mine.sh_info, mine.sh_addralign,
                    mine.sh_entsize) == (
                theirs["sh_name"], _value(theirs["sh_type"], SH_TYPES), theirs["sh_flags"],
                theirs["sh_addr"], theirs["sh_offset"], theirs["sh_size"], theirs["sh_link"],
                theirs["sh_info"], theirs["sh_addralign"], theirs["sh_entsize"]), path
        for section in expected:
            found = raw.section(section.name)
            assert found is not None and found.sh_offset == \
                elf.get_section_by_name(section.name)["sh_offset"], (path, section.name)
        for name in (".dynstr", ".rela.plt", ".text"):
            section = elf.get_section_by_name(name)
            if section is not None:
                assert raw.data(raw.section(name)) == section.data(), (path, name)
        assert raw.section(".no-such-section") is None


def _symbol_tables(elf) -> List[tuple]:
    tables = []
    for section in elf.iter_sections():
        if section["sh_type"] in ("SHT_SYMTAB", "SHT_DYNSYM"):
            strings = elf.get_section(section["sh_link"])
            tables.append((".symtab" if section["sh_type"] == "SHT_SYMTAB" else ".dynsym",
                           section["sh_offset"], section["sh_size"], section["sh_entsize"],
                           strings["sh_offset"], strings["sh_size"]))
    return tables


def _functions(elf) -> Dict[str, Set[int]]:
    """{base name: st_values} of the defined functions of .symtab, else .dynsym."""
    table = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
    found: Dict[str, Set[int]] = {}
    for symbol in table.iter_symbols():
        if symbol["st_info"]["type"] == "STT_FUNC" and symbol["st_shndx"] != "SHN_UNDEF" \
                and symbol.name:
            found.setdefault(base_name(symbol.name), set()).add(symbol["st_value"])
    return found


def test_symbols_and_uprobe_offsets_match_pyelftools(files):
    """Every function (name and value), and its uprobe offset through pyelftools' PT_LOADs."""
    for path, _raw, elf in _each(files):
        mine = ElfFile(str(path), allow_stripped=True)
        assert mine._symbol_sections == _symbol_tables(elf), path
        expected = _functions(elf)
        if not expected:  # (a loader or program that exports no function)
            continue
        found = mine.function_symbols()
        assert set(found) == set(expected), path
        loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        for name, symbol in found.items():
            assert symbol.value in expected[name], (path, name)
            offset = next((symbol.value - s["p_vaddr"] + s["p_offset"] for s in loads
                           if s["p_vaddr"] <= symbol.value < s["p_vaddr"] + s["p_filesz"]),
                          None)
            assert mine.vaddr_to_offset(symbol.value) == offset, (path, name)
        assert mine.segments == [(s["p_vaddr"], s["p_offset"], s["p_filesz"], s["p_memsz"],
                                  s["p_flags"]) for s in loads]


def _build_id(elf) -> object:
    for section in elf.iter_sections():
        if section["sh_type"] == "SHT_NOTE":
            for note in section.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                    return note["n_desc"]
    return None


def test_dynamic_tags_and_build_id_match_pyelftools(files):
    for path, _raw, elf in _each(files):
        mine = ElfFile(str(path), allow_stripped=True)
        dynamic = [s for s in elf.iter_sections() if s["sh_type"] == "SHT_DYNAMIC"]
        assert (mine.needed, mine.soname, mine.rpath, mine.runpath) == pyelftools_tags(dynamic), path
        assert mine.build_id == _build_id(elf), path
    assert any(ElfFile(str(p), allow_stripped=True).needed for p in files)


def test_without_a_section_table_the_dynamic_segment_matches_pyelftools(fake, tmp_path):
    """sstrip's output: PT_DYNAMIC's tags (strings found through DT_STRTAB) and PT_NOTE."""
    lib, _ = fake
    data = bytearray(Path(lib).read_bytes())
    data[40:48], data[60:64] = bytes(8), bytes(4)  # e_shoff, e_shnum, e_shstrndx
    bare = tmp_path / "libbare.so"
    bare.write_bytes(bytes(data))
    mine = ElfFile(str(bare), allow_stripped=True)
    with open(bare, "rb") as stream:
        elf = ELFFile(stream)
        dynamic = [s for s in elf.iter_segments() if s["p_type"] == "PT_DYNAMIC"]
        expected = pyelftools_tags(dynamic)
        notes = [n for s in elf.iter_segments() if s["p_type"] == "PT_NOTE"
                 for n in s.iter_notes() if n["n_type"] == "NT_GNU_BUILD_ID"]
    assert expected[0] and (mine.needed, mine.soname, mine.rpath, mine.runpath) == expected
    assert mine.build_id == (notes[0]["n_desc"] if notes else None)
    assert elf_raw.ElfTables(open(bare, "rb")).sections == []


def test_the_loaders_r_debug_matches_pyelftools():
    loader = loaders.own_loader()
    if loader is None:
        pytest.skip("this Python runs without a dynamic loader")
    with open(loader, "rb") as stream:
        symbols = ELFFile(stream).get_section_by_name(".dynsym").get_symbol_by_name("_r_debug")
        expected = next(s["st_value"] for s in symbols if s["st_value"])
        assert loaders.dynamic_symbol_value(elf_raw.ElfTables(stream), "_r_debug") == expected
    hook = ElfFile(loader, allow_stripped=True).symbol_address("_dl_debug_state")
    assert loaders.r_debug_distance(loader, hook) == expected - hook != 0
    plain = shutil.which("true") or "/bin/true"  # (no _r_debug of its own)
    assert loaders.r_debug_distance(plain, 0) == 0


def test_the_interpreters_symbols_match_pyelftools():
    """python_layouts' reader (the `--py-stacks` probe's _PyRuntime, Py_Version, libpython):
    on this Python's executable and, where it has one, its libpython."""
    names = ("_PyRuntime", "Py_Version", "Py_Initialize")
    path = str(Path(sys.executable).resolve())
    paths = [path]
    found = python_layouts._read_symbols(path, names)
    assert found is not None
    library = python_layouts._libpython(path, found)
    if library is not None:
        paths.append(library)
    for path in paths:
        found = python_layouts._read_symbols(path, names)
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            for name, (value, size) in found.values.items():
                symbols = [s for table in (".dynsym", ".symtab")
                           if elf.get_section_by_name(table)
                           for s in elf.get_section_by_name(table).get_symbol_by_name(name)
                           or []]
                assert (value, size) in [(s["st_value"], s["st_size"]) for s in symbols], name
            assert found.needed == pyelftools_tags([s for s in elf.iter_sections()
                                          if s["sh_type"] == "SHT_DYNAMIC"])[0]
            rodata = elf.get_section_by_name(".rodata")
            assert found.rodata == ((rodata["sh_offset"], rodata["sh_size"])
                                    if rodata else (0, 0))
            assert found.segments == [(s["p_vaddr"], s["p_offset"], s["p_filesz"])
                                      for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
    assert "_PyRuntime" in found.values  # (the last file read holds the interpreter)


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.__setitem__(4, 1), "32-bit"),
    (lambda d: d.__setitem__(5, 2), "big-endian"),
    (lambda d: d.__setitem__(4, 3), "unknown class 3"),
    (lambda d: d.__setitem__(slice(0, 4), b"\x7fELG"), "is not an ELF file"),
])
def test_what_is_not_elf64_little_endian_is_refused_in_one_line(fake, tmp_path, edit, message):
    """ElfFile: the same one-line errors as before; the best-effort readers: nothing."""
    data = bytearray(Path(fake[0]).read_bytes())
    edit(data)
    bad = tmp_path / "libbad.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(ElfError, match=message) as info:
        ElfFile(str(bad))
    assert "\n" not in str(info.value)
    with pytest.raises(elf_raw.RawElfError):
        elf_raw.ElfTables(open(bad, "rb"))
    assert python_layouts._read_symbols(str(bad), ("cudaMalloc",)) is None
    assert loaders.r_debug_distance(str(bad), 0) == 0


def test_notes_are_read_as_pyelftools_pads_them(tmp_path):
    """Name and descriptor each padded to 4 bytes; a note cut by its table's end ends it."""
    def note(name: bytes, kind: int, desc: bytes) -> bytes:
        pad = lambda b: b + bytes(-len(b) % 4)  # noqa: E731
        return struct.pack("<III", len(name), len(desc), kind) + pad(name) + pad(desc)

    table = note(b"GNU\0", 5, b"\1\2\3\4\5\6") + note(b"GNU\0", 3, bytes(range(20))) + \
        note(b"", 7, b"")
    path = tmp_path / "notes"
    path.write_bytes(b"x" * 8 + table)
    with open(path, "rb") as stream:
        found = list(elf_raw.notes(stream, 8, len(table)))
        assert found == [(b"GNU", 5, b"\1\2\3\4\5\6"), (b"GNU", 3, bytes(range(20)))]
        assert list(elf_raw.notes(stream, 8, 12 + 4 + 3)) == [(b"GNU", 5, b"\1\2\3")]


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), min_size=1,
                      max_size=12),
       cut=st.one_of(st.none(), st.integers(0, 20000)))
def test_the_best_effort_readers_take_any_damage(fake, tmp_path, edits, cut):
    """The readers that look sections up by name (kernel registrations, the interpreter's
    symbols, the loader's _r_debug) answer "nothing" for a damaged file, never raise. The
    headers and tables lie in the first 4 KB of the stand-in's program: the edits go there."""
    data = bytearray(Path(fake[1]).read_bytes())
    shoff, = struct.unpack_from("<Q", data, 40)
    for position, value in edits:
        # half of the edits on the section table (at the file's end), half on the rest
        at = position if position % 2 else shoff + position % (len(data) - shoff)
        if at < len(data):
            data[at] = value
    bad = tmp_path / "bad"
    bad.write_bytes(bytes(data[:cut] if cut is not None else data))
    registrations._cache.clear()
    assert isinstance(registrations.registrations(str(bad)), registrations.Registrations)
    found = python_layouts._read_symbols(str(bad), ("main", "cudaMalloc"))
    assert found is None or isinstance(found.values, dict)
    assert isinstance(loaders.r_debug_distance(str(bad), 0), int)
