"""ELF symbol tables read in bulk with `struct` (Elf64_Sym below): iterating
libtorch_cuda.so's 211k symbols through pyelftools takes seconds, a raw read a fraction of a
second; the tests check the bulk reader against pyelftools. Also the look-up of a few names
and the address index of `ElfFile.symbolize`, both in chunks and arrays (no object per
symbol: a framework's library has ~10^6), and the "did you mean" suggestions.
"""
import heapq
import os
import re
import struct
from array import array
from bisect import bisect_right
from typing import Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

from ..errors import ElfError

STT_FUNC = 2
SHN_UNDEF = 0
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SYM_FORMAT = "<IBBHQQ"  # Elf64_Sym: st_name st_info st_other st_shndx st_value st_size
SYM_SIZE = struct.calcsize(SYM_FORMAT)


class FunctionSymbol(NamedTuple):
    """A defined function symbol; `name` has any `@version` suffix removed."""

    name: str
    value: int
    size: int
    bind: int


class SymbolSection(NamedTuple):
    """A symbol table (.symtab or .dynsym) and its string table, where they lie in the file."""

    name: str
    offset: int
    size: int
    entsize: int
    str_offset: int
    str_size: int


def base_name(name: str) -> str:
    """`cudaMalloc@@libcudart.so.12` -> `cudaMalloc` (symbol versions are not part of the name)."""
    return name.split("@", 1)[0]


def _bind_rank(bind: int) -> int:
    """Lower is preferred when one name has several definitions: global, weak, then local."""
    return {STB_GLOBAL: 0, STB_WEAK: 1}.get(bind, 2)


Sym = Tuple[int, int, int]  # value, size, bind
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


_STRINGS_CHUNK = 1 << 20  # bytes of a string table read at once (never the whole: ~100 MB;
# a larger search holds the interpreter lock from the pump, pump.py)
_SYMBOLS_CHUNK = 43690 * SYM_SIZE  # ~1 MB of symbol entries read at once


def find_functions(stream, table: "SymbolSection", names: Set[str]) -> Set[str]:
    """Which of `names` one symbol table defines as functions."""
    return {name for name, *_ in lookup_functions(stream, table, names)}


def lookup_functions(stream, table: "SymbolSection", names: Iterable[str]
                     ) -> List[Tuple[str, int, int, int]]:
    """(name, value, size, bind) of each definition of `names` as a function in one symbol
    table, read in chunks (a framework's tables are ~100 MB; only these names are made).
    The string table is searched first for every place a name ends (with a NUL or a symbol
    version: a linker may store it as the tail of a longer string); then a symbol is looked
    at only when its name is at one of those offsets."""
    if table.entsize != SYM_SIZE:
        raise ElfError("symbol entries are %d bytes, expected %d" % (table.entsize, SYM_SIZE))
    at = _string_offsets(stream, table, [n for n in names if n])
    if not at:
        return []
    found = []
    for start in range(0, table.size - table.size % SYM_SIZE, _SYMBOLS_CHUNK):
        stream.seek(table.offset + start)
        data = stream.read(min(_SYMBOLS_CHUNK, table.size - table.size % SYM_SIZE - start))
        found += [(at[st_name], value, size, st_info >> 4) for st_name, st_info, _other, shndx,
                  value, size in struct.iter_unpack(SYM_FORMAT, data[:len(data) // SYM_SIZE
                                                                    * SYM_SIZE])
                  if st_name in at and _FUNCTION_TYPES[st_info] and shndx != SHN_UNDEF]
    return found


def defines_a_function(stream, table: "SymbolSection") -> bool:
    """Whether one symbol table defines any function (read in chunks, up to the first)."""
    size = table.size - table.size % SYM_SIZE
    for start in range(0, size if table.entsize == SYM_SIZE else 0, _SYMBOLS_CHUNK):
        stream.seek(table.offset + start)
        data = stream.read(min(_SYMBOLS_CHUNK, size - start))
        if any(_FUNCTION_TYPES[st_info] and shndx != SHN_UNDEF for _, st_info, _other, shndx,
               _value, _size in struct.iter_unpack(SYM_FORMAT, data[:len(data) // SYM_SIZE
                                                                   * SYM_SIZE])):
            return True
    return False


