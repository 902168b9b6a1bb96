"""Run-time addresses → function names: kernel names of launches, frames of call stacks.

A launch's `func` is the address of the kernel's host stub in the launching process. It is
mapped to a file through a snapshot of /proc/PID/maps (taken the first time the process is
seen, while it still lives, and re-read when an address is not covered: a library opened
later with dlopen), turned into the file's virtual address through the PT_LOAD segment that
holds it (this undoes the load bias of PIE executables and shared libraries), looked up in
the file's .symtab/.dynsym (elf.py) and demangled. Everything is cached per process, per file
and per address; names are resolved in user space, after the event was read.
"""
import os
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

from ..apis import BY_NAME, Kind
from ..discovery import Mapping, parse_maps_line, process_file_path, process_mappings
from ..elf import ElfFile, demangle, open_elf
from ..errors import TracerError
from ..events import Event


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
        self.mappings: List[Tuple[Mapping, str]] = [
            (m, process_file_path(pid, m.path, m.inode)) for m in mappings if m.is_file]

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

    def file_offset(self, address: int) -> Optional[Tuple[str, int]]:
        """(path, offset in that file) of a run-time address, or None when not covered."""
        for mapping, path in self.mappings:
            if mapping.start <= address < mapping.end:
                return path, address - mapping.start + mapping.offset
        return None


def _elf(path: str) -> Optional[ElfFile]:
    try:
        return open_elf(path)
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

    def observe(self, pid: int) -> None:
        """Snapshot `pid`'s mappings unless already done (cheap after the first call)."""
        if pid not in self._maps:
            self._maps[pid] = ProcessMaps.read(pid)

    def use(self, maps: ProcessMaps) -> None:
        """Take `maps` as the snapshot of its process (a saved maps file, a test's mappings)."""
        self._maps[maps.pid] = maps

    def locate(self, pid: int, address: int) -> Optional[Tuple[str, int]]:
        """(path, file virtual address) of a run-time address in process `pid`."""
        self.observe(pid)
        found = self._maps[pid].file_offset(address)
        if found is None and (pid, address) not in self._reread:
            self._reread.add((pid, address))
            fresh = ProcessMaps.read(pid)
            if fresh.mappings:  # keep the old snapshot when the process is gone
                self._maps[pid] = fresh
                found = fresh.file_offset(address)
        if found is None:
            return None
        path, offset = found
        elf = _elf(path)
        vaddr = None if elf is None else elf.offset_to_vaddr(offset)
        return None if vaddr is None else (path, vaddr)

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


def _symbolize(path: str, vaddr: int, return_address: bool) -> Frame:
    elf = _elf(path)
    lookup = vaddr - 1 if return_address else vaddr  # a call may be a function's last bytes
    name = None
    if elf is not None:
        try:
            name = elf.symbolize(lookup)
        except TracerError:
            name = None
    if name is None:
        return Frame(None, vaddr, path)
    symbol = elf.symbol(name)
    start = symbol.value if symbol is not None else vaddr
    return Frame(demangle(name), vaddr - start, path)


HandleNamer = Callable[[int, int], Optional[str]]  # (pid, CUfunction handle) → name


def _takes_handle(api: str) -> bool:
    """True when the launch's `func` is a driver handle (CUfunction), not a code address."""
    row = BY_NAME.get(api)
    return row is not None and any(a.name == "func" and a.kind == Kind.HANDLE for a in row.args)


class KernelNamer:
    """Kernel names of launches: `name(pid, address)` → demangled name or None.

    Usable as a sink (its `write` calls `observe`) and as the outputs' `namer`
    (`namer(event, address)`): a runtime launch's `func` is a code address, named from the
    symbols; a driver launch's is a CUfunction handle, named by `handles(pid, handle)` (the
    decoder's names learned from cuModuleGetFunction and co.) when given."""

    def __init__(self, resolver: Optional[AddressResolver] = None,
                 handles: Optional[HandleNamer] = None,
                 functions: Optional[Callable[[int, int], Optional[int]]] = None) -> None:
        self.resolver = resolver or AddressResolver()
        self.handles = handles
        self.functions = functions  # (pid, cudaKernel_t) -> host stub address
        self._names: Dict[Tuple[int, int], Optional[str]] = {}
        self._handle_apis: Dict[str, bool] = {}
        self._found: Dict[Tuple[int, str, int], str] = {}  # name_for's answers (known ones)

    def observe(self, events: Iterable[Event]) -> None:
        """Snapshot the mappings of every process seen for the first time."""
        self.observe_pids({event.pid for event in events})

    def observe_pids(self, pids: Iterable[int]) -> None:
        """Snapshot the mappings of these processes, unless already done."""
        observe = self.resolver.observe
        for pid in pids:
            observe(pid)

    def found_names(self) -> "FoundNames":
        """A read-only view of the names found so far (and found later)."""
        return FoundNames(self._found)

    def name(self, pid: int, address: int) -> Optional[str]:
        """The demangled name of the function starting at `address` in process `pid`."""
        key = (pid, address)
        if key in self._names:
            return self._names[key]
        frame = self.resolver.frame(pid, address)
        # A kernel stub starts at its symbol; an address inside a function is no kernel name.
        name = frame.function if frame is not None and frame.offset == 0 else None
        if name is not None or frame is not None:  # an unmapped address may be dlopened later
            self._names[key] = name
        return name

    def __call__(self, event: Event, address: int) -> Optional[str]:
        return self.name_for(event.pid, event.api, address)

    def name_for(self, pid: int, api: str, address: int) -> Optional[str]:
        """The kernel a launch by function `api` of process `pid` with `func` = `address`
        runs: a driver launch's is a handle; a runtime launch's a host stub's address or,
        in CUDA 13, a cudaKernel_t (the CUkernel of cuLibraryGetKernel). A name once
        found is kept (launches repeat); an unknown one may be learned later."""
        found = self._found.get((pid, api, address))
        if found is not None:
            return found
        name = self._name_for(pid, api, address)
        if name:
            self._found[(pid, api, address)] = name
        return name

    def _name_for(self, pid: int, api: str, address: int) -> Optional[str]:
        handle = self._handle_apis.get(api)
        if handle is None:
            handle = self._handle_apis[api] = _takes_handle(api)
        if handle:
            return self.handle_name(pid, address)
        return self.name(pid, address) or self.handle_name(pid, address)

    def handle_name(self, pid: int, handle: int) -> Optional[str]:
        """The demangled kernel name of a CUfunction/CUkernel handle, if it was learned."""
        name = self.handles(pid, handle) if self.handles is not None else None
        if name:
            return demangle(name)
        stub = self.functions(pid, handle) if self.functions is not None else None
        return self.name(pid, stub) if stub else None

    # Sink protocol: snapshot processes as their events arrive.
    def header(self) -> None:
        """Nothing to write."""

    def write(self, events: Iterable[Event]) -> None:
        self.observe(events)

    def close(self) -> None:
        """Nothing to flush."""


class FoundNames:
    """The kernel names a KernelNamer found, read only, usable as the outputs' `namer`: for
    a thread that formats lines behind the reader, while the reader names the launches as it
    reads them (their processes may be gone by the time the lines are written)."""

    def __init__(self, found: Dict[Tuple[int, str, int], str]) -> None:
        self._found = found

    def name_for(self, pid: int, api: str, address: int) -> Optional[str]:
        return self._found.get((pid, api, address))

    def __call__(self, event: Event, address: int) -> Optional[str]:
        return self._found.get((event.pid, event.api, address))
