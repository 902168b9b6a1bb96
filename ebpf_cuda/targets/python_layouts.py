"""Where CPython keeps its threads, frames and code objects, per interpreter version, and how to
turn the raw bytes a probe reads from them into file, line and function (`--py-stacks`).

The probe walks `_PyRuntime -> interpreters.head -> threads -> frame -> previous...` with
bpf_probe_read_user and sends (code object address, raw instruction value) pairs, plus once
per code object the raw file name, (qual)name, line table and first line number. This module
says which offsets to use (`Layout`), finds the interpreter in a file (`find_interpreter`,
reading the file as data, never loading it) and decodes what was read (`line_number`,
`decode_unicode`, `string_data_offset`).

Provenance of the offsets:
- 3.8 to 3.12: the table `_TABLES` below, written from offsetof() of each version's own
  headers (pyenv 3.8.18, 3.9.18, 3.10.13, 3.11.7, 3.12.1, compiled with -DPy_BUILD_CORE) and
  proven against each running interpreter by tests/test_python_layouts.py (through ctypes).
- 3.13 and later: `_Py_DebugOffsets`, which CPython places at the start of `_PyRuntime`
  (cookie b"xdebugpy"). Its own layout changes between minor versions, so it is parsed by a
  per-version field list (`_DEBUG_FIELDS`): 3.13 from 3.13.0's header and checked against
  3.13.0's real bytes; 3.14 from CPython's 3.14 header (no 3.14 interpreter to run here).
  Values every version shares (bytes and str object layouts) are cross-checked, so a field
  list that does not match the interpreter is refused rather than trusted.

Only 64-bit little-endian targets (x86-64, AArch64) are described.
"""
import os
import re
import stat
import struct
import threading
from typing import Dict, List, NamedTuple, Optional, Tuple

SUPPORTED = ((3, 8), (3, 14))  # the first and last minor versions with a layout
DEBUG_COOKIE = b"xdebugpy"
DEBUG_OFFSETS_READ = 1024  # bytes read at `_PyRuntime`: more than any _Py_DebugOffsets so far
RUNTIME_SYMBOL = "_PyRuntime"
VERSION_SYMBOL = "Py_Version"  # const unsigned long = PY_VERSION_HEX, 3.11+
# A CPython older than 3.7 has no `_PyRuntime`; these name it as a CPython all the same, so
# that it is refused with a reason instead of being taken for a non-Python program.
CPYTHON_MARKERS = ("Py_GetVersion", "Py_Initialize", "PyEval_EvalFrameEx")


class UnknownInterpreter(Exception):
    """A Python interpreter the tracer has no layout for (its message: one line, says which
    and why, e.g. 'python3.7 (3.7.16): Python 3.7 is not supported (3.8 to 3.14 are)',
    or a free-threaded build)."""


