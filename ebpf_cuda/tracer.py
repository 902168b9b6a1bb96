"""The public `Tracer`: a Session (the kernel objects) and a Stream (the read loop).

    with Tracer(command=["./app"]) as tracer:
        for event in tracer.events():
            print(event.api, event.phase, event.args)

    with Tracer(command=["./app"]) as tracer:  # every output the CLI has
        tracer.trace_into([TextWriter(sys.stdout, namer=tracer.names)], spool=Spool())

It never prints, exits or installs signal handlers; progress notes go to `log` if given.
"""
import os
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from .decode import aggregates
from .spec import apis, layout
from .spec.apis import Api
from .errors import TracerError
from .decode.events import Decoder, Event
from .decode.names import KernelNamer
from .bpf.programs import Program
from .session import Attachment, Options, Session
from .stream import Notice, Stream
from .targets.selection import Target

DEFAULT_RING_SIZE = layout.DEFAULT_RING_SIZE

__all__ = ["Tracer", "Attachment", "Target", "DEFAULT_RING_SIZE"]


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
    no per-call records are written at all (the cheapest way to get a summary; the calls
    that teach kernel names still write theirs, while their process lives; with
    `emit_memory`, device allocations and frees too: the monitor's memory gauge).
    `sample_returns=N` (with `aggregate=True, emit=False`, on kernels with uprobe sessions):
    the launch rows' returns are taken by 1 call in N (a power of two) and by every call
    made while its process captures a graph; the others are counted at entry, with no
    return probe: exact call and launch counts (launches attempted, the failed ones too),
    durations and errors of the sampled calls (`sampled_returns()` says which rows).
    `per_process=True` (with `aggregate=True`): each call is also added to its process's
    calls, errors and API time (the `proc_calls` map: layout.PROCESS_KEY; the sampled rows
    excepted, whose calls by process are their launches by process).

    With a pid or a command (and no `library`), the CUDA libraries its processes map later
    are probed as their dynamic loader maps them (loader_watch.py; `late_loads` lists them):
    calls made in the milliseconds before their probes are on are not seen.
    """

    def __init__(self, functions: Optional[Sequence[str]] = None,
                 library: Optional[Sequence[str]] = None, pid: Optional[int] = None,
                 command: Optional[Sequence[str]] = None, api: str = "all",
                 everything: bool = False, follow_children: bool = True,
                 return_probes: bool = True,
                 entries: bool = False, ring_size: int = DEFAULT_RING_SIZE,
                 stacks: bool = False, aggregate: bool = False, emit: bool = True,
                 log: Optional[Callable[[str], None]] = None,
                 emit_memory: bool = False, py_stacks: bool = False,
                 sample_returns: int = 0, per_process: bool = False) -> None:
        options = Options(tuple(functions) if functions else None, tuple(library or ()), pid,
                          tuple(command or ()), api, everything, follow_children,
                          return_probes, entries, ring_size, stacks, aggregate, emit,
                          emit_memory, py_stacks, sample_returns, per_process)
        self.session = Session(options, log)
        self.names = KernelNamer(probe_names=self.session.probe_name,
                                 exec_times=self.session.exec_times)
        self.decoder = Decoder(apis.TABLE)  # clock offset measured now, before the start
        self.stream = Stream(self.session, self.names, self.decoder)

    # -- set-up ----------------------------------------------------------------------------

    def start(self) -> "Tracer":
        """Find files, load and attach every probe; a command is started but held until
        `run()` (or the first read), so that its first call is seen."""
        self.session.start()
        return self

    def run(self) -> None:
        """Let a held command run (once)."""
        if self.session.command is not None:
            self.session.command.release()

    @property
    def options(self) -> Options:
        return self.session.options

    @property
    def apis(self) -> List[Api]:
        """The selected rows of the function table."""
        return self.session.selected

    @property
    def apis_table(self) -> Sequence[Api]:
        """The function table records are numbered by."""
        return self.decoder.table

    @property
    def targets(self) -> List[Target]:
        return self.session.targets

    @property
    def attachments(self) -> List[Attachment]:
        return self.session.attachments

    @property
    def failures(self) -> List[str]:
        return self.session.failures

    def sampled_returns(self) -> List[str]:
        """The functions whose returns are sampled (Options.sample_returns), by name."""
        return self.session.sampled_returns()

    @property
    def late_loads(self) -> List[Tuple[str, int, float]]:
        """Files probed after the start because a traced process mapped them (see
        loader_watch.py): (path, pid, milliseconds from its loader's notice to the probes
        being on)."""
        return list(self.session.late_probed)

    @property
    def programs(self) -> Dict[Tuple[str, bool], Program]:
        return self.session.programs

    @property
    def emit(self) -> bool:
        return self.options.emit

    @property
    def aggregate(self) -> bool:
        return self.options.aggregate

    @property
    def pid(self) -> Optional[int]:
        return self.options.pid

    @property
    def command(self) -> List[str]:
        return list(self.options.command)

    @property
    def child_pid(self) -> Optional[int]:
        """The PID of the started command."""
        command = self.session.command
        return command.pid if command is not None else None

    @property
    def exit_status(self) -> Optional[int]:
        """The started command's exit code once it ended (128+N when killed by signal N)."""
        command = self.session.command
        return command.exit_status if command is not None else None

    def children_left(self) -> List[int]:
        """The processes the command started that still live once it has ended (a job it
        put in the background): the kernel's followed set still holds them."""
        from .spec import layout
        from .targets.command import alive

        followed = self.session.maps.get(layout.FOLLOWED)
        if followed is None or self.exit_status is None:
            return []
        try:
            pids = [int(pid) for pid in followed.keys()]
        except (TracerError, OSError, TypeError, ValueError):
            return []
        return sorted(pid for pid in pids if pid != self.child_pid and alive(pid))

    # -- reading ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the reading to finish after draining what is already in the ring buffer.
        Safe to call from a signal handler."""
        self.stream.stop()

    def frames(self, timeout: Optional[float] = None) -> Iterator[bytes]:
        """Batches of raw ring frames (8-byte header + record each) until the target ends,
        `stop()` is called or `timeout` seconds pass, for callers that save or count
        records without decoding them; `decoder` decodes them."""
        self.start()
        return self.stream.frames(timeout)

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Events until the end (as `frames()`). Everything produced before the end is
        drained and yielded."""
        self.start()
        return self.stream.events(timeout)

    def on_event(self, callback: Callable[[Event], None],
                 timeout: Optional[float] = None) -> None:
        """Call `callback` with each event until the end (as `events()`); returns then."""
        for event in self.events(timeout):
            callback(event)

    def trace_into(self, sinks: Sequence, save=None, spool=None,
                   notice: Optional[Notice] = None, reader_nice: Optional[int] = None) -> None:
        """Run the command (if any) and read until the end, delivering every batch to
        `sinks` (output writers and analyses), `save` (savefile.open_save) and, with one
        text or JSON writer alone, through `spool` (spool.Spool): lossless however slowly
        lines are written. `reader_nice` sets the calling thread's CPU priority while it
        reads (the CLI uses -10: a busy program cannot starve the reader)."""
        self.start()
        if reader_nice is not None:
            _set_thread_nice(reader_nice)
        self.stream.deliver(sinks, save=save, spool=spool, notice=notice)

    def wait_command(self) -> Optional[int]:
        """Wait for a started command to end; its exit code (128+N when killed by signal N)."""
        command = self.session.command
        return command.wait() if command is not None else None

    def stats(self) -> Dict[str, int]:
        """Counters kept by the probes, summed over CPUs: `lost` records (ring buffer full),
        `unpaired` returns (no entry seen)."""
        return self.session.stats()

    def losses(self):
        """Everything lost so far, by cause (losses.Losses): records the probes could not
        write, the spool's drops, and what each output that failed could not take (a failing
        output is dropped, the others go on; `stream.outputs.failures` says which)."""
        return self.stream.losses()

    @property
    def lost(self) -> int:
        """Records lost because the ring buffer was full."""
        return self.stats()["lost"]

    def aggregates(self) -> aggregates.Aggregates:
        """The in-kernel aggregates so far (with `aggregate=True`)."""
        return self.session.aggregates()

    def stack(self, stack_id: int) -> List[int]:
        """Return addresses (innermost first) of an event's `stack_id`; [] when none."""
        return self.session.stack(stack_id)

    def unnamed_launches(self) -> Optional[str]:
        """A sentence counting the launches whose kernel could not be named, and why (None
        when every launch read so far was named)."""
        return self.names.unnamed_summary()

    @staticmethod
    def fn_ids(categories: Sequence[str]) -> Set[int]:
        """Record function ids of the table rows in these categories."""
        return {i for i, api in enumerate(apis.TABLE) if api.category in categories}

    # -- tear-down -------------------------------------------------------------------------

    def close(self, wait: bool = True) -> None:
        """Detach every probe and free every kernel object (idempotent). `wait=False`: in a
        forked child, for a program about to exit (see Session.close)."""
        if self.stream.pystacks is not None:  # (its ring's mapping and watcher thread first)
            self.stream.pystacks.close()
        self.session.close(wait)

    def __enter__(self) -> "Tracer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- for long-running users (the monitor) --

    def live_sums(self) -> "aggregates.LiveSums":  # (the module: `aggregates` is a method here)
        """The in-kernel sums (with `aggregate=True`) read again and again as they grow:
        per-function totals, errors, launches and calls by process; and the entries of
        processes that exited let go, so that the kernel's maps keep room for new ones
        (aggregates.LiveSums). Make it once: it keeps its buffers."""
        return self.session.live_sums()


def _set_thread_nice(nice: int) -> None:
    """Give the calling thread (PRIO_PROCESS 0 is the calling thread on Linux) this CPU
    priority; threads it starts later inherit it. Without CAP_SYS_NICE: left as it is."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass
