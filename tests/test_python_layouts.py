"""python_layouts.py against the real interpreters installed here (pyenv 3.8.18 to 3.13.0,
Debian's /usr/bin/python3; those absent are skipped): each layout is followed through the
interpreter's own live memory by a child it runs (tests/python_layouts/live_check.py), and
every line table of several source files is decoded here and compared, offset by offset,
with the interpreter's own PyCode_Addr2Line and co_lines()/findlinestarts
(tests/python_layouts/line_tables.py). No compiler is needed."""
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from ebpf_cuda.targets import python_layouts as pl
from ebpf_cuda.targets import python_offsets
from ebpf_cuda.targets.python_layouts import (UnknownInterpreter, decode_unicode, find_interpreter,
                                              layout_for, layout_from_debug_offsets, line_number)

HERE = Path(__file__).parent / "python_layouts"
PYENV = Path(os.path.expanduser("~/.pyenv/versions"))
PYENV_VERSIONS = ["3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"]
# (id, executable, version find_interpreter must give; None: whatever Py_Version says)
INTERPRETERS = [(v, PYENV / v / "bin" / ("python" + v.rsplit(".", 1)[0]), v)
                for v in PYENV_VERSIONS] + [("debian", Path("/usr/bin/python3"), None)]
LINE_SOURCES = ["json.decoder", "asyncio.tasks", "dataclasses", str(HERE / "tricky.py"),
                str(HERE / "live_check.py")]


def present(path: Path) -> Path:
    if not path.exists():
        pytest.skip("%s is not installed" % path)
    return path


