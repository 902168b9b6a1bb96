"""The flight recorder of `ebpf-cuda monitor --flight-recorder SECONDS`: the last SECONDS of
every call's record on disk, written out as a saved trace when something goes wrong.

    recorder = FlightRecorder(FlightOptions(seconds=10, directory="/var/log/ebpf-cuda"),
                              tracer)
    for frames in tracer.frames(): recorder.put(frames)    # the monitor's reader
    recorder.request("SIGUSR1")                           # from a signal handler
    recorder.poll()                                       # the reader, now and then

The frames go into a bounded ring on disk (an unnamed file in the dump folder, `size`
bytes: page cache and disk, not the tracer's memory); batches older than SECONDS are let go,
and a batch still younger that must make room is counted as overwritten. A trigger — a call
returning one of the trigger error codes, a synchronising call slower than `latency_ns`, or
`request()` — writes the frames of the SECONDS before it into a new saved trace in the
folder (`ebpf-cuda report` reads it), whose trailer also names the trigger (`read_trigger`).
Error and latency triggers dump at most once per SECONDS (the others are counted). A dump
says what its window lost, by cause (its trailer's losses, as any saved trace's): records
the probes could not write, calls overwritten in the ring, calls the disk refused. The
probes' counters are read at every `poll()`, so a window's count may take in up to one
poll interval (half a second) before it: a count at most, never one short.
"""
import collections
import json
import os
import struct
import tempfile
import threading
import time
from typing import Deque, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Tuple

from ..decode.losses import Losses
from ..errors import DecodeError, UsageError
from ..output import savefile
from ..output.spool import write_all_at
from ..spec import record
from ..spec.cuda_enums import CU_RESULTS, CUDA_ERRORS
from .metrics import Family

DEFAULT_SIZE = 1 << 30  # bytes of frames the disk ring holds: ~4.8M calls
# The error families a dump is triggered by (codes are the same in both layers).
TRIGGER_FAMILIES: Dict[str, Tuple[int, ...]] = {
    "oom": (2,),  # cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY
    "illegal-address": (700, 716, 717),  # illegal, misaligned address; invalid address space
}
DEFAULT_TRIGGERS = "oom,illegal-address"
SYNC_CATEGORY = "sync"  # the rows whose latency can trigger a dump
_RET_MASK = 0xFFFFFFFF  # cudaError_t and CUresult are 32-bit
_HEADER = struct.Struct("<8sHHqQI")  # savefile's header (its module docstring)


class FlightOptions(NamedTuple):
    seconds: float
    directory: str = "."
    errors: FrozenSet[int] = frozenset(c for f in TRIGGER_FAMILIES.values() for c in f)
    latency_ns: Optional[int] = None  # a synchronising call at least this long triggers
    size: int = DEFAULT_SIZE


def parse_trigger_errors(text: str) -> FrozenSet[int]:
    """`oom,illegal-address,719,cudaErrorLaunchFailure` → the error codes (a family, a
    number, or a cudaError_t or CUresult name); "" or "none": no error triggers."""
    names = {name: code for table in (CUDA_ERRORS, CU_RESULTS) for code, name in table.items()}
    codes = set()
    for word in (w.strip() for w in text.split(",")):
        if not word or word == "none":
            continue
        if word in TRIGGER_FAMILIES:
            codes.update(TRIGGER_FAMILIES[word])
        elif word.isdigit():
            codes.add(int(word))
        elif word in names:
            codes.add(names[word])
        else:
            raise UsageError("--trigger-error: %r is no error family (%s), number or CUDA "
                             "error name" % (word, ", ".join(TRIGGER_FAMILIES)))
    return frozenset(codes)


class _Batch(NamedTuple):
    offset: int
    length: int
    first_ns: int
    last_ns: int
    calls: int


