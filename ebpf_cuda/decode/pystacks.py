"""Python stacks (--py-stacks), user side: each process's interpreter told to the probes,
the `pystacks` ring read, and each event's stack key turned into file:line (function) frames.

The probes (probes/pystack.py) walk a process's frames only once this module has put its
interpreter in `pyprocs`: the `_PyRuntime` address and the offsets of its version
(python_layouts.py, read from the file as data). A process is looked at when it is first
seen (a record, a hello at its first call or at an exec) and, for a while after an exec,
until its interpreter is mapped (a shared libpython comes after the exec). The exec
tracepoint (execs.py) removes a process from `pyprocs` as it execs: a new program is never
walked with the old one's offsets.

Stacks and code objects arrive once each on the `pystacks` ring, before the records that
name them; `annotate` sets `event.py_stack`. What cannot be shown is counted by cause
(`missing`), never guessed.
"""
import os
import threading
import time
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

from ..arch import current as current_arch
from ..bpf.maps import Map
from ..bpf.ringbuf import RingBuffer
from ..errors import TracerError
from ..probes.pystack import (CODE_FILENAME_AT, CODE_HEAD, CODE_LINETABLE_AT, CODE_NAME_AT,
                              CODE_RECORD, FRAME, FRAME_COPY, MAX_FRAMES, NONE, PROC, PROC_FIELDS,
                              STACK_HEAD, STACK_RECORD, STACK_TRUNCATED, seen_slot)
from ..spec import layout, record
from ..targets import discovery
from ..targets.libc_threads import NoThreadConstant, thread_below_pointer
from ..targets.python_layouts import (Interpreter, Layout, UnknownInterpreter, decode_unicode,
                                      find_interpreter, line_number, unicode_kind)
from .events import Event, PyFrame

Log = Callable[[str], None]
WATCH_AFTER_EXEC_S = 5.0  # how long a process is looked at for its interpreter after exec
WATCH_EVERY_S = 0.002
UNMATCHED_MAIN = ("made by a main thread whose thread state was not found (arm64: the kernel "
                  "had not saved its thread pointer since its exec yet, or it ran no Python)")
_NAMES = ("python", "libpython")


class Code(NamedTuple):
    """A code object as the probe read it."""

    file: Optional[str]
    function: Optional[str]
    firstlineno: int
    linetable: Optional[bytes]


class Registered(NamedTuple):
    interpreter: Interpreter
    generation: int


