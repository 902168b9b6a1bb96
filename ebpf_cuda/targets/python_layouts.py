"""How to find the CPython in a file and turn the raw bytes the `--py-stacks` probe reads into
file, line and function.

The probe walks `_PyRuntime -> interpreters.head -> threads -> frame -> previous...` with
bpf_probe_read_user and sends (code object address, raw instruction value) pairs, plus once
per code object the raw file name, (qual)name, line table and first line number. Which
offsets to use (`Layout`, per version) is python_offsets.py's, whose public names are
importable from here too; this module finds the interpreter in a file (`find_interpreter`,
reading the file as data, never loading it) and decodes what was read (`line_number`,
`decode_unicode`, `string_data_offset`).

Only 64-bit little-endian targets (x86-64, AArch64) are described.
"""
import os
import re
import stat
import struct
import threading
from typing import Dict, List, NamedTuple, Optional, Tuple

from . import elf_raw
from .python_offsets import DEBUG_COOKIE  # noqa: F401 (importable from here, as before)
from .python_offsets import (SUPPORTED, Layout, UnknownInterpreter, layout_for,
                             layout_from_debug_offsets, supported_range)

DEBUG_OFFSETS_READ = 1024  # bytes read at `_PyRuntime`: more than any _Py_DebugOffsets so far
RUNTIME_SYMBOL = "_PyRuntime"
VERSION_SYMBOL = "Py_Version"  # const unsigned long = PY_VERSION_HEX, 3.11+
# A CPython older than 3.7 has no `_PyRuntime`; these name it as a CPython all the same, so
# that it is refused with a reason instead of being taken for a non-Python program.
CPYTHON_MARKERS = ("Py_GetVersion", "Py_Initialize", "PyEval_EvalFrameEx")


# ---- line tables ------------------------------------------------------------------------------

def _line_lnotab(table: bytes, firstlineno: int, offset: int) -> Optional[int]:
    """3.8/3.9 PyCode_Addr2Line: (byte increment, signed line increment) pairs."""
    line, address = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        address += table[i]
        if address > offset:
            break
        line += table[i + 1] - 256 if table[i + 1] >= 128 else table[i + 1]
    return line


def _line_310(table: bytes, firstlineno: int, offset: int) -> Optional[int]:
    """3.10 PyCode_Addr2Line: (byte length, signed line delta) pairs, delta -128 = no line;
    the line of the first range ending after `offset`."""
    if offset < 0:
        return firstlineno
    line, end = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        end += table[i]
        delta = table[i + 1] - 256 if table[i + 1] >= 128 else table[i + 1]
        if delta != -128:
            line += delta
        if end > offset:
            return None if delta == -128 else line
    return None


def _varint(table: bytes, i: int) -> Tuple[int, int]:
    """(value, next index) of a 6-bit-chunk varint (scan_varint in Objects/codeobject.c)."""
    byte = table[i]
    value, shift = byte & 63, 0
    while byte & 64:
        i += 1
        byte = table[i]
        shift += 6
        value |= (byte & 63) << shift
    return value, i + 1


def _line_locations(table: bytes, firstlineno: int, offset: int) -> Optional[int]:
    """3.11+ PyCode_Addr2Line over the location table (Objects/locations.md): entries of a
    header byte (bit 7 set, code in bits 3-6, length-1 code units in bits 0-2) and data."""
    if offset < 0:
        return firstlineno
    line, end, i, size = firstlineno, 0, 0, len(table)
    while i < size:
        header = table[i]
        code = (header >> 3) & 15
        if code in (13, 14):  # no columns / long form: a signed varint line delta first
            value, _ = _varint(table, i + 1)
            line += -(value >> 1) if value & 1 else value >> 1
        elif code in (11, 12):  # one-line forms 1 and 2
            line += code - 10
        end += ((header & 7) + 1) * 2
        if end > offset:
            return None if code == 15 else line
        i += 1
        while i < size and not table[i] & 128:
            i += 1
    return None


_LINE_FORMATS = {"lnotab": _line_lnotab, "linetable310": _line_310,
                 "locations": _line_locations}


def line_number(line_format: str, linetable: bytes, firstlineno: int,
                byte_offset: int) -> Optional[int]:
    """Exactly PyCode_Addr2Line(code, byte_offset) of the version whose `line_format` this is;
    None where the table says the instruction has no line (or the offset is past its end)."""
    try:
        decode = _LINE_FORMATS[line_format]
    except KeyError:
        raise ValueError("unknown line table format %r" % line_format) from None
    try:
        return decode(bytes(linetable), firstlineno, byte_offset)
    except IndexError:  # a table cut short inside an entry: no answer rather than a guess
        return None