class FrameRing:
    """Batches of frames in a bounded, unnamed file, oldest first (see the module's
    docstring)."""

    def __init__(self, directory: str, size: int, seconds: float) -> None:
        self.size = size
        self.window_ns = int(seconds * 1e9)
        self._file = tempfile.TemporaryFile(dir=directory)  # (O_TMPFILE: no name)
        self._fd = self._file.fileno()
        self._batches: Deque[_Batch] = collections.deque()
        self._at = 0
        self.newest_ns = 0
        self.overwritten = 0  # calls that had to make room while younger than the window
        self.unwritten = 0  # calls the file refused (a full disk): not kept
        self.error: Optional[str] = None  # why, the last time

    def put(self, frames: bytes, first_ns: int, last_ns: int) -> None:
        calls = record.call_count(frames)
        self.newest_ns = max(self.newest_ns, last_ns)
        if len(frames) > self.size:
            self.overwritten += calls
            return
        if self._at + len(frames) > self.size:
            self._at = 0
        end = self._at + len(frames)
        while self._batches and self._batches[0].offset < end \
                and self._batches[0].offset + self._batches[0].length > self._at:
            old = self._batches.popleft()
            if old.last_ns >= self.newest_ns - self.window_ns:
                self.overwritten += old.calls
        try:
            write_all_at(self._fd, frames, self._at)
        except OSError as err:  # (ENOSPC: the calls are lost, counted; the monitor goes on)
            self.unwritten += calls
            self.error = err.strerror or str(err)
            return
        self._batches.append(_Batch(self._at, len(frames), first_ns, last_ns, calls))
        self._at = end
        while self._batches and self._batches[0].last_ns < self.newest_ns - self.window_ns:
            self._batches.popleft()

    def since(self, start_ns: int) -> List[bytes]:
        """The frames of every call (and hello record) at or after `start_ns`, in order."""
        out = []
        for batch in list(self._batches):
            if batch.last_ns < start_ns:
                continue
            frames = os.pread(self._fd, batch.length, batch.offset)
            if batch.first_ns < start_ns:
                frames = _frames_since(frames, start_ns)
            out.append(frames)
        return out

    def close(self) -> None:
        self._file.close()


def _times(frames: bytes) -> List[int]:
    """Each frame's time: its exit (a call) or its entry (a hello record)."""
    enters = record.frame_column(frames, record.TS_ENTER, "Q")
    exits = record.frame_column(frames, record.TS_EXIT, "Q")
    return [max(a, b) for a, b in zip(enters, exits)]


def _frames_since(frames: bytes, start_ns: int) -> bytes:
    size = record.FRAME_SIZE
    return b"".join(frames[i * size:(i + 1) * size]
                    for i, t in enumerate(_times(frames)) if t >= start_ns)


class _Counts(NamedTuple):
    """What was lost so far, at `at_ns` (CLOCK_MONOTONIC, the records' clock)."""

    at_ns: int
    ring_full: int  # records the probes could not write
    too_deep: int  # calls whose entry could not be kept
    overwritten: int
    unwritten: int


