"""The CUDA files any process of the machine maps after the monitor started (`SystemWatch`):
the loader program without a pid filter on every distinct dynamic loader, exec notices, a ring
and a reader thread of their own; late_loads.py's `LateLoads` probes what they announce, and
detaches the files no process maps any more (every DETACH_CHECK_S).
"""
import os
import threading
import time
from typing import Any, Callable, Iterable, Optional, Tuple

from ..bpf.maps import RingBufMap
from ..bpf.ringbuf import RingBuffer
from ..errors import ProcessError, TracerError
from ..late_loads import CHECKER_JOIN_S, WHY_RUNNING, LateLoads
from ..probes.execs import ExecNotices
from ..probes.loader import LOST
from ..spec import layout, record
from ..targets.loaders import own_loader
from ..targets.procfs import all_pids, maps_lines

NOTICE_RING_SIZE = 1 << 18  # the monitor's notices: ~1,500 waiting before one is lost
NOTICE_POLL_S = 0.25  # how long its reader waits before looking at stop() and the lost
DETACH_CHECK_S = 30.0  # how often the monitor looks for late files no process maps any more
Log = Callable[[str], None]


class SystemWatch:
    """The CUDA files any process of the machine maps after the start, probed as they come
    (`ebpf-cuda monitor`): the loader program, without a pid filter, on every distinct
    dynamic loader the processes use (the host's, those of containers, through
    /proc/PID/root), and an exec notice of every exec (execs.ExecNotices) that has the
    program's loader watched when it is new and the program checked (its executable may
    carry the runtime statically). The notices go to a small ring of their own, read by a
    thread of its own: a process that is not CUDA's never reaches the session's reader
    (names, containers, the monitor's processes), and nothing changes per CUDA call.

    `late_loads(ring, traced)` makes the LateLoads (Session.late_loads_everywhere); its
    `late` and `reasons` say what was probed late. Without the exec tracepoint, loaders met
    later are not watched and programs are checked only when their loader tells. Every
    `sweep_every` seconds the thread detaches the files it probed that no process maps any
    more (LateLoads.sweep; `known()`: the processes the monitor saw calling)."""

    def __init__(self, late_loads: Callable[[Any, Callable[[], Iterable[int]]], LateLoads],
                 pid_ns: Optional[Tuple[int, int]], log: Log,
                 known: Callable[[], Iterable[int]] = tuple) -> None:
        self.log = log
        self.known = known
        self.sweep_every = DETACH_CHECK_S
        self._swept = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.execs: Optional[ExecNotices] = None
        self.late: Optional[LateLoads] = None
        self.ring_map = RingBufMap(NOTICE_RING_SIZE, name="notices")
        self.ring = RingBuffer.from_map(self.ring_map)
        try:
            self.late = late_loads(self.ring_map, all_pids)
            try:
                self.execs = ExecNotices({layout.EVENTS: self.ring_map,
                                          LOST: self.late.watch.lost}, pid_ns)
            except TracerError as err:
                log("execs are not told of (loaders that appear later are not watched, "
                    "programs that carry the runtime statically not checked): %s" % err)
            self._watch_running()
            self._thread = threading.Thread(target=self._read, name="ebpf-cuda notices",
                                            daemon=True)
            self._thread.start()
        except BaseException:
            self.close()
            raise

    def _watch_running(self) -> None:
        """The loaders of the processes running now (and this process's own), then what
        they map that the start-up search did not name: renamed copies of the libraries
        (libcudart-1a2b3c4d.so.12), runtimes carried statically (on the checker thread)."""
        assert self.late is not None
        loader = own_loader()
        if loader:
            self.late.watch_loaders([loader])
        own = os.getpid()
        for pid in all_pids():
            try:
                lines = maps_lines(pid)
            except ProcessError:
                continue  # (gone, or a kernel thread)
            self.late.watch_loader_of(pid, lines)
            if pid != own:
                self.late.scan(pid, None, WHY_RUNNING, lines)

    def _read(self) -> None:
        """The notices' reader: each batch to LateLoads.note (it looks at lost notices too,
        so it is called when nothing came)."""
        assert self.late is not None
        while not self._stop.is_set():
            frames = b""
            if self.ring.poll(min(NOTICE_POLL_S, self.sweep_every)):
                frames = self.ring.drain_frames(record.SIZE)
            try:
                self.late.note(frames)
                if time.monotonic() - self._swept >= self.sweep_every:
                    self._swept = time.monotonic()
                    if self.ring.available() > 0:  # (the mappers told of so far, first)
                        self.late.note(self.ring.drain_frames(record.SIZE))
                    self.late.sweep(self.known())
            except Exception as err:  # (a thread of its own: said, and it reads on)
                self.log("late loads: %s" % err)

    def counts(self) -> Tuple[int, int]:
        """(files probed after the start whose probes are on, files detached so far)."""
        if self.late is None:
            return (0, 0)
        return (len(self.late.files), self.late.detached)

    def lost(self) -> int:
        """Notices the full ring could not take, in all (its reader scans every process
        again when some were)."""
        return sum(self.late.watch.lost[0]) if self.late is not None else 0

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(NOTICE_POLL_S * 4 + CHECKER_JOIN_S)
            self._thread = None
        if self.execs is not None:
            self.execs.close()
            self.execs = None
        if self.late is not None:
            self.late.close()
            self.late = None
        self.ring.close(drain=False)
        self.ring_map.close()
