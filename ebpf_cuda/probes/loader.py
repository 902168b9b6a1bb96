"""Libraries a traced process maps after the trace began: told by its dynamic loader.

glibc's loader calls `_dl_debug_state()` (the r_debug `r_brk` rendezvous hook that debuggers
break on) twice around every dlopen and dlclose: once before it maps or unmaps objects
(RT_ADD, RT_DELETE) and once when the link map is consistent again (RT_CONSISTENT, after
mapping, before relocation and constructors). A uprobe on it in each loader file the traced
processes use runs `loader_program`, which (for RT_CONSISTENT only, read from _r_debug)
writes a *loader notice* into the events ring (a hello record, record.PHASE_HELLO, whose
first argument cell is LOADER_MARK, so that every consumer that skips hello records skips it
too) and wakes the reader at once. The reader (stream.py, through Session.note_loads) then
reads /proc/PID/maps of that process, finds the CUDA files it maps that no probe covers yet
(by (device, inode) of a path that reaches the file the process maps: its own path,
/proc/PID/root/..., /proc/PID/map_files/...), and attaches the session's probes to those
named as CUDA libraries; other new executable mappings go to a checker thread, which probes
those that carry the runtime statically (CuPy's extension modules, libnccl).

System-wide (the monitor, `SystemWatch`), the loader program has no pid filter, goes on
every distinct loader file the machine's processes use, and writes into a ring of its own
with exec notices (execs.ExecNotices): an exec has the new program's loader watched when no
loader of that file is, then its executable and what it maps checked (by (device, inode):
a file looked at once is not read again; `Examined` bounds what is remembered).

The monitor's probes on a file probed after the start come off once no process maps it
(`LateLoads.sweep`, every DETACH_CHECK_S from SystemWatch's thread): the pids seen mapping
each such file (when their notices were read) and the processes the monitor knows are
looked at; the file is then forgotten, so that a later mapping probes it again.

A uprobe handler cannot wait for the reader: calls the process makes between the mapping and
the attach (milliseconds, see docs/design.md) are not seen, and nothing can count them (no
probe is on the file yet). A notice the full ring could not take is counted (`loader_lost`);
the reader then scans every traced process again.
"""
import collections
import fnmatch
import os
import queue
import struct
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .. import asm
from ..targets import discovery
from ..spec import layout, record
from . import calls as probes
from ..spec.apis import Api
from ..arch import Arch, current as current_arch
from ..asm import DW, FP, R0, R1, R2, R3, R6, R8, RB_FORCE_WAKEUP, W, Helper
from ..errors import NoCudaSymbolsError, ProcessError, TracerError, UnsupportedKernelError
from .execs import EXEC_MARK, NOTICES_LOST
from ..bpf.maps import PerCpuArrayMap
from ..bpf.programs import Program
from ..targets.selection import Target, find_targets
from ..bpf.uprobe import Link, attach_uprobe

HOOK = "_dl_debug_state"  # glibc's r_brk: called after every change of the link map
LOADER_MARK = 0x4C4F4144  # "LOAD": the first argument cell of a loader notice
LOST = NOTICES_LOST  # "loader_lost": per-CPU count of notices the full ring could not take
NOTICE_LOADER, NOTICE_EXEC = 1, 2  # what a process's notices in a batch were
_KIND_OF = {LOADER_MARK: NOTICE_LOADER, EXEC_MARK: NOTICE_EXEC}
EXAMINED_MAX = 1 << 14  # files (maps device, inode, path) looked at, kept; the oldest go
NOTICE_RING_SIZE = 1 << 18  # the monitor's notices: ~1,500 waiting before one is lost
NOTICE_POLL_S = 0.25  # how long its reader waits before looking at stop() and the lost
# struct r_debug (glibc, 64-bit): r_version, r_map, r_brk, then r_state, an int.
R_STATE = 24
RT_CONSISTENT = 0
STATE_AT, LOST_KEY_AT = -8, -16  # the program's stack slots (probes.py's are lower)
LOST_CHECK_S = 0.05  # how often the reader looks at the lost notices' count
CHECKER_JOIN_S = 1.0  # how long close() waits for the checker thread
DETACH_CHECK_S = 30.0  # how often the monitor looks for late files no process maps any more
PT_INTERP = 3
SHT_SYMTAB, SHT_STRTAB, SHT_DYNSYM = 2, 3, 11
AT_BASE = 7  # auxv: where the interpreter (the dynamic loader) is mapped
# Basenames of the files each library kind may be, wherever they lie: NVIDIA's sonames and
# the renamed private copies frameworks bundle (libcudart-1a2b3c4d.so.12).
PATTERNS = {"runtime": ("libcudart*.so*",), "driver": ("libcuda.so*", "libcuda-*.so*"),
            "nccl": ("libnccl*.so*",)}
