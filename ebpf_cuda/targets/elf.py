"""ELF symbols for uprobes: symbol -> file offset, address -> symbol, fast bulk symbol reads.

The file's structure (headers, segments, dynamic tags, build id) is read with `struct` by
`elf_headers.ElfHeaders` (elf_raw.py's readers), which `ElfFile` builds on: no pyelftools on a
start's path (its import was 26-28 ms of every start).
The symbol tables themselves are read in bulk with `struct` (elf_symbols.py): iterating
libtorch_cuda.so's 211k symbols through pyelftools takes seconds, a raw read a fraction of a
second. Tables larger than WHOLE_TABLE_LIMIT (a framework's: ~10^6 symbols, ~100 MB) are
never read whole nor made into a table of every function: a few names are looked up in
chunks, addresses named through a compact index (the tracer's memory stays bounded). C++ names are demangled by cxx_demangle.py. Every name of those modules that callers
use is importable from here.

Every failure while reading a file (struct, I/O, a corrupted field) comes out as an
`ElfError` (or a subclass) with a one-line message, never as a raw exception.
"""
import contextlib
import gc
import os
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

from ..errors import ElfError, NoCudaSymbolsError, SymbolNotFoundError
from .cxx_demangle import demangle  # noqa: F401 (importable from here, as before)
from .elf_headers import (ELF_MAGIC, ELFCLASS64,  # noqa: F401 (importable from here, as before)
                          ELFDATA2LSB, ET_DYN, ET_EXEC, MACHINES, ElfHeaders, Segment,
                          describe_error, is_elf_for_this_machine)
from .elf_symbols import (SYM_FORMAT, SYM_SIZE,  # noqa: F401 (importable from here, as before)
                          AddressIndex, FunctionSymbol, Sym, SymbolSection, base_name,
                          defines_a_function, find_functions, lookup_functions, merge_preferring_global,
                          read_function_symbols, suggest)


# Symbol and string tables up to this size are read whole into a table of every function
# (a CUDA runtime's: ~1 MB, ~2 ms); larger ones (a framework's: ~100 MB) are only searched
WHOLE_TABLE_LIMIT = 4 << 20