def _string_offsets(stream, table: "SymbolSection", names: List[str]) -> Dict[int, str]:
    """{offset in the string table: name} of every place one of `names` ends with a NUL or
    an `@`, the table read in chunks (each overlapping the next by the longest name)."""
    if not names:
        return {}
    pattern = re.compile(b"(?=(" + _trie(n.encode() for n in names) + b")[\\0@])")
    overlap = max(len(n.encode()) for n in names) + 1
    at: Dict[int, str] = {}
    for start in range(0, table.str_size, _STRINGS_CHUNK):
        stream.seek(table.str_offset + start)
        data = stream.read(min(_STRINGS_CHUNK + overlap, table.str_size - start))
        for found in pattern.finditer(data):
            if found.start() >= _STRINGS_CHUNK:
                break  # (the next chunk's)
            at[start + found.start()] = found.group(1).decode()
    return at


def _trie(names: Iterable[bytes]) -> bytes:
    """A regular expression matching exactly `names`, as a trie: one alternation per
    branching byte (hundreds of names tried at each place in ~0.2 s per 10 MB)."""
    root: dict = {}
    for name in names:
        node = root
        for byte in name:
            node = node.setdefault(byte, {})
        node[None] = {}

    def emit(node: dict) -> bytes:
        parts = [re.escape(bytes([byte])) + emit(node[byte])
                 for byte in sorted(k for k in node if k is not None)]
        if not parts:
            return b""
        ends = None in node
        body = parts[0] if len(parts) == 1 and not ends else b"(?:" + b"|".join(parts) + b")"
        return body + (b"?" if ends else b"")

    return emit(root)


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


def merge_preferring_global(by_name: Dict[str, Sym], symbols) -> None:
    get = by_name.get
    for name, value, size, bind in symbols:
        known = get(name)
        if known is None or (bind != known[2] and _bind_rank(bind) < _bind_rank(known[2])):
            by_name[name] = (value, size, bind)


_INDEX_BITS = 24  # bits of a function's number in a sort key (16M functions a file at most)
_RANK_BITS = 2
_VALUE_LIMIT = 1 << (64 - _INDEX_BITS - _RANK_BITS)  # addresses below 256 GB (all real ones)
_SORT_BLOCK = 1 << 16  # keys sorted at once (a list of Python ints: ~2.6 MB)
_NAME_READ = 4096  # bytes read at a time for one name
_RANKS = [_bind_rank(bind) for bind in range(16)]