class PyStacks:
    """One session's Python stacks (see the module's docstring)."""

    def __init__(self, maps: Dict[str, Map], log: Optional[Log] = None,
                 exits: bool = True) -> None:
        self.procs = maps[layout.PY_PROCS]
        self.seen = maps[layout.PY_SEEN]  # (a stack whose code objects were lost: sent again)
        self.ring = RingBuffer.from_map(maps[layout.PY_RING])
        self.log = log or (lambda message: None)
        self.warn: Optional[Log] = None  # told, once per file, of an interpreter not known
        self.registered: Dict[int, Registered] = {}
        self.not_python: Set[int] = set()
        self.codes: Dict[Tuple[int, int], Code] = {}
        self.stacks: Dict[int, Tuple[int, bool, Tuple[Tuple[int, int], ...]]] = {}
        self._shown: Dict[int, Tuple[Optional[Tuple[PyFrame, ...]], Optional[str]]] = {}
        self._exits = exits  # calls come as enter and exit events (not entries alone)
        self._since: Dict[int, int] = {}  # pid -> kernel time its interpreter was told
        self._warned: Set[str] = set()
        self._generation = 0
        self.missing: Dict[str, int] = {}  # events without their stack, by cause
        self.truncated = 0  # stacks deeper than the probe walks (their innermost kept)
        self._lock = threading.Lock()
        self._watched: Dict[int, float] = {}  # pid -> until when to look for its interpreter
        self._watcher: Optional[threading.Thread] = None
        self._closed = False
        # arm64: the kernel's copy of a thread pointer, saved at each switch out, is stale
        # in a main thread that has not been switched out since its exec
        self._saved_pointer = current_arch().thread_self_symbol is not None

    # -- telling the probes --------------------------------------------------------------

    def observe(self, frames: bytes) -> None:
        """The processes of a batch of frames: new ones looked at; a hello record (a
        thread's first call, or an exec) has its process looked at again when the exec
        tracepoint took it out of `pyprocs`."""
        pids = record.frame_pids(frames)
        hellos = set()
        if record.HELLO_FN in record.frame_column(frames, record.FN_ID, "H"):
            ids = record.frame_column(frames, record.FN_ID, "H")
            tgids = record.frame_column(frames, record.PID_TGID + 4, "I")
            hellos = {tgid for fn, tgid in zip(ids, tgids) if fn == record.HELLO_FN}
        for pid in pids:
            if pid in hellos and pid in self.registered and self.procs.get(pid) is None:
                self.forget(pid)  # (it exec'd: the exec tracepoint took it out)
            if pid not in self.registered and pid not in self.not_python:
                if not self.register(pid) and pid in hellos:
                    self.watch(pid)

    def register(self, pid: int) -> bool:
        """Tell the probes where process `pid`'s interpreter is; False when it has none
        (yet), or one the tracer does not know (one warning per file)."""
        if pid in self.registered:
            return True
        try:
            found = self._interpreter_of(pid)
        except TracerError:
            return False  # (gone)
        if found is None:
            self.not_python.add(pid)
            return False
        interpreter, bias = found
        with self._lock:
            self._generation += 1
            generation = self._generation
        try:
            below = _thread_below_pointer(pid)
            value = proc_value(interpreter.layout, interpreter.runtime_vaddr + bias, generation,
                               below)
        except (ValueError, NoThreadConstant) as err:
            self._unknown(pid, interpreter.path, str(err))
            self.not_python.add(pid)
            return False
        except TracerError:
            return False  # (gone)
        self.procs[pid] = value
        self.registered[pid] = Registered(interpreter, generation)
        self._since[pid] = time.monotonic_ns()
        self.not_python.discard(pid)
        return True

    def _interpreter_of(self, pid: int) -> Optional[Tuple[Interpreter, int]]:
        """(interpreter, load bias) of the CPython that `pid` maps: a libpython first, else
        an executable holding `_PyRuntime` itself (one linking a libpython names it, but its
        libpython is taken only as the process maps it: in a container the name can resolve
        to another file here)."""
        mapped: Dict[str, str] = {}  # the path that reaches each file -> its real path
        for mapping in discovery.process_mappings(pid):
            name = os.path.basename(mapping.path)
            if mapping.is_file and name.startswith(_NAMES) and mapping.path not in mapped:
                path = discovery.process_file_path(pid, mapping.path, mapping.inode)
                mapped[mapping.path] = path
        order = sorted(mapped.items(), key=lambda item: not os.path.basename(item[0])
                       .startswith("libpython"))
        real = {os.path.realpath(path) for path in mapped.values()}
        for _, path in order:
            try:
                interpreter = find_interpreter(path)
            except UnknownInterpreter as err:
                self._unknown(pid, path, str(err))
                return None
            except (OSError, ValueError):
                continue
            if interpreter is not None and os.path.realpath(interpreter.path) in real:
                return interpreter, discovery.load_bias(pid, interpreter.path)
        return None

    def prepare(self, program: str) -> None:
        """Read the interpreter of a program about to run (`program` as a command names
        it): a process that lives some milliseconds is told to the probes in time."""
        path = program if "/" in program else discovery.which(program)
        try:
            if path:
                find_interpreter(os.path.realpath(path))
        except (UnknownInterpreter, OSError, ValueError):
            pass  # (said when a process of it is seen)

    def _unknown(self, pid: int, path: str, why: str) -> None:
        """One warning line per interpreter (an executable and its libpython say the same)."""
        if why not in self._warned:
            self._warned.add(why)
            (self.warn or self.log)("no Python stacks for process %d: %s" % (pid, why))

    def watch(self, pid: int) -> None:
        """Look for `pid`'s interpreter every few milliseconds for a while (it has just
        exec'd: a shared libpython is mapped by the dynamic loader after the exec)."""
        with self._lock:
            self._watched[pid] = time.monotonic() + WATCH_AFTER_EXEC_S
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch_loop, daemon=True,
                                                 name="ebpf-cuda-pystacks")
                self._watcher.start()

    def _watch_loop(self) -> None:
        while not self._closed:
            with self._lock:
                now = time.monotonic()
                pids = [pid for pid, until in self._watched.items() if until > now]
                self._watched = {pid: self._watched[pid] for pid in pids}
                if not pids:
                    self._watcher = None
                    return
            for pid in pids:
                self.not_python.discard(pid)
                if self.register(pid) or not os.path.exists("/proc/%d" % pid):
                    with self._lock:
                        self._watched.pop(pid, None)
            time.sleep(WATCH_EVERY_S)

    # -- reading the ring ----------------------------------------------------------------

    def drain(self) -> None:
        """Read the stacks and code objects the probes have sent."""
        for raw in self.ring.read_batch():
            kind = int.from_bytes(raw[:4], "little")
            if kind == STACK_RECORD and len(raw) >= STACK_HEAD.size:
                self._stack(raw)
            elif kind == CODE_RECORD and len(raw) >= CODE_LINETABLE_AT:
                self._code(raw)

    def _stack(self, raw: bytes) -> None:
        _, count, pid_tgid, key = STACK_HEAD.unpack_from(raw)
        n = count & ~STACK_TRUNCATED
        frames = tuple(FRAME.iter_unpack(raw[STACK_HEAD.size:STACK_HEAD.size + FRAME.size * n]))
        self.stacks.setdefault(key, (pid_tgid >> 32, bool(count & STACK_TRUNCATED), frames))

    def _code(self, raw: bytes) -> None:
        (_, first, pid_tgid, address, file_state, file_bytes, name_state, name_bytes,
         table_bytes, table_length) = CODE_HEAD.unpack_from(raw)
        file = _text(file_state, raw[CODE_FILENAME_AT:CODE_FILENAME_AT + file_bytes])
        name = _text(name_state, raw[CODE_NAME_AT:CODE_NAME_AT + name_bytes])
        # (None: not read whole, its lines unknown; b"": an empty table, which means the
        # first line in 3.8-3.10)
        table = raw[CODE_LINETABLE_AT:CODE_LINETABLE_AT + table_bytes] \
            if table_bytes == table_length else None
        self.codes[(pid_tgid >> 32, address)] = Code(file, name, first, table)

    # -- events --------------------------------------------------------------------------

    def annotate(self, events: Iterable[Event]) -> None:
        """event.py_stack from event.py_stack_id; a call whose stack cannot be shown is
        counted once (at its exit event, or its enter event when entries come alone)."""
        for event in events:
            if not event.py_stack_id:
                since = self._since.get(event.pid)
                if since is None or not self._counts(event):
                    continue
                if event.ts_ns < since:
                    self._add("made before its process's interpreter was read")
                elif self._saved_pointer and event.tid == event.pid:
                    self._add(UNMATCHED_MAIN)
            else:
                frames, cause = self.frames(event.pid, event.py_stack_id)
                event.py_stack = frames
                if cause is not None and self._counts(event):
                    self._add(cause)

    def _counts(self, event: Event) -> bool:
        """Whether `event` is the one event of its call that counts it."""
        return event.phase == "exit" or not self._exits

    def _add(self, cause: str) -> None:
        self.missing[cause] = self.missing.get(cause, 0) + 1

    def sentence(self) -> str:
        """The "calls without their Python stack" line, "" when none."""
        deep = ("; %d stacks deeper than %d frames kept their innermost %d"
                % (self.truncated, MAX_FRAMES, MAX_FRAMES)) if self.truncated else ""
        if not self.missing:
            return deep.lstrip("; ")
        causes = ", ".join("%d %s" % (n, why) for why, n in sorted(self.missing.items()))
        return "%d calls without their Python stack: %s%s" % (sum(self.missing.values()),
                                                              causes, deep)

    def frames(self, pid: int, key: int) -> Tuple[Optional[Tuple[PyFrame, ...]], Optional[str]]:
        """(the frames of stack `key`, innermost first, or None; why not). A stack that
        cannot be shown yet (its record, or one of its code objects' records, found the
        ring full) is asked for again: the probes send it, and what is missing of it, at its
        next call."""
        shown = self._shown.get(key)
        if shown is not None:
            return shown
        stack = self.stacks.get(key)
        registered = self.registered.get(pid)
        if stack is None:
            return None, "its stack record was lost (ring full)"  # (not marked sent)
        if registered is None:
            return None, "its process was forgotten before it was shown"
        shown = self._resolve(pid, registered.interpreter.layout, stack[2])
        if shown[0] is None and shown[1] is not None:
            try:
                if self.seen.get(seen_slot(key)) == key:
                    self.seen[seen_slot(key)] = 0
            except (OSError, TracerError):
                pass
            return shown
        if shown[0] is not None and stack[1]:
            self.truncated += 1
        self._shown[key] = shown
        return shown

    def _resolve(self, pid: int, lay: Layout, pairs
                 ) -> Tuple[Optional[Tuple[PyFrame, ...]], Optional[str]]:
        out = []
        for address, raw in pairs:
            if address == 0:
                continue  # a C-stack shim frame (3.12+), no Python code
            code = self.codes.get((pid, address))
            if code is None or code.file is None or code.function is None:
                return None, "a code object of its stack could not be read"
            offset = lay.instruction_offset(address, raw)
            line = None if offset is None or code.linetable is None else line_number(
                lay.line_format, code.linetable, code.firstlineno, offset)
            out.append(PyFrame(code.file, line, code.function))
        return (tuple(out), None) if out else (None, None)

    def export(self) -> Dict[int, List[list]]:
        """Every stack shown whole, key -> [[file, line, function], ...] innermost first
        (a saved trace's trailer)."""
        for key, (pid, _, _) in list(self.stacks.items()):
            self.frames(pid, key)
        return {key: [list(frame) for frame in frames]
                for key, (frames, _) in self._shown.items() if frames is not None}

    def forget(self, pid: int) -> None:
        """Drop what is kept of a process that exited (its stacks' frames stay, resolved
        now: a saved trace's trailer or a late reader may still ask)."""
        for key, (owner, _, _) in list(self.stacks.items()):
            if owner == pid:
                self.frames(pid, key)
        self.registered.pop(pid, None)
        self._since.pop(pid, None)
        self.not_python.discard(pid)
        try:
            self.procs.delete(pid)
        except (OSError, TracerError):
            pass
        for key in [k for k in self.codes if k[0] == pid]:
            del self.codes[key]
        for key in [k for k, v in self.stacks.items() if v[0] == pid]:
            del self.stacks[key]

    def close(self) -> None:
        """Stop watching for interpreters and unmap the ring (what it still holds is
        dropped: the outputs are done with). Its counts stay readable (`sentence`)."""
        if not self._closed:
            self._closed = True
            self.ring.close(drain=False)