class ElfFile(ElfHeaders):
    """A validated 64-bit ELF executable or shared library of the running architecture.

    Headers are read when the object is made; symbol tables on first use. A file without
    function symbols raises ElfError unless `allow_stripped` (enough to read its
    dependencies and segments).
    """

    def __init__(self, path: str, machine: Optional[int] = None,
                 allow_stripped: bool = False) -> None:
        self._by_name: Optional[Dict[str, Sym]] = None
        # What lookups of a few names found (None: not defined), without the whole table
        self._looked_up: Dict[str, Optional[Sym]] = {}
        self._index: Optional[AddressIndex] = None  # (symbolize's, made at its first call)
        super().__init__(path, machine)
        if not allow_stripped:
            self._check_not_stripped()

    def __repr__(self) -> str:
        return "ElfFile(%r)" % self.path

    def _check_not_stripped(self) -> None:
        names = [s.name for s in self._symbol_sections]
        if ".symtab" in names:
            return
        if not names or not (self._load_symbols() if self._small()
                             else self._defines_a_function()):
            raise ElfError("%s is stripped (it has no symbol table and exports no functions)"
                           % self.path)

    def _small(self) -> bool:
        """Whether the symbol tables are read whole (WHOLE_TABLE_LIMIT)."""
        return sum(t.size + t.str_size for t in self._function_tables()) <= WHOLE_TABLE_LIMIT

    def _defines_a_function(self) -> bool:
        """Whether .dynsym defines any function (without reading it whole: a framework's
        library exports ~10^5)."""
        try:
            with open(self.path, "rb") as stream:
                return any(defines_a_function(stream, t) for t in self._symbol_sections)
        except OSError as err:
            raise ElfError("%s: cannot read: %s" % (self.path, err.strerror or err)) from None

    # ---- bulk symbol reading ---------------------------------------------------------

    def _load_symbols(self) -> Dict[str, Sym]:
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
                               % (self.path, describe_error(err))) from None
            finally:
                if gc_was_enabled:
                    gc.enable()
        return self._by_name

    def _function_tables(self) -> List[SymbolSection]:
        # .symtab, where present, already holds every .dynsym function (the linker writes
        # both) plus the local ones; reading .dynsym too would double the cost for nothing.
        return [s for s in self._symbol_sections if s.name == ".symtab"] or \
            self._symbol_sections

    def _read_all_functions(self) -> Dict[str, Sym]:
        by_name: Dict[str, Sym] = {}
        with open(self.path, "rb") as stream:
            for section in self._function_tables():
                merge_preferring_global(by_name, read_function_symbols(
                    stream, section.offset, section.size, section.entsize,
                    section.str_offset, section.str_size))
        return by_name


    # ---- public queries --------------------------------------------------------------

    def function_symbols(self) -> Dict[str, FunctionSymbol]:
        """All defined function symbols by base name (global definitions win over local)."""
        return {name: FunctionSymbol(name, *sym) for name, sym in self._load_symbols().items()}

    def function_names(self) -> List[str]:
        """Names of all defined functions (cheap: no per-symbol objects are made)."""
        return list(self._load_symbols())

    def symbol(self, name: str) -> Optional[FunctionSymbol]:
        """The definition of function `name` (any `@version` ignored), or None."""
        sym = self._lookup([base_name(name)])[base_name(name)]
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
        return self._lookup([base_name(name)])[base_name(name)] is not None

    def has_any(self, names: Iterable[str]) -> Set[str]:
        """The subset of `names` this file defines as functions."""
        wanted = list(names)
        table = self._lookup(base_name(n) for n in wanted)
        return {n for n in wanted if table.get(base_name(n)) is not None}

    def _lookup(self, names: Iterable[str]) -> Dict[str, Optional[Sym]]:
        """{name: its definition, None when not a defined function} for a few names: from
        the whole table once it is read, else by a look for those names only (a framework's
        library has ~10^6 symbols: its table is never made to probe a runtime in it)."""
        wanted = set(names)
        if self._by_name is None and self._small():
            self._load_symbols()  # (a runtime's: read whole at once is faster, and small)
        if self._by_name is not None:
            return {n: self._by_name.get(n) for n in wanted}
        missing = wanted - self._looked_up.keys()
        if missing:
            found: Dict[str, Sym] = {}
            with self._symbol_table_errors(), open(self.path, "rb") as stream:
                for section in self._function_tables():
                    merge_preferring_global(found, lookup_functions(stream, section, missing))
            self._looked_up.update((n, found.get(n)) for n in missing)
        return {n: self._looked_up[n] for n in wanted}

    def defines_any(self, names: Iterable[str]) -> Set[str]:
        """Like `has_any`, for a look at a few names in a file that may never be read again
        (a library checked for a runtime linked in statically): the symbol tables are
        scanned for those names only, and no table of every function is made or kept."""
        wanted = list(names)
        if self._by_name is not None or all(base_name(n) in self._looked_up for n in wanted):
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
                           % (self.path, describe_error(err))) from None
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
        sym = self._lookup([base_name(name)])[base_name(name)]
        if sym is None:
            suggestions = suggest(base_name(name), self._load_symbols().keys())
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
        found = self.function_at(vaddr)
        return None if found is None else found[0]

    @contextlib.contextmanager
    def _symbol_table_errors(self) -> Iterator[None]:
        """Reading the symbol tables: what goes wrong is one ElfError naming the file."""
        try:
            yield
        except OSError as err:
            raise ElfError("%s: cannot read: %s" % (self.path, err.strerror or err)) from None
        except ElfError:
            raise
        except Exception as err:
            raise ElfError("%s has a corrupted symbol table (%s)"
                           % (self.path, describe_error(err))) from None

    def function_at(self, vaddr: int) -> Optional[Tuple[str, int]]:
        """(name, start) of the function whose [value, value + size) holds `vaddr` (or
        starts at it), else None. The file's functions are indexed by address at the first
        call, compactly (elf_symbols.AddressIndex: no table of every name is made)."""
        if self._index is None:
            with self._symbol_table_errors():
                self._index = AddressIndex(self.path, self._function_tables())
        return self._index.function_at(vaddr)

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