class Layout(NamedTuple):
    """Offsets (bytes) into one CPython version's structures; -1 where a field does not exist."""

    version: Tuple[int, int]
    # _PyRuntime -> main interpreter -> its thread states
    runtime_interpreters_head: int
    interp_threads_head: int
    tstate_next: int
    tstate_thread_id: int
    tstate_frame: int
    cframe_current_frame: int
    # a frame (PyFrameObject before 3.11, _PyInterpreterFrame from 3.11)
    frame_previous: int
    frame_code: int
    frame_instr: int
    frame_owner: int
    # Frames whose owner is this value *or greater* run no Python code (3.12/3.13:
    # FRAME_OWNED_BY_CSTACK = 3, the highest owner; 3.14: FRAME_OWNED_BY_INTERPRETER = 3 and
    # FRAME_OWNED_BY_CSTACK = 4, both such frames). -1: none.
    frame_owner_skip: int
    frame_window: int
    code_tag_bits: int  # a mask (like CPython's Py_TAG_BITS): frame_code & ~code_tag_bits
    instr_kind: str
    # a code object
    code_filename: int
    code_name: int
    code_linetable: int
    code_firstlineno: int
    code_adaptive: int
    code_window: int
    line_format: str
    # strings and bytes objects
    unicode_length: int
    unicode_state: int
    unicode_ascii_size: int
    unicode_compact_size: int
    bytes_size: int
    bytes_data: int

    def instruction_offset(self, code_address: int, raw: int) -> Optional[int]:
        """The byte offset in the code's bytecode of a frame's raw instruction value (as the
        probe read 8 bytes at frame_instr: for a C int only the low 32 bits count, signed),
        the one PyCode_Addr2Line takes (f_lasti for 3.8/3.9; f_lasti*2 for 3.10;
        (ptr - (code + code_adaptive)) for 3.11+, as _PyInterpreterFrame_LASTI*2); None if
        negative (a frame not started yet). `code_address` may still carry its tag bits."""
        if self.instr_kind == "pointer":
            offset = raw - (self.code_address(code_address) + self.code_adaptive)
        else:
            lasti = raw & 0xFFFFFFFF
            lasti -= (lasti & 0x80000000) << 1  # sign of the C int
            offset = lasti * 2 if self.instr_kind == "lasti_units" else lasti
        return offset if offset >= 0 else None

    def code_address(self, raw: int) -> int:
        """The code object's address from the raw value read at frame_code (untagged)."""
        return raw & ~self.code_tag_bits


def _window(*offsets: int, last: int = 8) -> int:
    """Bytes to read from a structure's start to cover the given fields (8-byte ones)."""
    return max(offsets) + last


def _row(version: Tuple[int, int], runtime: Tuple[int, int, int, int, int, int],
         frame: Tuple[int, int, int, int, int, int, str], code: Tuple[int, int, int, int, int, str],
         unicode_sizes: Tuple[int, int]) -> Layout:
    """One table row, in the order the probe follows the pointers (see `_TABLES`)."""
    head, threads, tnext, tid, tframe, cframe = runtime
    previous, fcode, instr, owner, skip, tag, kind = frame
    filename, name, linetable, firstlineno, adaptive, line_format = code
    frame_window = _window(previous, fcode, instr, owner if owner >= 0 else 0)
    code_window = _window(filename, name, linetable, firstlineno, adaptive)
    return Layout(version, head, threads, tnext, tid, tframe, cframe,
                  previous, fcode, instr, owner, skip, frame_window, tag, kind,
                  filename, name, linetable, firstlineno, adaptive, code_window, line_format,
                  16, 32, unicode_sizes[0], unicode_sizes[1], 16, 32)


# One row per version: offsetof() from the version's headers (see the module docstring).
#   runtime: interpreters.head, interp threads head, tstate next, thread_id, frame/cframe,
#            cframe.current_frame
#   frame:   previous, code, instr, owner, owner to skip, code tag mask, instr kind
#   code:    filename, (qual)name, linetable, firstlineno, co_code_adaptive, line format
#   unicode: sizeof(PyASCIIObject), sizeof(PyCompactUnicodeObject) (wstr gone in 3.12)
_TABLES: Dict[Tuple[int, int], Layout] = {v[0]: _row(*v) for v in [
    ((3, 8), (32, 8, 8, 176, 24, -1), (24, 32, 104, -1, -1, 0, "lasti_bytes"),
     (104, 112, 120, 40, -1, "lnotab"), (48, 72)),
    ((3, 9), (32, 8, 8, 176, 24, -1), (24, 32, 104, -1, -1, 0, "lasti_bytes"),
     (104, 112, 120, 40, -1, "lnotab"), (48, 72)),
    ((3, 10), (32, 8, 8, 176, 24, -1), (24, 32, 96, -1, -1, 0, "lasti_units"),
     (104, 112, 120, 40, -1, "linetable310"), (48, 72)),
    ((3, 11), (40, 16, 8, 152, 56, 8), (48, 32, 56, 69, -1, 0, "pointer"),
     (112, 128, 136, 72, 184, "locations"), (48, 72)),
    ((3, 12), (40, 72, 8, 136, 56, 0), (8, 0, 56, 70, 3, 0, "pointer"),
     (112, 128, 136, 68, 192, "locations"), (40, 56)),
]}

