"""Saved traces: raw ring frames on disk, decoded later (another machine, no privileges).

Layout (little-endian):

    magic    8 bytes  b"EBPFCUDA"
    version  u16      FORMAT_VERSION
    rsize    u16      record size (record.SIZE when saved)
    offset   i64      wall clock minus CLOCK_MONOTONIC, ns, measured when tracing started
    nlen     u32      length of the function names blob
    names    nlen     utf-8 names of the function table, "\\n"-separated, in function-id order
    frames   ...      ring frames (8-byte header + record) appended batch after batch

Frames have a fixed size, so no batch framing is needed; a trailing partial frame (the tracer
was killed mid-write) is dropped and reported by `SavedTrace.truncated`.

    with open_save("run.ebpfcuda", tracer.apis_table, tracer.decoder.clock_offset_ns) as out:
        for frames in tracer.frames():
            out.write_frames(frames)
    for event in load("run.ebpfcuda"):
        ...
"""
import struct
from typing import BinaryIO, Iterator, List, Sequence, Tuple

from . import apis, record
from .apis import Api
from .errors import DecodeError, UsageError
from .events import Decoder, Event

MAGIC = b"EBPFCUDA"
FORMAT_VERSION = 1
FRAME_HEADER = 8
_HEADER = struct.Struct("<8sHHqI")
READ_FRAMES = 4096  # frames per batch when reading back


def frame_size(record_size: int = record.SIZE) -> int:
    """Bytes of one ring frame holding a record of `record_size` bytes (8-byte aligned)."""
    return (FRAME_HEADER + record_size + 7) & ~7


class SaveWriter:
    """Writes a saved trace: the header at once, then raw frames batch by batch."""

    def __init__(self, stream: BinaryIO, table: Sequence[Api], clock_offset_ns: int) -> None:
        self.stream = stream
        names = "\n".join(api.name for api in table).encode()
        stream.write(_HEADER.pack(MAGIC, FORMAT_VERSION, record.SIZE, clock_offset_ns,
                                  len(names)) + names)

    def write_frames(self, frames: bytes) -> None:
        """Append a batch of raw ring frames (as `Tracer.frames()` yields them)."""
        self.stream.write(frames)

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> "SaveWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_save(path: str, table: Sequence[Api], clock_offset_ns: int) -> SaveWriter:
    """A `SaveWriter` on a new file at `path` (UsageError when it cannot be created)."""
    try:
        stream = open(path, "wb")
    except OSError as err:
        raise UsageError("cannot write %s: %s" % (path, err.strerror)) from None
    return SaveWriter(stream, table, clock_offset_ns)


class SavedTrace:
    """A saved trace opened for reading. Iterating yields its events; `batches()` yields
    lists of events, `frames()` raw frame batches. Reads are streamed (constant memory)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.truncated = False
        with self._open() as f:
            head = f.read(_HEADER.size)
            self._clock_offset_ns, self.function_names = _parse_header(path, head, f)
            self._data_start = f.tell()
        self.table = _table(path, self.function_names)
        self.decoder = Decoder(self.table, self.clock_offset_ns)

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
        size = frame_size()
        with self._open() as f:
            f.seek(self._data_start)
            while True:
                chunk = f.read(size * per_batch)
                whole = len(chunk) - len(chunk) % size
                if whole:
                    yield chunk[:whole]
                if whole != len(chunk):
                    self.truncated = True
                if len(chunk) < size * per_batch:
                    return

    def batches(self) -> Iterator[List[Event]]:
        """Lists of decoded events, one per batch of frames."""
        for frames in self.frames():
            yield list(self.decoder.decode_frames(frames))

    def __iter__(self) -> Iterator[Event]:
        for frames in self.frames():
            yield from self.decoder.decode_frames(frames)


def _parse_header(path: str, head: bytes, f: BinaryIO) -> Tuple[int, List[str]]:
    """(clock offset, function names) from the header; `f` is left at the first frame."""
    if len(head) < _HEADER.size or not head.startswith(MAGIC):
        raise DecodeError("%s is not a saved ebpf-cuda trace (bad magic)" % path)
    _, version, rsize, offset, nlen = _HEADER.unpack(head)
    if version != FORMAT_VERSION:
        raise DecodeError("%s has format version %d; this ebpf-cuda reads version %d"
                          % (path, version, FORMAT_VERSION))
    if rsize != record.SIZE:
        raise DecodeError("%s has %d-byte records; this ebpf-cuda uses %d-byte records"
                          % (path, rsize, record.SIZE))
    names = f.read(nlen)
    if len(names) != nlen:
        raise DecodeError("%s is truncated inside its header" % path)
    return offset, names.decode().split("\n") if names else []


def _table(path: str, names: Sequence[str]) -> List[Api]:
    unknown = [name for name in names if name not in apis.BY_NAME]
    if unknown:
        raise DecodeError("%s traces functions this ebpf-cuda does not know: %s"
                          % (path, ", ".join(unknown)))
    return [apis.BY_NAME[name] for name in names]


def load(path: str) -> SavedTrace:
    """Open a saved trace (DecodeError when it is not one, or from an incompatible version)."""
    return SavedTrace(path)
