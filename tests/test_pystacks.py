"""pystacks.py without probes: records of the `pystacks` ring parsed, stacks resolved with
each interpreter's line rules, what cannot be shown counted and asked for again."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from ebpf_cuda.decode import events, pystacks
from ebpf_cuda.spec import layout
from ebpf_cuda.probes import pystack as pp
from ebpf_cuda.targets import python_layouts
from ebpf_cuda.decode.pystacks import PyStacks, Registered, proc_value

LAYOUT_312 = python_layouts.layout_for((3, 12))


class FakeMap(dict):
    def delete(self, key):
        return self.pop(key, None) is not None


class FakeRing:
    def __init__(self):
        self.records = []

    def read_batch(self):
        out, self.records = self.records, []
        return out


@pytest.fixture
def stacks(monkeypatch) -> PyStacks:
    # (the ring is replaced: no kernel object behind this one)
    monkeypatch.setattr(pystacks.RingBuffer, "from_map", staticmethod(lambda m: FakeRing()))
    stacks = PyStacks({layout.PY_PROCS: FakeMap(), layout.PY_SEEN: FakeMap(),
                       layout.PY_RING: None})
    interp = python_layouts.Interpreter("/x/libpython3.12.so", "3.12.1", 0x1000, LAYOUT_312)
    stacks.registered[7] = Registered(interp, 1)
    return stacks


def _code_record(pid: int, address: int, file: str, name: str, first: int,
                 table: bytes) -> bytes:
    ascii_state = 1 << 2 | 1 << 5 | 1 << 6  # kind 1, compact, ascii
    head = pp.CODE_HEAD.pack(pp.CODE_RECORD, first, pid << 32 | pid, address, ascii_state,
                             len(file), ascii_state, len(name), len(table), len(table))
    body = bytearray(pp.CODE_LINETABLE_AT + len(table))
    body[:len(head)] = head
    body[pp.CODE_FILENAME_AT:pp.CODE_FILENAME_AT + len(file)] = file.encode()
    body[pp.CODE_NAME_AT:pp.CODE_NAME_AT + len(name)] = name.encode()
    body[pp.CODE_LINETABLE_AT:] = table
    return bytes(body)


def _stack_record(pid: int, key: int, pairs) -> bytes:
    return pp.STACK_HEAD.pack(pp.STACK_RECORD, len(pairs), pid << 32 | pid, key) + b"".join(
        pp.FRAME.pack(*pair) for pair in pairs)


def _table_of(func):
    code = func.__code__
    return code.co_linetable, code.co_firstlineno


def test_a_stack_resolves_to_the_lines_the_interpreter_gives(stacks):
    # (3.11 and later share the location table format: this test's own table)
    if sys.version_info < (3, 11):
        table, first = b"", 10  # an empty table: no line for any instruction
    else:
        table, first = _table_of(test_a_stack_resolves_to_the_lines_the_interpreter_gives)
    code = 0x5000
    stacks.ring.records = [_stack_record(7, 99, [(code, code + LAYOUT_312.code_adaptive + 4),
                                                 (0, 0)]),
                           _code_record(7, code, "/app/train.py", "Model.forward", first, table)]
    stacks.drain()
    event = events.Event(0.0, 5, 7, 7, "app", "cudaMalloc", "exit", {}, py_stack_id=99)
    stacks.annotate([event])
    expected = python_layouts.line_number("locations", table, first, 4)
    assert expected is not None or not table
    assert event.py_stack == (events.PyFrame("/app/train.py", expected, "Model.forward"),)
    assert stacks.missing == {}


def test_a_lost_code_object_is_counted_and_its_stack_asked_for_again(stacks):
    stacks.ring.records = [_stack_record(7, 42, [(0x5000, 0x5000 + 200)])]
    stacks.drain()
    first = events.Event(0.0, 5, 7, 7, "app", "cudaMalloc", "exit", {}, py_stack_id=42)
    stacks.annotate([first])
    assert first.py_stack is None
    assert stacks.missing == {"a code object of its stack could not be read": 1}
    assert stacks.seen == {}  # (never marked sent here)
    stacks.seen[pp.seen_slot(42)] = 42  # (as the probe marks it)
    stacks.annotate([first])
    assert stacks.seen[pp.seen_slot(42)] == 0  # (the probes send it again)
    stacks.ring.records = [_code_record(7, 0x5000, "/app/a.py", "f", 3, b"")]
    stacks.drain()
    again = events.Event(0.0, 6, 7, 7, "app", "cudaMalloc", "exit", {}, py_stack_id=42)
    stacks.annotate([again])
    assert again.py_stack == (events.PyFrame("/app/a.py", None, "f"),)  # (no line table)
    assert "2 calls without their Python stack" in stacks.sentence()


def test_calls_before_the_interpreter_was_read_are_counted_once_each(stacks):
    stacks._since[7] = 100
    before = [events.Event(0.0, 50, 7, 7, "app", "cudaFree", phase, {})
              for phase in ("enter", "exit")]
    after = events.Event(0.0, 150, 7, 7, "app", "cudaFree", "exit", {})
    stacks.annotate(before + [after])
    assert stacks.missing == {"made before its process's interpreter was read": 1}


def test_arm64_main_thread_calls_without_a_stack_are_counted(stacks):
    """arm64: a main thread not switched out since its exec has a stale thread pointer in
    the kernel, and no stack: counted; another thread's calls (a C thread) are not."""
    stacks._since[7] = 100
    stacks._saved_pointer = True
    main = events.Event(0.0, 150, 7, 7, "app", "cudaFree", "exit", {})
    other = events.Event(0.0, 150, 7, 8, "app", "cudaFree", "exit", {})
    stacks.annotate([main, other])
    assert stacks.missing == {pystacks.UNMATCHED_MAIN: 1}
    stacks._saved_pointer = False  # (x86-64: the fs base is always current)
    stacks.annotate([main])
    assert stacks.missing == {pystacks.UNMATCHED_MAIN: 1}


