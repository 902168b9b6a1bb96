"""The one read loop: ring frames → new processes noted → names learned → outputs.

Every batch of frames drained from the ring goes through the same steps, whatever the
outputs: the processes it shows for the first time have their mappings snapshotted while
they live, the calls that teach kernel names are decoded and learned, and then the batch
goes to its outputs, one of four ways (`Stream.deliver`):
- saved only: raw frames to the file, launches named in bulk for its trailer;
- text or JSON alone, spooled: the frames to an on-disk spool, lines written by a second
  thread behind the reader (lossless when lines are slower than calls come);
- text or JSON alone, inline: lines straight from the frames;
- anything else: decoded once into events, handed to every sink.
Decoded events are annotated by the enrichers, one list applied in order (`annotate`); each
text or JSON writer is bound once to what the reader knows besides the records
(output.DecodeContext). `closing()` says what the end of the trace tells.
"""
import os
import select
import threading
import time
from typing import (TYPE_CHECKING, Callable, Dict, Generator, Iterator, List, NamedTuple,
                    Optional, Sequence, Tuple)

from .decode.devices import DeviceTracker
from .decode.events import Decoder, Event
from .decode.graphs import GraphTracker
from .decode.losses import Losses
from .decode.names import KernelNamer
from .decode.nccl import Communicators
from .decode.reaper import Reaper
from .output import DecodeContext, LineWriter
from .output.outputs import Outputs, lines_only
from .output.plan import format_size
from .pump import PUMP_CAUSE, Pump
from .session import Session
from .spec import layout, record
from .targets.command import alive
from .targets.containers import Containers

if TYPE_CHECKING:  # (the GPU's: imported when it is sampled)
    from .decode.pystacks import PyStacks
    from .gpu.feed import GpuFeed
    from .gpu.launches import LastLaunches

BATCH_RECORDS = 2048  # records handed over at once (330 KB): bounds the memory of a batch
POLL_INTERVAL_S = 0.05  # the longest wait before the loop looks at stop() and the target
# After a batch that took all the ring held, records gather in it up to this long before the
# next read: read as they come, batches are small (the reader chases the producer) and each
# batch's own work (mappings, names, launches, the spool) weighs on every call. Never longer
# than 1/8 of the ring (where the probes' wakeups begin) takes to fill at PAUSE_RATE records
# a second: 1.5 ms with the default 4 MiB ring (~450 records at 300k calls/s, 2% of it).
PAUSE_S = 0.002
PAUSE_RATE = 2_000_000
# The lines thread holds the interpreter lock while it formats; the reader, woken by the
# ring, waits for it up to the switch interval (5 ms by default): shorter keeps that wait
# well below the time the ring takes to fill.
SWITCH_INTERVAL_S = 0.0002
SPOOL_NOTICE = 200_000  # calls left at the end worth a word: about a second of formatting
LOST_EVERY_S = 0.5  # how often a saved trace's header learns the ring-full count

Notice = Callable[[str], None]
Named = List[Tuple[int, int, Optional[str]]]  # (pid, func, kernel name) of a batch's launches
# What annotates decoded events before the sinks get them (names, graphs, ...): each takes a
# batch of events, in order (see Stream.annotate).
Enricher = Callable[[List[Event]], None]


class Closing(NamedTuple):
    """What the end of a trace tells a person, and how a command line ends (Tracer.closing)."""

    left_running: List[str]  # first: the processes the command started that still run
    losses: Losses  # everything lost (a summary says what it did not count)
    # after the reports: what was lost, launches left unnamed, graphs not known, calls
    # without their Python stack, why the command could not run
    lines: List[str]
    # the command's exit code; else 1 when an output failed; None: 0 (if the reports could
    # be written)
    exit_status: Optional[int]


