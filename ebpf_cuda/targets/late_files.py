"""Which files a process maps that are new to the late-load watch: the CUDA libraries named
as such, and the executable files that may carry the runtime statically (`may_carry_runtime`,
a cheap look at the ELF section headers before discovery.is_static_cudart reads symbols).
Files are told apart by (device, inode) as /proc/PID/maps writes them (`maps_key`), those
looked at once are remembered by `Examined`; `identity` is a file's (st_dev, st_ino) through
a path.
"""
import collections
import fnmatch
import os
import struct
from typing import Any, Iterable, List, Optional, Tuple

from . import discovery, procfs

EXAMINED_MAX = 1 << 14  # files (maps device, inode, path) looked at, kept; the oldest go
SHT_SYMTAB, SHT_STRTAB, SHT_DYNSYM = 2, 3, 11
# Basenames of the files each library kind may be, wherever they lie: NVIDIA's sonames and
# the renamed private copies frameworks bundle (libcudart-1a2b3c4d.so.12).
PATTERNS = {"runtime": ("libcudart*.so*",), "driver": ("libcuda.so*", "libcuda-*.so*"),
            "nccl": ("libnccl*.so*",)}
Identity = Tuple[int, int]  # (st_dev, st_ino) of a file
MapsKey = Tuple[bytes, bytes]  # (device, inode) of a file as /proc/PID/maps writes them


def identity(path: str) -> Optional[Identity]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class Examined:
    """The files already looked at, by (maps device, inode, path), at most `limit` of them,
    the least recently met going first (a host running for months execs ever new programs;
    a file forgotten is only looked at again: its probes are kept by inode elsewhere). The
    path is in the key because a file system reuses a deleted file's inode for the next new
    file (ext4 at once): a library installed where another was deleted is a new file, looked
    at anew. ~200 bytes an entry: 3 MB when full."""

    def __init__(self, limit: int = EXAMINED_MAX) -> None:
        self.limit = limit
        self._keys: "collections.OrderedDict[bytes, None]" = collections.OrderedDict()

    def __contains__(self, key: Tuple[bytes, ...]) -> bool:
        joined = b" ".join(key)
        if joined not in self._keys:
            return False
        self._keys.move_to_end(joined)  # (met again: kept longer)
        return True

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: Tuple[bytes, ...]) -> None:
        self._keys[b" ".join(key)] = None
        if len(self._keys) > self.limit:
            self._keys.popitem(last=False)

    def discard(self, key: Tuple[bytes, bytes]) -> None:
        """Forget a file by (maps device, inode), under every path it was met at (detached:
        a later mapping of it is looked at again; rare, so a scan)."""
        prefix = b"%s %s " % key
        for joined in [k for k in self._keys if k.startswith(prefix)]:
            del self._keys[joined]


_DELETED = b" (deleted)"


def _undeleted(path: bytes) -> bytes:
    """A maps line's path without the " (deleted)" the kernel adds once the file is unlinked
    or replaced: the same file as before (looked at once)."""
    return path[:-len(_DELETED)] if path.endswith(_DELETED) else path


def new_mappings(pid: int, kinds: Iterable[str], examined: Any,
                 lines: Optional[List[bytes]] = None) -> List[Tuple[discovery.Mapping, bool]]:
    """(mapping, named) for each file process `pid` maps that is not in `examined` (maps
    device, inode and path; each one returned is added): files named as a CUDA library of these
    kinds (named=True, any mapping), and, when the runtime is traced, other executable file
    mappings (named=False: a library or program that may carry the runtime statically, as
    CuPy's extension modules do). `examined`: a set or an Examined; `lines`: the process's
    maps when already read. ProcessError when it has exited. Lines are split only as
    far as they need: a framework's process maps thousands."""
    patterns = [p for kind in kinds for p in PATTERNS.get(kind, ())]
    static = "runtime" in kinds
    if lines is None:
        lines = procfs.maps_lines(pid)
    found: List[Tuple[discovery.Mapping, bool]] = []
    for line in lines:
        named = b"/libcu" in line or b"/libnccl" in line
        if not named and not (static and b" r-xp " in line):
            continue
        fields = line.split(None, 5)
        if len(fields) < 6:
            continue
        key = (fields[3], fields[4], _undeleted(fields[5].rstrip(b"\n")))
        if key in examined:
            continue
        m = discovery.parse_maps_line(os.fsdecode(line))
        if m is None or not m.is_file:
            continue
        named = named and any(fnmatch.fnmatch(os.path.basename(m.path), p) for p in patterns)
        if named or (static and m.perms[2:3] == "x"):
            examined.add(key)
            found.append((m, named))
    return found