Identity = Tuple[int, int]  # (st_dev, st_ino) of a file
MapsKey = Tuple[bytes, bytes]  # (device, inode) of a file as /proc/PID/maps writes them
Log = Callable[[str], None]


def loader_program(follow: bool, pid_ns: Optional[Tuple[int, int]] = None,
                   arch: Optional[Arch] = None) -> list:
    """The uprobe program on _dl_debug_state: a loader notice into the ring, reader woken
    (`follow`: only processes of the `followed` map; else the link's pid filter decides;
    `pid_ns`: the tracer's PID namespace, whose pids the notice carries, as the call
    probes do). With the distance from _dl_debug_state to _r_debug as attach cookie, only
    a consistent link map (r_state RT_CONSISTENT: objects mapped, or unmapped) is told of:
    half the notices, and none before the mapping."""
    arch = arch or current_arch()
    options = probes.ProbeOptions(follow=follow, pid_ns=pid_ns)
    prog = [asm.mov(R6, R1)] + probes._in_namespace(options)
    if follow:
        prog += probes._only_followed(options)
    prog += [
        asm.mov(R1, R6), asm.call(Helper.GET_ATTACH_COOKIE),
        asm.jeq(R0, 0, "tell"),  # (no cookie: every call is told of)
        asm.ldx(DW, R3, R6, arch.ip), asm.add(R3, R0), asm.add(R3, R_STATE),
        asm.mov(R1, FP), asm.add(R1, STATE_AT), asm.mov(R2, 4),
        asm.call(Helper.PROBE_READ_USER),
        asm.jne(R0, 0, "tell"),  # (unreadable: told of anyway)
        asm.ldx(W, R1, FP, STATE_AT),
        asm.jne(R1, RT_CONSISTENT, "out"),
        asm.Label("tell"),
        asm.ld_map(R1, layout.EVENTS), asm.mov(R2, record.SIZE), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE),
        asm.jeq(R0, 0, "lost"),
        asm.mov(R8, R0),
    ] + probes._entry_head(record.HELLO_FN, record.PHASE_HELLO, options) + [
        asm.st(DW, R8, record.ARGS, LOADER_MARK),
    ]
    prog += [asm.st(DW, R8, offset, 0) for offset in range(record.ARGS + 8, record.SIZE, 8)]
    return prog + [
        asm.mov(R1, R8), asm.mov(R2, RB_FORCE_WAKEUP), asm.call(Helper.RINGBUF_SUBMIT),
        asm.ja("out"),
        asm.Label("lost"),
        asm.st(W, FP, LOST_KEY_AT, 0),
        asm.ld_map(R1, LOST), asm.mov(R2, FP), asm.add(R2, LOST_KEY_AT),
        asm.call(Helper.MAP_LOOKUP_ELEM),
        asm.jeq(R0, 0, "out"),
        asm.ldx(DW, R1, R0, 0), asm.add(R1, 1), asm.stx(DW, R0, 0, R1),
        asm.Label("out"), asm.mov(R0, 0), asm.exit(),
    ]


def notice_times(frames: bytes) -> Dict[int, int]:
    """pid -> the time (ns, CLOCK_MONOTONIC) of its first loader notice in this batch."""
    return {pid: ns for pid, (ns, _) in notices(frames, (LOADER_MARK,)).items()}


def notices(frames: bytes, marks: Sequence[int] = (LOADER_MARK, EXEC_MARK)
            ) -> Dict[int, Tuple[int, int]]:
    """pid -> (the time of its first notice in this batch, the marks of its notices OR'ed
    as NOTICE_LOADER | NOTICE_EXEC) for the notices of these `marks`."""
    ids = record.frame_column(frames, record.FN_ID, "H")
    if record.HELLO_FN not in ids:
        return {}
    cells = record.frame_column(frames, record.ARGS, "Q")
    pids = record.frame_column(frames, record.PID_TGID + 4, "I")
    times = record.frame_column(frames, record.TS_ENTER, "Q")
    found: Dict[int, Tuple[int, int]] = {}
    for i, fn in enumerate(ids):
        if fn == record.HELLO_FN and cells[i] in marks:
            ns, kinds = found.get(pids[i], (times[i], 0))
            found[pids[i]] = (ns, kinds | _KIND_OF[cells[i]])
    return found