# ---- strings ----------------------------------------------------------------------------------

def decode_unicode(kind: int, data: bytes) -> str:
    """The text of a PEP 393 string's data: kind 1 latin-1, 2 UTF-16-LE, 4 UTF-32-LE."""
    if kind == 1:
        return data.decode("latin-1")
    if kind == 2:
        return data[:len(data) & ~1].decode("utf-16-le", "replace")
    if kind == 4:
        return data[:len(data) & ~3].decode("utf-32-le", "replace")
    raise ValueError("not a PEP 393 string kind: %r" % kind)


def unicode_kind(state: int) -> int:
    """The kind (1, 2, 4) from a str's state bit field (interned:2, kind:3, compact, ascii)."""
    return (state >> 2) & 7


def string_data_offset(layout: Layout, state: int) -> Optional[int]:
    """Where a str's characters start, from its state bit field: after PyASCIIObject for a
    compact ASCII string, after PyCompactUnicodeObject for another compact one; None for a
    legacy (non-compact) string, whose data lives elsewhere (not read)."""
    if not (state >> 5) & 1:
        return None
    return layout.unicode_ascii_size if (state >> 6) & 1 else layout.unicode_compact_size


# ---- finding the interpreter in a file ---------------------------------------------------------

class Interpreter(NamedTuple):
    path: str  # the file that holds `_PyRuntime` (the executable, or its libpython)
    version: str
    runtime_vaddr: int
    layout: Layout


class _Symbols(NamedTuple):
    values: Dict[str, Tuple[int, int]]  # name -> (st_value, st_size) of the names asked
    segments: List[Tuple[int, int, int]]  # PT_LOAD (vaddr, offset, filesz)
    needed: List[str]
    search: List[str]  # DT_RUNPATH / DT_RPATH entries, $ORIGIN expanded
    rodata: Tuple[int, int]  # (file offset, size) of .rodata, (0, 0) if none


def _read_symbols(path: str, names: Tuple[str, ...]) -> Optional[_Symbols]:
    """The named symbols' values (from .dynsym, then .symtab), the file's load segments and
    libraries it needs; None for a file that is no 64-bit little-endian ELF (the probe reads
    those layouts only). The tables are read with struct (elf_raw.py), in bulk."""
    try:
        with open(path, "rb") as stream:
            elf = elf_raw.ElfTables(stream)
            segments = [(s.p_vaddr, s.p_offset, s.p_filesz) for s in elf.load_segments()]
            values: Dict[str, Tuple[int, int]] = {}
            for section_name in (".dynsym", ".symtab"):
                _scan_symbols(elf, stream, section_name, names, values)
            needed, search = _dynamic(elf, path)
            rodata = elf.section(".rodata")
            where = (rodata.sh_offset, rodata.sh_size) if rodata is not None else (0, 0)
    except Exception:  # struct's, elf_raw's, I/O: a damaged file (or none), which no
        return None  # interpreter runs from
    return _Symbols(values, segments, needed, search, where)


def _scan_symbols(elf: elf_raw.ElfTables, stream, section_name: str, names: Tuple[str, ...],
                  values: Dict[str, Tuple[int, int]]) -> None:
    """Add to `values` the defined symbols of `names` in one symbol table."""
    section = elf.section(section_name)
    if section is None or section.sh_entsize != 24:
        return
    table = elf.data(elf.sections[section.sh_link])
    wanted = {}
    for name in names:
        if name in values:
            continue
        at = table.find(b"\0" + name.encode() + b"\0")
        if at >= 0:
            wanted[at + 1] = name
    if not wanted:
        return
    stream.seek(section.sh_offset)
    raw = stream.read(section.sh_size)
    for st_name, _info, _other, shndx, value, size in struct.iter_unpack("<IBBHQQ", raw):
        if st_name in wanted and shndx != 0:
            values[wanted.pop(st_name)] = (value, size)
            if not wanted:
                return


