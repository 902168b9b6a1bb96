"""Which program each table row gets: the one place that decides.

For each row to probe, from the trace's config and what the kernel takes: an entry program,
a return program (with return probes), or one uprobe-session program doing both (launch
returns sampled); what each does (`calls.ProbeOptions`: records or not, aggregates, wakeups,
stacks, ...); and which rows share one program (with uprobe_multi links each probe carries
its function's id as attach cookie, so rows of one shape and options share theirs).

Pure: what the kernel takes (`Features`) is passed in, never probed here. The Session loads
what this says; tests/test_golden.py lists the same programs.
"""
from typing import Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

from ..arch import Arch
from ..bpf.features import BPF_TRACE_UPROBE_SESSION
from ..bpf.programs import EXPECTED_UPROBE_MULTI
from ..spec import apis, layout
from ..spec.apis import Api
from ..spec.config import TraceConfig
from . import calls
from .calls import ProbeOptions
from .options import HASH_ONLY

WAKEUP_FRACTION = 8  # the probes wake the reader as 1/8 of the ring comes to wait (records.py)
ENTRY, RETURN, SESSION = "entry", "return", "session"  # the kinds of program


class Features(NamedTuple):
    """What the kernel (and the machine) takes, found by bpf/features.py, kernel_btf.py."""

    arch: Arch
    uprobe_multi: bool  # uprobe_multi links (the attach path): programs shared by shape
    task_storage: bool  # task-local storage for calls in flight (else the inflight map)
    session_is_return: Optional[int] = None  # bpf_session_is_return's BTF id: uprobe sessions
    pid_ns: Optional[Tuple[int, int]] = None  # the tracer's PID namespace, if not the first
    thread_pointer: Optional[int] = None  # task_struct.thread.fsbase (for Python stacks)
    # task_struct's pid, tgid and comm offsets, when the probes may load them through
    # bpf_get_current_task_btf (features.task_fields): no helper call for either
    task_fields: Optional[Tuple[int, int, int]] = None


class ProgramSpec(NamedTuple):
    """One program to load, and the rows (in table order) that run it."""

    key: Hashable  # one program per key: rows (also of a file probed later) share it
    kind: str  # ENTRY, RETURN or SESSION (entry and return in one)
    api: Api  # the row it is generated from: the first that runs it
    fn_id: int  # the function id compiled in (calls.FROM_COOKIE: the attach cookie's)
    options: ProbeOptions
    attach_type: int  # the expected_attach_type it is loaded with
    functions: List[str]

    @property
    def retprobe(self) -> bool:
        return self.kind == RETURN

    @property
    def shared(self) -> bool:
        """Whether its function id comes from the attach cookie (rows share it)."""
        return self.fn_id == calls.FROM_COOKIE

    def instructions(self, arch: Arch) -> list:
        generate = {ENTRY: calls.entry_program, RETURN: calls.return_program,
                    SESSION: calls.session_program}[self.kind]
        return generate(self.api, self.fn_id, arch, self.options)

    def name(self, number: int) -> str:
        """Its name in the kernel (`number`: how many programs were loaded before it)."""
        if self.kind == SESSION:
            return "cuda%d_ses" % apis.FN_ID[self.api.name]
        return calls.program_name(number if self.shared else self.fn_id, self.retprobe,
                                   self.shared)


def programs_for(rows: Sequence[Api], config: TraceConfig,
                 features: Features) -> List[ProgramSpec]:
    """The programs of `rows` (table rows, in table order), in the order they are first
    needed: per row its entry program, then its return program (or its one session
    program)."""
    specs: Dict[Hashable, ProgramSpec] = {}
    for api in rows:
        fn_id = apis.FN_ID[api.name]
        options = probe_options(api, config, features)
        if options.sample_returns:  # one session program, entry and return: `sampled`
            # One per function, its id a constant: a launch pays no cookie helper.
            kinds: Tuple[str, ...] = (SESSION,)
        else:
            kinds = (ENTRY, RETURN) if config.return_probes else (ENTRY,)
        for kind in kinds:
            shared = features.uprobe_multi and kind != SESSION
            key = ((calls.shape_of(api, kind == RETURN, features.arch, options.aggregate),
                    options, kind == RETURN) if shared else
                   (fn_id, kind if kind == SESSION else kind == RETURN))
            if key not in specs:
                specs[key] = ProgramSpec(
                    key, kind, api, calls.FROM_COOKIE if shared else fn_id, options,
                    BPF_TRACE_UPROBE_SESSION if kind == SESSION else
                    EXPECTED_UPROBE_MULTI if features.uprobe_multi else 0, [])
            specs[key].functions.append(api.name)
    return list(specs.values())


