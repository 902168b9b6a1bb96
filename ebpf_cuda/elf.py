"""ELF symbols for uprobes: symbol -> file offset, address -> symbol, fast bulk symbol reads.

Headers, symbol tables and the dynamic section are read in bulk with `struct` (the Elf64
layouts below): iterating libtorch_cuda.so's 211k symbols through pyelftools takes seconds and
even opening it with pyelftools parses whole hash tables; a raw read takes a fraction of a
second. pyelftools remains the reference the tests check these readings against.

Every failure while reading a file (struct, I/O, a corrupted field) comes out as an
`ElfError` (or a subclass), never as a raw exception.
"""
import bisect
import ctypes
import functools
import gc
import heapq
import os
import stat
import struct
from typing import Dict, Iterable, Iterator, List, NamedTuple, Optional, Set, Tuple

from .errors import ElfError, NoCudaSymbolsError, SymbolNotFoundError

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
ET_EXEC, ET_DYN = 2, 3
PT_LOAD = 1
SHT_NOBITS = 8
STT_FUNC = 2
SHN_UNDEF = 0
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SYM_FORMAT = "<IBBHQQ"  # Elf64_Sym: st_name st_info st_other st_shndx st_value st_size
SYM_SIZE = struct.calcsize(SYM_FORMAT)
EHDR_SIZE = 64
PHDR_FORMAT = "<IIQQQQQQ"  # Elf64_Phdr: type flags offset vaddr paddr filesz memsz align
PHDR_SIZE = struct.calcsize(PHDR_FORMAT)
SHDR_FORMAT = "<IIQQQQIIQQ"  # Elf64_Shdr: name type flags addr offset size link info align entsize
SHDR_SIZE = struct.calcsize(SHDR_FORMAT)
SHT_SYMTAB, SHT_DYNAMIC, SHT_DYNSYM = 2, 6, 11
DYN_FORMAT = "<qQ"  # Elf64_Dyn: d_tag d_val
DYN_SIZE = struct.calcsize(DYN_FORMAT)
DT_NULL, DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 14, 15, 29

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
        if header[:4] != ELF_MAGIC:
            raise ElfError("%s is not an ELF file" % self.path)
        if len(header) < EHDR_SIZE:
            raise ElfError("%s is truncated (%d bytes, shorter than an ELF header)"
                           % (self.path, len(header)))
        if header[4] != ELFCLASS64:
            kind = {1: "32-bit (ELFCLASS32)"}.get(header[4], "of unknown class %d" % header[4])
            raise ElfError("%s is a %s ELF file; only 64-bit ELF files can be traced"
                           % (self.path, kind))
        if header[5] != ELFDATA2LSB:
            raise ElfError("%s is a big-endian ELF file; only little-endian is supported"
                           % self.path)
        self.elf_type, self.machine = struct.unpack_from("<HH", header, 16)
        if self.machine != self._expected_machine:
            raise ElfError("%s is built for %s (e_machine %d), not for this machine (%s)"
                           % (self.path, MACHINE_NAMES.get(self.machine, "another machine"),
                              self.machine, MACHINE_NAMES.get(self._expected_machine, "?")))
        if self.elf_type not in (ET_EXEC, ET_DYN):
            raise ElfError("%s is %s, not an executable or shared library"
                           % (self.path, TYPE_NAMES.get(self.elf_type, "of ELF type %d"
                                                        % self.elf_type)))
        self._check_table_bounds(header)

    def _check_table_bounds(self, header: bytes) -> None:
        phoff, shoff = struct.unpack_from("<QQ", header, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 54)
        if phoff + phentsize * phnum > self.size or shoff + shentsize * shnum > self.size:
            raise ElfError("%s is truncated (its header tables run past the end of the "
                           "%d-byte file)" % (self.path, self.size))

    def _read_headers(self) -> None:
        try:
            with open(self.path, "rb") as stream:
                header = stream.read(EHDR_SIZE)
                self._check_ident(header)
                self._parse(stream, header)
        except ElfError:
            raise
        except OSError as err:
            raise ElfError("%s: cannot read: %s" % (self.path, err.strerror or err)) from None
        except Exception as err:  # corrupted fields: struct.error, IndexError, ...
            raise ElfError("%s is a corrupted ELF file (%s)" % (self.path, _describe(err))) \
                from None

    def _parse(self, stream, header: bytes) -> None:
        # The headers are parsed with struct, not pyelftools: pyelftools builds every section
        # object (parsing whole GNU hash tables), which costs a third of a second on big files.
        self.entry, phoff, shoff = struct.unpack_from("<QQQ", header, 24)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 54)
        if phnum and phentsize < PHDR_SIZE or shnum and shentsize < SHDR_SIZE:
            raise ElfError("%s is a corrupted ELF file (header entries too small)" % self.path)
        stream.seek(phoff)
        table = stream.read(phentsize * phnum)
        for i in range(phnum):
            p_type, flags, offset, vaddr, _paddr, filesz, memsz, _align = \
                struct.unpack_from(PHDR_FORMAT, table, i * phentsize)
            if p_type == PT_LOAD:
                self.segments.append(Segment(vaddr, offset, filesz, memsz, flags))
        stream.seek(shoff)
        table = stream.read(shentsize * shnum)
        sections = [struct.unpack_from(SHDR_FORMAT, table, i * shentsize) for i in range(shnum)]
        for index, section in enumerate(sections):
            if section[1] in (SHT_SYMTAB, SHT_DYNSYM):
                self._add_symbol_section(index, sections)
            elif section[1] == SHT_DYNAMIC:
                self._read_dynamic(stream, section, sections)

    def _section_bytes_in_file(self, section: Tuple[int, ...], what: str) -> None:
        _name, sh_type, _flags, _addr, offset, size = section[:6]
        if sh_type != SHT_NOBITS and offset + size > self.size:
            raise ElfError("%s is truncated (its %s runs past the end of the file)"
                           % (self.path, what))

    def _linked_strings(self, section: Tuple[int, ...], sections, what: str):
        link = section[6]
        if not 0 < link < len(sections):
            raise ElfError("%s: its %s links to no string table" % (self.path, what))
        strtab = sections[link]
        self._section_bytes_in_file(section, what)
        self._section_bytes_in_file(strtab, "string table of its " + what)
        return strtab

    def _add_symbol_section(self, index: int, sections) -> None:
        section = sections[index]
        kind = ".symtab" if section[1] == SHT_SYMTAB else ".dynsym"
        strtab = self._linked_strings(section, sections, kind)
        self._symbol_sections.append(_SymbolSection(
            kind, section[4], section[5], section[9] or SYM_SIZE, strtab[4], strtab[5]))

    def _read_dynamic(self, stream, section, sections) -> None:
        strtab = self._linked_strings(section, sections, "dynamic section")
        stream.seek(section[4])
        data = stream.read(section[5] - section[5] % DYN_SIZE)
        stream.seek(strtab[4])
        strings = stream.read(strtab[5])
        for tag, value in struct.iter_unpack(DYN_FORMAT, data):
            if tag == DT_NULL:
                break
            if tag not in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH):
                continue
            text = _c_string(strings, value)
            if tag == DT_NEEDED:
                self.needed.append(text)
            elif tag == DT_SONAME:
                self.soname = text
            else:
                paths = self.rpath if tag == DT_RPATH else self.runpath
                paths.extend(p for p in text.split(":") if p)

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

    def _read_all_functions(self) -> Dict[str, "_Sym"]:
        # .symtab, where present, already holds every .dynsym function (the linker writes
        # both) plus the local ones; reading .dynsym too would double the cost for nothing.
        tables = [s for s in self._symbol_sections if s.name == ".symtab"] or \
            self._symbol_sections
        by_name: Dict[str, _Sym] = {}
        with open(self.path, "rb") as stream:
            for section in tables:
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

    def runtime_to_vaddr(self, address: int, load_bias: int) -> int:
        """A run-time address in a process -> this file's virtual address (see discovery)."""
        return address - load_bias

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


def _c_string(strings: bytes, offset: int) -> str:
    if not 0 <= offset < len(strings):
        raise ElfError("string offset %d lies outside its string table" % offset)
    end = strings.find(b"\0", offset)
    return strings[offset:end if end >= 0 else len(strings)].decode("utf-8", "replace")


def _describe(err: BaseException) -> str:
    text = str(err).strip()
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
