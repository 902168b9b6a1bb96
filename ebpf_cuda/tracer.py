"""The public `Tracer`: finds the files, loads the probes, attaches them, reads events.

    with Tracer(command=["./app"]) as tracer:
        for event in tracer.events():
            print(event.api, event.phase, event.args)

It never prints, exits or installs signal handlers; progress notes go to `log` if given.
"""
import os
import queue
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import (Callable, Dict, Hashable, Iterator, List, NamedTuple, Optional, Sequence, Set,
                    Tuple)

from . import aggregates, apis, discovery, probes, record
from .apis import Api
from .arch import current as current_arch
from .elf import open_elf
from .errors import AttachError, KernelError, NoCudaSymbolsError, TracerError, UsageError
from .events import Decoder, Event
from .maps import (HashMap, LruHashMap, PerCpuArrayMap, RingBufMap, StackTraceMap,
                   TaskStorageMap)
from .programs import EXPECTED_UPROBE_MULTI, Program
from .ringbuf import RingBuffer
from .follow import FOLLOWED_MAP, ProcessFollower, followed_map
from .uprobe import Link, attach_uprobe, attach_uprobe_multi, uprobe_multi_supported

DEFAULT_RING_SIZE = 4 << 20  # 4 MiB (data pages mapped once): ~26k records, ~50 ms of a 500k/s stream
INFLIGHT_ENTRIES = 16384  # concurrent calls in flight, all threads together (LRU)
NAME_ENTRIES = 16384  # kernel names learned from cuModuleGetFunction & co.
STACK_ENTRIES = 16384  # distinct user stacks kept with --stacks
NAMED_CATEGORIES = ("module",)  # rows that always emit (see `emit`): they teach names
BATCH_RECORDS = 2048  # records handed over at once (330 KB): bounds the memory of a batch
WAKEUP_FRACTION = 8  # the probes wake the reader when 1/8 of the ring is waiting
POLL_INTERVAL_S = 0.05  # otherwise the reader looks every 50 ms (and checks the target)


class Attachment(NamedTuple):
    """One function probed in one file."""

    path: str
    api: str
    symbol: str
    offset: int
    retprobe: bool


@dataclass
class Target:
    """A file to probe and the (api, symbol, offset) entries found in it."""

    path: str
    functions: List[Tuple[Api, str, int]] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)


