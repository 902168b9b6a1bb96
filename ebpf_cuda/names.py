"""The one store of kernel names in a trace.

A launch's `func` is either a code address (a runtime launch: the kernel's host stub) or a
handle (a driver launch's CUfunction, a CUDA 13 runtime launch's cudaKernel_t). Addresses are
named from the symbols of the file mapped there (analysis/kernels.py's AddressResolver, from
a snapshot of /proc/PID/maps taken while the process lives); handles from what the calls that
create them taught (`learn`): cuModuleGetFunction & co. store the name string in the probes'
`names` map, __cudaGetKernel ties a cudaKernel_t to its stub, cuKernelGetFunction gives a
CUkernel's CUfunction the same name. Every output asks this store, so all of them show the
same names.
"""
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from . import record
from .analysis.kernels import AddressResolver
from .apis import BY_NAME, Api, Kind
from .elf import demangle
from .events import EXIT, Event

# fn_id, pid, tid, entry and exit time, func, caller (the return address, or 0)
Launch = Tuple[int, int, int, int, int, int, int]
HINT = "[kernel launched from %s]"  # what a launch site without its kernel's name shows
HINT_START = HINT.split("%")[0]
STUB_PREFIX = "__device_stub__"  # nvcc's host stub of kernel _Z... is __device_stub__Z...
ProbeNames = Callable[[int, int], Optional[str]]  # (pid, handle) -> name the probes stored


def _takes_handle(api: Optional[Api]) -> bool:
    """True when a launch's `func` is a driver handle (CUfunction), not a code address (a
    driver graph kernel node's too)."""
    return api is not None and any((a.name == "func" and a.kind == Kind.HANDLE)
                                   or (api.driver and a.kind == Kind.KERNEL_NODE)
                                   for a in api.args)