def may_carry_runtime(path: str) -> bool:
    """A first, cheap look for a runtime linked in statically, before
    discovery.is_static_cudart reads the symbols: a marker name (cudaMalloc & co) in the
    strings of the file's .symtab but not of its .dynsym. A library that imports the runtime
    (libtorch_cuda.so) or exports it (libcudart itself) names it in .dynsym; one that carries
    it privately (CuPy's extension modules, libnccl, libnvshmem) in .symtab alone. The
    strings are read in pieces (the read lets other threads run; libtorch_cpu's are 76 MB)."""
    markers = [b"\0" + name.encode() + b"\0" for name in discovery.STATIC_CUDART_MARKERS]
    try:
        with open(path, "rb") as stream:
            head = stream.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return False
            shoff, = struct.unpack_from("<Q", head, 40)
            entsize, count = struct.unpack_from("<HH", head, 58)
            if not shoff or not count or entsize < 64:
                return False
            stream.seek(shoff)
            table = stream.read(entsize * count)
            sections = [struct.unpack_from("<IIQQQQII", table, i * entsize)
                        for i in range(len(table) // entsize)]

            def strings_of(kind: int) -> List[Tuple[int, int]]:
                return [(sections[link][4], sections[link][5]) for link in
                        sorted({sec[6] for sec in sections if sec[1] == kind})
                        if link < len(sections) and sections[link][1] == SHT_STRTAB]

            def named(where: List[Tuple[int, int]]) -> bool:
                return any(_holds(stream, offset, size, markers) for offset, size in where)

            return not named(strings_of(SHT_DYNSYM)) and named(strings_of(SHT_SYMTAB))
    except (OSError, struct.error):
        return False


def _holds(stream, offset: int, size: int, markers: List[bytes], piece: int = 1 << 20) -> bool:
    """Whether the bytes at [offset, offset+size) of `stream` hold one of `markers` (each
    string of a string table is NUL-terminated; the table starts with a NUL). Read into one
    buffer of `piece` bytes that keeps the last 64 of the previous piece (a marker across
    two): reads of 4 MB, each joined to the tail, made 8 MB at a time in the thread that
    looks at every library a process maps when the tracer attaches to it."""
    stream.seek(offset)
    buf = bytearray(_TAIL + min(piece, size))  # (zeros: buf[0] is the table's first NUL)
    view, have = memoryview(buf), 1
    try:
        while size > 0:
            got = stream.readinto(view[have:have + min(piece, size)])
            if not got:
                return False
            have += got
            if any(buf.find(marker, 0, have) >= 0 for marker in markers):
                return True
            size -= got
            keep = min(_TAIL, have)
            buf[:keep] = buf[have - keep:have]
            have = keep
        return False
    finally:
        view.release()


_TAIL = 64  # bytes of a piece kept before the next (longer than any marker)


def maps_key(mapping: discovery.Mapping) -> MapsKey:
    """(device, inode) of `mapping`'s file, as its maps line writes them (Examined's keys)."""
    return (mapping.dev.encode(), b"%d" % mapping.inode)


def file_path(pid: int, mapping: discovery.Mapping) -> str:
    """A path that reaches the file of `mapping` from here (see process_file_path)."""
    return discovery.process_file_path(pid, mapping.path, mapping.inode,
                                       (mapping.start, mapping.end))
