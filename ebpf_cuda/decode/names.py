"""The one store of kernel names in a trace.

A launch's `func` is either a code address (a runtime launch: the kernel's host stub) or a
handle (a driver launch's CUfunction, a CUDA 13 runtime launch's cudaKernel_t). Addresses are
named from the symbols of the file mapped there (targets/symbols.py's AddressResolver, from
a snapshot of /proc/PID/maps taken while the process lives); handles from what the calls that
create them taught (`learn`): cuModuleGetFunction & co. store the name string in the probes'
`names` map, __cudaGetKernel ties a cudaKernel_t to its stub, cuKernelGetFunction gives a
CUkernel's CUfunction the same name. Every output asks this store, so all of them show the
same names.

An exec replaces a process's program and keeps its pid: what was known of the process names
nothing after it. Everything is therefore kept per *image*, a process's program between two
execs: `image(pid, when)` is the pid in the low 32 bits and, above, the number of the
process's execs before kernel time `when` (0 before any; the times come from execs.py's
tracepoint, read at each batch). Each launch and teaching call is taken in by the image of
its record's time, so a launch recorded before an exec is named from the old program and one
after from the new one, however late the reader or the lines thread gets to it. The mappings
of an old image are kept as they were last read (its process shows another program now).
"""
from __future__ import annotations
import copy
import time
from bisect import bisect_right
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..spec import layout, record
from ..spec.apis import BY_NAME, Api, Kind
from ..targets.elf import demangle
from ..targets.registrations import launch_site_kernel
from ..targets.symbols import AddressResolver, Frame
from .events import EXIT, Event
from .name_store import PID_MASK, HandleNames

# fn_id, pid, tid, entry and exit time, func, caller (the return address, or 0)
Launch = Tuple[int, int, int, int, int, int, int]
HINT = "[kernel launched from %s]"  # what a launch site without its kernel's name shows
HINT_START = HINT.split("%")[0]
GONE = "gone"  # why a launch is unnamed: its program was replaced or ended, not yet read
STUB_PREFIX = "__device_stub__"  # nvcc's host stub of kernel _Z... is __device_stub__Z...
# (pid, handle, the teaching call's exit time) -> the name the probes stored at that call
ProbeNames = Callable[[int, int, int], Optional[str]]
ExecTimes = Callable[[int, int], List[int]]  # (pid, execs known) -> times of the later ones


def image_of(pid: int, generation: int) -> int:
    """The key of process `pid`'s program after its `generation`-th exec (see the module's
    docstring): the pid itself before any exec."""
    return pid | generation << 32


def generation(times: Sequence[int], when: Optional[int]) -> int:
    """How many of the exec `times` came before kernel time `when` (all: None, now)."""
    return len(times) if when is None else bisect_right(times, when)


def _takes_handle(api: Optional[Api]) -> bool:
    """True when a launch's `func` is a driver handle (CUfunction), not a code address (a
    driver graph kernel node's too)."""
    return api is not None and any((a.name == "func" and a.kind == Kind.HANDLE)
                                   or (api.driver and a.kind == Kind.KERNEL_NODE)
                                   for a in api.args)


