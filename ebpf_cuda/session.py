"""One tracing session's kernel objects: targets → maps → programs → links → ring buffer.

    session = Session(TraceConfig(command=["./app"]), log=print).start()
    ... session.ring, session.command.release(), session.stats() ...
    session.close()

It owns every file descriptor it opens and closes them all in `close()`, also when `start()`
fails half-way. Reading the ring and naming kernels is stream.py's job.
"""
import errno as errnos
import os
import sys
import threading
from typing import (TYPE_CHECKING, Callable, Dict, Hashable, Iterable, Iterator, List,
                    NamedTuple, Optional, Sequence, Set, Tuple)

from . import syscalls
from .arch import current as current_arch
from .bpf import features, kernel_btf, maps, tracepoints
from .bpf.maps import create_map
from .bpf.programs import EXPECTED_UPROBE_MULTI, Program
from .bpf.ringbuf import RingBuffer
from .bpf.uprobe import (PATHS, UPROBE_MULTI, Link, attach_path, attach_uprobe,
                         attach_uprobe_multi, pinned)
from .bpf.workers import Job, Workers, close_all, forked_closer
from .errors import AttachError, KernelError, TracerError, UnsupportedKernelError, UsageError
from .probes import calls, plan, pystack
from .probes.cache import ProgramCache
from .probes.execs import TRACEPOINT as EXEC_TRACEPOINT, ExecWatcher
from .probes.follow import GROUP_DEAD, TRACEPOINTS as FOLLOW_TRACEPOINTS, ProcessFollower
from .spec import apis, layout, record
from .spec.apis import Api
from .spec.config import TraceConfig
from .targets import discovery
from .targets.command import HeldCommand, alive
from .targets.selection import (Target, check_proc_is_ours, driver_launches, find_targets,
                                launch_at_driver_only)

if TYPE_CHECKING:  # (imported when used: --summary, the monitor; late loads: not with -p)
    from . import late_loads
    from .decode import aggregates as sums

# uprobe_multi errors that perf-event uprobes would meet too (no fallback for them)
_NOT_THE_LINK = (errnos.ESRCH, errnos.ENOENT, errnos.EBADF, errnos.EACCES)
Log = Callable[[str], None]
LOADING_SWITCH_S = 0.0002  # the GIL's switch interval while programs load (default 5 ms)


class Attachment(NamedTuple):
    """One function probed in one file."""

    path: str
    api: str
    symbol: str
    offset: int
    retprobe: bool


