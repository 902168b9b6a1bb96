"""Saved traces: raw ring frames on disk, decoded later (another machine, no privileges).

Layout (little-endian):

    magic    8 bytes  b"EBPFCUDA"
    version  u16      FORMAT_VERSION (2; version 1 files, without hello records, read the same)
    rsize    u16      record size (record.SIZE when saved)
    offset   i64      wall clock minus CLOCK_MONOTONIC, ns, measured when tracing started
    fbytes   u64      bytes of frames; all ones while writing (frames run to the end of file)
    nlen     u32      length of the function names blob
    names    nlen     utf-8 names of the function table, "\\n"-separated, in function-id order
    frames   fbytes   ring frames (8-byte header + record) appended batch after batch
    trailer  ...      JSON: {"kernels": [[pid, func, name], ...], "lost": {...}}, the kernel
                      names known when tracing (resolving them needs the live process) and
                      the records lost, by cause (losses.Losses), written at close;
                      with --stacks, "stacks": [[pid, stack_id, [[function, offset, file]
                      or null, ...]], ...], the user stacks the records name, symbolised
                      while their processes lived (the stack map is gone offline)

Frames have a fixed size, so no batch framing is needed. A file whose writer was killed has
fbytes all ones and no trailer: its frames are read to the end, a trailing partial frame is dropped
and reported by `SavedTrace.truncated`. So that such a file still says what was lost, the
writer adds a *loss note* to the frames whenever the ring-full count has grown: a hello
record (no event for any reader, old ones too) of pid 0, comm LOSS_COMM, the count in its
first argument cell.

    with open_save("run.ebpfcuda", tracer.apis_table, tracer.decoder.clock_offset_ns) as out:
        for frames in tracer.frames():
            out.write_frames(frames)
    for event in load("run.ebpfcuda"):
        ...
"""
import json
import os
import stat
import struct
import time
from typing import BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..decode.devices import DeviceTracker
from ..decode.events import Decoder, Event, PyFrame
from ..decode.losses import Losses
from ..decode.nccl import Communicators
from ..errors import DecodeError, UsageError
from ..gpu.records import from_json as gpu_record
from ..spec import apis, record
from ..spec.apis import Api
from ..targets.symbols import Frame

MAGIC = b"EBPFCUDA"
FORMAT_VERSION = 2  # 2: frames may hold hello records (record.PHASE_HELLO)
READABLE_VERSIONS = (1, 2)
_HEADER = struct.Struct("<8sHHqQI")
_FBYTES_AT = 20  # offset of fbytes in the header
_UNKNOWN = (1 << 64) - 1  # fbytes of a file still being written (or whose writer died)
READ_FRAMES = 4096  # frames per batch when reading back
MAX_NAMES = 1 << 20  # bytes of function names a header may hold (the table takes ~3 KB)
LOSS_COMM = b"\0ebpf-cuda lost"  # the comm of a loss note (no process has a comm "")
_FRAME_HEAD = struct.Struct("<II")
# Files saved before records had their PY_STACK field: read, each record widened.
RECORD_SIZE_BEFORE_PY_STACK = record.SIZE - 8

Namer = Callable[[Event, int], Optional[str]]  # (launch event, func) -> kernel name
# (pid, stack_id) -> the stack's frames, innermost first (analysis/timeline.StackFrames)
StackFrames = Callable[[int, int], Sequence[Optional[Frame]]]


