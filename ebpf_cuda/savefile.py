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
    trailer  ...      JSON: {"kernels": [[pid, func, name], ...]}, the kernel names known when
                      tracing (resolving them needs the live process), written at close

Frames have a fixed size, so no batch framing is needed. A file whose writer was killed has
fbytes all ones and no trailer: its frames are read to the end, a trailing partial frame is dropped
and reported by `SavedTrace.truncated`.

    with open_save("run.ebpfcuda", tracer.apis_table, tracer.decoder.clock_offset_ns) as out:
        for frames in tracer.frames():
            out.write_frames(frames)
    for event in load("run.ebpfcuda"):
        ...
"""
import json
import struct
from typing import BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from . import apis, record
from .apis import Api
from .errors import DecodeError, UsageError
from .events import Decoder, Event

MAGIC = b"EBPFCUDA"
FORMAT_VERSION = 2  # 2: frames may hold hello records (record.PHASE_HELLO)
READABLE_VERSIONS = (1, 2)
_HEADER = struct.Struct("<8sHHqQI")
_FBYTES_AT = 20  # offset of fbytes in the header
_UNKNOWN = (1 << 64) - 1  # fbytes of a file still being written (or whose writer died)
READ_FRAMES = 4096  # frames per batch when reading back

Namer = Callable[[Event, int], Optional[str]]  # (launch event, func) -> kernel name


class SaveWriter:
    """Writes a saved trace: the header at once, then raw frames batch by batch.

    It is also a sink (`header`/`write`/`close`): given decoded batches and a `namer`, it
    remembers the kernel name of each (pid, func) launched, for the trailer."""

    def __init__(self, stream: BinaryIO, table: Sequence[Api], clock_offset_ns: int,
                 namer: Optional[Namer] = None) -> None:
        self.stream = stream
        self.namer = namer
        self.kernels: Dict[Tuple[int, int], Optional[str]] = {}
        self._frame_bytes = 0
        names = "\n".join(api.name for api in table).encode()
        stream.write(_HEADER.pack(MAGIC, FORMAT_VERSION, record.SIZE, clock_offset_ns,
                                  _UNKNOWN, len(names)) + names)

    def write_frames(self, frames: bytes) -> None:
        """Append a batch of raw ring frames (as `Tracer.frames()` yields them)."""
        self.stream.write(frames)
        self._frame_bytes += len(frames)

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

    def close(self) -> None:
        """Write the trailer and the frames' length (when the file is seekable), close."""
        if self.stream.closed:
            return
        names = [[pid, func, name] for (pid, func), name in self.kernels.items() if name]
        self.stream.write(json.dumps({"kernels": names}).encode())
        if self.stream.seekable():
            self.stream.seek(_FBYTES_AT)
            self.stream.write(struct.pack("<Q", self._frame_bytes))
        self.stream.close()

    def __enter__(self) -> "SaveWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
        with self._open() as f:
            head = f.read(_HEADER.size)
            self._clock_offset_ns, self._frame_bytes, self.function_names = _parse_header(
                path, head, f)
            self._data_start = f.tell()
            self.kernels = self._read_trailer(f)
        self.table = _table(path, self.function_names)
        self.decoder = Decoder(self.table, self.clock_offset_ns)

    def _read_trailer(self, f: BinaryIO) -> Dict[Tuple[int, int], str]:
        if self._frame_bytes == _UNKNOWN:
            return {}
        f.seek(self._data_start + self._frame_bytes)
        try:
            trailer = json.loads(f.read().decode() or "{}")
            return {(pid, func): name for pid, func, name in trailer.get("kernels", [])}
        except (ValueError, TypeError) as err:
            raise DecodeError("%s has a damaged trailer: %s" % (self.path, err)) from None

    def namer(self, event: Event, address: int) -> Optional[str]:
        """Kernel names as known when tracing (a `namer` for the outputs and analyses)."""
        return self.kernels.get((event.pid, address))

    def _open(self) -> BinaryIO:
        try:
            return open(self.path, "rb")
        except OSError as err:
            raise UsageError("cannot read %s: %s" % (self.path, err.strerror)) from None

    @property
    def clock_offset_ns(self) -> int:
        return self._clock_offset_ns

    def frames(self, per_batch: int = READ_FRAMES) -> Iterator[bytes]:
        """Batches of whole raw frames, in the order they were saved."""
        size = record.FRAME_SIZE
        left = None if self._frame_bytes == _UNKNOWN else self._frame_bytes  # None: to EOF
        with self._open() as f:
            f.seek(self._data_start)
            while left is None or left > 0:
                want = size * per_batch if left is None else min(size * per_batch, left)
                chunk = f.read(want)
                whole = len(chunk) - len(chunk) % size
                if whole:
                    yield chunk[:whole]
                if whole != len(chunk) or (left is not None and len(chunk) < want):
                    self.truncated = True
                if len(chunk) < want:
                    return
                if left is not None:
                    left -= len(chunk)

    def batches(self) -> Iterator[List[Event]]:
        """Lists of decoded events, one per batch of frames."""
        for frames in self.frames():
            yield list(self.decoder.decode_frames(frames))

    def __iter__(self) -> Iterator[Event]:
        for frames in self.frames():
            yield from self.decoder.decode_frames(frames)


def _parse_header(path: str, head: bytes, f: BinaryIO) -> Tuple[int, int, List[str]]:
    """(clock offset, frame bytes, function names) from the header; `f` is left at the first
    frame."""
    if len(head) < _HEADER.size or not head.startswith(MAGIC):
        raise DecodeError("%s is not a saved ebpf-cuda trace (bad magic)" % path)
    _, version, rsize, offset, frame_bytes, nlen = _HEADER.unpack(head)
    if version not in READABLE_VERSIONS:
        raise DecodeError("%s has format version %d; this ebpf-cuda reads version %d"
                          % (path, version, FORMAT_VERSION))
    if rsize != record.SIZE:
        raise DecodeError("%s has %d-byte records; this ebpf-cuda uses %d-byte records"
                          % (path, rsize, record.SIZE))
    names = f.read(nlen)
    if len(names) != nlen:
        raise DecodeError("%s is truncated inside its header" % path)
    return offset, frame_bytes, names.decode().split("\n") if names else []


def _table(path: str, names: Sequence[str]) -> List[Api]:
    unknown = [name for name in names if name not in apis.BY_NAME]
    if unknown:
        raise DecodeError("%s traces functions this ebpf-cuda does not know: %s"
                          % (path, ", ".join(unknown)))
    return [apis.BY_NAME[name] for name in names]


def load(path: str) -> SavedTrace:
    """Open a saved trace (DecodeError when it is not one, or from an incompatible version)."""
    return SavedTrace(path)