# 3.13+: the owner values and stack-reference tags that _Py_DebugOffsets does not carry.
#   version: (frame_owner_skip, code_tag_bits)
_DEBUG_EXTRAS = {(3, 13): (3, 0), (3, 14): (3, 3)}

# _Py_DebugOffsets, as the u64 fields after cookie/version/free_threaded, section by section;
# only the sections up to the ones used are listed (later ones are never read).
_DEBUG_SECTIONS_313 = [
    ("runtime_state", ["size", "finalizing", "interpreters_head"]),
    ("interpreter_state", ["size", "id", "next", "threads_head", "gc", "imports_modules",
                           "sysdict", "builtins", "ceval_gil", "gil_runtime_state",
                           "gil_runtime_state_enabled", "gil_runtime_state_locked",
                           "gil_runtime_state_holder"]),
    ("thread_state", ["size", "prev", "next", "interp", "current_frame", "thread_id",
                      "native_thread_id", "datastack_chunk", "status"]),
    ("interpreter_frame", ["size", "previous", "executable", "instr_ptr", "localsplus",
                           "owner"]),
    ("code_object", ["size", "filename", "name", "qualname", "linetable", "firstlineno",
                     "argcount", "localsplusnames", "localspluskinds", "co_code_adaptive"]),
    ("pyobject", ["size", "ob_type"]),
    ("type_object", ["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", ["size", "ob_item", "ob_size"]),
    ("list_object", ["size", "ob_item", "ob_size"]),
    ("dict_object", ["size", "ma_keys", "ma_values"]),
    ("float_object", ["size", "ob_fval"]),
    ("long_object", ["size", "lv_tag", "ob_digit"]),
    ("bytes_object", ["size", "ob_size", "ob_sval"]),
    ("unicode_object", ["size", "state", "length", "asciiobject_size"]),
]
_DEBUG_SECTIONS_314 = [
    ("runtime_state", ["size", "finalizing", "interpreters_head"]),
    ("interpreter_state", ["size", "id", "next", "threads_head", "threads_main", "gc",
                           "imports_modules", "sysdict", "builtins", "ceval_gil",
                           "gil_runtime_state", "gil_runtime_state_enabled",
                           "gil_runtime_state_locked", "gil_runtime_state_holder",
                           "code_object_generation", "tlbc_generation"]),
    ("thread_state", ["size", "prev", "next", "interp", "current_frame", "thread_id",
                      "native_thread_id", "datastack_chunk", "status"]),
    ("interpreter_frame", ["size", "previous", "executable", "instr_ptr", "localsplus",
                           "owner", "stackpointer", "tlbc_index"]),
    ("code_object", ["size", "filename", "name", "qualname", "linetable", "firstlineno",
                     "argcount", "localsplusnames", "localspluskinds", "co_code_adaptive",
                     "co_tlbc"]),
    ("pyobject", ["size", "ob_type"]),
    ("type_object", ["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", ["size", "ob_item", "ob_size"]),
    ("list_object", ["size", "ob_item", "ob_size"]),
    ("set_object", ["size", "used", "table", "mask"]),
    ("dict_object", ["size", "ma_keys", "ma_values"]),
    ("float_object", ["size", "ob_fval"]),
    ("long_object", ["size", "lv_tag", "ob_digit"]),
    ("bytes_object", ["size", "ob_size", "ob_sval"]),
    ("unicode_object", ["size", "state", "length", "asciiobject_size"]),
]
_DEBUG_FIELDS = {(3, 13): _DEBUG_SECTIONS_313, (3, 14): _DEBUG_SECTIONS_314}
_DEBUG_HEADER = struct.Struct("<8sQQ")  # cookie, version (PY_VERSION_HEX), free_threaded


def supported_range() -> str:
    """'3.8 to 3.14', for messages."""
    return "%d.%d to %d.%d" % (SUPPORTED[0] + SUPPORTED[1])


def layout_for(version: Tuple[int, int]) -> Optional[Layout]:
    """The checked table row of a version without _Py_DebugOffsets (3.8 to 3.12), else None."""
    return _TABLES.get(tuple(version))


def _debug_fields(data: bytes, sections: List[Tuple[str, List[str]]]) -> Dict[str, int]:
    """{"section.field": value} of the u64 fields following the header."""
    fields = {}
    position = _DEBUG_HEADER.size
    for section, names in sections:
        for name in names:
            if position + 8 > len(data):
                raise UnknownInterpreter("_Py_DebugOffsets is cut short (%d bytes)" % len(data))
            fields[section + "." + name] = struct.unpack_from("<Q", data, position)[0]
            position += 8
    return fields


def _check_debug_fields(f: Dict[str, int], asciisize: int, version: str) -> None:
    """Refuse a field list that does not fit the bytes: values every 3.13+ build shares,
    and offsets inside their structure's size. A shifted list fails these at once."""
    shared = {"bytes_object.ob_size": 16, "bytes_object.ob_sval": 32,
              "unicode_object.length": 16, "unicode_object.state": 32,
              "pyobject.ob_type": 8}
    wrong = [k for k, v in shared.items() if f[k] != v] + ([] if asciisize == 40 else
                                                          ["unicode_object.asciiobject_size"])
    for key, value in f.items():
        section = key.split(".", 1)[0]
        if not key.endswith(".size") and value >= f[section + ".size"] and \
                key != "interpreter_state.gil_runtime_state_enabled":
            wrong.append(key)
    if wrong:
        raise UnknownInterpreter("Python %s: its _Py_DebugOffsets do not have the expected "
                                 "layout (%s)" % (version, ", ".join(sorted(wrong)[:4])))


def layout_from_debug_offsets(data: bytes) -> Layout:
    """The layout of a 3.13+ interpreter from the first bytes of its `_PyRuntime`
    (_Py_DebugOffsets). UnknownInterpreter for free-threaded builds and versions whose
    _Py_DebugOffsets layout is unknown."""
    if len(data) < _DEBUG_HEADER.size or not data.startswith(DEBUG_COOKIE):
        raise UnknownInterpreter("no _Py_DebugOffsets at _PyRuntime (no %r cookie)"
                                 % DEBUG_COOKIE.decode())
    _, hexversion, free_threaded = _DEBUG_HEADER.unpack_from(data)
    version = ((hexversion >> 24) & 0xFF, (hexversion >> 16) & 0xFF)
    text = "%d.%d" % version
    if free_threaded:
        # Frames hold tagged references and code objects per-thread bytecode there, and no
        # GIL orders the probe's reads against the threads: not attempted.
        raise UnknownInterpreter("Python %st is a free-threaded build (not supported)" % text)
    if version not in _DEBUG_FIELDS:
        raise UnknownInterpreter("Python %s: its _Py_DebugOffsets layout is unknown "
                                 "(%s are supported)" % (text, supported_range()))
    f = _debug_fields(data, _DEBUG_FIELDS[version])
    asciisize = f["unicode_object.asciiobject_size"]
    _check_debug_fields(f, asciisize, text)
    skip, tag = _DEBUG_EXTRAS[version]
    frame = [f["interpreter_frame." + k] for k in ("previous", "executable", "instr_ptr")]
    owner = f["interpreter_frame.owner"]
    code = [f["code_object." + k] for k in
            ("filename", "qualname", "linetable", "firstlineno", "co_code_adaptive")]
    return Layout(
        version, f["runtime_state.interpreters_head"], f["interpreter_state.threads_head"],
        f["thread_state.next"], f["thread_state.thread_id"], f["thread_state.current_frame"],
        -1, frame[0], frame[1], frame[2], owner, skip, _window(*frame, owner), tag, "pointer",
        code[0], code[1], code[2], code[3], code[4], _window(*code), "locations",
        f["unicode_object.length"], f["unicode_object.state"], asciisize,
        asciisize + 16,  # PyCompactUnicodeObject adds utf8_length and utf8 (3.12+)
        f["bytes_object.ob_size"], f["bytes_object.ob_sval"])


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
    libraries it needs; None for a file that is no ELF. The symbol tables are scanned in
    bulk with struct: pyelftools' per-symbol iteration is slow on libpython's 15k symbols."""
    from elftools.elf.elffile import ELFFile
    try:
        with open(path, "rb") as stream:
            if stream.read(4) != b"\x7fELF":
                return None
            stream.seek(0)
            elf = ELFFile(stream)
            if elf.elfclass != 64 or not elf.little_endian:
                return None  # the probe reads 64-bit little-endian layouts only
            segments = [(s["p_vaddr"], s["p_offset"], s["p_filesz"])
                        for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            values: Dict[str, Tuple[int, int]] = {}
            for section_name in (".dynsym", ".symtab"):
                _scan_symbols(elf, stream, section_name, names, values)
            needed, search = _dynamic(elf, path)
            rodata = elf.get_section_by_name(".rodata")
            where = (rodata["sh_offset"], rodata["sh_size"]) if rodata is not None else (0, 0)
    except Exception:  # pyelftools' ELFError, construct errors, struct, I/O: a damaged
        return None  # file, which no interpreter runs from
    return _Symbols(values, segments, needed, search, where)


def _scan_symbols(elf, stream, section_name: str, names: Tuple[str, ...],
                  values: Dict[str, Tuple[int, int]]) -> None:
    """Add to `values` the defined symbols of `names` in one symbol table."""
    section = elf.get_section_by_name(section_name)
    if section is None or section["sh_entsize"] != 24:
        return
    strings = elf.get_section(section["sh_link"])
    stream.seek(strings["sh_offset"])
    table = stream.read(strings["sh_size"])
    wanted = {}
    for name in names:
        if name in values:
            continue
        at = table.find(b"\0" + name.encode() + b"\0")
        if at >= 0:
            wanted[at + 1] = name
    if not wanted:
        return
    stream.seek(section["sh_offset"])
    raw = stream.read(section["sh_size"])
    for st_name, _info, _other, shndx, value, size in struct.iter_unpack("<IBBHQQ", raw):
        if st_name in wanted and shndx != 0:
            values[wanted.pop(st_name)] = (value, size)
            if not wanted:
                return


def _dynamic(elf, path: str) -> Tuple[List[str], List[str]]:
    """DT_NEEDED names and DT_RUNPATH/DT_RPATH directories ($ORIGIN expanded)."""
    section = elf.get_section_by_name(".dynamic")
    if section is None:
        return [], []
    needed, search = [], []
    origin = os.path.dirname(os.path.realpath(path))
    for tag in section.iter_tags():
        if tag.entry.d_tag == "DT_NEEDED":
            needed.append(tag.needed)
        elif tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
            text = tag.runpath if tag.entry.d_tag == "DT_RUNPATH" else tag.rpath
            search += [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
                       for d in text.split(":") if d]
    return needed, search


def _file_offset(segments: List[Tuple[int, int, int]], vaddr: int) -> Optional[int]:
    for start, offset, filesz in segments:
        if start <= vaddr < start + filesz:
            return offset + vaddr - start
    return None


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
    if minor in _TABLES:
        return Interpreter(path, version or text, runtime, _TABLES[minor])
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


_cache: Dict[Tuple[str, int, int, int], object] = {}
_cache_lock = threading.Lock()


def find_interpreter(path: str) -> Optional[Interpreter]:
    """The CPython in an executable or shared library, read as data (never loaded): None for
    a file that is no CPython; UnknownInterpreter for one without a layout here. A Python
    executable linked against libpython gives its libpython (found from the executable's
    RUNPATH/RPATH). Cached per (path, device, inode, mtime)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    key = (os.path.realpath(path), info.st_dev, info.st_ino, info.st_mtime_ns)
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