# -- which loader --------------------------------------------------------------------------

def interpreter_of(path: str, depth: int = 0) -> Optional[str]:
    """The PT_INTERP of the ELF file at `path` (its dynamic loader), the loader of a
    script's `#!` interpreter (scripts run by scripts: 4 deep at most, as the kernel), or
    None (a static executable, not readable)."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(64)
            if head.startswith(b"#!"):
                stream.seek(0)
                words = stream.readline(256)[2:].split()
                program = discovery.resolve_executable(os.fsdecode(words[0])) if words else None
                return (interpreter_of(program, depth + 1)
                        if program and depth < 4 else None)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            stream.seek(phoff)
            table = stream.read(phentsize * phnum)
            for i in range(phnum):
                p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(
                    "<IIQQQQ", table, i * phentsize)
                if p_type == PT_INTERP:
                    stream.seek(p_offset)
                    return os.fsdecode(stream.read(p_filesz).split(b"\0", 1)[0]) or None
    except (OSError, struct.error, IndexError):
        return None
    return None


def own_loader() -> Optional[str]:
    """The dynamic loader this process runs with (the machine's usual one)."""
    return process_loader(os.getpid(), own=True)


def process_loader(pid: int, own: bool = False) -> Optional[str]:
    """A path that reaches the dynamic loader process `pid` maps (from its auxv AT_BASE:
    the loader's first mapping), or None for a static executable."""
    try:
        with open("/proc/%d/auxv" % pid, "rb") as stream:
            data = stream.read()
        base = dict(struct.iter_unpack("<QQ", data[:len(data) // 16 * 16])).get(AT_BASE, 0)
        if not base:
            return None
        for m in discovery.process_mappings(pid):
            if m.start == base and m.is_file:
                return m.path if own else discovery.process_file_path(
                    pid, m.path, m.inode, (m.start, m.end))
    except (OSError, ProcessError):
        return None
    return None


def at_base(pid: int) -> int:
    """Where process `pid`'s dynamic loader is mapped (auxv AT_BASE); 0 for a static
    executable or a process gone."""
    try:
        with open("/proc/%d/auxv" % pid, "rb") as stream:
            data = stream.read()
    except OSError:
        return 0
    return dict(struct.iter_unpack("<QQ", data[:len(data) // 16 * 16])).get(AT_BASE, 0)


def loader_line(pid: int, lines: Sequence[bytes]) -> Optional[bytes]:
    """The maps line (of `lines`, process `pid`'s) of its dynamic loader's first mapping."""
    base = at_base(pid)
    if not base:
        return None
    prefix = b"%x-" % base
    return next((line for line in lines if line.startswith(prefix)), None)


def r_debug_distance(loader: str, hook_vaddr: int) -> int:
    """_r_debug's address minus _dl_debug_state's in the loader file (0 when it has none:
    then the program tells of every call)."""
    from ..targets.elf import _pyelftools

    try:
        with open(loader, "rb") as stream:
            dynsym = _pyelftools().ELFFile(stream).get_section_by_name(".dynsym")
            symbols = (dynsym.get_symbol_by_name("_r_debug") if dynsym else None) or []
            for symbol in symbols:
                if symbol["st_value"]:
                    return symbol["st_value"] - hook_vaddr
    except Exception:  # pyelftools' errors, a file that is no ELF after all
        return 0
    return 0


def identity(path: str) -> Optional[Identity]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


# -- the watch -----------------------------------------------------------------------------

class LoaderWatch:
    """The loader program and its links, one per distinct loader file (`watch`)."""

    def __init__(self, session_maps: Dict[str, Any], pid: Optional[int] = None,
                 log: Optional[Log] = None, pid_ns: Optional[Tuple[int, int]] = None) -> None:
        self.pid = pid  # the links' pid filter (-d PID, a command not followed)
        self.log = log or (lambda message: None)
        self.lost = PerCpuArrayMap(8, 1, name=LOST, value_struct=layout.U64)
        # The session's maps by name (the ring, the followed processes and what probes.py's
        # pieces of code use with them), and its own count.
        maps = dict(session_maps, **{LOST: self.lost})
        self.program = Program(loader_program(layout.FOLLOWED in maps, pid_ns), maps,
                               name="cuda_loader")
        self.links: List[Link] = []
        self._loaders: Set[Identity] = set()
        self._lost_seen = 0
        try:
            self.program.load()
        except BaseException:
            self.close()
            raise

    def watch(self, loader: str) -> bool:
        """Put the loader program on `loader`'s _dl_debug_state (once per file); False when
        that file has already one, TracerError when it cannot."""
        key = identity(loader)
        if key is None or key in self._loaders:
            return False
        from ..targets.elf import open_elf

        elf = open_elf(loader, allow_stripped=True)
        offset = elf.symbol_offset(HOOK)
        distance = r_debug_distance(loader, elf.symbol_address(HOOK))
        try:
            link = attach_uprobe(self.program, loader, offset, pid=self.pid, what=HOOK,
                                 cookie=distance & (1 << 64) - 1)
        except UnsupportedKernelError:  # no cookies: every call of the hook is told of
            distance = 0
            link = attach_uprobe(self.program, loader, offset, pid=self.pid, what=HOOK)
        self.links.append(link)
        self._loaders.add(key)
        self.log("watching the dynamic loader %s (%s at 0x%x%s): libraries mapped later "
                 "are probed as they come" % (loader, HOOK, offset, ", told of consistent "
                                              "link maps" if distance else ""))
        return True

    def lost_since(self) -> int:
        """Notices the full ring could not take since the last call."""
        total = sum(self.lost[0])
        new, self._lost_seen = total - self._lost_seen, total
        return new

    def close(self) -> None:
        from ..bpf.workers import close_all

        close_all(self.links)
        self.links = []
        self.program.close()
        self.lost.close()


# -- which files are new -------------------------------------------------------------------

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


def maps_lines(pid: int) -> List[bytes]:
    """The lines of /proc/PID/maps; ProcessError when it has exited."""
    try:
        with open("/proc/%d/maps" % pid, "rb") as stream:
            return stream.readlines()
    except OSError as err:
        raise ProcessError("cannot read the mappings of process %d: %s"
                           % (pid, err.strerror or err)) from None


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
        lines = maps_lines(pid)
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


def _holds(stream, offset: int, size: int, markers: List[bytes], piece: int = 1 << 22) -> bool:
    """Whether the bytes at [offset, offset+size) of `stream` hold one of `markers` (each
    string of a string table is NUL-terminated; the table starts with a NUL)."""
    stream.seek(offset)
    tail = b"\0"
    while size > 0:
        chunk = tail + stream.read(min(piece, size))
        if len(chunk) == len(tail):
            return False
        if any(marker in chunk for marker in markers):
            return True
        size -= len(chunk) - len(tail)
        tail = chunk[-64:]
    return False


def maps_key(mapping: discovery.Mapping) -> MapsKey:
    """(device, inode) of `mapping`'s file, as its maps line writes them (Examined's keys)."""
    return (mapping.dev.encode(), b"%d" % mapping.inode)


def file_path(pid: int, mapping: discovery.Mapping) -> str:
    """A path that reaches the file of `mapping` from here (see process_file_path)."""
    return discovery.process_file_path(pid, mapping.path, mapping.inode,
                                       (mapping.start, mapping.end))


def loaders_for(pid: Optional[int], command: Sequence[str]) -> List[str]:
    """The loader files to watch: process `pid`'s, or the command's interpreter (or its
    script's) and this process's own (a command that runs another program through a
    shell or env still uses the machine's usual loader)."""
    found: List[str] = []
    if pid is not None:
        found.append(process_loader(pid) or "")
    else:
        exe = discovery.resolve_executable(command[0]) if command else None
        found.append((interpreter_of(exe) if exe else None) or "")
        found.append(own_loader() or "")
    return [path for path in dict.fromkeys(found) if path]


# -- probing what comes ---------------------------------------------------------------------

# How a file probed late came (said with -v).
WHY_LOADER = "its dynamic loader mapped it: a dlopen, or a program's start"
WHY_EXEC = "it exec'd this program or one that maps it"
WHY_STATIC = "carrying the runtime statically"
WHY_RUNNING = "it ran when the trace began"
Probe = Callable[[Target, Optional[int]], bool]  # the session's probes on a file: attached?


class LateLoads:
    """A session's libraries mapped after its start: the watch on the loaders, the files
    probed by (device, inode) (those of the start included, and those found to define none
    of the selection: one look, one probe set per file), what each notice led to.

    `probe(target, pid)` attaches the session's probes to a new file (pid: the links' pid
    filter); `traced()` lists the traced processes (to scan all of them again when notices
    were lost). With `detach(path)` (Session.detach: the monitor), the pids seen mapping each
    file it probed are kept, and `sweep` detaches the files none of them maps any more."""

    def __init__(self, session_maps: Dict[str, Any], pid: Optional[int],
                 selected: Sequence[Api],
                 started: Sequence[Target], probe: Probe, traced: Callable[[], Iterable[int]],
                 log: Log, pid_ns: Optional[Tuple[int, int]] = None,
                 detach: Optional[Callable[[str], int]] = None) -> None:
        self.watch = LoaderWatch(session_maps, pid, log, pid_ns)
        self.kinds = sorted({api.library for api in selected})
        self.selected = list(selected)
        self.probe = probe
        self.traced = traced
        self.log = log
        self.probed: Set[Identity] = {key for key in (identity(t.path) for t in started) if key}
        # With `detach`: the files probed here (never those of the start) by maps key, with
        # their identity and the path the session probed them at (each path one file's:
        # detach(path) closes that file's links alone), and the pids seen mapping each (of
        # those files, and of those the checker thread is still looking at).
        self.detach = detach
        self.paths: Dict[str, Identity] = {t.path: key for t, key in
                                           ((t, identity(t.path)) for t in started) if key}
        self.files: Dict[MapsKey, Tuple[Identity, str]] = {}
        self.mappers: Dict[MapsKey, Set[int]] = {}
        self.detached = 0  # files detached so far
        self.examined = Examined()  # (maps device, inode, path) of the files looked at
        self._loaders: Set[Tuple[bytes, ...]] = set()  # (maps device, inode, path) of loaders
        self.late: List[Tuple[str, int, float]] = []  # (path, pid, ms after the notice)
        self.reasons: Dict[str, str] = {}  # path -> how it came (`late`'s files)
        self._lost_checked = 0.0
        self._lock = threading.Lock()  # `probed`: the reader and the checker thread
        self._checks: "queue.SimpleQueue" = queue.SimpleQueue()
        self._checker = threading.Thread(target=self._check, name="ebpf-cuda late loads",
                                         daemon=True)
        self._checker.start()

    def watch_loaders(self, loaders: Sequence[str]) -> None:
        for loader in loaders:
            try:
                self.watch.watch(loader)
            except TracerError as err:
                self.log("cannot watch the dynamic loader %s: %s" % (loader, err))
        if not self.watch.links:
            self.log("no dynamic loader to watch (a static executable?): libraries mapped "
                     "later are not probed")

    def note(self, frames: bytes) -> None:
        """Scan the processes whose loader sent a notice in this batch (and, when notices
        were lost to a full ring, every traced process); a process that exec'd has its
        loader watched first (exec notices: the monitor's, SystemWatch)."""
        told = notices(frames)
        now = time.monotonic()
        if now - self._lost_checked >= LOST_CHECK_S:
            self._lost_checked = now
            lost = self.watch.lost_since()
            if lost:
                self.log("%d loader notices lost (ring full): every traced process is "
                         "scanned again" % lost)
                for pid in self.traced():
                    told.setdefault(pid, (0, NOTICE_EXEC))
        for pid in sorted(told):
            notice_ns, kinds = told[pid]
            if kinds & NOTICE_EXEC:
                self.exec_seen(pid, notice_ns)
            else:
                self.scan(pid, notice_ns)

    def exec_seen(self, pid: int, notice_ns: Optional[int] = None) -> None:
        """A process that exec'd (or one not scanned yet): its dynamic loader watched when
        no loader of that file is (a container's, a new one), then its program and what
        it maps scanned (read again after a new watch: what its loader mapped before the
        watch was on is in the maps then, what it maps later is told of)."""
        try:
            lines = maps_lines(pid)
            if self.watch_loader_of(pid, lines):
                lines = maps_lines(pid)
        except ProcessError:
            return  # (gone already: a short-lived program)
        self.scan(pid, notice_ns, WHY_EXEC, lines)

    def watch_loader_of(self, pid: int, lines: Sequence[bytes]) -> bool:
        """Put the loader program on process `pid`'s dynamic loader (`lines`: its maps)
        unless that file (by maps device and inode) was met before; True when it was
        put on now."""
        line = loader_line(pid, lines)
        fields = line.split(None, 5) if line else []
        if len(fields) < 6 or tuple(fields[3:6]) in self._loaders:
            return False
        self._loaders.add(tuple(fields[3:6]))  # (by path too: see Examined)
        mapping = discovery.parse_maps_line(os.fsdecode(line))
        if mapping is None or not mapping.is_file:
            return False
        try:
            return self.watch.watch(file_path(pid, mapping))
        except TracerError as err:
            self.log("cannot watch the dynamic loader %s of process %d: %s"
                     % (mapping.path, pid, err))
            return False

    def scan(self, pid: int, notice_ns: Optional[int] = None, why: str = "",
             lines: Optional[List[bytes]] = None) -> None:
        """Probe the CUDA files process `pid` maps that no probe covers yet: those named as
        CUDA libraries at once; the others that may carry the runtime statically are left
        to the checker thread (reading a big library's symbols takes a second: the reader
        must not wait for it). `why` says how they came (for -v); `lines`: its maps."""
        why = why or WHY_LOADER
        try:
            if lines is None:
                lines = maps_lines(pid)
            if self.mappers:
                self._note_mappers(pid, lines)
            mappings = new_mappings(pid, self.kinds, self.examined, lines)
        except ProcessError:
            return  # it has exited: nothing of it to probe
        for m, named in mappings:
            path = file_path(pid, m)
            if self.detach is not None:
                with self._lock:
                    self.mappers.setdefault(maps_key(m), set()).add(pid)
            if named:
                self._probe_new(path, pid, notice_ns, why, m)
            else:
                self._checks.put((path, pid, notice_ns, why, m))

    def _note_mappers(self, pid: int, lines: Sequence[bytes]) -> None:
        """Note process `pid` as mapping the files probed here that its maps `lines` hold
        (their code: the r-xp lines only; split only when a file is probed late)."""
        with self._lock:
            for line in lines:
                if b" r-xp " not in line:
                    continue
                fields = line.split(None, 5)
                pids = self.mappers.get((fields[3], fields[4])) if len(fields) > 4 else None
                if pids is not None:
                    pids.add(pid)

    def _probe_new(self, path: str, pid: int, notice_ns: Optional[int], why: str,
                   m: Optional[discovery.Mapping] = None) -> None:
        key = identity(path)
        mkey = maps_key(m) if m is not None else None
        with self._lock:
            if key is None or key in self.probed:
                if mkey is not None:
                    self._forget_mappers(mkey)  # (a file of the start, reached anew)
                return
            self.probed.add(key)
        try:
            probed = self._probe(path, pid, notice_ns, why, key, m)
        except _MappingGone as gone:
            self.log("not probed now: %s" % gone)
            with self._lock:  # (not looked at: the process's next notice looks again)
                self.probed.discard(key)
                if mkey is not None:
                    self.examined.discard(mkey)
                    self._forget_mappers(mkey)
            return
        with self._lock:
            if probed is not None and mkey is not None and self.detach is not None:
                self.files[mkey] = (key, probed)
                self.paths[probed] = key
            elif mkey is not None:
                self._forget_mappers(mkey)

    def _forget_mappers(self, mkey: MapsKey) -> None:
        """Stop keeping the processes that map `mkey`, unless it is a file probed here (its
        processes keep its probes on: a look at it under another name changes nothing).
        Holding the lock."""
        if mkey not in self.files:
            self.mappers.pop(mkey, None)

    def _check(self) -> None:
        """The checker thread: libraries that may carry the runtime statically, one by one
        (None ends it)."""
        while True:
            job = self._checks.get()
            if job is None:
                return
            if isinstance(job, _Mark):
                job.done.set()
                continue
            path, pid, notice_ns, why, m = job
            try:
                if may_carry_runtime(path) and discovery.is_static_cudart(path):
                    self._probe_new(path, pid, notice_ns, why + ", " + WHY_STATIC, m)
                    continue
            except Exception as err:  # (a thread of its own: its error is said, not raised)
                self.log("not probed: %s: %s" % (path, err))
            with self._lock:
                self._forget_mappers(maps_key(m))  # (not a file probed here)

    def idle(self, timeout: float = 10.0) -> bool:
        """Wait until the checker has looked at everything handed to it so far (tests)."""
        done = threading.Event()
        self._checks.put(_Mark(done))
        return done.wait(timeout)

    def _probe(self, path: str, pid: int, notice_ns: Optional[int], why: str,
               key: Optional[Identity] = None,
               m: Optional[discovery.Mapping] = None) -> Optional[str]:
        """Probe the file at `path` (process `pid` maps it at `m`); the path the session
        probed it at, or None."""
        try:
            target = find_targets(self.selected, [path], None, (), self.log)[0]
            other = self.paths.get(target.path, key)
            if self.detach is not None and other != key and m is not None:
                # Another file is probed at that path (one replaced since, still mapped by
                # its processes): this one through the process's own mapping, so that
                # each file's probes come off alone.
                mapped = "/proc/%d/map_files/%x-%x" % (pid, m.start, m.end)
                if identity(mapped) != key:
                    raise _MappingGone("%s: another file is probed at that path, and process "
                                       "%d maps it at %x-%x no more" % (path, pid, m.start,
                                                                        m.end))
                target = find_targets(self.selected, [mapped], None, (), self.log)[0]
        except NoCudaSymbolsError:
            return None
        except TracerError as err:
            self.log("not probed: %s" % err)
            return None
        try:
            if not self.probe(target, self.watch.pid):
                return None
        except TracerError as err:  # (a program the verifier refused: the reader goes on)
            self.log("not probed: %s: %s" % (target.path, err))
            return None
        functions = len({a.name for a, _, _ in target.functions})
        if not notice_ns:  # (-d: mapped before the start, under a name the search missed)
            self.log("probed: %s (%d functions), mapped by process %d" % (target.path,
                                                                        functions, pid))
            return target.path
        after = (time.monotonic_ns() - notice_ns) / 1e6
        self.late.append((target.path, pid, after))
        self.reasons[target.path] = why
        self.log("probed late: %s (%d functions), mapped by process %d after the trace "
                 "began (%s); probes on %.1f ms after its %s notice"
                 % (target.path, functions, pid, why, after,
                    "exec's" if why.startswith(WHY_EXEC) else "loader's"))
        return target.path

    # -- files no process maps any more (the monitor) ----------------------------------------

    def sweep(self, known: Iterable[int] = ()) -> List[str]:
        """Detach the files probed here that no process maps any more; their paths. A file
        is looked for in the maps of the pids seen mapping it (until one still does; the
        others only checked to be alive), then, when none does, in those of `known` (the
        processes the monitor saw calling: one that inherited the mapping by a fork). A
        file detached is forgotten: its next mapping probes it again. Called by the thread
        that reads the notices (SystemWatch), so that no scan runs meanwhile."""
        if self.detach is None:
            return []
        known = list(known)
        with self._lock:
            files = [(mkey, key, path, set(self.mappers.get(mkey, ())))
                     for mkey, (key, path) in self.files.items()]
        texts: Dict[int, Optional[bytes]] = {}

        def maps_of(pid: int) -> Optional[bytes]:  # (each process's read once a sweep)
            if pid not in texts:
                try:
                    with open("/proc/%d/maps" % pid, "rb") as stream:
                        texts[pid] = stream.read()
                except OSError:
                    texts[pid] = None
            return texts[pid]

        unmapped = []
        for mkey, key, path, pids in files:
            tag = b" %s %s " % mkey
            kept: Set[int] = set()
            holder = None
            for pid in pids:
                if holder is None:
                    if tag in (maps_of(pid) or b""):
                        holder = pid
                        kept.add(pid)
                elif os.path.exists("/proc/%d" % pid):
                    kept.add(pid)  # (alive: looked at when the holder has gone)
            if holder is None:
                holder = next((pid for pid in known if tag in (maps_of(pid) or b"")), None)
                if holder is not None:
                    kept.add(holder)
            with self._lock:  # (and those noted since the copy, if any)
                self.mappers[mkey] = kept | (self.mappers.get(mkey, set()) - pids)
            if holder is None:
                unmapped.append((mkey, key, path))
        for mkey, key, path in unmapped:
            links = self.detach(path)
            with self._lock:
                del self.files[mkey]
                self.mappers.pop(mkey, None)
                self.probed.discard(key)
                self.paths.pop(path, None)
                self.examined.discard(mkey)
            self.detached += 1
            self.log("detached: %s (probed after the start; no process maps it any more: "
                     "%d links closed; probed again when one maps it)" % (path, links))
        return [path for _, _, path in unmapped]

    def close(self) -> None:
        self._checks.put(None)
        self._checker.join(CHECKER_JOIN_S)  # (a daemon: one still reading is let go)
        self.watch.close()


class _MappingGone(Exception):
    """The mapping a file was to be probed through has gone from its process: unmapped, or
    remapped by a dynamic loader still at work (a scan on an exec notice can read the maps
    while the loader maps a library: its first mapping spans the whole file, then the
    segments are mapped over it). The loader's notice when it is done looks again."""


class _Mark:
    """A point in the checker's queue: set once everything before it was looked at."""

    def __init__(self, done: threading.Event) -> None:
        self.done = done


# -- the whole machine (the monitor) ----------------------------------------------------------

class SystemWatch:
    """The CUDA files any process of the machine maps after the start, probed as they come
    (`ebpf-cuda monitor`): the loader program, without a pid filter, on every distinct
    dynamic loader the processes use (the host's, those of containers, through
    /proc/PID/root), and an exec notice of every exec (execs.ExecNotices) that has the
    program's loader watched when it is new and the program checked (its executable may
    carry the runtime statically). The notices go to a small ring of their own, read by a
    thread of its own: a process that is not CUDA's never reaches the session's reader
    (names, containers, the monitor's processes), and nothing changes per CUDA call.

    `late_loads(ring, traced)` makes the LateLoads (Session.late_loads_everywhere); its
    `late` and `reasons` say what was probed late. Without the exec tracepoint, loaders met
    later are not watched and programs are checked only when their loader tells. Every
    `sweep_every` seconds the thread detaches the files it probed that no process maps any
    more (LateLoads.sweep; `known()`: the processes the monitor saw calling)."""

    def __init__(self, late_loads: Callable[[Any, Callable[[], Iterable[int]]], LateLoads],
                 pid_ns: Optional[Tuple[int, int]], log: Log,
                 known: Callable[[], Iterable[int]] = tuple) -> None:
        from .execs import ExecNotices
        from ..bpf.maps import RingBufMap
        from ..bpf.ringbuf import RingBuffer

        self.log = log
        self.known = known
        self.sweep_every = DETACH_CHECK_S
        self._swept = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.execs: Optional[ExecNotices] = None
        self.late: Optional[LateLoads] = None
        self.ring_map = RingBufMap(NOTICE_RING_SIZE, name="notices")
        self.ring = RingBuffer.from_map(self.ring_map)
        try:
            self.late = late_loads(self.ring_map, all_pids)
            try:
                self.execs = ExecNotices({layout.EVENTS: self.ring_map,
                                          LOST: self.late.watch.lost}, pid_ns)
            except TracerError as err:
                log("execs are not told of (loaders that appear later are not watched, "
                    "programs that carry the runtime statically not checked): %s" % err)
            self._watch_running()
            self._thread = threading.Thread(target=self._read, name="ebpf-cuda notices",
                                            daemon=True)
            self._thread.start()
        except BaseException:
            self.close()
            raise

    def _watch_running(self) -> None:
        """The loaders of the processes running now (and this process's own), then what
        they map that the start-up search did not name: renamed copies of the libraries
        (libcudart-1a2b3c4d.so.12), runtimes carried statically (on the checker thread)."""
        assert self.late is not None
        loader = own_loader()
        if loader:
            self.late.watch_loaders([loader])
        own = os.getpid()
        for pid in all_pids():
            try:
                lines = maps_lines(pid)
            except ProcessError:
                continue  # (gone, or a kernel thread)
            self.late.watch_loader_of(pid, lines)
            if pid != own:
                self.late.scan(pid, None, WHY_RUNNING, lines)

    def _read(self) -> None:
        """The notices' reader: each batch to LateLoads.note (it looks at lost notices too,
        so it is called when nothing came)."""
        assert self.late is not None
        while not self._stop.is_set():
            frames = b""
            if self.ring.poll(min(NOTICE_POLL_S, self.sweep_every)):
                frames = self.ring.drain_frames(record.SIZE)
            try:
                self.late.note(frames)
                if time.monotonic() - self._swept >= self.sweep_every:
                    self._swept = time.monotonic()
                    if self.ring.available() > 0:  # (the mappers told of so far, first)
                        self.late.note(self.ring.drain_frames(record.SIZE))
                    self.late.sweep(self.known())
            except Exception as err:  # (a thread of its own: said, and it reads on)
                self.log("late loads: %s" % err)

    def counts(self) -> Tuple[int, int]:
        """(files probed after the start whose probes are on, files detached so far)."""
        if self.late is None:
            return (0, 0)
        return (len(self.late.files), self.late.detached)

    def lost(self) -> int:
        """Notices the full ring could not take, in all (its reader scans every process
        again when some were)."""
        return sum(self.late.watch.lost[0]) if self.late is not None else 0

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(NOTICE_POLL_S * 4 + CHECKER_JOIN_S)
            self._thread = None
        if self.execs is not None:
            self.execs.close()
            self.execs = None
        if self.late is not None:
            self.late.close()
            self.late = None
        self.ring.close(drain=False)
        self.ring_map.close()


def all_pids() -> List[int]:
    """Every process of the machine (as this /proc numbers them)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]