class Session:
    """The kernel objects of one trace (see the module's docstring)."""

    def __init__(self, options: TraceConfig, log: Optional[Log] = None) -> None:
        self.options = options.checked()
        self.selected: List[Api] = options.rows()
        self.log = log or options.log or (lambda message: None)
        self._verbose = (log or options.log) is not None  # (lines only it prints are made)
        self.targets: List[Target] = []
        self.maps: Dict[str, maps.Map] = {}
        self.programs: Dict[Tuple[str, bool], Program] = {}  # by (function, retprobe)
        self.attachments: List[Attachment] = []
        self.failures: List[str] = []  # what could not be probed or followed, in words
        self.command: Optional[HeldCommand] = None
        self.ring: Optional[RingBuffer] = None
        self._links: List[Link] = []
        self._no_return: Set[Tuple[str, str]] = set()  # (file, function): refused, no entry
        self._follower: Optional[ProcessFollower] = None
        self._execs: Optional[ExecWatcher] = None  # when each process exec'd (names.py)
        self._tracepoints: Optional[tracepoints.ReadAhead] = None  # theirs, read meanwhile
        self._started = False
        self._loaded: Dict[Hashable, Program] = {}  # programs by shape (or function) key
        self._cache = ProgramCache()  # the programs assembled by earlier starts
        # Libraries mapped after the start (late_loads.py); the lock keeps the reader's
        # late attaches and close() apart.
        self.late: Optional[late_loads.LateLoads] = None
        self.late_probed: List[Tuple[str, int, float]] = []  # (path, pid, ms): LateLoads.late
        self._late_links: Dict[str, List[Link]] = {}  # the links of each file probed late
        self._runtime_launches = True  # False: the driver's launch probes replace them
        self._lock = threading.RLock()
        self._closed = False
        self._name_lookup: Optional[syscalls.ElementLookup] = None  # (probe_name's)
        # Not the initial PID namespace: the probes use pids as this one numbers them.
        self.pid_ns = features.pid_namespace()
        # --py-stacks: where the kernel keeps a thread's thread pointer (kernel BTF)
        self.thread_pointer: Optional[int] = None
        if options.py_stacks:
            self.thread_pointer = kernel_btf.thread_pointer_offset()
            if self.thread_pointer is None:
                raise UnsupportedKernelError("--py-stacks needs the kernel's BTF (/sys/kernel/"
                                             "btf/vmlinux) to find task_struct.%s; this kernel "
                                             "has none" % ".".join(current_arch().thread_pointer))

    def start(self, meanwhile: Optional[Callable[[], None]] = None) -> "Session":
        """Find the files, create the maps, load and attach every program; a command is
        forked but held until `command.release()`, so that its first call is seen.
        `meanwhile` runs in this thread while the kernel verifies the programs."""
        if self._started:
            return self
        self._started = True
        o = self.options
        try:
            if o.pid is not None:
                check_proc_is_ours(o.pid)  # UsageError: /proc numbers another namespace's
                discovery.process_mappings(o.pid)  # ProcessError for a dead PID
            # (tracefs mounted privately by a child while the files are read)
            self._tracepoints = tracepoints.ReadAhead(FOLLOW_TRACEPOINTS + [EXEC_TRACEPOINT])
            self.targets = find_targets(self.selected, o.library, o.pid, o.command, self.log)
            if features.proc_warning() is not None:  # (a PID namespace with another's /proc)
                self.failures.append(features.proc_warning())
            # A running process (-d) made its driver handles before the trace began: its
            # runtime launches name them (names.py pairs the two); else the driver alone.
            if o.functions is None and not o.everything and o.pid is None:
                self._runtime_launches = not driver_launches(self.targets)
                self.targets = launch_at_driver_only(self.targets, self.log)
            self._create_maps()
            self._log_targets()
            # Probes go on as their programs load, unless they must be filtered on the pid
            # of a command not forked yet (--no-follow).
            early = not (o.command and not o.follow_children)
            self._load_programs(early, meanwhile)
            if o.command:
                self._fork_command()
            if not early:
                self._attach_all(self.command.pid if self.command else None)
            if not self._links:
                raise AttachError("no probe could be attached: %s" % "; ".join(self.failures))
            self._start_late_loads()
            self.ring = RingBuffer(self.maps[layout.EVENTS].fd, o.ring_size)
        except BaseException:
            self.close()
            raise
        return self

    # -- maps ------------------------------------------------------------------------------

    def _create_maps(self) -> None:
        o = self.options
        specs = layout.map_specs(o.ring_size, len(apis.TABLE), o.stacks, o.aggregate,
                                 o.follows, self.pid_ns is not None, o.per_process,
                                 launch_slots=plan.samples_returns(o, self.kernel_features()),
                                 process_slots=o.process_slots if o.per_process else 0)
        if o.py_stacks:
            specs += pystack.map_specs(max(o.ring_size // 2, 1 << 20))
        for spec in specs:
            if spec.name in _BY_TASK and layout.TASKS not in self.maps:
                continue  # (no task storage: plan.process_slots)
            try:
                self.maps[spec.name] = create_map(spec)
            except KernelError as err:
                if spec.name != layout.TASKS:
                    raise
                # No task-local storage (or no kernel BTF): calls in flight go to a hash map.
                self.log("no task storage (%s): calls in flight go to a hash map" % err)
                fallback = layout.inflight_fallback()
                self.maps[fallback.name] = create_map(fallback)

    # -- programs and links ----------------------------------------------------------------

    def _load_programs(self, attach: bool, meanwhile: Optional[Callable[[], None]]) -> None:
        """Start the follower and the exec watcher, then load the programs (from
        probes/cache.py, or generated one after the other) in worker threads: the verifier
        runs there without the GIL, while this thread runs `meanwhile`. With `attach`, each
        program's probes are attached once it is loaded (the kernel's first uprobe
        registration waits for an RCU grace period: it overlaps the verifier too). A worker
        back from the kernel waits for the GIL while this thread runs Python: at most the
        switch interval, short while they share it."""
        if self._tracepoints is not None:
            self._tracepoints.wait()
        # (before the programs: a tracepoint's attach waited 10-200 ms behind verifiers busy
        # on both CPUs of a loaded 2-core VM; in a thread of its own beside them a start
        # took ~10 ms longer on a quiet one)
        if layout.FOLLOWED in self.maps:
            self._follower = self._start_follower()
        self._execs = self._start_exec_watcher()
        workers = min(os.cpu_count() or 2, 16)
        switch = sys.getswitchinterval()
        sys.setswitchinterval(LOADING_SWITCH_S)
        try:
            with Workers(workers) as pool:
                loads = []
                for program in self._generate_programs():
                    made = bool(program.instructions)  # (not read from the cache)
                    program.code  # (assembled here: its instruction list freed now)
                    loads.append((program, pool.submit(Program.load, program)))
                    if made and len(loads) > 2 * workers:  # (made no faster than verified)
                        loads[-2 * workers - 1][1].done.wait()
                if meanwhile is not None:
                    meanwhile()
                self._attach_loaded(loads, attach)
        finally:
            sys.setswitchinterval(switch)
        self._cache.save()  # (what this start had to make: the next one reads it)

    def _attach_loaded(self, loads: List[Tuple[Program, Job]], attach: bool) -> None:
        """Wait for each load; attach each program's links (`attach`), return probes first."""
        groups_of: Dict[int, list] = {}  # program -> its (file, sites) links
        for group in self._link_groups() if attach else []:
            groups_of.setdefault(id(group[0]), []).append(group)
        with pinned([t.path for t in self.targets] if attach else []) as through:
            entries = []  # (attached once every return probe is: _link_groups says why)
            for program, load in loads:
                load.result()  # the first error, if any (the others finish first)
                for group in groups_of.get(id(program), []):
                    if group[3]:
                        self._attach(*group, pid=self.options.pid, at=through[group[1]])
                    else:
                        entries.append(group)
            for group in entries:
                self._attach(*group, pid=self.options.pid, at=through[group[1]])

    def _generate_programs(self) -> Iterator[Program]:
        """Fill `self.programs` (by function and probe kind); yield each new program."""
        path = attach_path()  # what this kernel was found to take, not its version
        if self._verbose:  # (the report probes the kernel: ~100 ms for a line)
            self.log(features.report())
        self.log("attach path: %s" % PATHS[path])
        if self._follower is not None:
            self.log("following the command's processes: a process is forgotten %s" % (
                "when its last thread exits (sched_process_exit's group_dead)"
                if self._follower.exit_rule == GROUP_DEAD else
                "when its leader thread exits (this kernel's sched_process_exit has no "
                "group_dead)"))
        if self.options.return_probes:
            hazard = features.return_probe_hazard(self.options.pid, bool(self.options.command))
            if hazard is not None and (self.options.pid is not None or self.options.command):
                raise UnsupportedKernelError(hazard)
            if hazard is not None:
                self.failures.append(hazard)
        return self._programs_for({api.name for target in self.targets
                                   for api, _, _ in target.functions})

    def _programs_for(self, wanted: Set[str]) -> Iterator[Program]:
        """Fill `self.programs` for the functions named `wanted`; yield each new program
        (also for a library mapped after the start, whose functions may be new). Which
        program each function gets is plan.py's to say; programs already loaded are shared
        (by their plan key)."""
        arch = current_arch()
        rows = [api for api in apis.TABLE if api.name in wanted]
        for spec in plan.programs_for(rows, self.options, self.kernel_features()):
            program = self._loaded.get(spec.key)
            if program is None:
                program = self._loaded[spec.key] = self._cache.program(
                    spec, arch, self.maps, spec.name(len(self._loaded)))
                yield program
            for name in spec.functions:
                self.programs[(name, spec.retprobe)] = program

    def kernel_features(self) -> plan.Features:
        """What this kernel takes, as the program plan needs it (task storage: as the maps
        were made)."""
        multi = attach_path() == UPROBE_MULTI
        kfunc = (features.session_is_return_id() if plan.may_sample_returns(self.options, multi)
                 else None)  # (a search of the kernel's BTF: only for a mode that uses it)
        tasks = layout.TASKS in self.maps
        return plan.Features(current_arch(), multi, tasks, kfunc, self.pid_ns,
                             self.thread_pointer, features.task_fields() if tasks else None)

    def probe_options(self, api: Api) -> calls.ProbeOptions:
        """What the programs of `api` do (plan.probe_options)."""
        return plan.probe_options(api, self.options, self.kernel_features())

    def sampled_returns(self) -> List[str]:
        """The functions whose programs are uprobe sessions sampling their returns."""
        return sorted(name for (name, _), program in list(self.programs.items())
                      if program.expected_attach_type == features.BPF_TRACE_UPROBE_SESSION)

    def _log_targets(self, targets: Optional[Sequence[Target]] = None) -> None:
        for target in self.targets if targets is None else targets:
            self.log("probing %s (%d functions%s)" % (
                target.path, len({a.name for a, _, _ in target.functions}),
                ", %d not in it: %s" % (len(target.missing), " ".join(target.missing))
                if target.missing else ""))

    def _link_groups(self, targets: Optional[Sequence[Target]] = None
                     ) -> List[Tuple[Program, str, List[Tuple[str, str, int]], bool]]:
        """(program, file, sites, retprobe) per program and file (of `targets`, else of the
        session's): one link each, a shared program taking all its functions' (function,
        symbol, offset) sites. Return probes first: an entry stashed before its return
        probe was on stays on its thread's stack, where a launch's entry takes it for its
        twin's (probes/inflight.py): the runtime's launches went unrecorded (GPU, -d)."""
        groups: Dict[Tuple[int, str], Tuple[Program, str, List[Tuple[str, str, int]], bool]] = {}
        for target in self.targets if targets is None else targets:
            by_name = target.sites_by_name()
            for (api_name, retprobe), program in self.programs.items():
                sites = by_name.get(api_name)
                if sites:
                    groups.setdefault((id(program), target.path),
                                      (program, target.path, [], retprobe))[2].extend(sites)
        return sorted(groups.values(), key=lambda group: not group[3])

    def _attach_all(self, pid: Optional[int]) -> None:
        with pinned([t.path for t in self.targets]) as through:
            for group in self._link_groups():
                self._attach(*group, pid=pid, at=through[group[1]])

    def _attach(self, program: Program, path: str, sites: List[Tuple[str, str, int]],
                retprobe: bool, pid: Optional[int], at: Optional[str] = None) -> None:
        """Attach `program` at (function, symbol, offset) sites of one file (uprobe_multi:
        function ids in cookies; refused, perf-event uprobes). `at`: the path the links are
        made through (a pinned descriptor of the file at `path`: see `_probe_late`)."""
        if not retprobe:  # (an entry without its return probe: see _link_groups)
            sites = [site for site in sites if (path, site[0]) not in self._no_return]
            if not sites:
                return
        names = sorted({api_name for api_name, _, _ in sites})
        through = at or path
        session = program.expected_attach_type == features.BPF_TRACE_UPROBE_SESSION
        shared = session or program.expected_attach_type == EXPECTED_UPROBE_MULTI
        try:
            multi = shared
            if multi:
                try:
                    self._links.append(attach_uprobe_multi(
                        program, through, [off for _, _, off in sites],
                        cookies=[plan.site_cookie(api_name, symbol, session)
                                 for api_name, symbol, _ in sites],
                        retprobe=retprobe, pid=pid, what=", ".join(names), session=session))
                except AttachError as err:
                    if err.errno in _NOT_THE_LINK or session:  # (sessions: no fallback)
                        raise
                    self.log("uprobe_multi link refused (%s): attaching perf-event uprobes "
                             "instead" % str(err).replace(through, path))
                    multi = False
            if not multi:
                for api_name, symbol, offset in sites:
                    self._links.append(attach_uprobe(
                        program, through, offset, retprobe=retprobe, pid=pid, what=symbol,
                        cookie=apis.FN_ID[api_name] if shared else 0))
        except AttachError as err:
            said = str(err).replace(through, path)  # (the file's name, not the descriptor's)
            self._no_return.update((path, name) for name in names if retprobe)
            self.failures.append(said)
            self.log("not traced: %s" % said)
            return
        for api_name, symbol, offset in sites:
            self.attachments.append(Attachment(path, api_name, symbol, offset, retprobe))
            self.log("  %s %s at 0x%x" % ("uprobe session, returns sampled 1 in %d:"
                                           % self.options.sample_returns if session else
                                           "uretprobe" if retprobe else "uprobe   ", symbol,
                                           offset))

    # -- libraries mapped later ------------------------------------------------------------

    def _start_late_loads(self) -> None:
        """Probe the CUDA libraries a traced process (-d PID, the command's) maps from now on,
        told by its dynamic loader (late_loads.py). Not for files named with -p, nor
        system-wide (there the start-up search is the whole story)."""
        o = self.options
        if o.library or (o.pid is None and self.command is None):
            return
        pid = o.pid if o.pid is not None else (
            None if layout.FOLLOWED in self.maps else self.command.pid)
        from . import late_loads
        try:
            self.late = late_loads.LateLoads(
                self.maps, pid, self.selected, self.targets, self._probe_late,
                self._traced_pids, self.log, self.pid_ns)
        except TracerError as err:
            self.failures.append("libraries mapped later are not probed: %s" % err)
            return
        self.late_probed = self.late.late  # (kept after close)
        self.late.watch_loaders(late_loads.loaders_for(o.pid, o.command))
        if o.pid is not None:  # what it maps already that the start-up search missed
            self.late.scan(o.pid)

    def late_loads_everywhere(self, notices: maps.Map,
                              traced: Callable[[], Iterable[int]]) -> "late_loads.LateLoads":
        """Probe the CUDA files any process maps from now on (the monitor: system_watch.py), no pid
        filter; notices go to the ring `notices`, read by the caller, which closes it first."""
        from . import late_loads
        late = late_loads.LateLoads(dict(self.maps, **{layout.EVENTS: notices}), None,
                                      self.selected, self.targets, self._probe_late, traced,
                                      self.log, self.pid_ns, detach=self.detach)
        self.late_probed = late.late
        return late

    def note_loads(self, frames: bytes) -> None:
        """The reader's hook for each batch: probe the files that loader notices announce."""
        with self._lock:
            if self.late is not None and not self._closed:
                self.late.note(frames)

    def _probe_late(self, target: Target, pid: Optional[int]) -> bool:
        """The session's probes on a file mapped after the start (programs loaded for the
        functions that no file of the start defined); False once closed, or when the file
        has none of the functions left. From the reader or late_loads' checker thread."""
        with self._lock:
            if self._closed:
                return False
            if not self._runtime_launches:
                target.functions = [f for f in target.functions
                                    if not apis.driver_replaces(f[0])]
            if not target.functions:
                return False
            for program in self._programs_for({api.name for api, _, _ in target.functions}):
                program.load()
            self.targets.append(target)
            self._log_targets([target])
            made = len(self._links)
            with pinned([target.path]) as through:
                for group in self._link_groups([target]):
                    self._attach(*group, pid=pid, at=through[target.path])
            self._late_links.setdefault(target.path, []).extend(self._links[made:])
            return True

    def detach(self, path: str) -> int:
        """Close the links of the file probed late at `path` (a target's path) and drop its
        attachments and target (the monitor, once no process maps it: late_loads.LateLoads
        .sweep); the number of links closed, 0 for a file not probed late (those of the
        start are never detached here) or a session closed. The aggregates stay (they are
        per function, not per file), and so do the programs (other files share them, and
        probing the file again reuses them)."""
        with self._lock:
            if self._closed or path not in self._late_links:
                return 0
            links = self._late_links.pop(path)
            close_all(links)  # (in parallel: each waits for a grace period of the kernel's)
            gone = {id(link) for link in links}
            self._links = [link for link in self._links if id(link) not in gone]
            self.attachments = [a for a in self.attachments if a.path != path]
            self.targets = [t for t in self.targets if t.path != path]
            return len(links)

    def _traced_pids(self) -> Iterable[int]:
        followed = self.maps.get(layout.FOLLOWED)
        if followed is not None:
            return [int(pid) for pid in followed.keys()]
        return [self.options.pid if self.options.pid is not None else self.command.pid]

    def _start_follower(self) -> Optional[ProcessFollower]:
        """Follow the command's processes in the kernel; None (then only the command's own
        process is traced, and a warning says so) when the kernel's fork and exit
        tracepoints cannot be used."""
        try:
            return ProcessFollower(self.maps[layout.FOLLOWED], self.maps.get(layout.FORKED),
                                   self.pid_ns)
        except TracerError as err:
            self.failures.append("the processes the command starts are not traced: %s" % err)
            return None

    def _start_exec_watcher(self) -> Optional[ExecWatcher]:
        """Keep the time of each exec (execs.py): launches are named from the program that
        made them. None when the exec tracepoint cannot be used."""
        try:
            return ExecWatcher(self.pid_ns, self.maps)
        except TracerError as err:
            self.failures.append("execs are not seen (kernel names may be those of the "
                                 "program a process ran before an exec): %s" % err)
            return None

    def exec_times(self, pid: int, known: int = 0) -> List[int]:
        """The kernel times of process `pid`'s execs after the first `known` (execs.py)."""
        return self._execs.times(pid, known) if self._execs is not None else []

    def _fork_command(self) -> None:
        self.command = HeldCommand(self.options.command)
        if layout.FOLLOWED in self.maps:  # (without the follower: this process alone)
            self.maps[layout.FOLLOWED][self.command.pid] = 1

    # -- what the probes kept --------------------------------------------------------------

    def stats(self) -> Dict[str, int]:
        """Counters kept by the probes, summed over CPUs: `lost` records (ring buffer full),
        `unpaired` returns (no entry seen: attached mid-call, or an entry dropped), `too_deep`
        calls lost because their entry could not be kept (nested too deep on a thread);
        `entries_lost`, entry records (--entries) lost; with --py-stacks `py_lost`, the stack
        and code object records lost."""
        stats_map = self.maps.get(layout.STATS)
        names = dict(_STAT_NAMES, **({"py_lost": record.STAT_PY_LOST} if self.options.py_stacks
                                     else {}))  # (stack and code records of --py-stacks)
        return {name: sum(stats_map[index]) if stats_map is not None else 0
                for name, index in names.items()}

    def children_left(self) -> List[int]:
        """The processes the command started that still live once it has ended (a job it
        put in the background): the kernel's followed set still holds them."""
        followed = self.maps.get(layout.FOLLOWED)
        if followed is None or self.command is None or self.command.exit_status is None:
            return []
        try:
            pids = [int(pid) for pid in followed.keys()]
        except (TracerError, OSError, TypeError, ValueError):
            return []
        return sorted(pid for pid in pids if pid != self.command.pid and alive(pid))

    def probe_name(self, pid: int, handle: int, when: int = 0) -> Optional[str]:
        """The name the probes stored for (pid, handle) at the call that returned at kernel
        time `when` (arguments.learn_name), taken out as it is read: the map holds only names
        not read yet (the oldest go when those fill it). None: none, or a chunk lost."""
        lookup = self._name_lookup
        if lookup is None:
            names = self.maps.get(layout.NAMES)
            if names is None:
                return None
            lookup = self._name_lookup = syscalls.ElementLookup(
                names.fd, layout.NAME_KEY_SIZE, layout.NAME_SIZE, take=True)
        chunks = []
        for k in range(layout.NAME_CHUNKS):  # chunk by chunk, until one ends the string
            key = layout.NAME_KEY.pack(pid | k << 32, handle, when)
            raw = lookup(key)
            if raw is None:
                return None  # (none stored, or a chunk let go: not a name cut short)
            chunk = raw.split(b"\0", 1)[0]
            chunks.append(chunk)
            if len(chunk) < layout.NAME_CHUNK:
                break
        return b"".join(chunks).decode("utf-8", "replace") or None

    def aggregates(self) -> "sums.Aggregates":
        """The in-kernel aggregates so far (with the `aggregate` option)."""
        if not self.options.aggregate:
            raise UsageError("aggregates need Tracer(aggregate=True)")
        from .decode import aggregates as sums

        return sums.read_aggregates(self.maps[layout.AGG], self.maps[layout.ERRORS],
                                          self.maps[layout.LAUNCHES],
                                          slots_map=self.maps.get(layout.LAUNCH_SLOTS))

    def stack(self, stack_id: int) -> List[int]:
        """Return addresses (innermost first) of an event's `stack_id` (1 + map id); [] when
        there is none or stacks were not captured."""
        stacks = self.maps.get(layout.STACKS)
        if not stack_id or stacks is None:
            return []
        return stacks.addresses(stack_id - 1)

    # -- tear-down -------------------------------------------------------------------------

    def close(self, wait: bool = True) -> None:
        """Detach every probe and free every kernel object (idempotent). Detaching waits
        for the kernel's grace periods (~0.1 s); with `wait=False` a forked child does it
        and this process returns at once (for a CLI that exits next: its exit would wait
        for the same detaches; the probes stay on until the child is done, their records
        read by nobody)."""
        go = forked_closer() if not wait and self._links else None
        if go == 0:  # the child: the parent has let go of every object, the detaches wait
            try:
                self._close_now()
            finally:
                os._exit(0)
        # The parent drops its references (one by one), then lets the child go: else its close
        # could be a link's last and wait for the detach (the race: exits of 40 or 240 ms).
        try:
            self._close_now(parallel=go is None)
        finally:
            if go is not None:
                os.close(go)

    def _close_now(self, parallel: bool = True) -> None:
        with self._lock:  # (after a late attach the reader is making, if any)
            self._closed = True
        if self._tracepoints is not None:
            self._tracepoints.wait()  # (a child still reading them: reaped)
        # The links and the follower's tracepoints detach in parallel: each waits for a
        # grace period of the kernel's.
        closing = self._links + [o for o in (self._follower, self._execs, self.late)
                                 if o is not None]
        if parallel:
            close_all(closing)
        else:
            for item in closing:
                item.close()
        self._links, self._follower, self._execs, self.late = [], None, None, None
        self._late_links = {}
        self._loaded = {}
        if self.ring is not None:
            self.ring.close(drain=False)
            self.ring = None
        for program in self.programs.values():
            program.close()
        self.programs = {}
        self._name_lookup = None  # (it holds the names map's descriptor number)
        for m in self.maps.values():
            m.close()
        self.maps = {}
        if self.command is not None:
            self.command.close()  # a held command that never ran: let it go

    def live_sums(self) -> "sums.LiveSums":
        """The in-kernel sums read again and again as they grow, and the entries of exited
        processes let go (with the `aggregate` option; see aggregates.LiveSums)."""
        if not self.options.aggregate:
            raise UsageError("aggregates need Tracer(aggregate=True)")
        from .decode import aggregates as sums

        return sums.LiveSums.of(self.maps)


_BY_TASK = (layout.PROCESS_OWNERS, layout.PROCESS_SUMS)  # (made after `tasks`: map_specs)
_STAT_NAMES = {"lost": record.STAT_RING_FULL, "unpaired": record.STAT_NO_ENTRY,
               "too_deep": record.STAT_INFLIGHT_FULL, "entries_lost": record.STAT_ENTRY_LOST}