class AddressIndex:
    """Every defined function of a file by address, for `ElfFile.symbolize`, in arrays of
    12 bytes a function (start, size, its name's place in the file); a name is read from
    the file when asked. A framework's library has ~10^6 functions: as
    Python objects (a dict of names, lists of starts) they took hundreds of MB, and only a
    few addresses are ever asked. At one address the preferred alias is kept: global, then
    weak, then local, then the longest, then the first in the table."""

    def __init__(self, path: str, tables: List["SymbolSection"]) -> None:
        self.path = path
        self._sizes = array("I")  # by number: size (capped at 4 GB)
        self._names = array("I")  # by number: st_name in its table's strings
        self._tables: List[Tuple[int, int, int]] = []  # (first number, str offset, size)
        keys = array("Q")  # start << 26 | bind rank << 24 | number
        self._highest = 0
        with open(path, "rb") as stream:
            for table in tables:
                self._tables.append((len(self._names), table.str_offset, table.str_size))
                self._read(stream, table, keys)
        self.starts = array("I" if self._highest >> 32 == 0 else "Q")
        self._order = array("I")  # by place in `starts`: the function's number
        self._sort(keys)
        self._in_order()
        self._asked: Dict[int, Optional[str]] = {}

    def _read(self, stream, table: "SymbolSection", keys: array) -> None:
        if table.entsize != SYM_SIZE:
            raise ElfError("symbol entries are %d bytes, expected %d"
                           % (table.entsize, SYM_SIZE))
        size = table.size - table.size % SYM_SIZE
        shift = _INDEX_BITS + _RANK_BITS
        step = max(SYM_SIZE, _SYMBOLS_CHUNK // 4 // SYM_SIZE * SYM_SIZE)  # (5 lists a chunk)
        for start in range(0, size, step):
            stream.seek(table.offset + start)
            data = stream.read(min(step, size - start))
            data = data[:len(data) // SYM_SIZE * SYM_SIZE]
            # Columns sliced out of the entries in C (a Python step per function only)
            view = memoryview(data)
            names, infos = view.cast("I")[0::6].tolist(), data[4::SYM_SIZE]
            sections = view.cast("H")[3::12].tolist()
            values, sizes = view.cast("Q")[1::3].tolist(), view.cast("Q")[2::3].tolist()
            picked = [j for j, function in enumerate(infos.translate(_FUNCTION_TYPES))
                      if function and sections[j] != SHN_UNDEF and values[j] < _VALUE_LIMIT
                      and names[j] < table.str_size]
            first = len(self._names)
            if (first + len(picked)) >> _INDEX_BITS:
                raise ElfError("more than %d functions" % (1 << _INDEX_BITS))
            self._highest = max([self._highest] + [values[j] for j in picked])
            keys.extend([values[j] << shift | _RANKS[infos[j] >> 4] << _INDEX_BITS
                         | first + k for k, j in enumerate(picked)])
            self._sizes.extend([min(sizes[j], 0xFFFFFFFF) for j in picked])
            self._names.extend([names[j] for j in picked])

    def _sort(self, keys: array) -> None:
        """Keys sorted block by block, then merged: no list of every key is ever made."""
        blocks = [array("Q", sorted(keys[at:at + _SORT_BLOCK]))
                  for at in range(0, len(keys), _SORT_BLOCK)]
        del keys[:]
        mask, shift = (1 << _INDEX_BITS) - 1, _INDEX_BITS + _RANK_BITS
        last, kept_rank = -1, 0
        for key in heapq.merge(*blocks):
            start, rank, number = key >> shift, key >> _INDEX_BITS & 3, key & mask
            if start == last:  # an alias (sorted by rank: as good or worse)
                if rank == kept_rank and self._sizes[number] > self._sizes[self._order[-1]]:
                    self._order[-1] = number
                continue
            self.starts.append(start)
            self._order.append(number)
            last, kept_rank = start, rank

    def _in_order(self) -> None:
        """Sizes, names (and tables) put in address order, one array at a time; the
        functions' numbers are dropped."""
        order = self._order  # (generators: a list of every function's is what is avoided)
        self._sizes = array("I", (self._sizes[n] for n in order))
        self._names = array("I", (self._names[n] for n in order))
        firsts = [first for first, _, _ in self._tables]
        self._table = (array("B", (bisect_right(firsts, n) - 1 for n in order))
                       if len(firsts) > 1 else None)
        del self._order

    def __len__(self) -> int:
        return len(self.starts)

    def function_at(self, vaddr: int) -> Optional[Tuple[str, int]]:
        """(name, start) of the function whose [start, start + size) holds `vaddr` (or that
        starts at it), else None."""
        place = bisect_right(self.starts, vaddr) - 1
        if place < 0:
            return None
        start = self.starts[place]
        if start != vaddr and vaddr >= start + self._sizes[place]:
            return None
        name = self._name(place)
        return None if name is None else (name, start)

    def _name(self, place: int) -> Optional[str]:
        if place in self._asked:
            return self._asked[place]
        _, str_offset, str_size = self._tables[self._table[place] if self._table else 0]
        at = self._names[place]
        with open(self.path, "rb") as stream:
            stream.seek(str_offset + at)
            raw = stream.read(min(_NAME_READ, str_size - at))
            while b"\0" not in raw and len(raw) < str_size - at:  # (a long name)
                more = stream.read(min(_NAME_READ, str_size - at - len(raw)))
                if not more:
                    break
                raw += more
        raw = raw.split(b"\0", 1)[0]
        name = base_name(raw.decode("utf-8", "replace")) or None
        if len(self._asked) >= 4096:
            self._asked.clear()
        self._asked[place] = name
        return name