class KernelNamer:
    """Kernel names of launches (see the module's docstring).

    `name_for(pid, api, func)` and `namer(event, func)` (the outputs' protocol) name a launch;
    `learn(events)` takes in what teaching calls say; `observe_frames` snapshots the mappings
    of the processes first seen in a batch. `probe_names` reads the probes' `names` map."""

    def __init__(self, probe_names: Optional[ProbeNames] = None,
                 resolver: Optional[AddressResolver] = None) -> None:
        self.resolver = resolver or AddressResolver()
        self.probe_names = probe_names
        self.handles: Dict[Tuple[int, int], str] = {}  # (pid, CUfunction/CUkernel) -> name
        self.stubs: Dict[Tuple[int, int], int] = {}  # (pid, cudaKernel_t) -> stub address
        self._symbols: Dict[Tuple[int, int], Optional[str]] = {}  # (pid, address) -> name
        self._found: Dict[Tuple[int, str, int], str] = {}  # name_for's answers (known ones)
        self._handle_apis: Dict[str, bool] = {}
        self._seen: Set[int] = set()
        # (pid, func, why: True a handle, False an address, "hint" a launch site) -> launches
        self.unnamed: Dict[Tuple[int, int, object], int] = {}

    # -- taking in -------------------------------------------------------------------------

    def observe_frames(self, frames: bytes) -> None:
        """Snapshot the mappings of the processes first seen in a batch of frames, while
        they live. A thread's first call sends a hello record, read at once, so this happens
        long before its first launch."""
        new = record.frame_pids(frames) - self._seen
        if new:
            self.observe_pids(new)

    def observe_pids(self, pids: Iterable[int]) -> None:
        """Snapshot the mappings of these processes, unless already done."""
        for pid in pids:
            self._seen.add(pid)
            self.resolver.observe(pid)

    def forget(self, pid: int) -> None:
        """Drop everything known of process `pid` (it exited): its snapshot, handles, stubs,
        names found, unnamed counts stay (they are the run's account)."""
        for table in (self.handles, self.stubs, self._symbols, self._found):
            for key in [key for key in table if key[0] == pid]:
                del table[key]
        self._seen.discard(pid)
        self.resolver.forget(pid)

    def learn(self, events: Iterable[Event]) -> None:
        """Take in the handles that successful teaching calls (rows with learn_name,
        learn_func or learn_alias) created, and show each name as the out `kernel_name`."""
        for event in events:
            if event.phase != EXIT or event.ret != 0:
                continue
            api = BY_NAME.get(event.api)
            if api is not None and (api.learn_name or api.learn_func or api.learn_alias):
                self._learn(api, event)

    def _learn(self, api: Api, event: Event) -> None:
        pid, args, outs = event.pid, event.args, event.outs
        if api.learn_func is not None:
            handle, address = outs.get(api.learn_func[0]), args.get(api.learn_func[1])
            if handle and address:
                self.stubs[(pid, handle)] = address
        elif api.learn_name is not None:
            handle = outs.get(api.learn_name[0], args.get(api.learn_name[0]))
            name = (self.probe_names(pid, handle)
                    if self.probe_names is not None and handle is not None else None)
            if name:
                self.handles[(pid, handle)] = name
            self.annotate([event])
        elif api.learn_alias is not None:
            new, known = api.learn_alias
            name = self.handles.get((pid, args.get(known, outs.get(known))))
            if name and outs.get(new):
                self.handles[(pid, outs[new])] = name

    def annotate(self, events: Iterable[Event]) -> None:
        """Show the learned name of each teaching call's handle as out `kernel_name` (for
        events decoded again, behind the reader that learned it)."""
        for event in events:
            api = BY_NAME.get(event.api)
            if api is None or api.learn_name is None or event.phase != EXIT:
                continue
            field = api.learn_name[0]
            name = self.handles.get((event.pid, event.outs.get(field, event.args.get(field))))
            if name:
                event.outs["kernel_name"] = name

    # -- naming ----------------------------------------------------------------------------

    def __call__(self, event: Event, address: int) -> Optional[str]:
        return self.name_for(event.pid, event.api, address)

    def name_for(self, pid: int, api: str, address: int) -> Optional[str]:
        """The kernel a launch by function `api` of process `pid` with `func` = `address`
        runs. A name once found is kept (launches repeat); an unknown one may be learned
        later."""
        found = self._found.get((pid, api, address))
        if found is not None:
            return found
        name = self._name_for(pid, api, address)
        if name:
            self._found[(pid, api, address)] = name
        return name

    def _name_for(self, pid: int, api: str, address: int) -> Optional[str]:
        if self._takes_handle(api):
            return self.handle_name(pid, address)
        # A runtime launch's func: a host stub's address (named by its registration, else
        # its symbol) or, in CUDA 13, a cudaKernel_t.
        return self.handle_name(pid, address) or self.name(pid, address)

    def learned(self, pid: int, handle: int) -> Optional[str]:
        """The name a teaching call gave this handle of process `pid`, as the probe read it."""
        return self.handles.get((pid, handle))

    def _takes_handle(self, api: str) -> bool:
        handle = self._handle_apis.get(api)
        if handle is None:
            handle = self._handle_apis[api] = _takes_handle(BY_NAME.get(api))
        return handle

    def handle_name(self, pid: int, handle: int) -> Optional[str]:
        """The demangled kernel name of a CUfunction/CUkernel/cudaKernel_t, if learned."""
        name = self.handles.get((pid, handle))
        if name:
            return demangle(name)
        stub = self.stubs.get((pid, handle))
        return self.name(pid, stub) if stub else None

    def name(self, pid: int, address: int) -> Optional[str]:
        """The demangled name of the function starting at `address` in process `pid`."""
        key = (pid, address)
        if key in self._symbols:
            return self._symbols[key]
        frame = self.resolver.frame(pid, address)
        # A kernel stub starts at its symbol; an address inside a function is no kernel name.
        name = frame.function if frame is not None and frame.offset == 0 else None
        if name is not None or frame is not None:  # an unmapped address may be dlopened later
            self._symbols[key] = name
        return name

    def name_launches(self, launches: Sequence[Launch],
                      table: Sequence[Api]) -> List[Tuple[int, int, Optional[str]]]:
        """(pid, func, name) of a batch's launches (events.Decoder.launches), named now,
        while their processes live. A driver launch inside a runtime launch on the same
        thread runs the runtime's kernel: its handle takes that name (the way to name
        handles created before the trace began). Launches left unnamed are counted."""
        inner = self._pair(launches, table)
        named = []
        for i, (fn_id, pid, _, _, _, func, caller) in enumerate(launches):
            api = table[fn_id].name
            name = self.name_for(pid, api, func)
            if name is None and caller:
                self._learn_from_caller(pid, func, caller)
                name = self.name_for(pid, api, func)
            unknown = name is None or name.startswith(HINT_START)
            # (a nested one is its outer launch again; a NULL func names no kernel at all)
            if unknown and func and i not in inner:
                key = (pid, func, "hint" if name else self._takes_handle(api))
                self.unnamed[key] = self.unnamed.get(key, 0) + 1
            named.append((pid, func, name))
        return named

    def _pair(self, launches: Sequence[Launch], table: Sequence[Api]) -> Set[int]:
        """Teach unnamed driver handles the name of the runtime launch enclosing them; the
        indexes of the launches nested in another."""
        outer: Dict[int, List[Tuple[int, int, int, int, int]]] = {}  # tid -> runtime launches
        for fn_id, pid, tid, enter, exit_, func, _ in launches:
            if not table[fn_id].driver and exit_:
                outer.setdefault(tid, []).append((enter, exit_, pid, fn_id, func))
        nested = set()
        for i, (fn_id, pid, tid, enter, exit_, func, _) in enumerate(launches):
            if not table[fn_id].driver or tid not in outer:
                continue
            for o_enter, o_exit, o_pid, o_fn, o_func in outer[tid]:
                if o_pid == pid and o_enter <= enter and exit_ <= o_exit:
                    nested.add(i)
                    if (pid, func) not in self.handles:
                        name = self.name_for(pid, table[o_fn].name, o_func)
                        if name:
                            self.handles[(pid, func)] = name
                    break
        return nested

    def _learn_from_caller(self, pid: int, func: int, caller: int) -> None:
        """A runtime launch called from nvcc's `__device_stub__KERNEL` runs KERNEL: its func
        (a cudaKernel_t made before the trace began, or a stub without a symbol) takes that
        name. Another caller (the stub inlined into it) names the launch site only."""
        frame = self.resolver.frame(pid, caller, return_address=True)
        if frame is None or frame.function is None:
            return
        if not frame.function.startswith(STUB_PREFIX):
            # The stub was inlined into its caller (PyTorch's launchers are): the launch site
            # is known, its kernel is not. Shown as a hint, counted as unnamed.
            self.handles[(pid, func)] = HINT % frame.function
            return
        kernel = frame.function[len(STUB_PREFIX):]  # Z6vecAddPf for _Z6vecAddPf; C names
        self.handles[(pid, func)] = "_" + kernel if kernel.startswith("Z") else kernel

    def unnamed_summary(self) -> Optional[str]:
        """One sentence counting the launches left unnamed, and why; None when all were."""
        if not self.unnamed:
            return None
        hints = [n for (_, _, why), n in self.unnamed.items() if why == "hint"]
        handles = [n for (_, _, why), n in self.unnamed.items() if why is True]
        addresses = [n for (_, _, why), n in self.unnamed.items() if why is False]
        parts = []
        if hints:
            parts.append("%d launches of %d kernels made before the trace began, shown by "
                         "the code that launched them (%s)" % (sum(hints), len(hints),
                                                               HINT % "FUNCTION"))
        if handles:
            parts.append("%d launches of %d kernels whose handles were made before the trace "
                         "began (start the program under the tracer to name them)"
                         % (sum(handles), len(handles)))
        if addresses:
            parts.append("%d launches of %d kernels at addresses no symbol names"
                         % (sum(addresses), len(addresses)))
        return "not named: " + "; ".join(parts)

    def found_names(self) -> "FoundNames":
        """A read-only view of the names found so far (and found later)."""
        return FoundNames(self._found)


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
