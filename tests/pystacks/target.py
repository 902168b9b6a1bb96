"""Calls the CUDA runtime from known places; writes, for each call, the calling thread's
native id and its Python stack as the interpreter sees it (innermost first), to compare
with the trace's `py_stack` (tests/test_py_stacks_e2e.py).

    python target.py LIBCUDART OUT.json
"""
import asyncio
import ctypes
import json
import sys
import threading
import traceback

lib = ctypes.CDLL(sys.argv[1])
calls = []
lock = threading.Lock()


def rec(value):
    """Record the caller's stack; returns `value` (called in the CUDA call's arguments, so
    that the frame stands on the call's own line)."""
    frame = sys._getframe(1)
    summary = traceback.extract_stack(frame)  # outermost first
    stack = []
    for entry in reversed(summary):
        stack.append([entry.filename, entry.lineno, entry.name])
    # qualified names where the interpreter has them (3.11+)
    f, names = frame, []
    while f is not None:
        names.append(getattr(f.f_code, "co_qualname", f.f_code.co_name))
        f = f.f_back
    for entry, name in zip(stack, names):
        entry[2] = name
    with lock:
        calls.append({"tid": threading.get_native_id(), "stack": stack})
    return value


def count():
    return ctypes.byref(ctypes.c_int())


def nested():
    def inner():
        lib.cudaGetDeviceCount(rec(count()))
    inner()


class Model:
    def forward(self):
        lib.cudaGetDeviceCount(rec(count()))


def generator():
    for i in range(2):
        lib.cudaGetDeviceCount(rec(count()))
        yield i


def multi_line():
    return (1 +
            lib.cudaGetDeviceCount(rec(count())))


async def task_body():
    lib.cudaGetDeviceCount(rec(count()))
    await asyncio.sleep(0)
    lib.cudaGetDeviceCount(rec(count()))


async def main_task():
    await asyncio.create_task(task_body())


def deep(n):
    if n:
        return deep(n - 1)
    lib.cudaGetDeviceCount(rec(count()))


def main():
    nested()
    Model().forward()
    list(generator())
    (lambda: lib.cudaGetDeviceCount(rec(count())))()
    multi_line()
    worker = threading.Thread(target=nested)
    worker.start()
    worker.join()
    asyncio.run(main_task())
    deep(20)
    with open(sys.argv[2], "w") as out:
        json.dump(calls, out)


main()
