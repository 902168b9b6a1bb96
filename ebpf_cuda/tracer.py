"""The public `Tracer`: a Session (the kernel objects) and a Stream (the read loop).

    with Tracer(command=["./app"]) as tracer:
        for event in tracer.events():
            print(event.api, event.phase, event.args)

    with Tracer(command=["./app"]) as tracer:  # every output the CLI has
        tracer.trace_into([TextWriter(sys.stdout, namer=tracer.names)], spool=Spool())

It never prints, exits or installs signal handlers; progress notes go to `log` if given.
"""
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from .decode.events import Decoder, Event
from .decode.names import KernelNamer
from .session import Attachment, Session
from .spec import apis, layout
from .spec.config import TraceConfig
from .stream import Closing, Notice, Stream
from .targets.selection import Target

if TYPE_CHECKING:  # (imported when used: --summary, not the default trace)
    from .decode import aggregates as sums

DEFAULT_RING_SIZE = layout.DEFAULT_RING_SIZE

__all__ = ["Tracer", "TraceConfig", "Closing", "Attachment", "Target", "DEFAULT_RING_SIZE"]


class Tracer:
    """Traces CUDA calls of one process (`pid`), of a command it starts (`command`), or of
    every process using the probed files: what and how, a `TraceConfig` (see its fields),
    given whole or by its keywords: `Tracer(command=["./app"], functions=["cudaMalloc"])`."""

    def __init__(self, config: Optional[TraceConfig] = None, **keywords) -> None:
        if config is not None and keywords:
            raise TypeError("Tracer() takes a TraceConfig or its keywords, not both")
        if config is not None and not isinstance(config, TraceConfig):
            raise TypeError("Tracer()'s one positional argument is a TraceConfig, not %s"
                            % type(config).__name__)
        self.config = config if config is not None else TraceConfig(**keywords)
        self.session = Session(self.config)
        self.names = KernelNamer(probe_names=self.session.probe_name,
                                 exec_times=self.session.exec_times)
        self.decoder = Decoder(apis.TABLE)  # clock offset measured now, before the start
        self.stream = Stream(self.session, self.names, self.decoder)
        self.gpu = None  # the GPU sampler (gpu/sampler.py) with `gpu_samples`
        self._gpu_asked = False

    # -- set-up ----------------------------------------------------------------------------

    def start(self, meanwhile: Optional[Callable[[], None]] = None) -> "Tracer":
        """Find files, load and attach every probe; a command is started but held until
        `run()` (or the first read), so that its first call is seen. `meanwhile`: work of
        the caller's done while the kernel verifies the programs (once, at the first start)."""
        self.session.start(meanwhile)
        if self.config.gpu_samples > 0 and not self._gpu_asked:
            self._gpu_asked = True
            self._start_gpu()
        return self

    def _start_gpu(self) -> None:
        """The GPU's state sampled beside the calls (gpu/sampler.py); what cannot be is
        said in `gpu_lines` (and to the `notice` of `trace_into`), never raised. Where the
        absence of NVML is no news (the default), a host without it imports no sampler."""
        from .gpu import nvml_findable

        if self.config.gpu_absent_ok and self.config.nvml is None and not nvml_findable():
            return
        from .gpu.launches import LastLaunches
        from .gpu.sampler import Sampler

        sampler = Sampler(1.0 / self.config.gpu_samples, self.config.nvml,
                          clock_offset_ns=self.decoder.clock_offset_ns)
        self.gpu = sampler
        if sampler.start(absent_ok=self.config.gpu_absent_ok and self.config.nvml is None):
            self.stream.gpu = sampler
            self.stream.last_launches = LastLaunches()

    @property
    def gpu_lines(self) -> List[str]:
        """What the GPU sampler said it could not sample, and why."""
        return list(self.gpu.lines) if self.gpu is not None else []

    def run(self) -> None:
        """Let a held command run (once)."""
        if self.session.command is not None:
            self.session.command.release()

    # What was asked for, and what the start found (the Session's).
    options = property(lambda self: self.config)  # (its name when it was a tuple)
    emit = property(lambda self: self.config.emit)
    aggregate = property(lambda self: self.config.aggregate)
    pid = property(lambda self: self.config.pid)
    command = property(lambda self: list(self.config.command))
    apis = property(lambda self: self.session.selected)  # the selected rows of the table
    apis_table = property(lambda self: self.decoder.table)  # the rows records are numbered by
    targets = property(lambda self: self.session.targets)
    attachments = property(lambda self: self.session.attachments)
    failures = property(lambda self: self.session.failures)
    programs = property(lambda self: self.session.programs)  # by (function, retprobe)

    def sampled_returns(self) -> List[str]:
        """The functions whose returns are sampled (TraceConfig.sample_returns), by name."""
        return self.session.sampled_returns()

    @property
    def late_loads(self) -> List[Tuple[str, int, float]]:
        """Files probed after the start because a traced process mapped them (see
        late_loads.py): (path, pid, milliseconds from its loader's notice to the probes
        being on)."""
        return list(self.session.late_probed)

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
        return self.session.children_left()

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
        if notice is not None and self.gpu is not None:  # (its lines so far, and later)
            self.gpu.set_notice(notice)
        self.start()
        self.stream.deliver(sinks, save=save, spool=spool, notice=notice,
                            reader_nice=reader_nice)

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

    def aggregates(self) -> "sums.Aggregates":
        """The in-kernel aggregates so far (with `aggregate=True`)."""
        return self.session.aggregates()

    def stack(self, stack_id: int) -> List[int]:
        """Return addresses (innermost first) of an event's `stack_id`; [] when none."""
        return self.session.stack(stack_id)

    def closing(self) -> Closing:
        """What to tell at the end of a trace, and the exit status (stream.Closing): call it
        once the reading is over, before `close()` (the loss counts are the kernel's)."""
        return self.stream.closing()

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
        if self.gpu is not None:
            self.gpu.stop()
        if self.stream.pystacks is not None:  # (its ring's mapping and watcher thread first)
            self.stream.pystacks.close()
        self.stream.close()
        self.session.close(wait)

    def __enter__(self) -> "Tracer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def live_sums(self) -> "sums.LiveSums":
        """The in-kernel sums (with `aggregate=True`) read again and again as they grow, and
        the entries of exited processes let go (aggregates.LiveSums). Make it once."""
        return self.session.live_sums()
