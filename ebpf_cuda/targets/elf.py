"""ELF symbols for uprobes: symbol -> file offset, address -> symbol, fast bulk symbol reads.

The file's structure (ELF header, program headers, section headers, dynamic tags such as
DT_NEEDED/DT_RPATH/DT_RUNPATH/DT_SONAME, notes such as the GNU build id) is read with
pyelftools, imported on the first file opened (its import costs ~15-20 ms: `import
ebpf_cuda.targets.elf` alone does not pay it). Only pyelftools' cheap, lazy pieces are used: headers
one by one, never its section objects for hash tables, which parse the whole table (a tenth of
a second and more on big libraries), nor its section-name map or dynamic segment, which build
every section.

The symbol tables themselves are read in bulk with `struct` (Elf64_Sym below): iterating
libtorch_cuda.so's 211k symbols through pyelftools takes seconds, a raw read a fraction of a
second; the tests check the bulk reader against pyelftools.

Every failure while reading a file (pyelftools' ELFError and construct errors, struct, I/O, a
corrupted field) comes out as an `ElfError` (or a subclass) with a one-line message, never as
a raw exception.
"""
import bisect
import ctypes
import errno
import functools
import gc
import heapq
import os
import stat
import struct
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Set, Tuple

from ..errors import ElfError, NoCudaSymbolsError, SymbolNotFoundError

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
ET_EXEC, ET_DYN = 2, 3
STT_FUNC = 2
SHN_UNDEF = 0
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SYM_FORMAT = "<IBBHQQ"  # Elf64_Sym: st_name st_info st_other st_shndx st_value st_size
SYM_SIZE = struct.calcsize(SYM_FORMAT)
EHDR_SIZE = 64
PHDR_SIZE = 56  # Elf64_Phdr
SHDR_SIZE = 64  # Elf64_Shdr
DYN_SIZE = 16  # Elf64_Dyn
MAX_DYNAMIC_TAGS = 65536  # a damaged table without DT_NULL is not read to the end of the file
_STRING_TAGS = {"DT_NEEDED": "needed", "DT_SONAME": "soname", "DT_RPATH": "rpath",
                "DT_RUNPATH": "runpath"}

# e_machine values by `os.uname().machine` name.
MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}
MACHINE_NAMES = {3: "x86 (i386)", 8: "MIPS", 20: "PowerPC", 21: "PowerPC64", 40: "ARM",
                 62: "x86-64", 183: "AArch64", 243: "RISC-V"}
TYPE_NAMES = {0: "an ELF file of no type", 1: "a relocatable object", 4: "a core dump"}


class Segment(NamedTuple):
    """A PT_LOAD program header."""

    vaddr: int
    offset: int
    filesz: int
    memsz: int
    flags: int


class FunctionSymbol(NamedTuple):
    """A defined function symbol; `name` has any `@version` suffix removed."""

    name: str
    value: int
    size: int
    bind: int


class _SymbolSection(NamedTuple):
    name: str
    offset: int
    size: int
    entsize: int
    str_offset: int
    str_size: int


def running_machine() -> int:
    """The e_machine value of the machine this process runs on."""
    machine = os.uname().machine.lower()
    if machine not in MACHINES:
        raise ElfError("unsupported architecture %r" % machine)
    return MACHINES[machine]


def base_name(name: str) -> str:
    """`cudaMalloc@@libcudart.so.12` -> `cudaMalloc` (symbol versions are not part of the name)."""
    return name.split("@", 1)[0]


def _bind_rank(bind: int) -> int:
    """Lower is preferred when one name has several definitions: global, weak, then local."""
    return {STB_GLOBAL: 0, STB_WEAK: 1}.get(bind, 2)