class SaveWriter:
    """Writes a saved trace: the header at once, then raw frames batch by batch.

    It is also a sink (`header`/`write`/`close`): given decoded batches and a `namer`, it
    remembers the kernel name of each (pid, func) launched, for the trailer."""

    def __init__(self, stream: BinaryIO, table: Sequence[Api], clock_offset_ns: int,
                 namer: Optional[Namer] = None) -> None:
        self.stream = stream
        self.namer = namer
        self.kernels: Dict[Tuple[int, int], Optional[str]] = {}
        self.losses: Optional[Losses] = None  # for the trailer (note_losses)
        # True: the processes were traced from their start (a command's), so a thread
        # that set no device was on device 0 (devices.py); for the trailer
        self.from_start: Optional[bool] = None
        # --py-stacks: the stacks' frames by key, for the trailer (note_py_stacks)
        self.py_stacks: Dict[int, List[list]] = {}
        self.gpu: List[dict] = []  # the GPU's samples and events as JSON (note_gpu)
        # --stacks: each user stack the records name, symbolised when first seen
        self.stacks: Optional[StackFrames] = None
        self.stack_frames: Dict[Tuple[int, int], list] = {}
        self._frame_bytes = 0
        self._lost_noted = 0
        names = "\n".join(api.name for api in table).encode()
        stream.write(_HEADER.pack(MAGIC, FORMAT_VERSION, record.SIZE, clock_offset_ns,
                                  _UNKNOWN, len(names)) + names)

    def write_frames(self, frames: bytes) -> None:
        """Append a batch of raw ring frames (as `Tracer.frames()` yields them)."""
        self.stream.write(frames)
        self._frame_bytes += len(frames)
        if self.stacks is not None:
            self._keep_stacks(frames)

    def _keep_stacks(self, frames: bytes) -> None:
        """Symbolise the user stacks first named in a batch, while their processes live."""
        ids = record.frame_column(frames, record.STACK_ID, "I")
        pids = record.frame_column(frames, record.PID_TGID + 4, "I")
        for key in set(zip(pids, ids)):
            if key[1] and key not in self.stack_frames:
                self.stack_frames[key] = [list(frame) if frame is not None else None
                                          for frame in self.stacks(*key)]

    def header(self) -> None:
        """The file header is written at creation."""

    def write(self, events: Iterable[Event]) -> None:
        """Learn the kernel names of launches (frames are saved by `write_frames`)."""
        if self.namer is None:
            return
        for ev in events:
            func = ev.args.get("func")
            if isinstance(func, int) and (ev.pid, func) not in self.kernels:
                self.kernels[(ev.pid, func)] = self.namer(ev, func)

    def learn(self, names: Iterable[Tuple[int, int, Optional[str]]]) -> None:
        """Keep the kernel names of launches named by the caller as (pid, func, name), when
        the launch records are not decoded (see Decoder.launch_keys)."""
        for pid, func, name in names:
            if name or (pid, func) not in self.kernels:
                self.kernels[(pid, func)] = name

    def note_lost(self, ring_full: int) -> None:
        """The ring-full count so far: a loss note joins the frames when it has grown (a
        file whose tracer is killed then still says how much it had lost)."""
        if ring_full > self._lost_noted:
            self._lost_noted = ring_full
            self.write_frames(loss_note(ring_full))

    def note_py_stacks(self, stacks: Dict[int, List[list]]) -> None:
        """The Python stacks the records name, key -> [[file, line, function], ...]
        innermost first (pystacks.PyStacks.export), for the trailer (told before close)."""
        self.py_stacks = dict(stacks)

    def note_losses(self, losses: Losses) -> None:
        """What the trace lost, by cause, for the trailer (told before `close`)."""
        self.losses = losses

    def note_gpu(self, records: List) -> None:
        """The GPU's samples and events (gpu/records.py), for the trailer."""
        self.gpu = [record.to_json() for record in records]

    def close(self) -> None:
        """Write the trailer and the frames' length (when the file is seekable), close."""
        if self.stream.closed:
            return
        names = [[pid, func, name] for (pid, func), name in self.kernels.items() if name]
        trailer: dict = {"kernels": names}
        if self.losses is not None:
            trailer["lost"] = self.losses.to_json()
        if self.from_start is not None:
            trailer["from_start"] = self.from_start
        if self.py_stacks:
            trailer["py_stacks"] = [[key, frames] for key, frames in self.py_stacks.items()]
        if self.gpu:
            trailer["gpu"] = self.gpu
        if self.stack_frames:
            trailer["stacks"] = [[pid, stack_id, frames]
                                 for (pid, stack_id), frames in self.stack_frames.items()]
        self.stream.write(json.dumps(trailer).encode())
        if self.stream.seekable():
            self.stream.seek(_FBYTES_AT)
            self.stream.write(struct.pack("<Q", self._frame_bytes))
        self.stream.close()

    def __enter__(self) -> "SaveWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def loss_note(ring_full: int) -> bytes:
    """A frame saying how many records were lost so far (see the module's docstring)."""
    cells = [ring_full] + [0] * (record.ARG_CELLS - 1)
    payload = record.LAYOUT.pack(time.monotonic_ns(), 0, 0, 0, record.HELLO_FN,
                                 record.PHASE_HELLO, 0, 0, LOSS_COMM, *cells, 0,
                                 *[0] * record.OUT_CELLS, 0)
    return _FRAME_HEAD.pack(len(payload), 0) + payload


def _noted_loss(frames: bytes) -> Optional[int]:
    """The last loss note's count in a batch of frames, if it holds one."""
    ids = record.frame_column(frames, record.FN_ID, "H")
    if record.HELLO_FN not in ids:
        return None
    found = None
    for index, fn_id in enumerate(ids):
        if fn_id != record.HELLO_FN:
            continue
        at = index * record.FRAME_SIZE + record.FRAME_HEADER
        if frames[at + record.COMM:at + record.COMM + record.COMM_LEN].rstrip(b"\0") == \
                LOSS_COMM.rstrip(b"\0") and not frames[at + record.PID_TGID:at + record.FN_ID]\
                .strip(b"\0"):
            found = struct.unpack_from("<Q", frames, at + record.ARGS)[0]
    return found


