"""Where CPython keeps its threads, frames and code objects, per interpreter version: the
offsets (`Layout`) the `--py-stacks` probe follows, as data (python_layouts.py finds the
interpreter in a file and decodes what the probe read).

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
import struct
from typing import Dict, List, NamedTuple, Optional, Tuple

SUPPORTED = ((3, 8), (3, 14))  # the first and last minor versions with a layout
DEBUG_COOKIE = b"xdebugpy"


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
