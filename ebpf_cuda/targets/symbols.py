"""Run-time addresses → function names: the frames of call stacks and the kernel names of
launches by address (names.py keeps the names).

A launch's `func` is the address of the kernel's host stub in the launching process. It is
mapped to a file through a snapshot of /proc/PID/maps (taken the first time the process is
seen, while it still lives, and re-read when an address is not covered: a library opened
later with dlopen), turned into the file's virtual address through the PT_LOAD segment that
holds it (this undoes the load bias of PIE executables and shared libraries), looked up in
the file's .symtab/.dynsym (elf.py) and demangled. Everything is cached per process, per file
and per address; names are resolved in user space, after the event was read.
"""
import os
from bisect import bisect_right
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..errors import TracerError
from .discovery import Mapping, parse_maps_line, process_file_path, process_mappings
from .elf import ElfFile, demangle, open_elf
from .registrations import registered_kernels


_FIRST_READ = 1024  # bytes of a string read at first (a longer one: the rest up to the limit)


class Frame(NamedTuple):
    """A symbolized address: demangled function name, offset into it, file it lies in."""

    function: Optional[str]  # None when the address lies in no known function
    offset: int  # from the function's start, or from the file's start when function is None
    path: str

    def __str__(self) -> str:
        where = os.path.basename(self.path)
        if self.function is None:
            return "%s+0x%x" % (where, self.offset)
        return "%s+0x%x (%s)" % (self.function, self.offset, where)


class ProcessMaps:
    """A snapshot of the file mappings of one process."""

    def __init__(self, pid: int, mappings: Iterable[Mapping]) -> None:
        self.pid = pid
        self.mappings: List[Tuple[Mapping, str]] = sorted(
            # (a file replaced on disk since: the mapped one, through /proc/PID/map_files)
            ((m, process_file_path(pid, m.path, m.inode, (m.start, m.end)))
             for m in mappings if m.is_file),
            key=lambda pair: pair[0].start)
        # (bisected: a framework's process maps thousands of files, and an import burst
        # asks for tens of thousands of addresses)
        self._starts = [m.start for m, _ in self.mappings]

    @classmethod
    def read(cls, pid: int) -> "ProcessMaps":
        """The process's mappings now (an empty snapshot when it is gone)."""
        try:
            return cls(pid, process_mappings(pid))
        except TracerError:
            return cls(pid, [])

    @classmethod
    def parse(cls, pid: int, text: str) -> "ProcessMaps":
        """A snapshot from the text of a /proc/PID/maps file saved earlier."""
        return cls(pid, [m for m in map(parse_maps_line, text.splitlines()) if m is not None])

    def file_offset(self, address: int, read_only: bool = False) -> Optional[Tuple[str, int]]:
        """(path, offset in that file) of a run-time address, or None when not covered (with
        `read_only`, by a mapping the process cannot write: its bytes are the file's)."""
        place = bisect_right(self._starts, address) - 1
        if place < 0:
            return None
        mapping, path = self.mappings[place]
        if address >= mapping.end:
            return None
        if read_only and ("w" in mapping.perms or "r" not in mapping.perms):
            return None
        return path, address - mapping.start + mapping.offset


def _elf(path: str) -> Optional[ElfFile]:
    try:  # (a stripped file still maps addresses; its kernels may be registered)
        return open_elf(path, allow_stripped=True)
    except (TracerError, OSError):
        return None