def open_save(path: str, table: Sequence[Api], clock_offset_ns: int,
              namer: Optional[Namer] = None) -> SaveWriter:
    """A `SaveWriter` on a new file at `path` (UsageError when it cannot be created)."""
    try:
        stream = open(path, "wb")
    except OSError as err:
        raise UsageError("cannot write %s: %s" % (path, err.strerror)) from None
    return SaveWriter(stream, table, clock_offset_ns, namer)


class SavedTrace:
    """A saved trace opened for reading. Iterating yields its events; `batches()` yields
    lists of events, `frames()` raw frame batches. Reads are streamed (constant memory)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.truncated = False
        self.lost_noted: Optional[int] = None  # the last loss note's count, once read
        self._trailer_losses: Optional[Losses] = None
        self.from_start = False  # (the trailer says; a killed writer's file has none)
        self.py_stacks: Dict[int, Tuple[PyFrame, ...]] = {}  # (the trailer says)
        # --stacks: (pid, stack_id) → the user stack's frames (the trailer says)
        self.stacks: Dict[Tuple[int, int], Tuple[Optional[Frame], ...]] = {}
        self.gpu: list = []  # the GPU's samples and events (gpu/records.py; the trailer's)
        with self._open() as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_HEADER.size)
            self._clock_offset_ns, self._frame_bytes, self.function_names = _parse_header(
                path, head, f)
            self._record_size = _HEADER.unpack(head)[2]
            self._data_start = f.tell()
            if self._frame_bytes != _UNKNOWN and \
                    self._frame_bytes > size - self._data_start:
                raise DecodeError("%s says it holds %d bytes of frames, but only %d follow "
                                  "its header" % (path, self._frame_bytes,
                                                  size - self._data_start))
            self.kernels = self._read_trailer(f)
        self.table = _table(path, self.function_names)
        self.decoder = Decoder(self.table, self.clock_offset_ns)
        self.communicators = Communicators()
        self.devices = DeviceTracker(self.from_start)

    @property
    def complete(self) -> bool:
        """True when the writer finished the file (its trailer is there)."""
        return self._frame_bytes != _UNKNOWN

    def _read_trailer(self, f: BinaryIO) -> Dict[Tuple[int, int], str]:
        if self._frame_bytes == _UNKNOWN:
            return {}
        f.seek(self._data_start + self._frame_bytes)
        try:
            trailer = json.loads(f.read().decode() or "{}")
            if not isinstance(trailer, dict):
                raise ValueError("it is not an object")
            kernels = trailer.get("kernels", [])
            if not isinstance(kernels, list):
                raise ValueError("its kernels are not a list")
            names = {}
            for entry in kernels:
                if not (isinstance(entry, list) and len(entry) == 3
                        and all(isinstance(v, int) for v in entry[:2])
                        and isinstance(entry[2], str)):
                    raise ValueError("a kernel entry is not [pid, func, name]: %.60r" % (entry,))
                names[(entry[0], entry[1])] = entry[2]
            if "lost" in trailer:
                self._trailer_losses = Losses.from_json(trailer["lost"])
            self.from_start = trailer.get("from_start") is True
            self.py_stacks = _py_stacks(trailer.get("py_stacks", []))
            self.stacks = _stacks(trailer.get("stacks", []))
            self.gpu = [gpu_record(obj) for obj in trailer.get("gpu", [])]
            return names
        except (ValueError, TypeError, KeyError, RecursionError) as err:
            raise DecodeError("%s has a damaged trailer: %s" % (self.path, err)) from None

    @property
    def losses(self) -> Losses:
        """What the trace lost, by cause: from the trailer, or for a file whose writer was
        killed, the last loss note read so far (all of them once the frames are read)."""
        if self._trailer_losses is not None:
            return self._trailer_losses
        return Losses(ring_full=self.lost_noted or 0)

    def incomplete(self) -> Optional[str]:
        """A sentence when the file was not finished by its writer (None when it was):
        what is known to be missing. Meant for after the frames were read."""
        if self.complete and not self.truncated:
            return None
        how = "ends in a partial record" if self.truncated else "has no end"
        if self.lost_noted:
            known = ("%d events had been lost by its last loss note (ring buffer full); "
                     "the events still in the ring buffer then are missing too"
                     % self.lost_noted)
        elif self.complete:
            known = "the last record is missing"
        else:
            known = ("no loss was noted before; the events still in the ring buffer then "
                     "are missing")
        return "%s %s: its writer was stopped before it finished (killed?); %s" % (
            self.path, how, known)

    def namer(self, event: Event, address: int) -> Optional[str]:
        """Kernel names as known when tracing (a `namer` for the outputs and analyses)."""
        return self.kernels.get((event.pid, address))

    def _open(self) -> BinaryIO:
        try:
            st = os.stat(self.path)
        except OSError as err:
            raise UsageError("cannot read %s: %s" % (self.path, err.strerror)) from None
        if stat.S_ISDIR(st.st_mode):
            raise UsageError("cannot read %s: it is a directory" % self.path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO, a terminal: it could be read only once
            raise DecodeError("%s is not a regular file: a saved trace is read from a file "
                              "(copy it to one first)" % self.path)
        try:
            return open(self.path, "rb")
        except OSError as err:
            raise UsageError("cannot read %s: %s" % (self.path, err.strerror)) from None

    @property
    def clock_offset_ns(self) -> int:
        return self._clock_offset_ns

    def frames(self, per_batch: int = READ_FRAMES) -> Iterator[bytes]:
        """Batches of whole raw frames, in the order they were saved (records of an older
        size widened to this one's)."""
        if self._record_size != record.SIZE:
            for chunk in self._frames(per_batch, record.FRAME_HEADER + self._record_size):
                yield _widened(chunk, self._record_size)
            return
        yield from self._frames(per_batch, record.FRAME_SIZE)

    def _frames(self, per_batch: int, size: int) -> Iterator[bytes]:
        left = None if self._frame_bytes == _UNKNOWN else self._frame_bytes  # None: to EOF
        with self._open() as f:
            f.seek(self._data_start)
            while left is None or left > 0:
                want = size * per_batch if left is None else min(size * per_batch, left)
                chunk = f.read(want)
                whole = len(chunk) - len(chunk) % size
                if whole:
                    noted = _noted_loss(chunk[:whole])
                    if noted is not None:
                        self.lost_noted = noted
                    yield chunk[:whole]
                if whole != len(chunk) or (left is not None and len(chunk) < want):
                    self.truncated = True
                if len(chunk) < want:
                    return
                if left is not None:
                    left -= len(chunk)

    def batches(self) -> Iterator[List[Event]]:
        """Lists of decoded events, one per batch of frames."""
        decoder = self._new_pass()
        for frames in self.frames():
            yield self._decode(decoder, frames)

    def __iter__(self) -> Iterator[Event]:
        decoder = self._new_pass()
        for frames in self.frames():
            yield from self._decode(decoder, frames)

    def _decode(self, decoder: Decoder, frames: bytes) -> List[Event]:
        try:
            events = decoder.decode_batch(frames)
        except DecodeError as err:  # the file is named: a damaged record is the file's
            raise DecodeError("%s has a damaged record: %s" % (self.path, err)) from None
        self.annotate(events)
        return events

    def annotate(self, events: List[Event]) -> None:
        """What the trace knows besides the records, onto events decoded in this pass (as
        the live stream does): communicators, devices, Python stacks."""
        self.communicators.annotate_batch(events)
        self.devices.annotate(events)
        if self.py_stacks:
            for event in events:
                if event.py_stack_id:
                    event.py_stack = self.py_stacks.get(event.py_stack_id)

    def stack_frames(self, pid: int, stack_id: int) -> Sequence[Optional[Frame]]:
        """The frames of a user stack (--stacks), as the tracer symbolised them; () unknown."""
        return self.stacks.get((pid, stack_id), ())

    def names(self) -> "SavedNames":
        """The kernel names as a namer of both kinds: `namer(event, address)` and, for the
        lines straight from frames, `name_for(pid, api, address, when)`."""
        return SavedNames(self.kernels)

    def new_pass(self) -> Decoder:
        """A new pass over the frames (its decoder; `annotate` starts again too)."""
        return self._new_pass()

    def _new_pass(self) -> Decoder:
        """The decoder of a pass over the frames. What a pass knows of the trace so far
        (NCCL communicators, sequence numbers) starts again from the top each time."""
        self.decoder = Decoder(self.table, self.clock_offset_ns)
        self.communicators = Communicators()
        self.devices = DeviceTracker(self.from_start)
        return self.decoder


class SavedNames:
    """A saved trace's kernel names by (pid, address) (SavedTrace.names)."""

    def __init__(self, kernels: Dict[Tuple[int, int], str]) -> None:
        self.kernels = kernels

    def name_for(self, pid: int, api: str, address: int,
                 when: Optional[int] = None) -> Optional[str]:
        return self.kernels.get((pid, address))

    def __call__(self, event: Event, address: int) -> Optional[str]:
        return self.kernels.get((event.pid, address))


def _widened(chunk: bytes, old_size: int) -> bytes:
    """Frames of `old_size`-byte records as frames of this version's records (the new fields
    zero)."""
    step, pad = record.FRAME_HEADER + old_size, bytes(record.SIZE - old_size)
    head = _FRAME_HEAD.pack(record.SIZE, 0)
    return b"".join(head + chunk[at + record.FRAME_HEADER:at + step] + pad
                    for at in range(0, len(chunk), step))


def _py_stacks(entries) -> Dict[int, Tuple[PyFrame, ...]]:
    """A trailer's Python stacks: [[key, [[file, line, function], ...]], ...]."""
    if not isinstance(entries, list):
        raise ValueError("its Python stacks are not a list")
    stacks = {}
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int)
                and isinstance(entry[1], list)):
            raise ValueError("a Python stack is not [key, frames]: %.60r" % (entry,))
        frames = []
        for frame in entry[1]:
            if not (isinstance(frame, list) and len(frame) == 3 and isinstance(frame[0], str)
                    and (frame[1] is None or isinstance(frame[1], int))
                    and isinstance(frame[2], str)):
                raise ValueError("a Python frame is not [file, line, function]: %.60r"
                                 % (frame,))
            frames.append(PyFrame(*frame))
        stacks[entry[0]] = tuple(frames)
    return stacks