class FlightRecorder:
    """See the module's docstring. `tracer` gives the decoder, the function table, the
    kernel names (its KernelNamer) and the probes' loss counters (`stats()`)."""

    def __init__(self, options: FlightOptions, tracer, log=None) -> None:
        self.options = options
        self.tracer = tracer
        self.log = log or (lambda message: None)
        if not os.path.isdir(options.directory):
            raise UsageError("--flight-dir %s is not a folder" % options.directory)
        try:
            self.ring = FrameRing(options.directory, options.size, options.seconds)
        except OSError as err:
            raise UsageError("cannot keep a flight recorder in %s: %s"
                             % (options.directory, err.strerror or err)) from None
        table = tracer.apis_table
        self._sync_ids = frozenset(i for i, api in enumerate(table)
                                   if api.category == SYNC_CATEGORY)
        self._requested: Optional[str] = None
        self._xid = None  # an Xid (gpu/records.GpuEvent) to dump the calls before
        self._last_dump_ns: Optional[int] = None
        self._lock = threading.Lock()  # the counts, read by exporters
        self.dumps: Dict[str, int] = {}  # dumps written, by trigger kind
        self.suppressed = 0  # triggers within SECONDS of the last dump
        self.failed = 0  # dumps that could not be written
        self.paths: List[str] = []
        self._said: set = set()  # the ring's write errors said so far
        self._marks: Deque[_Counts] = collections.deque()  # (poll's: a window's losses)

    @property
    def overwritten(self) -> int:
        return self.ring.overwritten

    def put(self, frames: bytes) -> None:
        """Keep a batch; dump when one of its calls triggers."""
        times = _times(frames)
        self.ring.put(frames, min(times), max(times))
        error = self.ring.error
        if error is not None and error not in self._said:
            self._said.add(error)
            self.log("flight recorder: cannot keep calls in %s: %s (those not kept are "
                     "counted: ebpf_cuda_events_lost_total{cause=\"flight_recorder_unwritten\"})"
                     % (self.options.directory, error))
        for index, kind in self._triggers_in(frames):
            self._triggered(kind, frames, index, times[index])

    def _triggers_in(self, frames: bytes) -> List[Tuple[int, str]]:
        """(frame index, "error" or "latency") of each triggering call, in order."""
        ids = record.frame_column(frames, record.FN_ID, "H")
        found = []
        errors = self.options.errors
        if errors:
            rets = record.frame_column(frames, record.RET, "Q")
            found += [(i, "error") for i, ret in enumerate(rets)
                      if ret and (ret & _RET_MASK) in errors and ids[i] != record.HELLO_FN]
        limit = self.options.latency_ns
        if limit is not None and not self._sync_ids.isdisjoint(ids):
            enters = record.frame_column(frames, record.TS_ENTER, "Q")
            exits = record.frame_column(frames, record.TS_EXIT, "Q")
            found += [(i, "latency") for i, fn_id in enumerate(ids)
                      if fn_id in self._sync_ids and exits[i] - enters[i] >= limit]
        return sorted(found)

    def _triggered(self, kind: str, frames: bytes, index: int, at_ns: int) -> None:
        window = self.ring.window_ns
        if self._last_dump_ns is not None and at_ns - self._last_dump_ns < window:
            with self._lock:
                self.suppressed += 1
            return
        at = index * record.FRAME_SIZE + record.FRAME_HEADER
        events = self.tracer.decoder.decode_record(frames[at:at + record.SIZE])
        call = events[-1]
        trigger = {"kind": kind, "api": call.api, "pid": call.pid, "tid": call.tid,
                   "comm": call.comm, "ret": call.ret, "error": call.ret_name,
                   "duration_ns": call.duration_ns, "ts": call.ts}
        name = call.ret_name if kind == "error" else "latency-" + call.api
        self._dump(trigger, name, at_ns)

    def request(self, reason: str) -> None:
        """Ask for a dump at the next `poll()` (safe in a signal handler)."""
        self._requested = reason

    def xid(self, event) -> None:
        """Dump at the next `poll()` the calls before an Xid (a gpu/records.GpuEvent; from
        the GPU sampler's thread)."""
        self._xid = event

    def poll(self) -> None:
        """Note the loss counters; dump now if `request()` or an Xid asked for it."""
        self._marks.append(self._counts())
        oldest = self._marks[-1].at_ns - self.ring.window_ns
        while len(self._marks) > 1 and self._marks[1].at_ns <= oldest:
            self._marks.popleft()  # (the one left is at or before the window's start)
        reason, self._requested = self._requested, None
        if reason is not None:
            self._dump({"kind": "signal", "signal": reason, "ts": time.time()}, reason,
                       time.monotonic_ns())
        xid, self._xid = self._xid, None
        if xid is not None:
            self._dump({"kind": "xid", "xid": xid.code, "gpu": xid.device, "uuid": xid.uuid,
                        "meaning": xid.meaning, "ts": xid.ts}, "xid%d" % xid.code, xid.ts_ns)

    def _counts(self) -> _Counts:
        stats = self.tracer.stats()
        return _Counts(time.monotonic_ns(), stats["lost"], stats["too_deep"],
                       self.ring.overwritten, self.ring.unwritten)

    def window_losses(self, start_ns: int) -> Losses:
        """What was lost from `start_ns` on (at most: counted from the last mark at or
        before it, or from the start when there is none)."""
        now = self._counts()
        base = next((m for m in reversed(self._marks) if m.at_ns <= start_ns),
                    _Counts(0, 0, 0, 0, 0))
        overwritten, unwritten = now.overwritten - base.overwritten, now.unwritten - base.unwritten
        why = []
        if overwritten:
            why.append("%d overwritten before they were %gs old: try a larger --flight-size"
                       % (overwritten, self.options.seconds))
        if unwritten:
            why.append("%d refused by the disk: %s" % (unwritten, self.ring.error))
        dropped = {"the flight recorder": (overwritten + unwritten, "; ".join(why))} if why else {}
        return Losses(ring_full=now.ring_full - base.ring_full,
                      too_deep=now.too_deep - base.too_deep, dropped=dropped)

    def _dump(self, trigger: dict, name: str, at_ns: int) -> None:
        """Write the frames of the window before `at_ns` (and those read with it) as a
        saved trace naming `trigger` and what its window lost. A dump that cannot be
        written leaves no file, and does not hold the next trigger back."""
        trigger["window_s"] = self.options.seconds
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = os.path.join(self.options.directory, "flight-%s-%s-%d.ebpfcuda" % (
            stamp, name, len(self.paths) + 1))
        start_ns = at_ns - self.ring.window_ns
        try:
            calls = self._write(path, self.ring.since(start_ns), trigger,
                                self.window_losses(start_ns))
        except OSError as err:
            with self._lock:
                self.failed += 1
            try:
                os.unlink(path)
            except OSError:
                pass  # (never created)
            self.log("flight recorder: cannot write %s: %s" % (path, err.strerror or err))
            return
        self._last_dump_ns = at_ns
        with self._lock:
            self.dumps[trigger["kind"]] = self.dumps.get(trigger["kind"], 0) + 1
            self.paths.append(path)
        self.log("flight recorder: %d calls of the last %gs written to %s (%s)"
                 % (calls, self.options.seconds, path, describe(trigger)))

    def _write(self, path: str, batches: Sequence[bytes], trigger: dict,
               losses: Losses) -> int:
        tracer = self.tracer
        names = tracer.names
        table = tracer.apis_table
        with open(path, "w+b") as stream:
            writer = savefile.SaveWriter(_Unclosed(stream), table,
                                         tracer.decoder.clock_offset_ns)
            calls = 0
            for frames in batches:
                writer.write_frames(frames)
                calls += record.call_count(frames)
                writer.learn([(pid, func, names.name_for(pid, table[fn_id].name, func))
                              for fn_id, pid, func in tracer.decoder.launch_keys(frames)])
            trailer_at = stream.tell()
            writer.note_losses(losses)
            writer.close()
            trigger["calls"] = calls
            _add_to_trailer(stream, trailer_at, {"trigger": trigger})
        return calls

    def forget(self, pid: int) -> None:
        """A process exited (nothing is kept per process)."""

    def families(self) -> List[Family]:
        """The recorder's own metric families."""
        with self._lock:
            dumps = sorted(self.dumps.items())
            suppressed, failed = self.suppressed, self.failed
        return [
            Family("ebpf_cuda_flight_dumps", "counter",
                   "Flight-recorder dumps written, by trigger kind.", "1",
                   [((("trigger", kind),), n) for kind, n in dumps]),
            Family("ebpf_cuda_flight_triggers_skipped", "counter",
                   "Triggers that wrote no dump: within SECONDS of the last one "
                   "(reason=\"recent\") or the dump could not be written (\"failed\").", "1",
                   [((("reason", "recent"),), suppressed), ((("reason", "failed"),), failed)]),
        ]

    def close(self) -> None:
        self.ring.close()


