"""Run by each interpreter under test (3.8+; stdlib only): compiles the source files named in
argv[1:] (module names such as json.decoder, or paths) and prints, as JSON, every code object's
raw line table and first line, with the line of every instruction offset as the interpreter
gives it: its own PyCode_Addr2Line (through ctypes), and co_lines() (3.10+) or
dis.findlinestarts (3.8/3.9). The test decodes the tables in its own process and compares.
"""
import ctypes
import dis
import importlib.util
import json
import sys

ADDR2LINE = ctypes.pythonapi.PyCode_Addr2Line
ADDR2LINE.argtypes = [ctypes.py_object, ctypes.c_int]
ADDR2LINE.restype = ctypes.c_int


def source_path(name):
    return name if name.endswith(".py") else importlib.util.find_spec(name).origin


def code_objects(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            yield from code_objects(const)


def reference_lines(code):
    """Line per byte offset (every 2 bytes) from co_lines, or from findlinestarts."""
    size = len(code.co_code)
    lines = [None] * (size // 2)
    if hasattr(code, "co_lines"):
        for start, end, line in code.co_lines():
            for offset in range(start, min(end, size), 2):
                lines[offset // 2] = line
    else:
        starts = list(dis.findlinestarts(code))
        for i, (start, line) in enumerate(starts):
            end = starts[i + 1][0] if i + 1 < len(starts) else size
            for offset in range(start, end, 2):
                lines[offset // 2] = line
    return lines


def record(code):
    table = code.co_lnotab if sys.version_info < (3, 10) else code.co_linetable
    addr2line = [ADDR2LINE(code, offset) for offset in range(0, len(code.co_code), 2)]
    return {"name": code.co_name, "linetable": table.hex(), "firstlineno": code.co_firstlineno,
            "addr2line": [None if n < 0 else n for n in addr2line],
            "reference": reference_lines(code)}


def main():
    out = []
    for name in sys.argv[1:]:
        path = source_path(name)
        with open(path, "rb") as stream:
            top = compile(stream.read(), path, "exec")
        out.append({"file": path, "codes": [record(c) for c in code_objects(top)]})
    print(json.dumps(out))


main()