class ElfFile:
    """A validated 64-bit ELF executable or shared library of the running architecture.

    Headers are read when the object is made; symbol tables on first use. A file without
    function symbols raises ElfError unless `allow_stripped` (enough to read its
    dependencies and segments).
    """

    def __init__(self, path: str, machine: Optional[int] = None,
                 allow_stripped: bool = False) -> None:
        self.path = str(path)
        self._expected_machine = running_machine() if machine is None else machine
        self.size = self._check_path()
        self.machine = 0
        self.elf_type = 0
        self.entry = 0
        self.segments: List[Segment] = []
        self.needed: List[str] = []
        self.runpath: List[str] = []
        self.rpath: List[str] = []
        self.soname: Optional[str] = None
        self._symbol_sections: List[_SymbolSection] = []
        self._by_name: Optional[Dict[str, _Sym]] = None
        # Address index for bisect: sorted starts, and per start its end and name.
        self._starts: List[int] = []
        self._ends: List[int] = []
        self._names: List[str] = []
        self._indexed = False
        self._build_id: Optional[str] = None
        self._read_headers()
        if not allow_stripped:
            self._check_not_stripped()

    def __repr__(self) -> str:
        return "ElfFile(%r)" % self.path

    # ---- validation -------------------------------------------------------------------

    def _check_path(self) -> int:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            raise ElfError("%s: no such file" % self.path) from None
        except OSError as err:
            raise ElfError("%s: cannot read: %s" % (self.path, err.strerror or err)) from None
        if stat.S_ISDIR(info.st_mode):
            raise ElfError("%s is a directory, not an ELF file" % self.path)
        if not stat.S_ISREG(info.st_mode):
            raise ElfError("%s is not a regular file" % self.path)
        return info.st_size

    def _check_ident(self, header: bytes) -> None:
        """What pyelftools cannot say well: not ELF at all, or cut inside its header."""
        if header[:4] != ELF_MAGIC:
            raise ElfError("%s is not an ELF file" % self.path)
        if len(header) < EHDR_SIZE:
            raise ElfError("%s is truncated (%d bytes, shorter than an ELF header)"
                           % (self.path, len(header)))
        if header[4] not in (1, ELFCLASS64):
            raise ElfError("%s is an ELF file of unknown class %d; only 64-bit ELF files can be "
                           "traced" % (self.path, header[4]))
        if header[5] not in (ELFDATA2LSB, 2):
            raise ElfError("%s is an ELF file of unknown byte order %d" % (self.path, header[5]))

    def _check_identity(self, elf) -> None:
        """64-bit, little-endian, this machine, an executable or shared library."""
        if elf.elfclass != 64:
            raise ElfError("%s is a 32-bit (ELFCLASS32) ELF file; only 64-bit ELF files can be "
                           "traced" % self.path)
        if not elf.little_endian:
            raise ElfError("%s is a big-endian ELF file; only little-endian is supported"
                           % self.path)
        enums = _pyelftools().enums
        self.machine = _enum_value(elf["e_machine"], enums.ENUM_E_MACHINE)
        self.elf_type = _enum_value(elf["e_type"], enums.ENUM_E_TYPE)
        if self.machine != self._expected_machine:
            raise ElfError("%s is built for %s (e_machine %d), not for this machine (%s)"
                           % (self.path, MACHINE_NAMES.get(self.machine, "another machine"),
                              self.machine, MACHINE_NAMES.get(self._expected_machine, "?")))
        if self.elf_type not in (ET_EXEC, ET_DYN):
            raise ElfError("%s is %s, not an executable or shared library"
                           % (self.path, TYPE_NAMES.get(self.elf_type, "of ELF type %d"
                                                        % self.elf_type)))

    def _check_table(self, offset: int, entry_size: int, count: int, minimum: int,
                     what: str) -> None:
        if count and entry_size < minimum:
            raise ElfError("%s is a corrupted ELF file (%s entries of %d bytes, fewer than %d)"
                           % (self.path, what, entry_size, minimum))
        if count and offset + entry_size * count > self.size:
            raise ElfError("%s is truncated (its %s table runs past the end of the %d-byte "
                           "file)" % (self.path, what, self.size))

    def _read_headers(self) -> None:
        try:
            with open(self.path, "rb") as stream:
                self._check_ident(stream.read(EHDR_SIZE))
                stream.seek(0)
                self._parse(_pyelftools().ELFFile(stream))
        except ElfError:
            raise
        except OSError as err:
            raise self._read_error(err, "is a corrupted ELF file") from None
        except Exception as err:  # pyelftools' ELFError, construct errors, corrupted fields
            raise ElfError("%s is a corrupted ELF file (%s)" % (self.path, _describe(err))) \
                from None

    def _read_error(self, err: OSError, corrupted: str) -> ElfError:
        if err.errno in (errno.EINVAL, errno.EOVERFLOW):  # a seek to a corrupted offset
            return ElfError("%s %s (an offset past any file's end)" % (self.path, corrupted))
        return ElfError("%s: cannot read: %s" % (self.path, err.strerror or err))

    def _parse(self, elf) -> None:
        """Segments, symbol tables and dynamic tags: header by header through pyelftools
        (get_section and iter_segments would build pyelftools' objects for every section,
        hash tables parsed whole included)."""
        self._check_identity(elf)
        self.entry = elf["e_entry"]
        sections = elf.num_sections()  # e_shnum, or section 0's sh_size when past 0xff00
        self._check_table(elf["e_shoff"], elf["e_shentsize"], sections, SHDR_SIZE,
                          "section header")
        segments = elf.num_segments()  # e_phnum, or section 0's sh_info when 0xffff
        self._check_table(elf["e_phoff"], elf["e_phentsize"], segments, PHDR_SIZE,
                          "program header")
        dynamic_segment = None
        for index in range(segments):
            header = elf._get_segment_header(index)
            if header["p_type"] == "PT_LOAD":
                self.segments.append(Segment(header["p_vaddr"], header["p_offset"],
                                             header["p_filesz"], header["p_memsz"],
                                             header["p_flags"]))
            elif header["p_type"] == "PT_DYNAMIC" and dynamic_segment is None:
                dynamic_segment = index
        headers = [elf._get_section_header(index) for index in range(sections)]
        dynamic_sections = []
        for index, header in enumerate(headers):
            if header["sh_type"] in ("SHT_SYMTAB", "SHT_DYNSYM"):
                self._add_symbol_section(header, headers)
            elif header["sh_type"] == "SHT_DYNAMIC":
                dynamic_sections.append(index)
        for index in dynamic_sections:
            strtab = self._linked_strings(headers[index], headers, "dynamic section")
            if strtab["sh_type"] != "SHT_STRTAB":
                raise ElfError("%s: its dynamic section links to no string table" % self.path)
            self._read_dynamic(elf.get_section(index), headers[index]["sh_size"],
                               strtab["sh_size"])
        if not sections and dynamic_segment is not None:
            # No section table (stripped of it): the loader reads PT_DYNAMIC, so do we (with
            # sections, pyelftools' DynamicSegment would build every section to find its own).
            # Best effort: a damaged one leaves the file without known dependencies.
            try:
                segment = elf.get_segment(dynamic_segment)
                self._read_dynamic(segment, segment["p_filesz"], None)
            except Exception:  # pyelftools' errors, construct's, seek errors
                self.needed, self.soname, self.rpath, self.runpath = [], None, [], []

    def _section_bytes_in_file(self, header, what: str) -> None:
        if header["sh_type"] != "SHT_NOBITS" and \
                header["sh_offset"] + header["sh_size"] > self.size:
            raise ElfError("%s is truncated (its %s runs past the end of the file)"
                           % (self.path, what))

    def _linked_strings(self, header, headers, what: str):
        link = header["sh_link"]
        if not 0 < link < len(headers):
            raise ElfError("%s: its %s links to no string table" % (self.path, what))
        strtab = headers[link]
        self._section_bytes_in_file(header, what)
        self._section_bytes_in_file(strtab, "string table of its " + what)
        return strtab

    def _add_symbol_section(self, header, headers) -> None:
        kind = ".symtab" if header["sh_type"] == "SHT_SYMTAB" else ".dynsym"
        strtab = self._linked_strings(header, headers, kind)
        self._symbol_sections.append(_SymbolSection(
            kind, header["sh_offset"], header["sh_size"], header["sh_entsize"] or SYM_SIZE,
            strtab["sh_offset"], strtab["sh_size"]))

    def _read_dynamic(self, table, size: int, strings_size: Optional[int]) -> None:
        """DT_NEEDED, DT_SONAME, DT_RPATH and DT_RUNPATH of a pyelftools DynamicSection (or
        DynamicSegment), up to DT_NULL and never past the table's `size`."""
        for index in range(min(size // DYN_SIZE, MAX_DYNAMIC_TAGS)):
            entry = table._get_tag(index)  # the raw entry: get_tag also looks up its string
            tag = entry["d_tag"]
            if tag == "DT_NULL":
                break
            field = _STRING_TAGS.get(tag)
            if field is None:
                continue
            if strings_size is not None and not 0 <= entry["d_val"] < strings_size:
                raise ElfError("%s: string offset %d of its %s lies outside its string table"
                               % (self.path, entry["d_val"], tag))
            text = getattr(table.get_tag(index), field)
            if tag == "DT_NEEDED":
                self.needed.append(text)
            elif tag == "DT_SONAME":
                self.soname = text
            else:
                paths = self.rpath if tag == "DT_RPATH" else self.runpath
                paths.extend(p for p in text.split(":") if p)

    @property
    def build_id(self) -> Optional[str]:
        """The GNU build id (NT_GNU_BUILD_ID note) in hex, or None; read on first use."""
        if self._build_id is None:
            self._build_id = self._read_build_id() or ""
        return self._build_id or None

    def _read_build_id(self) -> Optional[str]:
        try:
            with open(self.path, "rb") as stream:
                elf = _pyelftools().ELFFile(stream)
                notes = [elf.get_section(i) for i in range(elf.num_sections())
                         if elf._get_section_header(i)["sh_type"] == "SHT_NOTE"]
                if not notes:  # no section table: the PT_NOTE segments
                    notes = [elf.get_segment(i) for i in range(elf.num_segments())
                             if elf._get_segment_header(i)["p_type"] == "PT_NOTE"]
                for table in notes:
                    for note in table.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                            return str(note["n_desc"])
        except OSError as err:
            raise self._read_error(err, "has corrupted notes") from None
        except Exception as err:
            raise ElfError("%s has corrupted notes (%s)" % (self.path, _describe(err))) \
                from None
        return None

    def _check_not_stripped(self) -> None:
        names = [s.name for s in self._symbol_sections]
        if ".symtab" in names:
            return
        if not names or not self._load_symbols():
            raise ElfError("%s is stripped (it has no symbol table and exports no functions)"
                           % self.path)

    # ---- bulk symbol reading ---------------------------------------------------------

    @property
    def is_pie(self) -> bool:
        """True for position-independent files (PIE executables and shared libraries)."""
        return self.elf_type == ET_DYN

    @property
    def has_symtab(self) -> bool:
        """True when the full (non-dynamic) symbol table is present."""
        return any(s.name == ".symtab" for s in self._symbol_sections)

    def _load_symbols(self) -> Dict[str, "_Sym"]:
        if self._by_name is None:
            gc_was_enabled = gc.isenabled()
            gc.disable()  # hundreds of thousands of tuples: collections would double the time
            try:
                self._by_name = self._read_all_functions()
            except ElfError:
                raise
            except OSError as err:
                raise ElfError("%s: cannot read: %s" % (self.path, err.strerror or err)) \
                    from None
            except Exception as err:
                self._by_name = None
                raise ElfError("%s has a corrupted symbol table (%s)"
                               % (self.path, _describe(err))) from None
            finally:
                if gc_was_enabled:
                    gc.enable()
        return self._by_name

    def _function_tables(self) -> List[_SymbolSection]:
        # .symtab, where present, already holds every .dynsym function (the linker writes
        # both) plus the local ones; reading .dynsym too would double the cost for nothing.
        return [s for s in self._symbol_sections if s.name == ".symtab"] or \
            self._symbol_sections

    def _read_all_functions(self) -> Dict[str, "_Sym"]:
        by_name: Dict[str, _Sym] = {}
        with open(self.path, "rb") as stream:
            for section in self._function_tables():
                _merge_preferring_global(by_name, read_function_symbols(
                    stream, section.offset, section.size, section.entsize,
                    section.str_offset, section.str_size))
        return by_name

    def _build_address_index(self) -> None:
        # Sorted by address (sorting on the bare address is 3x faster than on tuples); among
        # aliases at one address the preferred one (global, then longest) is moved last,
        # which is the one bisect_right lands on.
        items = sorted(self._load_symbols().items(), key=_address_of)
        starts = [sym[0] for _, sym in items]
        for i in range(1, len(items)):
            if starts[i] == starts[i - 1] and _alias_rank(items[i - 1]) < _alias_rank(items[i]):
                items[i - 1], items[i] = items[i], items[i - 1]
        self._starts = starts
        self._ends = [sym[0] + sym[1] for _, sym in items]
        self._names = [name for name, _ in items]
        self._indexed = True

    # ---- public queries --------------------------------------------------------------

    def function_symbols(self) -> Dict[str, FunctionSymbol]:
        """All defined function symbols by base name (global definitions win over local)."""
        return {name: FunctionSymbol(name, *sym) for name, sym in self._load_symbols().items()}

    def function_names(self) -> List[str]:
        """Names of all defined functions (cheap: no per-symbol objects are made)."""
        return list(self._load_symbols())

    def symbol(self, name: str) -> Optional[FunctionSymbol]:
        """The definition of function `name` (any `@version` ignored), or None."""
        sym = self._load_symbols().get(base_name(name))
        return None if sym is None else FunctionSymbol(base_name(name), *sym)

    def functions(self) -> Dict[str, int]:
        """Every defined function mapped to its uprobe file offset (skips unmapped ones)."""
        result = {}
        for name, sym in self._load_symbols().items():
            offset = self.vaddr_to_offset(sym[0])
            if offset is not None:
                result[name] = offset
        return result

    def defines(self, name: str) -> bool:
        """True when the file defines function `name` (any version, any binding)."""
        return base_name(name) in self._load_symbols()

    def has_any(self, names: Iterable[str]) -> Set[str]:
        """The subset of `names` this file defines as functions."""
        table = self._load_symbols()
        return {n for n in names if base_name(n) in table}

    def defines_any(self, names: Iterable[str]) -> Set[str]:
        """Like `has_any`, for a look at a few names in a file that may never be read again
        (a library checked for a runtime linked in statically): the symbol tables are
        scanned for those names only, and no table of every function is made or kept."""
        wanted = list(names)
        if self._by_name is not None:
            return self.has_any(wanted)
        defined: Set[str] = set()
        try:
            with open(self.path, "rb") as stream:
                for section in self._function_tables():
                    defined |= find_functions(stream, section, {base_name(n) for n in wanted})
        except OSError as err:
            raise ElfError("%s: cannot read: %s" % (self.path, err.strerror or err)) from None
        except Exception as err:
            raise ElfError("%s has a corrupted symbol table (%s)"
                           % (self.path, _describe(err))) from None
        return {n for n in wanted if base_name(n) in defined}

    def require_any(self, names: Iterable[str]) -> Set[str]:
        """Like `has_any`, but raises NoCudaSymbolsError when none is defined."""
        wanted = list(names)
        found = self.has_any(wanted)
        if not found:
            sample = ", ".join(wanted[:4]) + (", ..." if len(wanted) > 4 else "")
            raise NoCudaSymbolsError("%s defines none of the %d functions asked for (%s)"
                                     % (self.path, len(wanted), sample))
        return found

    def symbol_address(self, name: str) -> int:
        """The virtual address (st_value) of function `name`."""
        table = self._load_symbols()
        sym = table.get(base_name(name))
        if sym is None:
            suggestions = suggest(base_name(name), table.keys())
            hint = " (did you mean %s?)" % ", ".join(suggestions) if suggestions else ""
            raise SymbolNotFoundError("function %s is not defined in %s%s"
                                      % (name, self.path, hint), suggestions)
        return sym[0]

    def symbol_offset(self, name: str) -> int:
        """The file offset at which to place a uprobe on function `name`."""
        value = self.symbol_address(name)
        offset = self.vaddr_to_offset(value)
        if offset is None:
            raise ElfError("%s: function %s at 0x%x lies in no loadable segment"
                           % (self.path, name, value))
        return offset

    def vaddr_to_offset(self, vaddr: int) -> Optional[int]:
        """File offset of virtual address `vaddr`, via the PT_LOAD whose file bytes hold it."""
        for seg in self.segments:
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                return vaddr - seg.vaddr + seg.offset
        return None

    def offset_to_vaddr(self, offset: int) -> Optional[int]:
        """Virtual address of file offset `offset`, via the PT_LOAD whose file bytes hold it."""
        for seg in self.segments:
            if seg.offset <= offset < seg.offset + seg.filesz:
                return offset - seg.offset + seg.vaddr
        return None

    def symbolize(self, vaddr: int) -> Optional[str]:
        """The function whose [value, value + size) holds `vaddr` (or starts at it), else None."""
        if not self._indexed:
            self._build_address_index()
        index = bisect.bisect_right(self._starts, vaddr) - 1
        if index < 0:
            return None
        if self._starts[index] == vaddr or vaddr < self._ends[index]:
            return self._names[index]
        return None

    def symbolize_offset(self, offset: int) -> Optional[str]:
        """Like `symbolize`, for a file offset."""
        vaddr = self.offset_to_vaddr(offset)
        return None if vaddr is None else self.symbolize(vaddr)

    def read_at(self, offset: int, count: int) -> bytes:
        """`count` raw bytes at file offset `offset` (for checks and disassembly)."""
        try:
            with open(self.path, "rb") as stream:
                stream.seek(offset)
                return stream.read(count)
        except OSError as err:
            raise ElfError("%s: cannot read: %s" % (self.path, err.strerror or err)) from None


_Sym = Tuple[int, int, int]  # value, size, bind
_FUNCTION_TYPES = bytes(1 if i & 0xF == STT_FUNC else 0 for i in range(256))


def read_function_symbols(stream, offset: int, size: int, entsize: int, str_offset: int,
                          str_size: int) -> List[Tuple[str, int, int, int]]:
    """(base name, value, size, bind) of each defined function of one symbol table, read in
    bulk from `stream`: one read per table, one struct pass, names sliced from the table."""
    if entsize != SYM_SIZE:
        raise ElfError("symbol entries are %d bytes, expected %d" % (entsize, SYM_SIZE))
    stream.seek(offset)
    data = stream.read(size - size % SYM_SIZE)
    stream.seek(str_offset)
    raw_strings = stream.read(str_size)
    # An ASCII table (the normal case) is decoded once; names are then sliced as str.
    ascii_only = raw_strings.isascii()
    strings = raw_strings.decode("ascii") if ascii_only else raw_strings
    versioned = (b"@" in raw_strings)
    limit = len(strings)
    find = strings.find
    nul = "\0" if ascii_only else b"\0"
    result = []
    append = result.append
    for st_name, st_info, _other, shndx, value, sym_size in struct.iter_unpack(SYM_FORMAT, data):
        if not _FUNCTION_TYPES[st_info] or shndx == SHN_UNDEF or st_name >= limit:
            continue
        end = find(nul, st_name)
        name = strings[st_name:end if end >= 0 else limit]
        if not ascii_only:
            name = name.decode("utf-8", "replace")
        if versioned:
            name = name.split("@", 1)[0]
        if name:
            append((name, value, sym_size, st_info >> 4))
    return result


def find_functions(stream, table: "_SymbolSection", names: Set[str]) -> Set[str]:
    """Which of `names` one symbol table defines as functions. Each name's string offsets
    are found in the string table first (every place the name ends there, with a NUL or a
    symbol version: a linker may store it as the tail of a longer string); then a symbol
    is looked at only when its name is at one of those offsets."""
    if table.entsize != SYM_SIZE:
        raise ElfError("symbol entries are %d bytes, expected %d" % (table.entsize, SYM_SIZE))
    stream.seek(table.str_offset)
    strings = stream.read(table.str_size)
    at: Dict[int, str] = {}
    for name in names:
        encoded = name.encode()
        for end in (b"\0", b"@"):
            start = strings.find(encoded + end)
            while start >= 0:
                at[start] = name
                start = strings.find(encoded + end, start + 1)
    if not at:
        return set()
    stream.seek(table.offset)
    data = stream.read(table.size - table.size % SYM_SIZE)
    return {at[st_name] for st_name, st_info, _other, shndx, _value, _size
            in struct.iter_unpack(SYM_FORMAT, data)
            if st_name in at and _FUNCTION_TYPES[st_info] and shndx != SHN_UNDEF}


def suggest(name: str, names: Iterable[str], count: int = 5) -> List[str]:
    """The names closest to `name` (difflib), for "did you mean" hints.

    difflib over 200k similar C++ names takes seconds, so it only ranks the 2000 names that
    share the longest prefix or suffix with `name`.
    """
    pool = list(names)
    if len(pool) > 2000:
        reverse = name[::-1]
        common = os.path.commonprefix
        pool = heapq.nlargest(2000, pool, key=lambda n: max(len(common((name, n))),
                                                            len(common((reverse, n[::-1])))))
    import difflib  # only for the hint of an error message

    return difflib.get_close_matches(name, pool, n=count)


def _address_of(item: Tuple[str, _Sym]) -> int:
    return item[1][0]


def _alias_rank(item: Tuple[str, _Sym]) -> Tuple[int, int]:
    """Larger is preferred among aliases: global over weak over local, then longer (ties keep
    symbol-table order, the sort being stable)."""
    _name, (_value, size, bind) = item
    return (-_bind_rank(bind), size)


def _merge_preferring_global(by_name: Dict[str, _Sym], symbols) -> None:
    get = by_name.get
    for name, value, size, bind in symbols:
        known = get(name)
        if known is None or (bind != known[2] and _bind_rank(bind) < _bind_rank(known[2])):
            by_name[name] = (value, size, bind)


class _Pyelftools(NamedTuple):
    ELFFile: Any
    enums: Any


@functools.lru_cache(maxsize=None)
def _pyelftools() -> _Pyelftools:
    """pyelftools' ELFFile and enums, imported on first use (not by `import ebpf_cuda.targets.elf`);
    without collections meanwhile (its ~50 modules make objects by the thousand: ~1 ms)."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        from elftools.elf import enums
        from elftools.elf.elffile import ELFFile
    finally:
        if gc_was_enabled:
            gc.enable()
    return _Pyelftools(ELFFile, enums)


def _enum_value(value: Any, names: Dict[str, int]) -> int:
    """pyelftools gives the names of known enum values (`EM_X86_64`), others as numbers."""
    return names.get(value, -1) if isinstance(value, str) else int(value)


def _describe(err: BaseException) -> str:
    """`Type: message` on one line (construct's messages span several)."""
    text = " ".join(str(err).split())
    if not text and isinstance(err, AssertionError):
        text = "a table pyelftools cannot make sense of"
    if len(text) > 200:
        text = text[:197] + "..."
    return "%s: %s" % (type(err).__name__, text) if text else type(err).__name__


def _file_key(path: str) -> Tuple[int, int, int, int]:
    info = os.stat(path)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


_cache: Dict[Tuple[str, bool, Tuple[int, int, int, int]], ElfFile] = {}
_CACHE_LIMIT = 64


def open_elf(path: str, allow_stripped: bool = False) -> ElfFile:
    """An `ElfFile` for `path`, reused while the file's (dev, inode, size, mtime) is unchanged."""
    path = str(path)
    try:
        key = (path, allow_stripped, _file_key(path))
    except OSError:
        return ElfFile(path)  # raises the right ElfError
    elf = _cache.get(key)
    if elf is None:
        elf = ElfFile(path, allow_stripped=allow_stripped)
        if len(_cache) >= _CACHE_LIMIT:
            _cache.pop(next(iter(_cache)))
        _cache[key] = elf
    return elf


def forget_files() -> None:
    """Drop every ElfFile open_elf keeps (an always-on monitor keeps no file's symbols
    once its probes are on: a runtime's are ~1 MB)."""
    _cache.clear()


def is_elf_for_this_machine(path: str) -> bool:
    """Cheap check of the ELF identity only: magic, 64-bit, little-endian, this machine."""
    try:
        with open(path, "rb") as stream:
            header = stream.read(20)
    except OSError:
        return False
    if len(header) < 20 or header[:4] != ELF_MAGIC:
        return False
    return header[4] == ELFCLASS64 and header[5] == ELFDATA2LSB and \
        struct.unpack_from("<H", header, 18)[0] == MACHINES.get(os.uname().machine.lower())


# ---- C++ demangling ----------------------------------------------------------------------

def _cxx_runtimes() -> Iterator[Optional[str]]:
    """C++ runtimes that may export __cxa_demangle, the usual names first (find_library runs
    ldconfig or gcc: only when those fail)."""
    import ctypes.util

    yield "libstdc++.so.6"
    yield ctypes.util.find_library("stdc++")
    yield "libc++.so.1"
    yield ctypes.util.find_library("c++")


class _Demangler:
    """`__cxa_demangle` from the C++ runtime through ctypes, loaded on first use."""

    def __init__(self) -> None:
        self._demangle = None
        self._free = None
        self._loaded = False

    def _load(self) -> None:
        self._loaded = True
        for name in _cxx_runtimes():
            if not name:
                continue
            try:
                lib = ctypes.CDLL(name)
                func = getattr(lib, "__cxa_demangle")  # getattr: avoids name mangling
                libc = ctypes.CDLL(None)
            except (OSError, AttributeError):
                continue
            func.restype = ctypes.c_void_p
            func.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_int)]
            libc.free.argtypes = [ctypes.c_void_p]
            libc.free.restype = None
            self._demangle, self._free = func, libc.free
            return

    def __call__(self, name: str) -> Optional[str]:
        if not self._loaded:
            self._load()
        if self._demangle is None:
            return None
        status = ctypes.c_int(0)
        result = self._demangle(name.encode("utf-8", "replace"), None, None,
                                ctypes.byref(status))
        if not result:
            return None
        try:
            text = ctypes.string_at(result)
        finally:
            self._free(result)
        return text.decode("utf-8", "replace") if status.value == 0 else None


_demangler = _Demangler()


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """C++ demangled form of `name` (`_Z6vecAddPKfS0_Pfi` -> `vecAdd(float const*, ...)`);
    the name unchanged when it is not mangled or no C++ runtime is available."""
    if not name.startswith("_Z") or "\0" in name:
        return name
    return _demangler(name) or name