class Tracer:
    """Traces CUDA calls of one process (`pid`), of a command it starts (`command`), or of
    every process using the probed files.

    `functions`: glob patterns of function names (default: the table's default set, or
    every row with `everything`); `api`: "runtime", "driver" or "all" (both);
    `library`: files to probe (default: found from the pid, the command or the usual places);
    `follow_children`: with a command, also trace the processes it starts (the kernel keeps
    the set of followed processes, see follow.py; without it the kernel filters on the
    command's PID).
    `return_probes=False` attaches entry probes only (enter events, no durations);
    `entries=True` also emits an enter record at entry (for calls that block for long);
    `stacks=True` captures the user call stack of memory calls (see `stack()`);
    `aggregate=True` sums calls up in the kernel (see `aggregates()`), and with `emit=False`
    no per-call records are written at all (the cheapest way to get a summary).
    """

    def __init__(self, functions: Optional[Sequence[str]] = None,
                 library: Optional[Sequence[str]] = None, pid: Optional[int] = None,
                 command: Optional[Sequence[str]] = None, api: str = "all",
                 everything: bool = False, follow_children: bool = True,
                 return_probes: bool = True,
                 entries: bool = False, ring_size: int = DEFAULT_RING_SIZE,
                 stacks: bool = False, aggregate: bool = False, emit: bool = True,
                 log: Optional[Callable[[str], None]] = None) -> None:
        if pid is not None and command:
            raise UsageError("give either a PID or a command, not both")
        if api not in ("all", apis.RUNTIME, apis.DRIVER):
            raise UsageError("--api must be runtime, driver or all, not %r" % api)
        self.apis = _select(functions, api, everything)
        self._default_set = not functions and not everything
        self.api = api
        self.follow_children = follow_children
        self._follower: Optional[ProcessFollower] = None
        self.library = list(library or [])
        self.pid = pid
        self.command = list(command or [])
        self.return_probes = return_probes
        self.entries = entries
        self.ring_size = _check_ring_size(ring_size)
        self.stacks = stacks
        self.aggregate = aggregate
        self.emit = emit
        if not emit and not (aggregate and return_probes):
            raise UsageError("without event records, in-kernel aggregation (with return "
                             "probes) is the only output")
        # With emit=False, the calls that teach kernel names still write records (few; the
        # names must be learned while their process lives); launches are counted in the kernel.
        self.log = log or (lambda message: None)
        self.targets: List[Target] = []
        self.attachments: List[Attachment] = []
        self.failures: List[str] = []
        self.programs: Dict[Tuple[str, bool], Program] = {}
        self.exit_status: Optional[int] = None
        self._links: List[Link] = []
        self._maps: Dict[str, object] = {}
        self._ring: Optional[RingBuffer] = None
        self._decoder: Optional[Decoder] = None
        self._child: Optional[int] = None
        self._release_fd: Optional[int] = None
        self._stopping = False
        self._started = False

    # -- set-up ----------------------------------------------------------------------------

    def start(self) -> "Tracer":
        """Find files, load and attach every probe; a command is started but held until
        `run()` (or the first `events()` call), so that its first call is seen."""
        if self._started:
            return self
        self._started = True
        try:
            if self.pid is not None:
                discovery.process_mappings(self.pid)  # ProcessError for a dead PID
            self.targets = self._find_targets()
            if self._default_set:
                self._launch_at_driver_only()
            self._create_maps()
            self._log_targets()
            # Probes go on as their programs load, unless they must be filtered on the pid
            # of a command not forked yet (--no-follow).
            early = not (self.command and not self.follow_children)
            self._load_programs(attach=early)  # and start the follower meanwhile
            if self.command:
                self._fork_command()
            if not early:
                self._attach_all(self._child)
            if not self._links:
                raise AttachError("no probe could be attached: %s" % "; ".join(self.failures))
            self._ring = RingBuffer(self._maps[probes.EVENTS_MAP].fd, self.ring_size)
            self._decoder = Decoder(self.apis_table, names=self._learned_name)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def apis_table(self) -> Sequence[Api]:
        return apis.TABLE

    @staticmethod
    def fn_ids(categories: Sequence[str]) -> Set[int]:
        """Record function ids of the table rows in these categories."""
        return {i for i, api in enumerate(apis.TABLE) if api.category in categories}

    def _find_targets(self) -> List[Target]:
        paths = self._target_paths()
        targets = []
        for path in paths:
            elf = open_elf(path)
            symbols = [s for api in self.apis for s in api.symbols]
            target = Target(os.path.realpath(path))
            defined = elf.has_any(symbols)
            for api in self.apis:
                found = [s for s in api.symbols if s in defined]
                if not found:
                    target.missing.append(api.name)
                for symbol in found:
                    target.functions.append((api, symbol, elf.symbol_offset(symbol)))
            if target.functions:
                targets.append(target)
            else:
                self.log("%s: none of the selected functions, skipped" % path)
        if not targets:
            raise NoCudaSymbolsError("none of the %d selected functions is defined in %s"
                                     % (len(self.apis), ", ".join(paths)))
        return targets

    def _launch_at_driver_only(self) -> None:
        """Default set, both layers: when the driver's launch functions are probed, the
        runtime's are not. The driver sees every launch (also those of libraries with their
        own static runtime) and names it from the handles it learned; probing the runtime's
        launch too would add two probe hits to each launch, the costliest call of a real
        workload. Name them (--functions) or use --all to see them anyway."""
        if not any(api.library == apis.DRIVER and api.category == "launch"
                   for target in self.targets for api, _, _ in target.functions):
            return
        for target in self.targets:
            target.functions = [f for f in target.functions if not apis.driver_replaces(f[0])]
        self.targets = [target for target in self.targets if target.functions]
        self.log("launches are probed in the driver only (the runtime's launch functions: "
                 "with --all or --functions)")

    def _target_paths(self) -> List[str]:
        if self.library:
            return self.library
        libraries = [kind for kind in (apis.RUNTIME, apis.DRIVER)
                     if any(a.library == kind for a in self.apis)]
        found: List[str] = []
        for kind in libraries:
            paths = self._find_library(kind)
            if not paths:
                self.log("no CUDA %s library found; %s calls are not traced" % (kind, kind))
            found += [p for p in paths if p not in found]
        if not found:
            raise TracerError("no CUDA library (libcudart or libcuda) found for %s; name one "
                              "with -p PATH" % self._where())
        return found

    def _where(self) -> str:
        if self.pid is not None:
            return "process %d" % self.pid
        if self.command:
            return "command %s" % self.command[0]
        return "this machine"

    def _find_library(self, kind: str) -> List[str]:
        """Runtime or driver library files for the target: those a process has mapped (else
        those it would find: a probe on a file applies to every process mapping it later)."""
        driver = kind == apis.DRIVER
        if self.pid is not None:
            found = (discovery.driver_libraries_in_process(self.pid) if driver
                     else discovery.libraries_in_process(self.pid))
            if found:
                return found
        elif self.command:
            return (discovery.driver_library_for_command(self.command) if driver
                    else discovery.libraries_for_command(self.command))
        found = discovery.find_driver_library() if driver else discovery.find_library()
        return found[:1] if driver else found

    def _create_maps(self) -> None:
        self._maps[probes.EVENTS_MAP] = RingBufMap(self.ring_size, name="events")
        self._maps.update(self._inflight_map())
        if self.stacks:
            self._maps[probes.STACKS_MAP] = StackTraceMap(STACK_ENTRIES, name="stacks")
        self._maps[probes.NAMES_MAP] = LruHashMap(probes.NAME_KEY_SIZE, probes.NAME_SIZE,
                                                  NAME_ENTRIES, name="names")
        self._maps[probes.SCRATCH_MAP] = PerCpuArrayMap(
            probes.NAME_KEY_SIZE + probes.NAME_SIZE, 1, name="scratch")
        if self.aggregate:
            self._maps[aggregates.AGG_MAP] = PerCpuArrayMap(
                aggregates.AGG_VALUE.size, aggregates.agg_entries(), name="agg",
                value_struct=aggregates.AGG_VALUE)
            self._maps[aggregates.ERRORS_MAP] = HashMap(
                aggregates.ERROR_KEY.size, 8, aggregates.ERROR_ENTRIES, name="errors")
            self._maps[aggregates.LAUNCHES_MAP] = HashMap(
                aggregates.LAUNCH_KEY.size, aggregates.LAUNCH_VALUE.size,
                aggregates.LAUNCH_ENTRIES, name="launches")
        if self.command and self.follow_children:
            self._maps[FOLLOWED_MAP] = followed_map()  # kept up to date by the follower
        self._maps[probes.STATS_MAP] = PerCpuArrayMap(8, record.STAT_COUNT, name="stats",
                                                         value_struct=struct.Struct("<Q"))

    def _inflight_map(self) -> Dict[str, object]:
        """Where entries wait for their return: task-local storage when the kernel has it
        (and its own BTF), else an LRU hash map."""
        try:
            return {probes.TASKS_MAP: TaskStorageMap(record.TASK_VALUE_SIZE, name="tasks")}
        except KernelError as err:
            self.log("no task storage (%s): calls in flight go to a hash map" % err)
            return {probes.INFLIGHT_MAP: LruHashMap(
                record.INFLIGHT_KEY.size, record.INFLIGHT_VALUE_SIZE, INFLIGHT_ENTRIES,
                name="inflight")}

    def _load_programs(self, attach: bool) -> None:
        """Start the follower, then generate the programs and load them, each as soon as it
        is generated (the verifier runs in a worker thread without the GIL, so it overlaps
        the generation of the next one). With `attach`, each program's probes are attached
        once it is loaded, with the pid filter `self.pid` (the kernel's first uprobe
        registration waits for an RCU grace period: it overlaps the verifier too)."""
        if FOLLOWED_MAP in self._maps:
            self._follower = self._start_follower()
        with _Workers(min(os.cpu_count() or 2, 16)) as pool:
            loads = [(program, pool.submit(Program.load, program))
                     for program in self._generate_programs()]
            groups_of = {}  # type: Dict[int, list]  # program -> its (file, sites) links
            for group in self._link_groups() if attach else []:
                groups_of.setdefault(id(group[0]), []).append(group)
            for program, load in loads:
                load.result()  # the first error, if any (the others finish first)
                for group in groups_of.get(id(program), []):
                    self._attach(*group, pid=self.pid)

    def _generate_programs(self) -> Iterator[Program]:
        """Fill `self.programs` (by function and probe kind); yield each new program."""
        maps = dict(self._maps)
        plain = probes.ProbeOptions(stash=self.return_probes, emit_entry=self.entries,
                                    emit=self.emit, aggregate=self.aggregate,
                                    follow=FOLLOWED_MAP in self._maps,
                                    task_storage=probes.TASKS_MAP in self._maps,
                                    wakeup_bytes=self.ring_size // WAKEUP_FRACTION)
        with_stack = plain._replace(stacks=True)
        arch = current_arch()
        attach_type = EXPECTED_UPROBE_MULTI if uprobe_multi_supported() else 0
        wanted = {api.name for target in self.targets for api, _, _ in target.functions}
        # With uprobe_multi links each probe carries its function's id as attach cookie, so
        # functions of one shape share their programs: fewer programs to verify at start.
        shared = attach_type == EXPECTED_UPROBE_MULTI
        loaded: Dict[Hashable, Program] = {}
        for fn_id, api in enumerate(apis.TABLE):
            if api.name not in wanted:
                continue
            kinds = [(False, probes.entry_program)]
            if self.return_probes:
                kinds.append((True, probes.return_program))
            options = with_stack if self.stacks and api.category == "memory" else plain
            if api.category in NAMED_CATEGORIES:
                # Their process must still live when they are read: no waiting to batch.
                options = options._replace(emit=True, wake_now=True)
            for retprobe, generate in kinds:
                key = ((probes.shape_of(api, retprobe, arch, options.aggregate), options,
                        retprobe) if shared else (fn_id, retprobe))
                if key not in loaded:
                    number = len(loaded) if shared else fn_id
                    loaded[key] = Program(
                        generate(api, probes.FROM_COOKIE if shared else fn_id, arch, options),
                        maps, name=probes.program_name(number, retprobe, shared),
                        expected_attach_type=attach_type)
                    yield loaded[key]
                self.programs[(api.name, retprobe)] = loaded[key]

    def _log_targets(self) -> None:
        for target in self.targets:
            self.log("probing %s (%d functions%s)" % (
                target.path, len({a.name for a, _, _ in target.functions}),
                ", %d not in it: %s" % (len(target.missing), " ".join(target.missing))
                if target.missing else ""))

    def _link_groups(self) -> List[Tuple[Program, str, List[Tuple[str, str, int]], bool]]:
        """(program, file, sites, retprobe) per program and file: one link each, a shared
        program taking all its functions' (function, symbol, offset) sites."""
        groups: Dict[Tuple[int, str], Tuple[Program, str, List[Tuple[str, str, int]], bool]] = {}
        for target in self.targets:
            for (api_name, retprobe), program in self.programs.items():
                sites = [(api.name, symbol, offset) for api, symbol, offset in target.functions
                         if api.name == api_name]
                if sites:
                    groups.setdefault((id(program), target.path),
                                      (program, target.path, [], retprobe))[2].extend(sites)
        return list(groups.values())

    def _attach_all(self, pid: Optional[int]) -> None:
        for group in self._link_groups():
            self._attach(*group, pid=pid)

    def _attach(self, program: Program, path: str, sites: List[Tuple[str, str, int]],
                retprobe: bool, pid: Optional[int]) -> None:
        """Attach `program` at (function, symbol, offset) sites of one file; uprobe_multi
        links carry each site's function id as cookie."""
        names = sorted({api_name for api_name, _, _ in sites})
        try:
            if uprobe_multi_supported():
                self._links.append(attach_uprobe_multi(
                    program, path, [off for _, _, off in sites],
                    cookies=[apis.FN_ID[api_name] for api_name, _, _ in sites],
                    retprobe=retprobe, pid=pid, what=", ".join(names)))
            else:
                for _, symbol, offset in sites:
                    self._links.append(attach_uprobe(program, path, offset, retprobe=retprobe,
                                                     pid=pid, what=symbol))
        except AttachError as err:
            self.failures.append(str(err))
            self.log("not traced: %s" % err)
            return
        for api_name, symbol, offset in sites:
            self.attachments.append(Attachment(path, api_name, symbol, offset, retprobe))
            self.log("  %s %s at 0x%x" % ("uretprobe" if retprobe else "uprobe   ", symbol,
                                           offset))

    def _start_follower(self) -> Optional[ProcessFollower]:
        """Follow the command's processes in the kernel; None (then only the command's own
        process is traced, and a warning says so) when the kernel's fork and exit
        tracepoints cannot be used."""
        try:
            return ProcessFollower(self._maps[FOLLOWED_MAP])
        except TracerError as err:
            self.failures.append("the processes the command starts are not traced: %s" % err)
            return None

    def _fork_command(self) -> None:
        """Start the command in a child that waits until the probes are attached."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: wait for the go, then exec
            try:
                os.close(write_fd)
                if os.read(read_fd, 1) != b"g":
                    os._exit(125)
                os.close(read_fd)
                os.execvp(self.command[0], self.command)
            except OSError as err:
                os.write(2, ("ebpf-cuda: cannot run %s: %s\n"
                             % (self.command[0], err.strerror)).encode())
            finally:
                os._exit(127)
        os.close(read_fd)
        self._child, self._release_fd = pid, write_fd
        if FOLLOWED_MAP in self._maps:  # (without the follower: this process alone)
            self._maps[FOLLOWED_MAP][pid] = 1

    def run(self) -> None:
        """Let a held command run (once)."""
        if self._release_fd is not None:
            os.write(self._release_fd, b"g")
            os.close(self._release_fd)
            self._release_fd = None

    # -- reading ---------------------------------------------------------------------------

    @property
    def child_pid(self) -> Optional[int]:
        """The PID of the started command."""
        return self._child

    def stop(self) -> None:
        """Ask `events()` to finish after draining what is already in the ring buffer.
        Safe to call from a signal handler."""
        self._stopping = True

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Events until the target ends, `stop()` is called or `timeout` seconds pass.
        Everything produced before the end is drained and yielded."""
        for frames in self.frames(timeout):
            yield from self.decoder.decode_frames(frames)

    def on_event(self, callback: Callable[[Event], None],
                 timeout: Optional[float] = None) -> None:
        """Call `callback` with each event until the end (as `events()`); returns then."""
        for event in self.events(timeout):
            callback(event)

    def frames(self, timeout: Optional[float] = None) -> Iterator[bytes]:
        """Like `events()`, but batches of raw ring frames (8-byte header + record each),
        for callers that save or count records without decoding them."""
        self.start()
        self.run()
        assert self._ring is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stopping and not self._target_gone():
            wait = POLL_INTERVAL_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    break
            if self._ring.poll(wait):  # (Python retries epoll_wait after a signal)
                yield from self._drain_frames()
        yield from self._drain_frames()

    def _drain_frames(self) -> Iterator[bytes]:
        assert self._ring is not None
        while True:
            frames = self._ring.drain_frames(record.SIZE, BATCH_RECORDS)
            if not frames:
                return
            yield frames

    @property
    def decoder(self) -> Decoder:
        """The decoder for this tracer's records (clock offset measured at start)."""
        self.start()
        assert self._decoder is not None
        return self._decoder

    def _target_gone(self) -> bool:
        if self._child is not None:
            if self.exit_status is None:
                pid, status = os.waitpid(self._child, os.WNOHANG)
                if pid == 0:
                    return False
                self.exit_status = _exit_code(status)
            return True
        if self.pid is not None:
            return not _alive(self.pid)
        return False

    def wait_command(self) -> Optional[int]:
        """Wait for a started command to end; its exit code (128+N when killed by signal N)."""
        if self._child is not None and self.exit_status is None:
            _, status = os.waitpid(self._child, 0)
            self.exit_status = _exit_code(status)
        return self.exit_status

    def stats(self) -> Dict[str, int]:
        """Counters kept by the probes, summed over CPUs: `lost` records (ring buffer full),
        `unpaired` returns (no entry seen)."""
        stats_map = self._maps.get(probes.STATS_MAP)
        if stats_map is None:
            return {"lost": 0, "unpaired": 0}
        def total(index: int) -> int:
            return sum(stats_map[index])  # type: ignore[index]

        return {"lost": total(record.STAT_RING_FULL), "unpaired": total(record.STAT_NO_ENTRY)}

    def _learned_name(self, pid: int, handle: int) -> Optional[str]:
        """The name the probes stored for (pid, handle), e.g. cuModuleGetFunction's."""
        names = self._maps.get(probes.NAMES_MAP)
        if names is None:
            return None
        raw = names.get(struct.pack("<QQ", pid, handle))  # type: ignore[attr-defined]
        if raw is None:
            return None
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or None

    def aggregates(self) -> aggregates.Aggregates:
        """The in-kernel aggregates so far (with `aggregate=True`)."""
        if not self.aggregate:
            raise UsageError("aggregates need Tracer(aggregate=True)")
        return aggregates.read_aggregates(self._maps[aggregates.AGG_MAP],
                                          self._maps[aggregates.ERRORS_MAP],
                                          self._maps[aggregates.LAUNCHES_MAP])

    def stack(self, stack_id: int) -> List[int]:
        """Return addresses (innermost first) of an event's `stack_id` (1 + map id); [] when
        there is none or stacks were not captured."""
        stacks = self._maps.get(probes.STACKS_MAP)
        if not stack_id or stacks is None:
            return []
        return stacks.addresses(stack_id - 1)  # type: ignore[attr-defined]

    @property
    def lost(self) -> int:
        """Records lost because the ring buffer was full."""
        return self.stats()["lost"]

    # -- tear-down -------------------------------------------------------------------------

    def close(self) -> None:
        """Detach every probe and free every kernel object (idempotent)."""
        _close_all(self._links)
        self._links = []
        if self._ring is not None:
            self._ring.close(drain=False)
            self._ring = None
        for program in self.programs.values():
            program.close()
        self.programs = {}
        if self._follower is not None:
            self._follower.close()
            self._follower = None
        for m in self._maps.values():
            m.close()  # type: ignore[attr-defined]
        self._maps = {}
        if self._release_fd is not None:  # a held command that never ran: let it go
            os.close(self._release_fd)
            self._release_fd = None

    def __enter__(self) -> "Tracer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _select(functions: Optional[Sequence[str]], api: str, everything: bool) -> List[Api]:
    try:
        return apis.select(functions, api, everything)
    except KeyError as err:
        import difflib

        close = difflib.get_close_matches(err.args[0], [a.name for a in apis.TABLE], n=3)
        hint = "did you mean %s? " % ", ".join(close) if close else ""
        raise UsageError("unknown function %s (%s--list-functions lists them)"
                         % (err.args[0], hint)) from None


def _close_all(links: List[Link]) -> None:
    """Detach links in parallel: each detach waits for the kernel's uprobe synchronisation
    (tens of milliseconds), so one at a time, 80 links take seconds."""
    if len(links) < 2:
        for link in links:
            link.close()
        return
    with _Workers(min(len(links), 64)) as pool:
        for job in [pool.submit(Link.close, link) for link in links]:
            job.result()


class _Job:
    """One call handed to `_Workers`; `result()` waits for it and raises what it raised."""

    def __init__(self, function: Callable, argument: object) -> None:
        self.function, self.argument = function, argument
        self.done = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self.function(self.argument)
        except BaseException as err:  # handed to the waiter
            self.error = err
        finally:
            self.done.set()

    def result(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


class _Workers:
    """A few threads running jobs in the order they come: program loads (the verifier runs
    without the GIL) and link closes. concurrent.futures would do, but its import (logging)
    alone costs ~14 ms of start-up."""

    def __init__(self, count: int) -> None:
        self._jobs = queue.SimpleQueue()  # of _Job, and None to stop a thread
        self._threads = [threading.Thread(target=self._work, daemon=True)
                         for _ in range(max(1, count))]
        for thread in self._threads:
            thread.start()

    def submit(self, function: Callable, argument: object) -> _Job:
        job = _Job(function, argument)
        self._jobs.put(job)
        return job

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job.run()

    def __enter__(self) -> "_Workers":
        return self

    def __exit__(self, *exc) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()


def _check_ring_size(size: int) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    if size < page or size & (size - 1):
        raise UsageError("the ring buffer size must be a power of two of at least %d bytes, "
                         "not %d" % (page, size))
    return size


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return os.path.exists("/proc/%d" % pid) and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