def test_the_probes_value_of_a_process():
    value = proc_value(python_layouts.layout_for((3, 8)), 0x7F0000001000, 5)
    fields = pp.PROC.unpack(value)
    assert fields[0] == 0x7F0000001000 and fields[1] == (1 << 64) - 1  # (no tag bits)
    named = dict(zip(pp.PROC_FIELDS, fields[2:]))
    assert named["cframe_current_frame"] == pp.NONE  # (3.8: the thread state's frame)
    assert named["frame_owner_skip"] == 0x100  # (no owner field: nothing skipped)
    assert named["generation"] == 5 and named["frame_instr"] == 104
    assert named["thread_below_tp"] == 0  # (x86-64: pthread_self() is the thread pointer)


def test_arm64s_walk_takes_pthread_self_below_the_thread_pointer(monkeypatch):
    """arm64 (TLS_DTV_AT_TP): the value read at task_struct's tp_value, less the process's
    thread_below_tp, is what the thread states are matched with; x86-64 reads no such field."""
    from ebpf_cuda import arch
    from ebpf_cuda.asm import R0, R7

    def subtracts(machine: str) -> bool:
        monkeypatch.setattr(pp, "current_arch", lambda: arch.for_machine(machine))
        prog = [i for i in pp.walk(3128, [pp.asm.mov(R0, 1)])
                if isinstance(i, pp.asm.Instruction)]
        return any(i.src == R7 and i.off == pp.PROC_AT["thread_below_tp"] for i in prog)

    assert subtracts("aarch64") and not subtracts("x86_64")
    value = proc_value(python_layouts.layout_for((3, 11)), 0x1000, 1, thread_below_tp=1856)
    assert dict(zip(pp.PROC_FIELDS, pp.PROC.unpack(value)[2:]))["thread_below_tp"] == 1856
    assert arch.for_machine("aarch64").thread_pointer == ("thread", "uw", "tp_value")


def test_a_program_without_a_shared_glibc_is_told_in_one_line():
    """Where pthread_self() lies is read from the process's own glibc: a static program
    (busybox) has none to read, and says so."""
    from ebpf_cuda.targets import libc_threads

    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("no busybox")
    held = subprocess.Popen([busybox, "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while "busybox" not in open("/proc/%d/maps" % held.pid).read():
            assert time.monotonic() < deadline
        with pytest.raises(libc_threads.NoThreadConstant, match="maps no shared C library"):
            libc_threads.thread_below_pointer(held.pid, "_thread_db_const_thread_area")
        # this process's glibc (2.34+: in libc.so.6) states it
        assert 512 < libc_threads.thread_below_pointer(
            os.getpid(), "_thread_db_sizeof_pthread") < 16384
    finally:
        held.kill()
        held.wait()