class Stream:
    """Reads one session's ring until its target ends or `stop()` is called, and delivers
    every batch (see the module's docstring)."""

    def __init__(self, session: Session, names: KernelNamer, decoder: Decoder) -> None:
        self.session = session
        self.names = names
        self.graphs = GraphTracker(names)  # each graph from its calls (graphs.py)
        self.containers = Containers()  # each process's container (containers.py)
        self.devices = DeviceTracker()  # each call's device (devices.py)
        self.communicators = Communicators()  # NCCL calls' rank, size, id, seq (nccl.py)
        self.reaper = Reaper(names.seen_pids, self._forget)  # exited processes (reaper.py)
        # --py-stacks: each call's Python stack (pystacks.py), once the maps exist
        self.pystacks: Optional["PyStacks"] = None  # (pystacks.py imported only then)
        self.enrichers: List[Enricher] = self._enrichers()
        self._warn: Optional[Notice] = None
        self._read_bytes = 0  # frames read so far, and (behind a spool) written as lines
        self._lines_bytes = 0
        self.decoder = decoder
        self.teaching = {i for i, api in enumerate(decoder.table)
                         if api.learn_name or api.learn_func or api.learn_alias}
        self._stopping = False
        self._stats_at_end: Optional[Dict[str, int]] = None  # (the probes' counts: _last)
        self.outputs = Outputs([])  # the last deliver's outputs and their failures
        self._spool = None  # the spool the lines were written through, if they were
        # the ring kept drained while a batch takes long (pump.py): stopped after each loop
        self._pump = Pump(lambda: self.session.ring.drain_frames(  # type: ignore[union-attr]
            record.SIZE, BATCH_RECORDS))
        self._spool_given = None  # the spool the last deliver was handed
        self._prepared: Optional[Tuple[LineWriter, Decoder]] = None  # (prepare_lines)
        self._lost_noted = 0.0
        # While GPU state is sampled (Tracer sets them): the sampler, the launches kept for
        # its events, and how many of its events have their launches
        self.gpu = None
        self.last_launches: Optional["LastLaunches"] = None
        self._gpu_filled = 0

    def stop(self) -> None:
        """Finish after draining what is already in the ring. Safe in a signal handler."""
        self._stopping = True

    # -- reading ---------------------------------------------------------------------------

    def frames(self, timeout: Optional[float] = None) -> Iterator[bytes]:
        """Batches of raw frames until the end, each after its new processes were noted,
        its teaching calls learned and its launches named; what the probes wrote before the
        end is all drained. A held command is let run first."""
        for frames, _ in self._batches(timeout):
            yield frames

    def _batches(self, timeout: Optional[float] = None) -> Iterator[Tuple[bytes, Named]]:
        """(frames, the (pid, func, kernel name) of their launches) until the end."""
        # (a command's processes are traced from their start: device 0 until they set one)
        self.devices.from_start = bool(self.session.options.command)
        python = layout.PY_PROCS in self.session.maps and self.pystacks is None
        if python:
            from .decode.pystacks import PyStacks

            self.pystacks = PyStacks(self.session.maps, self.session.log,
                                     self.session.options.return_probes)
            self.pystacks.warn = self._warn
            if self.session.command is not None:  # (its file read before it runs)
                self.pystacks.prepare(self.session.command.argv[0])
            self.enrichers = self._enrichers()
        if self.session.command is not None:
            self.session.command.release()  # (returns once it has exec'd)
        if python:
            self._first_interpreters()
        deadline = None if timeout is None else time.monotonic() + timeout
        self._stats_at_end = None  # (this loop reads on: what its probes drop is lost)
        ring_size = self.session.ring.size if self.session.ring is not None else 0
        pause = min(PAUSE_S, ring_size / record.FRAME_SIZE / 8 / PAUSE_RATE)
        with _Waiter(self.session) as waiter, self._pump as pump:
            while not self._stopping and not self._target_gone():
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    break
                # Woken, or after POLL_INTERVAL_S: the probes wake the reader only once 1/8
                # of the ring waits, so what a slow program wrote is read at least this often.
                waiter.wait(wait)
                caught_up = yield from self._drain(pump)
                if self.gpu is not None:
                    self._fill_gpu_events()
                # (every batch read so far has been handed over; behind a spool, the
                # lines thread says how far it has written)
                self.reaper.tick(self._read_bytes, self._read_bytes if self._spool is None
                                 else self._lines_bytes)
                if caught_up and not self._stopping:
                    time.sleep(pause)
            pump.stop()
            yield from self._last(pump)

    def close(self) -> None:
        """Free what the read loops keep (the pump's file)."""
        self._pump.discard()

    def _first_interpreters(self) -> None:
        """The traced process's interpreter, or the command's once it is mapped."""
        assert self.pystacks is not None
        if self.session.options.pid is not None:
            self.pystacks.register(self.session.options.pid)
        elif self.session.command is not None and self.session.command.execed:
            self.pystacks.watch(self.session.command.pid)

    def _drain(self, pump: Pump) -> Generator[Tuple[bytes, Named], None, bool]:
        """The ring's batches (first those the pump took) until one takes all the ring held
        (then True: see PAUSE_S), it is empty, or the stream stops (a producer calling flat
        out fills every batch)."""
        while not self._stopping:
            frames = pump.frames()
            if not frames:
                return False
            with pump.busy():
                yield from self._batch(frames)
            if len(frames) < BATCH_RECORDS * record.FRAME_SIZE and not pump.waiting:
                return True
        return False

    def _last(self, pump: Pump) -> Generator[Tuple[bytes, Named], None, None]:
        """At the end: what the pump took, then the ring's records up to where the producers
        were now (not chasing a program that still calls flat out until it exits). The
        records the ring drops from here on would lie past that end, read by no one: the
        losses are the probes' counts at this point (a stop during a long naming scan left a
        backlog whose reading let the ring fill after the end)."""
        ring = self.session.ring
        assert ring is not None
        end = ring.producer_pos
        self._stats_at_end = self.session.stats()  # (after `end`: a drop counted is one past it)
        while pump.waiting or ring.consumer_pos < end:
            frames = pump.frames()
            if not frames:
                return
            yield from self._batch(frames)

    def _batch(self, frames: bytes) -> Generator[Tuple[bytes, Named], None, None]:
        """One batch: its new processes noted, its teaching calls learned and its launches
        named, then handed over."""
        if self.pystacks is not None:  # (the stacks of these records came before them)
            self.pystacks.drain()
            self.pystacks.observe(frames)
        self._read_bytes += len(frames)
        self.session.note_loads(frames)  # libraries just mapped: probed first
        pids = record.frame_pids(frames)
        self.names.observe_frames(frames, pids)
        self.containers.observe(pids, frames)
        teaching = self.decoder.decode_batch(frames, self.teaching)
        if teaching:  # (where each name lies, for those the probes could not keep)
            self.names.learn(teaching, self.decoder.name_pointers(frames))
        launches = self.decoder.launches(frames)
        named = self.names.name_launches(launches, self.decoder.table)
        if self.last_launches is not None:
            self.last_launches.add(launches, named, self.decoder.table)
        yield frames, named

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Decoded events until the end, teaching calls showing their `kernel_name`."""
        for frames in self.frames(timeout):
            yield from self.decode(frames)

    def decode(self, frames: bytes) -> List[Event]:
        """The events of a batch the stream has read (its names already learned)."""
        events = self.decoder.decode_batch(frames)
        self.annotate(events)
        return events

    def annotate(self, events: List[Event]) -> None:
        """What decoded events get besides their record (`enrichers`). Events are annotated
        once, in order, by whoever decodes them for the outputs (this thread, or the lines
        thread behind a spool)."""
        for enrich in self.enrichers:
            enrich(events)

    def _enrichers(self) -> List[Enricher]:
        """In order: the names teaching calls taught, the Python stacks, what graph launches
        ran and which launches a capture recorded (graphs.py), the communicator of NCCL
        calls (nccl.py), each process's container, each call's device (after the
        communicators: an NCCL call's device is its communicator's)."""
        pystacks = [self.pystacks.annotate] if self.pystacks is not None else []
        return [self.names.annotate] + pystacks + [
            self.graphs.annotate, self.communicators.annotate_batch,
            self.containers.annotate, self.devices.annotate]

    def _forget(self, pid: int) -> None:
        """Drop what is kept of a process that exited (the Reaper says when)."""
        self.names.forget(pid)
        if self.pystacks is not None:
            self.pystacks.forget(pid)
        self.communicators.forget(pid)
        self.containers.forget(pid)
        self.devices.forget(pid)

    def _lines_wrote(self, frames: bytes) -> None:
        """The lines thread has written a batch (the only writer of this counter)."""
        self._lines_bytes += len(frames)

    def _target_gone(self) -> bool:
        command = self.session.command
        if command is not None:
            return command.poll() is not None
        pid = self.session.options.pid
        return pid is not None and not alive(pid)

    # -- delivering ------------------------------------------------------------------------

    def prepare_lines(self, sinks: Sequence, save=None, spool=None) -> None:
        """What `deliver` with these same outputs does before the command runs, done now
        (the text or JSON writer's frame templates: ~3 ms): the CLI does it while the
        kernel verifies the programs (Tracer.start's `meanwhile`)."""
        lines = lines_only(list(sinks))
        if lines is None or save is not None:
            return
        decoder = (Decoder(self.decoder.table, self.decoder.clock_offset_ns)
                   if spool is not None else self.decoder)  # (behind a spool: its own)
        self._bind(list(sinks), spool is not None, alone=True)  # (the templates read it)
        lines.prepare(decoder)
        self._prepared = (lines, decoder)

    def deliver(self, sinks: Sequence, save=None, spool=None, notice: Optional[Notice] = None,
                reader_nice: Optional[int] = None) -> None:
        """Read until the end, handing every batch to the outputs: `sinks` (output.Sink),
        `save` (a savefile.SaveWriter), and, when one text or JSON writer is the only sink,
        `spool` (a spool.Spool) between the reader and its lines. `notice` is told of a
        backlog still to write at the end, and of an output that could not be written.
        Sinks are closed at the end; `save` too.

        An output whose write fails (OSError: a full disk, a closed pipe, a file size
        limit) is dropped at once, the others go on, and what it misses from the failing
        batch on is counted (`failures`). When none is left, a command is still read to
        its end (its records counted as not written), so that its exit status is known;
        without a command the reading stops. `reader_nice`: this thread's CPU priority
        while it reads."""
        if reader_nice is not None:
            _set_thread_nice(reader_nice)
        self._warn = notice  # (told of an interpreter --py-stacks does not know)
        sinks = list(sinks)
        lines = lines_only(sinks)
        spooled = lines is not None and save is None and spool is not None
        self._bind(sinks, spooled, alone=lines is not None and save is None)  # (again: the GPU
        # feed exists now; the rest is what prepare_lines' templates were bound to)
        self._spool, self._spool_given = None, spool
        self.outputs = outputs = Outputs(sinks + ([save] if save is not None else []), notice,
                                         goes_on=self.session.command is not None)
        if save is not None and not sinks:
            return self._save_only(save, outputs)
        if spooled:
            return self._spooled(lines, spool, notice, outputs)
        if lines is not None and save is None:
            lines.prepare(self.decoder)
        outputs.header()
        try:
            for frames in self.frames():
                if outputs.alive(save):
                    outputs.call(save, save.write_frames, frames)
                if lines is not None and save is None:
                    if outputs.alive(lines):  # no events needed
                        outputs.call(lines, lines.write_frames, frames, self.decoder)
                elif outputs.any_alive(sinks):
                    events = self.decode(frames)
                    for sink in sinks + ([save] if save is not None else []):
                        if outputs.alive(sink):
                            outputs.call(sink, sink.write, events)
                self._batch_done(outputs, frames, save)
        finally:
            self._close(outputs, save)

    def _bind(self, sinks: List, spooled: bool, alone: bool = False) -> None:
        """Give every text and JSON writer what the reader knows besides the records: the
        enrichers (for records decoded on their slow path), the graphs (which records take
        it), containers and devices; behind a spool, the kernel names as the reader found
        them (read from the lines thread); `alone`: one of them is the only output."""
        namer = None
        if spooled:
            namer = self.graphs.namer = self.names.found_names()
        context = DecodeContext(self.annotate, self.graphs, self.containers, self.devices,
                                namer)
        for sink in sinks:
            if isinstance(sink, LineWriter):
                sink.bind(context._replace(gpu=self._gpu_feed(alone)))

    def _gpu_feed(self, alone: bool) -> Optional["GpuFeed"]:
        """The GPU's records for one text or JSON writer, among the calls (an event once
        it has the launches before it); `alone`: the only output, the samples it wrote
        are not kept."""
        if self.gpu is None:
            return None
        from .gpu.feed import GpuFeed

        sampler = self.gpu
        return GpuFeed(sampler.samples, sampler.events, lambda: self._gpu_filled,
                       lambda: sampler.round_since, drop=alone)

    def _batch_done(self, outputs: "Outputs", frames: bytes, save=None) -> None:
        """After each batch: flush, count what failed outputs missed, keep the saved
        trace's loss count current, stop when nothing is left to write to."""
        outputs.flush()
        outputs.count(frames)
        if save is not None and outputs.alive(save):
            self._note_lost(outputs, save)
        if outputs.nothing_left and self.session.command is None:
            self.stop()

    def _note_lost(self, outputs: "Outputs", save, final: bool = False) -> None:
        """The ring-full count so far into the saved trace's header (read at most every
        LOST_EVERY_S): a trace whose tracer is killed still says what it had lost."""
        now = time.monotonic()
        if not final and now - self._lost_noted < LOST_EVERY_S:
            return
        self._lost_noted = now
        note = getattr(save, "note_lost", None)
        if note is not None:
            outputs.call(save, note, self._stats()["lost"])

    def losses(self) -> Losses:
        """What the outputs missed so far, by cause (the ring's count read now; the
        spool's and the failed outputs' as the last `deliver` left them)."""
        stats = self._stats()
        losses = Losses(ring_full=stats["lost"], entries_lost=stats["entries_lost"],
                        too_deep=stats["too_deep"], names_lost=self.names.names_lost,
                        names_unread=self.names.names_unread)
        spool = self._spool
        if spool is not None:
            refused = spool.dropped if spool.error else 0
            losses.spool_past = spool.dropped - refused
            losses.spool_refused, losses.spool_error = refused, spool.error
            losses.interrupted = spool.abandoned
        if self._pump.dropped:
            losses.dropped[PUMP_CAUSE] = (self._pump.dropped, self._pump.error or "its limit")
        for failure in self.outputs.failures:
            losses.unwritten[failure.name] = (failure.total, failure.cause)
        return losses

    def _stats(self) -> Dict[str, int]:
        return self._stats_at_end if self._stats_at_end is not None else self.session.stats()

    def closing(self) -> Closing:
        """What to tell at the end of the trace, and the exit status (Closing); before the
        session closes (its loss counts, the processes it still follows)."""
        losses = self.losses()
        if self._spool_given is not None:
            losses.spool_limit = "%s bytes" % format_size(self._spool_given.limit)
        left = self.session.children_left()
        left_running = ["the command ended; %d process%s it started still run%s (%s), not "
                        "traced from here on" % (
                            len(left), "es" if len(left) > 1 else "",
                            "" if len(left) > 1 else "s",
                            ", ".join("pid %d" % p for p in left[:5])
                            + (", ..." if len(left) > 5 else ""))] if left else []
        lines = [losses.sentence(), self.names.unnamed_summary(), self.graphs.unknown_summary(),
                 self.pystacks.sentence() if self.pystacks is not None else None]
        command = self.session.command
        if command is not None and command.exec_error is not None:
            lines.append("cannot run %s: %s" % (command.argv[0], command.exec_error.strerror))
        status = command.exit_status if command is not None else None
        if status is None and self.outputs.failures:
            status = 1
        return Closing(left_running, losses, [line for line in lines if line], status)

    def _close(self, outputs: "Outputs", save=None) -> None:
        """Close every output, the saved trace last, after telling the outputs that show
        losses (the HTML report, the saved trace's trailer) what was lost."""
        if save is not None and outputs.alive(save):
            self._note_lost(outputs, save, final=True)
            if self.pystacks is not None:
                self.pystacks.drain()
                outputs.call(save, save.note_py_stacks, self.pystacks.export())
        if self.gpu is not None:  # the GPU's samples and events, with the calls before them
            self.gpu.stop()
            self._fill_gpu_events()
            records = sorted(self.gpu.samples + self.gpu.events, key=lambda r: r.ts_ns)
            for sink in outputs.sinks:  # (text and JSON: those not written yet)
                tell = getattr(sink, "note_gpu", None)
                if tell is not None and outputs.alive(sink):
                    outputs.call(sink, tell, records)
        losses = self.losses()
        for sink in outputs.sinks:
            tell = getattr(sink, "note_losses", None)
            if tell is not None and outputs.alive(sink):
                outputs.call(sink, tell, losses)
        outputs.close()

    def _fill_gpu_events(self) -> None:
        """The GPU events come since the last look get the launches read before them."""
        events = self.gpu.events
        while self._gpu_filled < len(events):
            event = events[self._gpu_filled]
            event.last_launches = self.last_launches.before(event.ts_ns,
                                                            offset_ns=self.gpu.offset_ns)
            self._gpu_filled += 1

    def _save_only(self, save, outputs: "Outputs") -> None:
        """Saving alone decodes nothing: the launches are named from a bulk scan of their
        records (while their processes live), the rest is written raw."""
        try:
            for frames, named in self._batches():
                if outputs.alive(save):
                    outputs.call(save, save.write_frames, frames)
                    save.learn(named)
                self._batch_done(outputs, frames, save)
        finally:
            self._close(outputs, save)

    def _spooled(self, writer, spool, notice: Optional[Notice], outputs: "Outputs") -> None:
        """This thread reads the ring, names the launches while their processes live and
        spools the frames; a second thread writes the lines from the spool, behind the
        reader when it must (see spool.py). When the lines cannot be written, the reader
        stops spooling and counts the records instead."""
        self._spool = spool
        behind = (self._prepared[1] if self._prepared is not None and
                  self._prepared[0] is writer and self._prepared[1] is not self.decoder
                  else Decoder(self.decoder.table, self.decoder.clock_offset_ns))
        # (its namer: the names found, see `_bind`; before the command runs: no write error,
        # if it fails)
        writer.prepare(behind)
        failed: List[BaseException] = []  # the lines thread's error, for this thread
        outputs.header()  # before the command runs: the header comes first
        thread = threading.Thread(target=_write_spooled,
                                  args=(spool, writer, behind, failed, outputs,
                                        self._lines_wrote),
                                  name="ebpf-cuda lines", daemon=True)
        switch = _switch_interval(SWITCH_INTERVAL_S)
        if outputs.alive(writer):
            thread.start()
        else:
            spool.close()
        try:
            for frames in self.frames():  # (launches named as they are read)
                if failed:
                    break
                if outputs.alive(writer):
                    spool.put(frames)
                else:  # (the lines thread counts what it had not written yet)
                    outputs.count(frames, by_reader=True)
                    if self.session.command is None:
                        self.stop()
        finally:
            spool.close()
            if spool.backlog > SPOOL_NOTICE and not failed and notice is not None \
                    and outputs.alive(writer):
                notice("writing the %d events still spooled (Ctrl-C stops there; the rest "
                       "is counted as lost)" % spool.backlog)
            while thread.is_alive():
                thread.join(0.2)  # (a bare join would hold signals off until it returns)
            spool.discard()
            _switch_interval(switch)
            self._close(outputs)
        if failed:
            raise failed[0]


def _write_spooled(spool, writer, decoder: Decoder, failed: List[BaseException],
                   outputs: "Outputs", wrote: Callable[[bytes], None]) -> None:
    """The lines thread: every batch of the spool, in order. A write error drops the
    output (the backlog left is counted as not written); any other error stops the
    reader."""
    try:
        for frames in spool:
            if outputs.alive(writer):
                outputs.call(writer, writer.write_frames, frames, decoder)
                outputs.flush()
            outputs.count(frames)
            wrote(frames)
    except BaseException as err:  # handed to the reader's thread, which raises it
        failed.append(err)
        spool.abandon()


def _set_thread_nice(nice: int) -> None:
    """Give the calling thread (PRIO_PROCESS 0 is the calling thread on Linux) this CPU
    priority; threads it starts later inherit it. Without CAP_SYS_NICE: left as it is."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass


def _switch_interval(seconds: float) -> float:
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    return old


class _Waiter:
    """Waits for records in the ring or for the end of the target process, whichever comes
    first: with a process fd (pidfd, Linux 5.3+, Python 3.9+) the end is seen at once,
    without one within POLL_INTERVAL_S."""

    def __init__(self, session: Session) -> None:
        assert session.ring is not None
        self._epoll = select.epoll()
        self._epoll.register(session.ring.fileno(), select.EPOLLIN)
        self._pidfd = _pidfd(session.command.pid if session.command is not None
                             else session.options.pid)
        if self._pidfd is not None:
            self._epoll.register(self._pidfd, select.EPOLLIN)

    def wait(self, timeout: Optional[float]) -> bool:
        """True when woken (records, or the target ended); False after `timeout` seconds or
        POLL_INTERVAL_S, whichever is shorter (a signal handler's stop() is seen then)."""
        timeout = POLL_INTERVAL_S if timeout is None else min(timeout, POLL_INTERVAL_S)
        return bool(self._epoll.poll(timeout))

    def __enter__(self) -> "_Waiter":
        return self

    def __exit__(self, *exc) -> None:
        self._epoll.close()
        if self._pidfd is not None:
            os.close(self._pidfd)


def _pidfd(pid: Optional[int]) -> Optional[int]:
    pidfd_open = getattr(os, "pidfd_open", None)  # Python 3.9+
    if pid is None or pidfd_open is None:
        return None
    try:
        return pidfd_open(pid)
    except OSError:
        return None