def _stacks(entries) -> Dict[Tuple[int, int], Tuple[Optional[Frame], ...]]:
    """A trailer's user stacks: [[pid, stack_id, [[function, offset, file] or null, ...]]]."""
    if not isinstance(entries, list):
        raise ValueError("its stacks are not a list")
    stacks = {}
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], int)
                and isinstance(entry[1], int) and isinstance(entry[2], list)):
            raise ValueError("a stack is not [pid, stack_id, frames]: %.60r" % (entry,))
        frames = []
        for frame in entry[2]:
            if frame is not None and not (
                    isinstance(frame, list) and len(frame) == 3 and isinstance(frame[1], int)
                    and isinstance(frame[2], str)
                    and (frame[0] is None or isinstance(frame[0], str))):
                raise ValueError("a stack frame is not [function, offset, file]: %.60r"
                                 % (frame,))
            frames.append(Frame(*frame) if frame is not None else None)
        stacks[(entry[0], entry[1])] = tuple(frames)
    return stacks


def _parse_header(path: str, head: bytes, f: BinaryIO) -> Tuple[int, int, List[str]]:
    """(clock offset, frame bytes, function names) from the header; `f` is left at the first
    frame."""
    if len(head) < _HEADER.size or not head.startswith(MAGIC):
        raise DecodeError("%s is not a saved ebpf-cuda trace (bad magic)" % path)
    _, version, rsize, offset, frame_bytes, nlen = _HEADER.unpack(head)
    if version not in READABLE_VERSIONS:
        raise DecodeError("%s has format version %d; this ebpf-cuda reads version %d"
                          % (path, version, FORMAT_VERSION))
    if rsize not in (record.SIZE, RECORD_SIZE_BEFORE_PY_STACK):
        raise DecodeError("%s has %d-byte records; this ebpf-cuda uses %d-byte records"
                          % (path, rsize, record.SIZE))
    if nlen > MAX_NAMES:
        raise DecodeError("%s has a damaged header: a %d-byte block of function names"
                          % (path, nlen))
    names = f.read(nlen)
    if len(names) != nlen:
        raise DecodeError("%s is truncated inside its header" % path)
    try:
        text = names.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DecodeError("%s has a damaged header: its function names are not UTF-8 (%s)"
                          % (path, err.reason)) from None
    return offset, frame_bytes, text.split("\n") if text else []


def _table(path: str, names: Sequence[str]) -> List[Api]:
    unknown = [name for name in names if name not in apis.BY_NAME]
    if unknown:
        shown = ", ".join(repr(name) if not name.isprintable() else name
                          for name in unknown[:5])
        raise DecodeError("%s traces functions this ebpf-cuda does not know: %s%s"
                          % (path, shown, " and %d more" % (len(unknown) - 5)
                             if len(unknown) > 5 else ""))
    return [apis.BY_NAME[name] for name in names]


def load(path: str) -> SavedTrace:
    """Open a saved trace (DecodeError when it is not one, or from an incompatible version)."""
    return SavedTrace(path)