def site_cookie(api_name: str, symbol: str, session: bool) -> int:
    """An attach site's cookie: its function id; a session program's `_ptsz` site also
    says it is one (probes/calls.py, _twin_gate)."""
    alias = session and symbol in apis.BY_NAME[api_name].aliases
    return apis.FN_ID[api_name] | (layout.ALIAS_COOKIE if alias else 0)


def process_slots(config: TraceConfig, features: Features) -> int:
    """The monitor's process slots (layout.PROCESS_OWNERS): with task storage alone, which
    caches each thread's slot; else 0 (its sums by process all in the `proc_calls` hash)."""
    per_process = config.aggregate and config.per_process
    return config.process_slots if per_process and features.task_storage else 0


def probe_options(api: Api, config: TraceConfig, features: Features) -> ProbeOptions:
    """What the programs of `api` do, from the trace's config and the row's roles."""
    c = config
    options = ProbeOptions(
        stash=c.return_probes, emit_entry=c.entries, emit=c.emit, aggregate=c.aggregate,
        follow=c.follows, task_storage=features.task_storage, pid_ns=features.pid_ns,
        py_stacks=features.thread_pointer if c.py_stacks else None,
        per_process=(process_slots(c, features) or HASH_ONLY) if c.aggregate and c.per_process
        else False,
        task_fields=features.task_fields if features.task_storage else None,
        wakeup_bytes=c.ring_size // WAKEUP_FRACTION,
        stacks=c.stacks and api.captures_stack)
    if api.teaches_names:
        # Their process must still live when they are read (a name string the `names`
        # map may let go, the process's mappings): no waiting to batch. But
        # cuKernelGetFunction only ties a CUfunction to a CUkernel already named, and the
        # runtime calls it again and again (5 times a PyTorch training step): its records
        # wait with the others (a forced wakeup costs the calling thread the reader's
        # wakeup each time), read before the launches after them are named.
        options = options._replace(emit=True, wake_now=api.learn_alias is None)
    elif c.aggregate and api.category == "graph":
        # Rare calls (captures, nodes, instantiations, graph launches) from which the
        # summary rebuilds each graph and expands each graph launch into its kernels
        # (graphs.py), also with in-kernel aggregates; while a process captures, its
        # launches, copies, memsets and event calls write records too
        # (aggregates.capturing_gate).
        options = options._replace(emit=True)
    elif api.library == apis.NCCL:
        # Rare calls whose every record the NCCL table needs (its communicator, its
        # sequence number), also with in-kernel aggregates.
        options = options._replace(emit=True)
    elif c.emit_memory and api.memory == apis.DEVICE and api.role in (apis.Role.ALLOC,
                                                                      apis.Role.FREE):
        # (the monitor's live device-memory gauge: allocations are rare calls)
        options = options._replace(emit=True)
    if _sampled(api, options, config, features):
        options = options._replace(sample_returns=c.sample_returns,
                                   is_return_kfunc=features.session_is_return or 0)
    return options


def may_sample_returns(config: TraceConfig, uprobe_multi: bool) -> bool:
    """Whether `config` could sample launch returns on a kernel with uprobe sessions: only
    then is the kernel's BTF searched for bpf_session_is_return (a cost at start-up)."""
    return bool(config.aggregate and not config.emit and config.sample_returns > 1
                and uprobe_multi)


def samples_returns(config: TraceConfig, features: Features) -> bool:
    """Whether launch returns can be sampled (`_sampled` rows may exist): only then are the
    launch slots and the draw's state made (and read at each tick)."""
    return (may_sample_returns(config, features.uprobe_multi)
            and features.session_is_return is not None)


def _sampled(api: Api, options: ProbeOptions, config: TraceConfig,
             features: Features) -> bool:
    """Whether `api`'s returns are sampled (TraceConfig.sample_returns): a launch row
    aggregated without records, on a kernel with uprobe sessions and uprobe_multi."""
    return (samples_returns(config, features) and api.role == apis.Role.LAUNCH
            and options.aggregate and not options.emit and options.stash
            and options.task_storage and options.py_stacks is None)
