"""Run by each interpreter under test (3.8+; stdlib only): follows the offsets of a layout
(argv[1], JSON) through this interpreter's own live memory with ctypes, the way the probe
does, and prints JSON with what it found beside what the interpreter itself says.

Address checks (pointers leading to the right objects) are made here, where the memory is;
the raw bytes of frames, strings and line tables are printed for the test to decode with
ebpf_cuda.targets.python_layouts in its own process.
"""
import asyncio
import ctypes
import json
import sys
import threading

ARGS = json.loads(sys.argv[1])
L = ARGS["layout"]
R = ctypes.c_uint64.from_address  # a C method: calling it pushes no Python frame
I32 = ctypes.c_int.from_address
API = ctypes.pythonapi
API.PyThreadState_Get.restype = ctypes.c_void_p
API.PyInterpreterState_Main.restype = ctypes.c_void_p
TF, CF, FI = L["tstate_frame"], L["cframe_current_frame"], L["frame_instr"]


def raw(address, size):
    return (ctypes.c_char * size).from_address(address).raw


def runtime_checks():
    """_PyRuntime's address against the file's symbol plus the load bias from our maps."""
    runtime = ctypes.addressof(ctypes.c_char.in_dll(API, "_PyRuntime"))
    start = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == ARGS["path"] and int(parts[2], 16) == 0:
                start = int(parts[0].split("-")[0], 16)
                break
    bias = start - (ARGS["first_vaddr"] & ~0xFFF)
    interp = R(runtime + L["runtime_interpreters_head"]).value
    return {"runtime": runtime, "expected_runtime": ARGS["runtime_vaddr"] + bias,
            "interp": interp, "main_interp": API.PyInterpreterState_Main()}


def threads_checks(interp):
    """This thread's PyThreadState is in the interpreter's list, with our thread id."""
    me = API.PyThreadState_Get()
    found, tstate, seen = None, R(interp + L["interp_threads_head"]).value, 0
    while tstate and seen < 1000:
        if tstate == me:
            found = R(tstate + L["tstate_thread_id"]).value
        tstate, seen = R(tstate + L["tstate_next"]).value, seen + 1
    return me, {"in_list": found is not None, "thread_id": found,
                "ident": threading.get_ident()}


def obj_blob(obj):
    """The bytes of a str or bytes object as they lie in memory (its whole allocation)."""
    return raw(id(obj), sys.getsizeof(obj)).hex()


def code_record(code_address, code):
    """The code object's fields reached through the layout, and what Python says of them."""
    def field(off):
        return R(code_address + off).value
    table = code.co_lnotab if L["line_format"] == "lnotab" else code.co_linetable
    name = getattr(code, "co_qualname", code.co_name)
    return {
        "address_ok": code_address == id(code),
        "filename_ok": field(L["code_filename"]) == id(code.co_filename),
        "name_ok": field(L["code_name"]) == id(name),
        "linetable_ok": field(L["code_linetable"]) == id(table),
        "filename": [obj_blob(code.co_filename), code.co_filename],
        "name": [obj_blob(name), name],
        "linetable": [obj_blob(table), table.hex()],
        "firstlineno": [I32(code_address + L["code_firstlineno"]).value, code.co_firstlineno],
    }


def walk(first, first_raw):
    """Follow `previous` from a frame: per frame its code, raw instruction value and owner."""
    frames, frame, n = [], first, 0
    while frame and n < 200:
        code = R(frame + L["frame_code"]).value & ~L["code_tag_bits"]
        owner = raw(frame + L["frame_owner"], 1)[0] if L["frame_owner"] >= 0 else -1
        instr = first_raw if n == 0 else R(frame + FI).value
        frames.append({"frame": frame, "code": code, "raw": instr, "owner": owner})
        frame, n = R(frame + L["frame_previous"]).value, n + 1
    return frames


def snapshot(tstate):
    """The probe's view of this thread from here, beside Python's own view."""
    # One line on purpose: the frame pointer, our raw instruction value and the line Python
    # reports must all belong to the same line of this function.
    fp = R(R(tstate + TF).value + CF).value if CF >= 0 else R(tstate + TF).value; instr = R(fp + FI).value; here = sys._getframe(); line = here.f_lineno  # noqa: E702,E501
    frames = walk(fp, instr)
    expected, f = [], here
    while f is not None:
        expected.append({"code": id(f.f_code), "line": f.f_lineno, "frame": id(f),
                         "record": code_record(id(f.f_code), f.f_code)})
        f = f.f_back
    expected[0]["line"] = line
    return {"frames": frames, "expected": expected}


def check_thread(results, key):
    info = runtime_checks()
    tstate, threads = threads_checks(info["interp"])
    results[key] = {"runtime": info, "threads": threads, "stack": snapshot(tstate)}


def größe(results, key):
    return check_thread(results, key)


def 函数(results, key):
    return größe(results, key)


# A function named and filed with 4-byte-kind strings (an identifier of CJK Extension B).
NS = {"函数": 函数}
SOURCE = "def 𠀀(results, key):\n    return 函数(results, key)\n"
exec(compile(SOURCE, "<gen😀>.py", "exec"), NS)


class Kind:
    def method(self, results, key):
        value = [
            1,
            NS["𠀀"](results, key),  # a call inside a multi-line expression
        ]
        return value


def generator(results, key):
    yield Kind().method(results, key)


async def coroutine(results, key):
    await asyncio.sleep(0)
    return list(generator(results, key))


def main():
    results = {}
    list(generator(results, "main"))
    asyncio.run(coroutine(results, "asyncio"))  # a task's coroutine, stepped from the loop
    worker = threading.Thread(target=lambda: list(generator(results, "thread")))
    worker.start()
    worker.join()
    print(json.dumps(results))


main()
