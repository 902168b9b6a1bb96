"""Libraries a traced process maps after the trace began, probed as its dynamic loader tells.

The loader program (probes/loader.py) on each loader file the traced processes use writes a
loader notice into the events ring when a dlopen or dlclose is done. The reader (stream.py,
through Session.note_loads) hands each batch to `LateLoads.note`, which reads /proc/PID/maps
of the processes told of, finds the CUDA files they map that no probe covers yet (by (device,
inode) of a path that reaches the file the process maps: its own path, /proc/PID/root/...,
/proc/PID/map_files/...: targets/late_files.py), and attaches the session's probes to those
named as CUDA libraries; other new executable mappings go to a checker thread, which probes
those that carry the runtime statically (CuPy's extension modules, libnccl).

System-wide (the monitor, monitor/system_watch.py's `SystemWatch`), the loader program has no pid
filter, goes on every distinct loader file the machine's processes use, and writes into a ring
of its own with exec notices (execs.ExecNotices): an exec has the new program's loader
watched when no loader of that file is, then its executable and what it maps checked (by
(device, inode): a file looked at once is not read again; `Examined` bounds what is
remembered). The monitor's probes on a file probed after the start come off once no process
maps it (`LateLoads.sweep`): the pids seen mapping each such file (when their notices were
read) and the processes the monitor knows are looked at; the file is then forgotten, so that
a later mapping probes it again.

A uprobe handler cannot wait for the reader: calls the process makes between the mapping and
the attach (milliseconds, see docs/design.md) are not seen, and nothing can count them (no
probe is on the file yet). A notice the full ring could not take is counted (`loader_lost`);
the reader then scans every traced process again.
"""
import os
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .bpf.programs import Program
from .bpf.uprobe import Link, attach_uprobe
from .bpf.workers import close_all
from .decode.notices import NOTICE_EXEC, notices
from .errors import NoCudaSymbolsError, ProcessError, TracerError, UnsupportedKernelError
from .probes.loader import HOOK, LOST, loader_program, lost_map
from .spec import layout
from .spec.apis import Api
from .targets import discovery, procfs
from .targets.elf import open_elf
from .targets.late_files import (Examined, Identity, MapsKey, file_path, identity, maps_key,
                                 may_carry_runtime, new_mappings)
from .targets.loaders import loaders_for, r_debug_distance
from .targets.selection import Target, find_targets

# loaders_for is the session's to call (the loader files to watch): here too, so that the
# session's one import of this module reaches it.
__all__ = ["LateLoads", "LoaderWatch", "loaders_for"]

LOST_CHECK_S = 0.05  # how often the reader looks at the lost notices' count
CHECKER_JOIN_S = 1.0  # how long close() waits for the checker thread
Log = Callable[[str], None]


# -- the watch -----------------------------------------------------------------------------

class LoaderWatch:
    """The loader program and its links, one per distinct loader file (`watch`)."""

    def __init__(self, session_maps: Dict[str, Any], pid: Optional[int] = None,
                 log: Optional[Log] = None, pid_ns: Optional[Tuple[int, int]] = None) -> None:
        self.pid = pid  # the links' pid filter (-d PID, a command not followed)
        self.log = log or (lambda message: None)
        self.lost = lost_map()
        # The session's maps by name (the ring, the followed processes and what probes/calls.py's
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
        close_all(self.links)
        self.links = []
        self.program.close()
        self.lost.close()


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
            lines = procfs.maps_lines(pid)
            if self.watch_loader_of(pid, lines):
                lines = procfs.maps_lines(pid)
        except ProcessError:
            return  # (gone already: a short-lived program)
        self.scan(pid, notice_ns, WHY_EXEC, lines)

    def watch_loader_of(self, pid: int, lines: Sequence[bytes]) -> bool:
        """Put the loader program on process `pid`'s dynamic loader (`lines`: its maps)
        unless that file (by maps device and inode) was met before; True when it was
        put on now."""
        line = procfs.loader_line(pid, lines)
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
                lines = procfs.maps_lines(pid)
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
                texts[pid] = procfs.maps_text(pid)
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
                elif procfs.is_alive(pid):
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