def _dynamic(elf: elf_raw.ElfTables, path: str) -> Tuple[List[str], List[str]]:
    """DT_NEEDED names and DT_RUNPATH/DT_RPATH directories ($ORIGIN expanded)."""
    section = elf.section(".dynamic")
    if section is None:
        return [], []
    strings = elf.data(elf.sections[section.sh_link])
    needed, search = [], []
    origin = os.path.dirname(os.path.realpath(path))
    for tag, value in elf_raw.dynamic_entries(elf.stream, section.sh_offset, section.sh_size,
                                              65536):
        if tag not in (elf_raw.DT_NEEDED, elf_raw.DT_RUNPATH, elf_raw.DT_RPATH):
            continue
        end = strings.find(b"\0", value)
        text = strings[value:end if end >= 0 else len(strings)].decode("utf-8", "replace")
        if tag == elf_raw.DT_NEEDED:
            needed.append(text)
        else:
            search += [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
                       for d in text.split(":") if d]
    return needed, search


def _file_offset(segments: List[Tuple[int, int, int]], vaddr: int) -> Optional[int]:
    for start, offset, filesz in segments:
        if start <= vaddr < start + filesz:
            return offset + vaddr - start
    return None


def symbol_u32(path: str, name: str) -> Optional[int]:
    """The 4-byte little-endian constant that symbol `name` of file `path` holds (from
    .dynsym, then .symtab; read from the file); None when the file is no ELF, lacks the
    symbol, or does not hold its bytes."""
    symbols = _read_symbols(path, (name,))
    if symbols is None or name not in symbols.values:
        return None
    offset = _file_offset(symbols.segments, symbols.values[name][0])
    if offset is None:
        return None
    try:
        data = _read(path, offset, 4)
    except OSError:
        return None
    return struct.unpack("<I", data)[0] if len(data) == 4 else None


def _read(path: str, offset: int, count: int) -> bytes:
    with open(path, "rb") as stream:
        stream.seek(offset)
        return stream.read(count)


_NAME_VERSION = re.compile(r"python(\d)\.(\d+)")
_RODATA_VERSION = re.compile(rb"(?<![0-9.])(\d)\.(\d{1,2})\.(\d{1,3})((?:a|b|rc)\d+)?\+?\x00")


def _version_from_name(path: str) -> Optional[Tuple[int, int]]:
    match = _NAME_VERSION.search(os.path.basename(path))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _version_in_file(path: str, rodata: Tuple[int, int],
                     minor: Optional[Tuple[int, int]]) -> Optional[str]:
    """PY_VERSION as the file's .rodata holds it ("3.9.18", tail-merged into other strings
    at times), of the expected minor version where known. Other libraries linked in have
    version strings too (Debian's static python3.11 holds a "3.2.0"): without a minor to go
    by, one named by a "pythonX.Y" string as well (the library directory), else the only one."""
    try:
        data = _read(path, *rodata)
    except OSError:
        return None
    counts: Dict[str, int] = {}
    for match in _RODATA_VERSION.finditer(data):
        found = (int(match.group(1)), int(match.group(2)))
        if found[0] in (2, 3) and (minor is None or found == minor):
            text = b".".join(match.group(1, 2, 3)).decode() + (match.group(4) or b"").decode()
            counts[text] = counts.get(text, 0) + 1
    if minor is None and len(counts) > 1:
        named = {t: n for t, n in counts.items()
                 if ("python" + t.rsplit(".", 1)[0]).encode() in data}
        counts = named if named else {}
    return max(counts, key=lambda k: counts[k]) if counts else None


def _hex_version(value: int) -> Tuple[Tuple[int, int], str]:
    major, minor, micro = (value >> 24) & 0xFF, (value >> 16) & 0xFF, (value >> 8) & 0xFF
    level, serial = (value >> 4) & 0xF, value & 0xF
    suffix = {0xA: "a", 0xB: "b", 0xC: "rc"}.get(level, "")
    return (major, minor), "%d.%d.%d%s" % (major, minor, micro, suffix + str(serial)
                                           if suffix else "")