class _Unclosed:
    """A file for SaveWriter that its close() leaves open (the trailer is amended after)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.closed = False

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    def close(self) -> None:
        self.closed = True


def _add_to_trailer(stream, trailer_at: int, extra: dict) -> None:
    """Merge `extra` into the JSON object trailer that starts at `trailer_at`."""
    stream.seek(trailer_at)
    trailer = json.loads(stream.read().decode() or "{}")
    trailer.update(extra)
    stream.seek(trailer_at)
    stream.write(json.dumps(trailer).encode())
    stream.truncate()


def read_trigger(path: str) -> Optional[dict]:
    """The trigger a flight-recorder dump names (None for another saved trace; the file
    was checked by savefile.load)."""
    with open(path, "rb") as f:
        head = f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return None
        _, _, _, _, frame_bytes, names = _HEADER.unpack(head)
        if frame_bytes == (1 << 64) - 1:  # (a dump is always finished)
            return None
        f.seek(_HEADER.size + names + frame_bytes)
        try:
            trigger = json.loads(f.read().decode() or "{}").get("trigger")
        except (ValueError, AttributeError) as err:
            raise DecodeError("%s has a damaged trailer: %s" % (path, err)) from None
    return trigger if isinstance(trigger, dict) else None


def describe(trigger: dict) -> str:
    """The trigger in words."""
    kind = trigger.get("kind")
    if kind == "error":
        return "%s returned %s in %s (pid %s)" % (trigger.get("api"), trigger.get("error"),
                                                  trigger.get("comm"), trigger.get("pid"))
    if kind == "latency":
        return "%s took %.3f ms in %s (pid %s)" % (
            trigger.get("api"), (trigger.get("duration_ns") or 0) / 1e6, trigger.get("comm"),
            trigger.get("pid"))
    if kind == "xid":
        return "Xid %s on GPU %s: %s" % (trigger.get("xid"), trigger.get("gpu"),
                                         trigger.get("meaning"))
    return "asked for by %s" % trigger.get("signal")