def _text(state: int, data: bytes) -> Optional[str]:
    """A str object's characters as the probe read them; None when it read none."""
    if not data:
        return None
    return decode_unicode(unicode_kind(state), data)


# offsetof(PyThreadState, datastack_chunk), from each version's headers: where the frames of
# 3.11+ lie one after the other. Only the walk's speed depends on it: the probe reads frames
# from the chunk's memory only where they lie in it, and reads them one by one otherwise.
DATASTACK_CHUNK = {(3, 11): 296, (3, 12): 232, (3, 13): 232}


def _thread_below_pointer(pid: int) -> int:
    """How far below the thread pointer the kernel keeps a thread of `pid` has its
    pthread_self(): 0 where they are one (x86-64), else read from the process's own C
    library (libc_threads.py)."""
    symbol = current_arch().thread_self_symbol
    return 0 if symbol is None else thread_below_pointer(pid, symbol)


def proc_value(lay: Layout, runtime: int, generation: int, thread_below_tp: int = 0) -> bytes:
    """The `pyprocs` value of a process (probes/pystack.PROC); ValueError when its thread
    state's fields do not fit one window."""
    values = {name: getattr(lay, name) for name in PROC_FIELDS if hasattr(lay, name)}
    chunk = DATASTACK_CHUNK.get(lay.version) if lay.frame_window <= FRAME_COPY else None
    low = min(lay.tstate_thread_id, lay.tstate_frame, chunk or lay.tstate_frame)
    if chunk is not None and chunk - low > 248:
        chunk = None
        low = min(lay.tstate_thread_id, lay.tstate_frame)
    if max(lay.tstate_thread_id, lay.tstate_frame) - low > 248:
        raise ValueError("its thread state's fields lie too far apart")
    values.update(tstate_window=low, window_thread_id=lay.tstate_thread_id - low,
                  window_frame=lay.tstate_frame - low,
                  window_chunk=NONE if chunk is None else chunk - low,
                  thread_below_tp=thread_below_tp)
    values["cframe_current_frame"] = NONE if lay.cframe_current_frame < 0 \
        else lay.cframe_current_frame
    if lay.frame_owner < 0:  # (no owner field: no frame is skipped)
        values["frame_owner"], values["frame_owner_skip"] = 0, 0x100
    elif lay.frame_owner_skip < 0:
        values["frame_owner_skip"] = 0x100
    values["generation"] = generation
    tag_mask = ~lay.code_tag_bits & ((1 << 64) - 1)
    return PROC.pack(runtime, tag_mask, *(values[name] for name in PROC_FIELDS))