def _libpython(path: str, symbols: _Symbols) -> Optional[str]:
    """The libpython a Python executable links against, found as the dynamic loader would
    from the file alone (its RUNPATH/RPATH, then ../lib beside it, then the system dirs)."""
    names = [n for n in symbols.needed if n.startswith("libpython")]
    if not names:
        return None
    here = os.path.dirname(os.path.realpath(path))
    dirs = symbols.search + [os.path.join(here, "..", "lib"), "/usr/local/lib",
                             "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                             "/usr/lib64", "/usr/lib", "/lib"]
    for directory in dirs:
        candidate = os.path.join(directory, names[0])
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    return None


def _unsupported(path: str, version: Optional[str], minor: Optional[Tuple[int, int]],
                 why: str) -> UnknownInterpreter:
    name = os.path.basename(path)
    shown = "%s (%s)" % (name, version) if version else name
    return UnknownInterpreter("%s: %s" % (shown, why))


def _examine(path: str) -> Optional[Interpreter]:
    symbols = _read_symbols(path, (RUNTIME_SYMBOL, VERSION_SYMBOL) + CPYTHON_MARKERS)
    if symbols is None:
        return None
    if RUNTIME_SYMBOL not in symbols.values:
        library = _libpython(path, symbols)
        if library is not None and os.path.realpath(library) != os.path.realpath(path):
            return find_interpreter(library)
        if any(marker in symbols.values for marker in CPYTHON_MARKERS):
            minor = _version_from_name(path)
            version = _version_in_file(path, symbols.rodata, minor)
            if version is not None and minor is None:
                minor = tuple(int(p) for p in version.split(".")[:2])  # type: ignore
            raise _unsupported(path, version, minor, "Python %s is not supported (%s are)"
                               % ("%d.%d" % minor if minor else "of this age",
                                  supported_range()))
        return None
    return _interpreter(path, symbols)


def _interpreter(path: str, symbols: _Symbols) -> Interpreter:
    runtime, _ = symbols.values[RUNTIME_SYMBOL]
    minor, version = _version_of(path, symbols)
    if minor is None:
        raise _unsupported(path, None, None, "a CPython whose version cannot be told")
    text = "%d.%d" % minor
    if not SUPPORTED[0] <= minor <= SUPPORTED[1]:
        raise _unsupported(path, version, minor, "Python %s is not supported (%s are)"
                           % (text, supported_range()))
    table_layout = layout_for(minor)
    if table_layout is not None:
        return Interpreter(path, version or text, runtime, table_layout)
    offset = _file_offset(symbols.segments, runtime)
    if offset is None:
        raise _unsupported(path, version, minor, "its _PyRuntime has no bytes in the file")
    try:
        layout = layout_from_debug_offsets(_read(path, offset, DEBUG_OFFSETS_READ))
    except UnknownInterpreter as err:
        raise _unsupported(path, version, minor, str(err)) from None
    if layout.version != minor:
        raise _unsupported(path, version, minor, "its _Py_DebugOffsets say Python %d.%d"
                           % layout.version)
    return Interpreter(path, version or text, runtime, layout)


def _version_of(path: str, symbols: _Symbols) -> Tuple[Optional[Tuple[int, int]], Optional[str]]:
    """((major, minor), full version text or None): Py_Version, else file name, else rodata."""
    if VERSION_SYMBOL in symbols.values:
        offset = _file_offset(symbols.segments, symbols.values[VERSION_SYMBOL][0])
        if offset is not None:
            raw = _read(path, offset, 4)
            if len(raw) == 4:
                return _hex_version(struct.unpack("<I", raw)[0])
    minor = _version_from_name(path)
    version = _version_in_file(path, symbols.rodata, minor)
    if minor is None and version is not None:
        minor = (int(version.split(".")[0]), int(version.split(".")[1]))
    return minor, version


def file_identity(path: str) -> Optional[Tuple[int, int, int]]:
    """(device, inode, mtime) of a regular file, what a cache of what it holds is keyed on;
    None when it is no regular file or cannot be seen."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return info.st_dev, info.st_ino, info.st_mtime_ns


_cache: Dict[Tuple[str, int, int, int], object] = {}
_cache_lock = threading.Lock()


def find_interpreter(path: str) -> Optional[Interpreter]:
    """The CPython in an executable or shared library, read as data (never loaded): None for
    a file that is no CPython; UnknownInterpreter for one without a layout here. A Python
    executable linked against libpython gives its libpython (found from the executable's
    RUNPATH/RPATH). Cached per (path, device, inode, mtime)."""
    identity = file_identity(path)
    if identity is None:
        return None
    key = (os.path.realpath(path),) + identity
    with _cache_lock:
        known = _cache.get(key)
    if known is None:
        try:
            known = _examine(key[0])
        except UnknownInterpreter as err:
            known = err
        with _cache_lock:
            _cache[key] = known if known is not None else False
    if isinstance(known, UnknownInterpreter):
        raise UnknownInterpreter(str(known))
    return known or None  # type: ignore