class KernelNamer:
    """Kernel names of launches (see the module's docstring).

    `name_for(pid, api, func, when)` and `namer(event, func)` (the outputs' protocol) name a
    launch; `learn(events)` takes in what teaching calls say; `observe_frames` snapshots the
    mappings of the processes first seen in a batch and notes their execs. `probe_names`
    reads the probes' `names` map, `exec_times` the exec tracepoint's (execs.py). The tables
    are keyed by image (module docstring), not pid."""

    def __init__(self, probe_names: Optional[ProbeNames] = None,
                 resolver: Optional[AddressResolver] = None,
                 exec_times: Optional[ExecTimes] = None) -> None:
        self.resolver = resolver or AddressResolver()  # the processes' programs of now
        self.probe_names = probe_names
        self.exec_times = exec_times
        self.handles = HandleNames()  # (image, CUfunction/CUkernel) -> name
        self.stubs: Dict[Tuple[int, int], int] = {}  # (image, cudaKernel_t) -> stub address
        self._symbols: Dict[Tuple[int, int], Optional[str]] = {}  # (image, address) -> name
        self._found: Dict[Tuple[int, str, int], str] = {}  # name_for's answers (known ones)
        self._handle_apis: Dict[str, bool] = {}
        self._seen: Set[int] = set()
        self.execs: Dict[int, List[int]] = {}  # pid -> the times of its execs seen so far
        # pid -> the generation of the program whose mappings `resolver` has (-1: none)
        self._snapshot_of: Dict[int, int] = {}
        self._retired: Dict[int, AddressResolver] = {}  # old image -> its mappings, frozen
        # (pid, func, why: True a handle, False an address, "hint" a launch site, GONE an
        # address of a program whose mappings were never read) -> launches
        self.unnamed: Dict[Tuple[int, int, object], int] = {}
        self._unnamed_retired: Dict[object, List[int]] = {}  # why -> of processes forgotten
        # Teaching calls whose name is lost: the probe stored none (`names_unread` of them:
        # it could not read the string) or the names map (an LRU: layout.name_entries) let
        # it go before the reader came to it, and no file mapped read-only holds it
        self.names_lost = 0
        self.names_unread = 0
        # Names the probe could not keep, read from the file that holds them (.rodata)
        self.names_from_files = 0

    # -- taking in -------------------------------------------------------------------------

    def observe_frames(self, frames: bytes, pids: Optional[Set[int]] = None) -> None:
        """Note the execs of the processes of a batch of frames, and snapshot the mappings
        of those first seen (or exec'd since), while they live. A thread's first call sends
        a hello record, read at once, so this happens long before its first launch.
        `pids`: the batch's, when the caller has them (record.frame_pids)."""
        if pids is None:
            pids = record.frame_pids(frames)
        if self.exec_times is not None:
            for pid in pids & self._seen:
                self._note_execs(pid)
        new = pids - self._seen
        if new:
            self.observe_pids(new, _comms(frames, new))

    def observe_pids(self, pids: Iterable[int], comms: Optional[Dict[int, bytes]] = None
                     ) -> None:
        """Snapshot the mappings of these processes, unless already done (`comms`: the
        process names their records carry)."""
        for pid in pids:
            self._seen.add(pid)
            if self.exec_times is not None:
                self._note_execs(pid)
            if pid not in self._snapshot_of:
                self._snapshot(pid, (comms or {}).get(pid))

    def _note_execs(self, pid: int) -> None:
        """Take in the execs of `pid` since the last look; an exec retires the mappings
        taken of the program before it, and the new program's are read."""
        assert self.exec_times is not None
        known = self.execs.setdefault(pid, [])
        new = self.exec_times(pid, len(known))
        if not new:
            return
        known.extend(new)
        if pid in self._snapshot_of and self._snapshot_of[pid] != len(known):
            self._retire(pid)
            self._snapshot(pid)

    def _snapshot(self, pid: int, comm: Optional[bytes] = None) -> None:
        """Read `pid`'s mappings and note whose program they are (read again when an exec
        came in between). The kernel installs an exec's new program (its mappings, its
        name) before the exec tracepoint runs: mappings read in between would pass for the
        old program's. So when the process's name is no longer the one its records carry
        (`comm`), the exec tracepoint is waited for a moment before they are taken."""
        for _ in range(2):
            before = len(self.execs.get(pid, ()))
            self.resolver.observe(pid)
            if self.exec_times is not None:
                self.execs.setdefault(pid, []).extend(
                    self.exec_times(pid, len(self.execs.get(pid, ()))))
                if len(self.execs[pid]) == before and comm is not None \
                        and _comm_now(pid) not in (None, comm):
                    self._await_exec(pid, before)
            self._snapshot_of[pid] = len(self.execs.get(pid, ()))
            if self._snapshot_of[pid] == before:
                return
            self.resolver.forget(pid)
        self._snapshot_of[pid] = -1  # (exec'ing as fast as it is read: no image's mappings)

    def _await_exec(self, pid: int, known: int) -> None:
        """Wait up to EXEC_WAIT_S for the exec tracepoint to tell of an exec of `pid` after
        the first `known` (it runs a moment after the new program is in place)."""
        assert self.exec_times is not None
        deadline = time.monotonic() + EXEC_WAIT_S
        while time.monotonic() < deadline:
            new = self.exec_times(pid, known)
            if new:
                self.execs.setdefault(pid, []).extend(new)
                return
            time.sleep(0.001)

    def _retire(self, pid: int) -> None:
        """Keep the mappings of `pid`'s program before its exec, frozen (never read again:
        /proc shows the new program), under that program's image."""
        old = self.resolver.snapshot(pid)
        generation_ = self._snapshot_of.pop(pid, -1)
        image = image_of(pid, generation_)
        if old is not None and generation_ >= 0:
            frozen = copy.copy(old)
            frozen.pid = image  # (no /proc entry: a lookup it misses is not read again)
            self._retired[image] = AddressResolver()
            self._retired[image].use(frozen)
        self.resolver.forget(pid)

    def image(self, pid: int, when: Optional[int] = None) -> int:
        """The image of process `pid` at kernel time `when` (None: now)."""
        times = self.execs.get(pid)
        return image_of(pid, generation(times, when)) if times else pid

    def _resolver(self, image: int) -> Optional[AddressResolver]:
        """The mappings of an image's program: the process's own while it runs it, frozen
        ones after; None when the image was gone before its mappings were read."""
        pid = image & PID_MASK
        if self.exec_times is None or self._snapshot_of.get(pid, image >> 32) == image >> 32:
            return self.resolver
        return self._retired.get(image)

    def seen_pids(self) -> List[int]:
        """The processes whose records were read and not forgotten yet."""
        return list(self._seen)

    def forget(self, pid: int) -> None:
        """Drop everything known of process `pid` (it exited): its snapshots, handles,
        stubs, names found, execs; its unnamed launches stay counted (the run's account)."""
        self.handles.forget(pid)
        for table in (self.stubs, self._symbols, self._found, self._retired):
            for key in [key for key in table
                        if (key if isinstance(key, int) else key[0]) & PID_MASK == pid]:
                del table[key]
        for key in [key for key in self.unnamed if key[0] & PID_MASK == pid]:
            retired = self._unnamed_retired.setdefault(key[2], [0, 0])
            retired[0] += self.unnamed.pop(key)  # (launches, kernels: the run's account)
            retired[1] += 1
        self._seen.discard(pid)
        self.execs.pop(pid, None)
        self._snapshot_of.pop(pid, None)
        self.resolver.forget(pid)

    def learn(self, events: Iterable[Event],
              pointers: Optional[Dict[Tuple[int, int], Tuple[int, bool]]] = None) -> None:
        """Take in the handles that successful teaching calls (rows with learn_name,
        learn_func or learn_alias) created, and show each name as the out `kernel_name`.
        `pointers` (events.Decoder.name_pointers of their batch): where each name was, read
        there when the probes' map lacks it."""
        for event in events:
            if event.phase != EXIT or event.ret != 0:
                continue
            api = BY_NAME.get(event.api)
            if api is not None and (api.learn_name or api.learn_func or api.learn_alias):
                self._learn(api, event, pointers)

    def _learn(self, api: Api, event: Event,
               pointers: Optional[Dict[Tuple[int, int], Tuple[int, bool]]] = None) -> None:
        image, args, outs = self.image(event.pid, event.ts_ns), event.args, event.outs
        if api.learn_func is not None:
            handle, address = outs.get(api.learn_func[0]), args.get(api.learn_func[1])
            if handle and address:
                self.stubs[(image, handle)] = address
        elif api.learn_name is not None:
            handle = outs.get(api.learn_name[0], args.get(api.learn_name[0]))
            name = (self.probe_names(event.pid, handle, event.ts_ns)
                    if self.probe_names is not None and handle is not None else None)
            where = (pointers or {}).get((event.tid, event.ts_ns))
            if not name and where is not None:
                name = self._name_where_it_lies(image, where[0])
            if name:
                self.handles[(image, handle)] = name
                event.outs["kernel_name"] = name
            else:
                if self.probe_names is not None and handle is not None:
                    self.names_lost += 1
                    self.names_unread += bool(where and where[1])
                self.annotate([event])  # (a name taught before, if any)
        elif api.learn_alias is not None:
            new, known = api.learn_alias
            name = self.handles.get((image, args.get(known, outs.get(known))))
            if name and outs.get(new):
                self.handles[(image, outs[new])] = name

    def _name_where_it_lies(self, image: int, pointer: int) -> Optional[str]:
        """The name at `pointer` in the program of `image`, read from the file a read-only
        mapping put there: a string literal (nvcc's registration code passes one per
        kernel) whose page was not mapped in yet when the probe tried to read it, or that
        the names map let go. None for a string elsewhere (the heap, the stack)."""
        resolver = self._resolver(image)
        if resolver is None or not pointer:
            return None
        pid = image if resolver is not self.resolver else image & PID_MASK
        raw = resolver.read_string(pid, pointer, layout.NAME_CHUNKS * layout.NAME_CHUNK)
        if raw is None:
            return None
        self.names_from_files += 1
        return raw.decode("utf-8", "replace")

    def annotate(self, events: Iterable[Event]) -> None:
        """Show the learned name of each teaching call's handle as out `kernel_name` (for
        events decoded again, behind the reader that learned it)."""
        for event in events:
            api = BY_NAME.get(event.api)
            if api is None or api.learn_name is None or event.phase != EXIT:
                continue
            field = api.learn_name[0]
            name = self.handles.get((self.image(event.pid, event.ts_ns),
                                     event.outs.get(field, event.args.get(field))))
            if name:
                event.outs["kernel_name"] = name

    # -- naming ----------------------------------------------------------------------------

    def __call__(self, event: Event, address: int) -> Optional[str]:
        return self.name_for(event.pid, event.api, address, event.ts_ns)

    def name_for(self, pid: int, api: str, address: int,
                 when: Optional[int] = None) -> Optional[str]:
        """The kernel a launch by function `api` of process `pid` with `func` = `address`
        runs, made at kernel time `when` (None: by the program the process runs now). A
        name once found is kept (launches repeat); an unknown one may be learned later."""
        image = self.image(pid, when)
        found = self._found.get((image, api, address))
        if found is not None:
            return found
        name = self._name_for(image, api, address)
        if name:
            self._found[(image, api, address)] = name
        return name

    def _name_for(self, image: int, api: str, address: int) -> Optional[str]:
        if self._takes_handle(api):
            return self._handle_name(image, address)
        # A runtime launch's func: a host stub's address (named by its registration, else
        # its symbol) or, in CUDA 13, a cudaKernel_t.
        return self._handle_name(image, address) or self._name(image, address)

    def learned(self, pid: int, handle: int, when: Optional[int] = None) -> Optional[str]:
        """The name a teaching call gave this handle of process `pid`, as the probe read it."""
        return self.handles.get((self.image(pid, when), handle))

    def _takes_handle(self, api: str) -> bool:
        handle = self._handle_apis.get(api)
        if handle is None:
            handle = self._handle_apis[api] = _takes_handle(BY_NAME.get(api))
        return handle

    def handle_name(self, pid: int, handle: int, when: Optional[int] = None) -> Optional[str]:
        """The demangled kernel name of a CUfunction/CUkernel/cudaKernel_t, if learned."""
        return self._handle_name(self.image(pid, when), handle)

    def _handle_name(self, image: int, handle: int) -> Optional[str]:
        name = self.handles.get((image, handle))
        if name:
            return demangle(name)
        stub = self.stubs.get((image, handle))
        return self._name(image, stub) if stub else None

    def name(self, pid: int, address: int, when: Optional[int] = None) -> Optional[str]:
        """The demangled name of the function starting at `address` in process `pid`."""
        return self._name(self.image(pid, when), address)

    def _name(self, image: int, address: int) -> Optional[str]:
        key = (image, address)
        if key in self._symbols:
            return self._symbols[key]
        frame = self._frame(image, address)
        # A kernel stub starts at its symbol; an address inside a function is no kernel name.
        name = frame.function if frame is not None and frame.offset == 0 else None
        if name is not None or frame is not None:  # an unmapped address may be dlopened later
            self._symbols[key] = name
        return name

    def _frame(self, image: int, address: int, return_address: bool = False) -> Optional[Frame]:
        """The function at `address` in the program of `image` (None: not known)."""
        resolver = self._resolver(image)
        if resolver is None:
            return None
        pid = image if resolver is not self.resolver else image & PID_MASK
        return resolver.frame(pid, address, return_address=return_address)

    def _locate(self, image: int, address: int) -> Optional[Tuple[str, int]]:
        """(path, virtual address in that file) of `address` in the program of `image`."""
        resolver = self._resolver(image)
        if resolver is None:
            return None
        return resolver.locate(image if resolver is not self.resolver else image & PID_MASK,
                               address)

    def name_launches(self, launches: Sequence[Launch],
                      table: Sequence[Api]) -> List[Tuple[int, int, Optional[str]]]:
        """(pid, func, name) of a batch's launches (events.Decoder.launches), named now,
        while their processes live. A driver launch inside a runtime launch on the same
        thread runs the runtime's kernel: its handle takes that name (the way to name
        handles created before the trace began). Launches left unnamed are counted."""
        inner = self._pair(launches, table)
        named = []
        for i, (fn_id, pid, _, enter, _, func, caller) in enumerate(launches):
            api = table[fn_id].name
            name = self.name_for(pid, api, func, enter)
            if name is None and caller:
                self._learn_from_caller(self.image(pid, enter), func, caller)
                name = self.name_for(pid, api, func, enter)
            unknown = name is None or name.startswith(HINT_START)
            # (a nested one is its outer launch again; a NULL func names no kernel at all)
            if unknown and func and i not in inner:
                key = (pid, func, "hint" if name else self._why(pid, api, enter))
                self.unnamed[key] = self.unnamed.get(key, 0) + 1
            named.append((pid, func, name))
        return named

    def _pair(self, launches: Sequence[Launch], table: Sequence[Api]) -> Set[int]:
        """Teach unnamed driver handles the name of the runtime launch enclosing them; the
        indexes of the launches nested in another. A thread's runtime launches, sorted by
        entry, are searched by bisection (a batch of PyTorch's nested launches took
        quadratic time here: ~10 us a record at 2,048 records)."""
        driver = [api.driver for api in table]  # (a property: read once a row, not a launch)
        outer: Dict[int, List[Tuple[int, int, int, int, int]]] = {}  # tid -> runtime launches
        for fn_id, pid, tid, enter, exit_, func, _ in launches:
            if not driver[fn_id] and exit_:
                outer.setdefault(tid, []).append((enter, exit_, pid, fn_id, func))
        searched = {tid: _Enclosing(runs) for tid, runs in outer.items()}
        nested = set()
        for i, (fn_id, pid, tid, enter, exit_, func, _) in enumerate(launches):
            if not driver[fn_id] or tid not in searched:
                continue
            found = searched[tid].around(pid, enter, exit_)
            if found is None:
                continue
            nested.add(i)
            image = self.image(pid, enter)
            if (image, func) not in self.handles:
                name = self.name_for(pid, table[found[3]].name, found[4], enter)
                if name:
                    self.handles[(image, func)] = name
        return nested

    def _learn_from_caller(self, image: int, func: int, caller: int) -> None:
        """A runtime launch called from nvcc's `__device_stub__KERNEL` runs KERNEL: its func
        (a cudaKernel_t made before the trace began, or a stub without a symbol) takes that
        name. Another caller (the stub inlined into it) names the launch site only. First of
        all, the code before the launch site says which `__cudaGetKernel` handle it passes
        (registrations.py): that names it in files without symbols and in inlined stubs."""
        located = self._locate(image, caller)
        kernel = launch_site_kernel(*located) if located is not None else None
        if kernel:
            self.handles[(image, func)] = kernel
            return
        frame = self._frame(image, caller, return_address=True)
        if frame is None or frame.function is None:
            return
        if not frame.function.startswith(STUB_PREFIX):
            # The stub was inlined into its caller (PyTorch's launchers are): the launch site
            # is known, its kernel is not. Shown as a hint, counted as unnamed.
            self.handles[(image, func)] = HINT % frame.function
            return
        kernel = frame.function[len(STUB_PREFIX):]  # Z6vecAddPf for _Z6vecAddPf; C names
        self.handles[(image, func)] = "_" + kernel if kernel.startswith("Z") else kernel

    def _why(self, pid: int, api: str, when: int) -> object:
        """Why a launch is unnamed: its func is a handle (True), an address no symbol names
        (False), or one in a program an exec replaced before its mappings were read
        (GONE)."""
        if self._takes_handle(api):
            return True
        return GONE if self._resolver(self.image(pid, when)) is None else False

    def unnamed_summary(self) -> Optional[str]:
        """One sentence counting the launches left unnamed, and why; None when all were."""
        if not self.unnamed and not self._unnamed_retired:
            return None

        def counts(reason) -> Tuple[int, int]:
            """(launches, kernels) left unnamed for `reason`, forgotten processes too."""
            live = [n for (_, _, why), n in self.unnamed.items()
                    if why == reason and type(why) is type(reason)]
            launches, kernels = self._unnamed_retired.get(reason, (0, 0))
            return sum(live) + launches, len(live) + kernels

        hints, handles, addresses, gone = counts("hint"), counts(True), counts(False), counts(GONE)
        parts = []
        if hints[0]:
            parts.append("%d launches of %d kernels made before the trace began, shown by "
                         "the code that launched them (%s)" % (hints[0], hints[1],
                                                               HINT % "FUNCTION"))
        if handles[0]:
            parts.append("%d launches of %d kernels whose handles were made before the trace "
                         "began (start the program under the tracer to name them)"
                         % handles)
        if addresses[0]:
            parts.append("%d launches of %d kernels at addresses no symbol names"
                         % addresses)
        if gone[0]:
            parts.append("%d launches of %d kernels of programs replaced by an exec before "
                         "their mappings were read (kernels they register are named however "
                         "short they live)" % gone)
        return "not named: " + "; ".join(parts)

    def found_names(self) -> "FoundNames":
        """A read-only view of the names found so far (and found later)."""
        return FoundNames(self._found, self.execs)