class AddressResolver:
    """Per-process map snapshots and symbol lookups, shared by kernel naming and stacks.

    `observe(pid)` takes the first snapshot; `locate`/`frame` re-read the maps once per
    address that the snapshot does not cover."""

    def __init__(self) -> None:
        self._maps: Dict[int, ProcessMaps] = {}
        self._reread: Set[Tuple[int, int]] = set()
        self._frames: Dict[Tuple[str, int, bool], Frame] = {}

    def forget(self, pid: int) -> None:
        """Drop what is kept of process `pid` (it exited, or exec'd another program)."""
        self._maps.pop(pid, None)
        self._reread = {key for key in self._reread if key[0] != pid}
        root = "/proc/%d/" % pid  # (the files of a process in another mount namespace)
        for key in [key for key in self._frames if key[0].startswith(root)]:
            del self._frames[key]

    def observe(self, pid: int) -> None:
        """Snapshot `pid`'s mappings unless already done (cheap after the first call)."""
        if pid not in self._maps:
            self._maps[pid] = ProcessMaps.read(pid)

    def snapshot(self, pid: int) -> Optional[ProcessMaps]:
        """The snapshot kept of process `pid` (None before the first)."""
        return self._maps.get(pid)

    def use(self, maps: ProcessMaps) -> None:
        """Take `maps` as the snapshot of its process (a saved maps file, a test's mappings)."""
        self._maps[maps.pid] = maps

    def _file_offset(self, pid: int, address: int, read_only: bool = False
                     ) -> Optional[Tuple[str, int]]:
        """(path, file offset) of a run-time address in process `pid`, the maps read again
        (once per address) when the snapshot does not cover it: a library opened since."""
        self.observe(pid)
        found = self._maps[pid].file_offset(address, read_only)
        if found is None and (pid, address) not in self._reread:
            self._reread.add((pid, address))
            fresh = ProcessMaps.read(pid)
            if fresh.mappings:  # keep the old snapshot when the process is gone
                self._maps[pid] = fresh
                found = fresh.file_offset(address, read_only)
        return found

    def locate(self, pid: int, address: int) -> Optional[Tuple[str, int]]:
        """(path, file virtual address) of a run-time address in process `pid`."""
        found = self._file_offset(pid, address)
        if found is None:
            return None
        path, offset = found
        elf = _elf(path)
        vaddr = None if elf is None else elf.offset_to_vaddr(offset)
        return None if vaddr is None else (path, vaddr)

    def read_string(self, pid: int, address: int, limit: int) -> Optional[bytes]:
        """The NUL-terminated string at `address` in process `pid`, read from the file that
        a read-only mapping puts there (a string literal in a library's .rodata: the bytes
        the process sees are the file's, whenever they are read and however the process
        has gone since); None when no such mapping holds it or no NUL ends it within
        `limit` bytes (a string the process writes is never read: it may have changed)."""
        found = self._file_offset(pid, address, read_only=True)
        if found is None:
            return None
        path, offset = found
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.pread(fd, min(_FIRST_READ, limit + 1), offset)  # (most names fit)
            if b"\0" not in data and len(data) < limit + 1:
                data += os.pread(fd, limit + 1 - len(data), offset + len(data))
        except OSError:
            return None
        finally:
            os.close(fd)
        end = data.find(b"\0")
        return data[:end] if end > 0 else None

    def frame(self, pid: int, address: int, return_address: bool = False) -> Optional[Frame]:
        """The function holding `address` (for a return address, the call just before it)."""
        located = self.locate(pid, address)
        if located is None:
            return None
        path, vaddr = located
        key = (path, vaddr, return_address)
        frame = self._frames.get(key)
        if frame is None:
            frame = self._frames[key] = _symbolize(path, vaddr, return_address)
        return frame

    def stack(self, pid: int, addresses: Sequence[int]) -> List[Optional[Frame]]:
        """The frames of a user call stack (innermost first; None where an address lies in
        no file): a stack taken at a function's entry starts with the function itself, the
        rest are return addresses, each named after the call just before it."""
        frames: List[Optional[Frame]] = []
        for depth, address in enumerate(addresses):
            frame = None
            if depth == 0:
                frame = self.frame(pid, address)
                frame = frame if frame is not None and frame.offset == 0 else None
            if frame is None:
                frame = self.frame(pid, address, return_address=True)
            frames.append(frame)
        return frames


def _symbolize(path: str, vaddr: int, return_address: bool) -> Frame:
    if not return_address:  # a kernel's host function: the device name it registers
        registered = registered_kernels(path).get(vaddr)
        if registered is not None:
            return Frame(demangle(registered), 0, path)
    elf = _elf(path)
    lookup = vaddr - 1 if return_address else vaddr  # a call may be a function's last bytes
    found = None
    if elf is not None:
        try:
            found = elf.function_at(lookup)
        except TracerError:
            found = None
    if found is None:
        return Frame(None, vaddr, path)
    name, start = found
    return Frame(demangle(name), vaddr - start, path)