def run_child(executable: Path, script: str, *args: str) -> object:
    done = subprocess.run([str(executable), "-I", str(HERE / script)] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return json.loads(done.stdout)


def first_vaddr(path: str) -> int:
    """p_vaddr of the PT_LOAD that maps the file's start (for the load bias)."""
    with open(path, "rb") as stream:
        for segment in ELFFile(stream).iter_segments():
            if segment["p_type"] == "PT_LOAD" and segment["p_offset"] == 0:
                return segment["p_vaddr"]
    raise AssertionError("%s: no PT_LOAD at offset 0" % path)


def symbol_values(path: str, name: str) -> set:
    """st_value of every symbol `name` in .dynsym and .symtab, through pyelftools."""
    with open(path, "rb") as stream:
        elf = ELFFile(stream)
        tables = [elf.get_section_by_name(t) for t in (".dynsym", ".symtab")]
        return {s["st_value"] for t in tables if t is not None
                for s in (t.get_symbol_by_name(name) or [])}


@pytest.fixture(scope="module", params=INTERPRETERS, ids=[i[0] for i in INTERPRETERS])
def interpreter(request):
    name, executable, version = request.param
    found = find_interpreter(str(present(executable)))
    assert found is not None
    return executable, version, found


def expected_layout(found: pl.Interpreter) -> pl.Layout:
    minor = tuple(int(p) for p in found.version.split(".")[:2])
    if minor >= (3, 13):
        # The table-free versions: the file's own debug offsets, parsed independently here.
        with open(found.path, "rb") as stream:
            offset = next(ELFFile(stream).address_offsets(found.runtime_vaddr))
        return layout_from_debug_offsets(pl._read(found.path, offset, 1024))
    return layout_for(minor)


# ---- 1. find_interpreter and the live memory of each interpreter ------------------------------

def test_find_interpreter_version_and_layout(interpreter):
    executable, version, found = interpreter
    if version is not None:
        assert found.version == version
    assert found.layout.version == tuple(int(p) for p in found.version.split(".")[:2])
    assert found.layout == expected_layout(found)
    assert found.runtime_vaddr in symbol_values(found.path, "_PyRuntime")
    layout = found.layout
    frame_fields = [layout.frame_previous, layout.frame_code, layout.frame_instr,
                    layout.frame_owner]
    code_fields = [layout.code_filename, layout.code_name, layout.code_linetable,
                   layout.code_firstlineno, layout.code_adaptive]
    assert max(frame_fields) < layout.frame_window <= 256
    assert max(code_fields) < layout.code_window <= 256


@pytest.fixture(scope="module")
def live(interpreter):
    executable, _, found = interpreter
    args = {"layout": found.layout._asdict(), "path": os.path.realpath(found.path),
            "runtime_vaddr": found.runtime_vaddr, "first_vaddr": first_vaddr(found.path)}
    return found.layout, run_child(executable, "live_check.py", json.dumps(args))


@pytest.mark.parametrize("thread", ["main", "thread", "asyncio"])
def test_runtime_and_thread_list(live, thread):
    _, results = live
    result = results[thread]
    runtime = result["runtime"]
    assert runtime["runtime"] == runtime["expected_runtime"]
    assert runtime["interp"] == runtime["main_interp"] != 0
    assert result["threads"]["in_list"]
    assert result["threads"]["thread_id"] == result["threads"]["ident"]


def python_frames(layout, frames):
    if layout.frame_owner_skip < 0:
        return frames
    return [f for f in frames if f["owner"] < layout.frame_owner_skip]


@pytest.mark.parametrize("thread", ["main", "thread", "asyncio"])
def test_frames_codes_and_lines(live, thread):
    layout, results = live
    stack = results[thread]["stack"]
    frames, expected = python_frames(layout, stack["frames"]), stack["expected"]
    assert [f["code"] for f in frames] == [e["code"] for e in expected]
    if layout.version < (3, 11):  # the frame pointers are the frame objects themselves
        assert [f["frame"] for f in frames] == [e["frame"] for e in expected]
    for frame, want in zip(frames, expected):
        record = want["record"]
        table = bytes_of(layout, record["linetable"][0])
        offset = layout.instruction_offset(frame["code"], frame["raw"])
        assert offset is not None
        got = line_number(layout.line_format, table, record["firstlineno"][0], offset)
        assert got == want["line"], (record["name"][1], offset)


def test_shim_frame_below_outermost(live):
    layout, results = live
    if layout.version < (3, 12):
        assert layout.frame_owner_skip == -1
        pytest.skip("no C-stack shim frames before 3.12")
    for thread in ("main", "thread", "asyncio"):
        frames = results[thread]["stack"]["frames"]
        assert frames[-1]["owner"] == layout.frame_owner_skip
        assert frames[0]["owner"] < layout.frame_owner_skip
        # Also mid-stack, wherever C called Python (list(generator) here): a walk skips
        # shim frames and goes on, it does not stop at the first.
        middle = [f["owner"] for f in frames[1:-1]]
        assert layout.frame_owner_skip in middle


def string_of(layout, blob_hex):
    """(text, kind, ascii) of a str object's bytes, decoded through the layout."""
    blob = bytes.fromhex(blob_hex)
    length = struct.unpack_from("<q", blob, layout.unicode_length)[0]
    state = struct.unpack_from("<I", blob, layout.unicode_state)[0]
    kind = pl.unicode_kind(state)
    start = pl.string_data_offset(layout, state)
    assert start is not None, "not a compact string"
    return decode_unicode(kind, blob[start:start + length * kind]), kind, bool(state >> 6 & 1)


def bytes_of(layout, blob_hex):
    blob = bytes.fromhex(blob_hex)
    size = struct.unpack_from("<q", blob, layout.bytes_size)[0]
    return blob[layout.bytes_data:layout.bytes_data + size]


@pytest.mark.parametrize("thread", ["main", "thread", "asyncio"])
def test_code_object_fields(live, thread):
    layout, results = live
    kinds = {}
    for want in results[thread]["stack"]["expected"]:
        record = want["record"]
        assert record["address_ok"] and record["filename_ok"] and record["name_ok"]
        assert record["linetable_ok"]
        for field in ("filename", "name"):
            text, kind, ascii = string_of(layout, record[field][0])
            assert text == record[field][1]
            kinds[text] = (kind, ascii)
        assert bytes_of(layout, record["linetable"][0]).hex() == record["linetable"][1]
        assert record["firstlineno"][0] == record["firstlineno"][1]
    qualified = "Kind.method" if layout.version >= (3, 11) else "method"
    assert kinds[qualified] == (1, True)
    assert kinds["größe"] == (1, False)
    assert kinds["函数"] == (2, False)
    assert kinds["𠀀"] == (4, False)
    assert kinds["<gen😀>.py"] == (4, False)


# ---- 2. line tables against each interpreter's own view -------------------------------------

@pytest.mark.parametrize("version", PYENV_VERSIONS + ["debian"])
def test_line_tables(version):
    executable = dict((i[0], i[1]) for i in INTERPRETERS)[version]
    found = find_interpreter(str(present(executable)))
    codes = 0
    for source in run_child(executable, "line_tables.py", *LINE_SOURCES):
        for code in source["codes"]:
            codes += 1
            table = bytes.fromhex(code["linetable"])
            got = [line_number(found.layout.line_format, table, code["firstlineno"], offset)
                   for offset in range(0, 2 * len(code["addr2line"]), 2)]
            where = "%s:%s" % (source["file"], code["name"])
            assert got == code["addr2line"], where
            assert got == code["reference"], where
    assert codes > 150


def test_line_number_edges():
    assert line_number("locations", b"", 5, 0) is None
    assert line_number("locations", b"\xf0", 5, -2) == 5  # PyCode_Addr2Line: offset < 0
    assert line_number("locations", b"\xf8", 5, 0) is None  # code 15: no location
    assert line_number("locations", b"\xe8\x03", 5, 0) == 4  # code 13: line delta -1
    assert line_number("linetable310", b"\x02\x80\x02\x01", 5, 0) is None
    assert line_number("linetable310", b"\x02\x80\x02\x01", 5, 2) == 6
    assert line_number("lnotab", b"\x04\x01\x02\xff", 5, 3) == 5
    assert line_number("lnotab", b"\x04\x01\x02\xff", 5, 4) == 6
    assert line_number("lnotab", b"\x04\x01\x02\xff", 5, 6) == 5
    assert line_number("locations", b"\xe8", 5, 0) is None  # cut short: no guess
    with pytest.raises(ValueError):
        line_number("nonsense", b"", 1, 0)


def test_instruction_offset_kinds():
    assert layout_for((3, 8)).instruction_offset(0, 0xFFFFFFFF) is None  # f_lasti == -1
    assert layout_for((3, 9)).instruction_offset(0, 0xDEAD00000000000A) == 10
    assert layout_for((3, 10)).instruction_offset(0, 7) == 14
    l311 = layout_for((3, 11))
    code = 0x7F0000001000
    assert l311.instruction_offset(code, code + l311.code_adaptive + 6) == 6
    assert l311.instruction_offset(code, code + l311.code_adaptive - 2) is None
    tagged = layout_for((3, 12))._replace(code_tag_bits=3)
    assert tagged.instruction_offset(code | 1, code + tagged.code_adaptive + 4) == 4


def test_decode_unicode_kinds():
    text = "aé函😀"
    assert decode_unicode(1, "aé".encode("latin-1")) == "aé"
    assert decode_unicode(2, "a函".encode("utf-16-le")) == "a函"
    assert decode_unicode(4, text.encode("utf-32-le")) == text
    with pytest.raises(ValueError):
        decode_unicode(3, b"")


# ---- 3. what is not an interpreter, or not a supported one ------------------------------------

def test_not_python(tmp_path):
    assert find_interpreter("/bin/ls") is None
    assert find_interpreter(__file__) is None  # no ELF at all
    assert find_interpreter("/nonexistent/python3.11") is None
    assert find_interpreter(str(tmp_path)) is None  # a directory
    library = present(PYENV / "3.11.7" / "lib" / "libpython3.11.so.1.0")
    cut = tmp_path / "libpython3.11.so.1.0"
    cut.write_bytes(library.read_bytes()[:8192])  # headers point past the end
    assert find_interpreter(str(cut)) is None


def test_version_from_rodata_and_cache(tmp_path):
    """A libpython 3.9 under a name without the version: the version comes from .rodata;
    the file replaced (new mtime) is looked at again."""
    library = present(PYENV / "3.9.18" / "lib" / "libpython3.9.so.1.0")
    copy = tmp_path / "libpy.so"
    copy.write_bytes(library.read_bytes())
    found = find_interpreter(str(copy))
    assert (found.version, found.layout) == ("3.9.18", layout_for((3, 9)))
    assert found.runtime_vaddr == find_interpreter(str(library)).runtime_vaddr
    copy.write_bytes(Path("/bin/ls").read_bytes())
    os.utime(str(copy), ns=(1, 1))
    assert find_interpreter(str(copy)) is None


@pytest.mark.parametrize("version", ["3.6.15", "3.7.16", "2.7.18"])
def test_old_versions_refused(version):
    minor = version.rsplit(".", 1)[0]
    executable = present(PYENV / version / "bin" / ("python" + minor))
    with pytest.raises(UnknownInterpreter) as caught:
        find_interpreter(str(executable))
    message = str(caught.value)
    assert "\n" not in message
    assert "(%s)" % version in message and "Python %s is not supported" % minor in message
    with pytest.raises(UnknownInterpreter):  # the cached answer says the same
        find_interpreter(str(executable))


def real_debug_offsets() -> bytes:
    found = find_interpreter(str(present(PYENV / "3.13.0" / "bin" / "python3.13")))
    with open(found.path, "rb") as stream:
        offset = next(ELFFile(stream).address_offsets(found.runtime_vaddr))
    return pl._read(found.path, offset, 1024)


def test_debug_offsets_313_and_refusals():
    data = real_debug_offsets()
    assert data.startswith(b"xdebugpy")
    layout = layout_from_debug_offsets(data)
    # offsetof() of 3.13.0's own headers (gcc -DPy_BUILD_CORE), in the table rows' order
    assert layout == python_offsets._row((3, 13), (632, 7344, 8, 152, 72, -1),
                                         (8, 0, 56, 70, 3, 0, "pointer"),
                                         (112, 128, 136, 68, 200, "locations"), (40, 56))
    threaded = data[:16] + struct.pack("<Q", 1) + data[24:]
    with pytest.raises(UnknownInterpreter, match="free-threaded"):
        layout_from_debug_offsets(threaded)
    future = data[:8] + struct.pack("<Q", 0x030F00A1) + data[16:]
    with pytest.raises(UnknownInterpreter, match="3.15"):
        layout_from_debug_offsets(future)
    with pytest.raises(UnknownInterpreter, match="cookie"):
        layout_from_debug_offsets(b"\0" * 64)
    with pytest.raises(UnknownInterpreter):
        layout_from_debug_offsets(data[:100])
    # 3.14's field list on 3.13's bytes is shifted: refused by the cross-checks, not trusted.
    shifted = data[:8] + struct.pack("<Q", 0x030E00F0) + data[16:]
    with pytest.raises(UnknownInterpreter, match="expected layout"):
        layout_from_debug_offsets(shifted)


def synthetic_314() -> bytes:
    """_Py_DebugOffsets as 3.14's header lays it out, values as 3.14 might have them."""
    values = {"bytes_object.ob_size": 16, "bytes_object.ob_sval": 32,
              "unicode_object.length": 16, "unicode_object.state": 32,
              "unicode_object.asciiobject_size": 40, "pyobject.ob_type": 8,
              "runtime_state.interpreters_head": 600, "interpreter_state.threads_head": 7000,
              "thread_state.next": 8, "thread_state.thread_id": 152,
              "thread_state.current_frame": 72, "interpreter_frame.previous": 8,
              "interpreter_frame.executable": 0, "interpreter_frame.instr_ptr": 56,
              "interpreter_frame.owner": 74, "code_object.filename": 112,
              "code_object.qualname": 128, "code_object.linetable": 136,
              "code_object.firstlineno": 68, "code_object.co_code_adaptive": 208}
    out = b"xdebugpy" + struct.pack("<QQ", 0x030E00F0, 0)
    for section, names in python_offsets._DEBUG_SECTIONS_314:
        for name in names:
            key = section + "." + name
            out += struct.pack("<Q", 100000 if name == "size" else values.get(key, 1))
    return out


def test_debug_offsets_314_synthetic():
    layout = layout_from_debug_offsets(synthetic_314())
    assert layout.version == (3, 14)
    assert layout.frame_owner_skip == 3 and layout.code_tag_bits == 3
    assert (layout.runtime_interpreters_head, layout.interp_threads_head) == (600, 7000)
    assert (layout.frame_owner, layout.code_adaptive) == (74, 208)
    assert layout.unicode_compact_size == 56
