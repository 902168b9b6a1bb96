"""ELF symbol tables read in bulk with `struct` (Elf64_Sym below): iterating
libtorch_cuda.so's 211k symbols through pyelftools takes seconds, a raw read a fraction of a
second; the tests check the bulk reader against pyelftools. Also the address index of
`ElfFile.symbolize` and the "did you mean" suggestions.
"""
import heapq
import os
import struct
from typing import Dict, Iterable, List, NamedTuple, Set, Tuple

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


def find_functions(stream, table: "SymbolSection", names: Set[str]) -> Set[str]:
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


def _address_of(item: Tuple[str, Sym]) -> int:
    return item[1][0]


def _alias_rank(item: Tuple[str, Sym]) -> Tuple[int, int]:
    """Larger is preferred among aliases: global over weak over local, then longer (ties keep
    symbol-table order, the sort being stable)."""
    _name, (_value, size, bind) = item
    return (-_bind_rank(bind), size)


def merge_preferring_global(by_name: Dict[str, Sym], symbols) -> None:
    get = by_name.get
    for name, value, size, bind in symbols:
        known = get(name)
        if known is None or (bind != known[2] and _bind_rank(bind) < _bind_rank(known[2])):
            by_name[name] = (value, size, bind)


def address_index(by_name: Dict[str, Sym]) -> Tuple[List[int], List[int], List[str]]:
    """(starts, ends, names) of every function, sorted by start, for bisect."""
    # Sorted by address (sorting on the bare address is 3x faster than on tuples); among
    # aliases at one address the preferred one (global, then longest) is moved last,
    # which is the one bisect_right lands on.
    items = sorted(by_name.items(), key=_address_of)
    starts = [sym[0] for _, sym in items]
    for i in range(1, len(items)):
        if starts[i] == starts[i - 1] and _alias_rank(items[i - 1]) < _alias_rank(items[i]):
            items[i - 1], items[i] = items[i], items[i - 1]
    return starts, [sym[0] + sym[1] for _, sym in items], [name for name, _ in items]
