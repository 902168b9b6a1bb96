"""Processes that exited, forgotten: what the reader keeps per process (mappings, learned
kernel handles, names found, communicators, containers) goes once the process is gone and
every record it wrote has reached the outputs, so a long system-wide trace of short-lived
processes holds bounded state (bench/trace_memory.py measures it).

A process found gone at one look may still have records in the ring; they are read before
the next look (the reader drains between looks), so the process is *marked* at the next
look with the bytes read by then, and forgotten once the outputs have taken that many bytes
(at once when the reader writes its outputs itself; behind a spool, when the lines thread
has written up to there).
"""
import time
from typing import Callable, Dict, Iterable, List, Optional

from ..targets.command import alive

REAP_INTERVAL_S = 1.0  # how often the processes seen are looked at (a stat each)


class Reaper:
    """Calls `forget(pid)` for each process of `seen()` that has exited, once it is safe
    (see the module's docstring). `tick` is called by the reader between its drains."""

    def __init__(self, seen: Callable[[], Iterable[int]], forget: Callable[[int], None],
                 interval: float = REAP_INTERVAL_S, is_alive: Callable[[int], bool] = alive
                 ) -> None:
        self._seen = seen
        self._forget = forget
        self._interval = interval
        self._alive = is_alive
        self._next = time.monotonic() + interval
        self._found: List[int] = []  # gone at the last look, not marked yet
        self._marked: Dict[int, int] = {}  # pid -> bytes read when marked
        self.forgotten = 0

    def tick(self, read: int, delivered: int, now: Optional[float] = None) -> None:
        """`read`: bytes of frames read so far; `delivered`: bytes the outputs have taken."""
        now = time.monotonic() if now is None else now
        if now < self._next:
            return
        self._next = now + self._interval
        for pid in self._found:
            self._marked.setdefault(pid, read)
        done = [pid for pid, mark in self._marked.items() if mark <= delivered]
        for pid in done:
            del self._marked[pid]
            self._forget(pid)
        self.forgotten += len(done)
        waiting = set(self._marked)
        self._found = [pid for pid in list(self._seen())
                       if pid not in waiting and not self._alive(pid)]