class _Enclosing:
    """One thread's runtime launches of a batch, by entry time, searched for the one that
    encloses a driver launch: the latest entered at or before it whose process is the same
    and which returned after it (a thread's runtime launches do not overlap: that is the
    one; `reach` stops the search where no earlier one returned late enough)."""

    def __init__(self, runs: List[Tuple[int, int, int, int, int]]) -> None:
        self.runs = sorted(runs)
        self.enters = [run[0] for run in self.runs]
        self.reach: List[int] = []  # the latest return of runs[0..k]
        for run in self.runs:
            self.reach.append(max(run[1], self.reach[-1]) if self.reach else run[1])

    def around(self, pid: int, enter: int, exit_: int
               ) -> Optional[Tuple[int, int, int, int, int]]:
        k = bisect_right(self.enters, enter) - 1
        while k >= 0 and self.reach[k] >= exit_:
            run = self.runs[k]
            if run[2] == pid and exit_ <= run[1]:
                return run
            k -= 1
        return None


class FoundNames:
    """The kernel names a KernelNamer found, read only, usable as the outputs' `namer`: for
    a thread that formats lines behind the reader, while the reader names the launches as it
    reads them (their processes may be gone by the time the lines are written). Launches are
    told apart by image as the reader knew the execs (it noted them before the lines)."""

    def __init__(self, found: Dict[Tuple[int, str, int], str],
                 execs: Optional[Dict[int, List[int]]] = None) -> None:
        self._found = found
        self._execs = execs if execs is not None else {}

    def name_for(self, pid: int, api: str, address: int,
                 when: Optional[int] = None) -> Optional[str]:
        times = self._execs.get(pid)
        image = image_of(pid, generation(times, when)) if times else pid
        return self._found.get((image, api, address))

    def __call__(self, event: Event, address: int) -> Optional[str]:
        return self.name_for(event.pid, event.api, address, event.ts_ns)


EXEC_WAIT_S = 0.05  # the longest wait for an exec in flight to reach the exec tracepoint


def _comms(frames: bytes, pids: Set[int]) -> Dict[int, bytes]:
    """The process name (comm, NUL-free) the first record of each of `pids` carries."""
    comms: Dict[int, bytes] = {}
    tgid_at = record.FRAME_HEADER + record.PID_TGID + 4
    comm_at = record.FRAME_HEADER + record.COMM
    for at in range(0, len(frames), record.FRAME_SIZE):
        pid = int.from_bytes(frames[at + tgid_at:at + tgid_at + 4], "little")
        if pid in pids and pid not in comms:
            raw = frames[at + comm_at:at + comm_at + record.COMM_LEN]
            comms[pid] = raw.split(b"\0", 1)[0]
            if len(comms) == len(pids):
                break
    return comms


def _comm_now(pid: int) -> Optional[bytes]:
    """The process's name now (/proc/PID/comm), None when it cannot be read."""
    try:
        with open("/proc/%d/comm" % pid, "rb") as f:
            return f.read().rstrip(b"\n")
    except OSError:
        return None
