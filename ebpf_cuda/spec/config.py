"""What one trace probes and how: `TraceConfig`, built by keyword (the Tracer's keywords).

    config = TraceConfig(command=["./app"], functions=["cudaMalloc", "cudaFree"])
    with Tracer(config) as tracer: ...

Sequences are kept as tuples (a config is frozen and hashable); `checked()` refuses the
combinations that cannot work.
"""
import os
from typing import Any, Callable, List, Optional, Sequence

from ..errors import UsageError
from ..value_class import ValueClass
from . import apis, layout

MAX_SAMPLE_RETURNS = 1 << 20
MAX_PROCESS_SLOTS = 1 << 14  # (~64 MB of sums: 3.9 KB a slot)
MAX_GPU_SAMPLES = 1000  # (NVML's own counters update every 1 to 100 ms)  # (the draw's shift: 64 - log2(N) must stay positive)


class TraceConfig(ValueClass, frozen=True):
    """What to probe and how.

    What is traced: `command` (an argv: started, held until the probes are on, and traced;
    with `follow_children` the processes it starts too, kept by the kernel, see follow.py;
    without it the kernel filters on the command's PID), `pid` (a running process), or
    neither (every process using the probed files). `library`: the files to probe (default:
    found from the pid, the command or the usual places). With a pid or a command (and no
    `library`), the CUDA libraries its processes map later are probed as their dynamic
    loader maps them (late_loads.py); calls made before their probes are on are not seen.
    """

    # -- which functions -------------------------------------------------------------------
    # Glob patterns of function names (None: the table's default set, or every row with
    # `everything`); `api`: "runtime", "driver", "nccl" or "all" (every library).
    functions: Optional[Sequence[str]] = None
    api: str = "all"
    everything: bool = False

    # -- where: files and processes (see the class's docstring) ----------------------------
    library: Sequence[str] = ()
    pid: Optional[int] = None
    command: Sequence[str] = ()
    follow_children: bool = True

    # -- what each call writes -------------------------------------------------------------
    # `return_probes=False`: entry probes only (enter events, no durations); `entries`: an
    # enter record at entry too (calls that block for long); `ring_size`: the ring buffer's
    # bytes (a power of two); `stacks`: the user call stack of memory calls and of the calls
    # the analysis names (Tracer.stack; spec/row.py STACK_CATEGORIES);
    # `py_stacks`: each call's Python stack (pystack.py, pystacks.py; needs kernel BTF).
    return_probes: bool = True
    entries: bool = False
    ring_size: int = layout.DEFAULT_RING_SIZE
    stacks: bool = False
    py_stacks: bool = False

    # -- in-kernel aggregates --------------------------------------------------------------
    # `aggregate`: calls summed up in the kernel (Tracer.aggregates); with `emit=False` no
    # per-call records at all (the calls that teach kernel names, graph and NCCL calls still
    # write theirs; with `emit_memory`, device allocations and frees too: the monitor's
    # memory gauge). `sample_returns=N` (with aggregates and no records, on kernels with
    # uprobe sessions): the launch rows' returns taken by 1 call in N (a power of two) and by
    # every call made while its process captures a graph; the others are counted at entry
    # (exact call and launch counts; durations and errors of the sampled calls).
    # `per_process` (with aggregates): calls, errors and API time by process too
    # (layout.PROCESS_KEY; the sampled rows excepted: their launches by process), kept in
    # `process_slots` slots where the kernel has task storage (a power of two, 0: every
    # call through the `proc_calls` hash; processes beyond the slots go there too).
    aggregate: bool = False
    emit: bool = True
    emit_memory: bool = False
    sample_returns: int = 0
    per_process: bool = False
    process_slots: int = layout.PROCESS_SLOTS

    # -- the GPU's own state (gpu/sampler.py) ----------------------------------------------
    # `gpu_samples`: NVML samples of every device and its processes a second (0: none), and
    # its Xid and ECC events; `nvml`: the libnvidia-ml.so.1 to read (None: found as the
    # loader finds it, then in the drivers' folders); `gpu_absent_ok`: no line when no library
    # is found (the command line's default: a host without NVIDIA's driver says nothing)
    gpu_samples: float = 0.0
    nvml: Optional[str] = None
    gpu_absent_ok: bool = False

    # -- progress notes --------------------------------------------------------------------
    log: Optional[Callable[[str], None]] = None  # told which files and offsets are probed

    def __init__(self, *values: Any, **keywords: Any) -> None:
        super().__init__(*values, **keywords)
        # (as tuples: a frozen config holds no list a caller could change later)
        set_ = object.__setattr__
        set_(self, "functions", tuple(self.functions) if self.functions else None)
        set_(self, "library", tuple(self.library or ()))
        set_(self, "command", tuple(self.command or ()))

    def checked(self) -> "TraceConfig":
        """This config, or UsageError for a combination that cannot work."""
        if self.pid is not None and self.command:
            raise UsageError("give either a PID or a command, not both")
        if self.api not in ("all",) + apis.LIBRARIES:
            raise UsageError("--api must be runtime, driver, nccl or all, not %r" % self.api)
        if not self.emit and not (self.aggregate and self.return_probes):
            raise UsageError("without event records, in-kernel aggregation (with return "
                             "probes) is the only output")
        if self.entries and not self.return_probes:
            raise UsageError("--entries needs return probes; it cannot go with -r")
        if self.py_stacks and not self.emit:
            raise UsageError("--py-stacks needs event records: it cannot go with in-kernel "
                             "aggregates alone")
        n = self.sample_returns
        if n < 0 or n & (n - 1) or n > MAX_SAMPLE_RETURNS:
            raise UsageError("the return sampling must be a power of two (1: every call) "
                             "up to %d, not %d" % (MAX_SAMPLE_RETURNS, n))
        _check_ring_size(self.ring_size)
        n = self.process_slots
        if n < 0 or n & (n - 1) or n > MAX_PROCESS_SLOTS:
            raise UsageError("the process slots must be a power of two up to %d (0: none), "
                             "not %d" % (MAX_PROCESS_SLOTS, n))
        if not 0 <= self.gpu_samples <= MAX_GPU_SAMPLES:
            raise UsageError("--gpu-samples takes 0 (off) to %d samples a second, not %g"
                             % (MAX_GPU_SAMPLES, self.gpu_samples))
        return self

    def rows(self) -> List[apis.Api]:
        """The table rows to trace; UsageError naming an unknown function (with close
        matches)."""
        try:
            return apis.select(self.functions, self.api, self.everything)
        except KeyError as err:
            import difflib

            close = difflib.get_close_matches(err.args[0], [a.name for a in apis.TABLE], n=3)
            hint = "did you mean %s? " % ", ".join(close) if close else ""
            raise UsageError("unknown function %s (%s--list-functions lists them)"
                             % (err.args[0], hint)) from None

    @property
    def follows(self) -> bool:
        """Whether the kernel keeps the set of followed processes (a command and children)."""
        return bool(self.command) and self.follow_children


def _check_ring_size(size: int) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    if size < page or size & (size - 1):
        raise UsageError("the ring buffer size must be a power of two of at least %d bytes, "
                         "not %d" % (page, size))
    return size
