"""What a trace lost, and why: one account shared by the live run, saved traces and the
outputs that show it (the "events lost" line, the summary, the HTML report, `report`).

    losses = Losses(ring_full=1200, unwritten={"trace.txt": (300, "No space left on device")})
    losses.total      # 1500: the most any one output misses
    losses.sentence() # "1500 events lost: 1200 with the ring buffer full (try --ring-size),
                      #  300 not written to trace.txt (No space left on device)"

Counts are of calls ("events" in every output): a call is lost when its record is, or when
its entry could not be kept (`too_deep`). With --entries a call's entry record is an event of
its own, but losing it loses no call: those are counted apart (`entries_lost`).
"""
from typing import Dict, List, Optional, Tuple

from ..spec import record


class Losses:
    """Counts of what did not reach the outputs, by cause.

    `ring_full`: records the probes could not write (the ring buffer was full);
    `spool_past`: dropped past the spool's `spool_limit` (text, e.g. "2G");
    `spool_refused`: the spool's disk refused them (`spool_error`, e.g. ENOSPC's text);
    `interrupted`: left in the spool when a second interrupt stopped the writing;
    `unwritten`: output name -> (records it could not take, the error's text), counted from
    the batch whose write failed on;
    `too_deep`: calls lost because their entry could not be kept (nested deeper than
    record.TASK_DEPTH on one thread, or no per-thread storage): the monitor's cause label too;
    `entries_lost`: --entries' entry records lost with the ring full (not in `total`);
    `records_mixed`: a trace saved before 2026-12-07 with --entries, whose counts mixed entry
    and call records (its loss line says so, as it did);
    `names_lost`: kernel names lost, not events: teaching calls (registrations, module
    lookups) whose name neither the probes' names map held when the reader read their
    record nor a file mapped read-only holds (names.py reads a string literal there);
    `names_unread`: of those, the names the probe could not read at the call (the others
    the map let go: the reader fell that far behind);
    `dropped`: stage -> (records it dropped before every output, why in words): a flight
    recorder's calls overwritten or refused by its disk, in its dumps."""

    def __init__(self, ring_full: int = 0, spool_past: int = 0, spool_limit: str = "",
                 spool_refused: int = 0, spool_error: Optional[str] = None,
                 interrupted: int = 0,
                 unwritten: Optional[Dict[str, Tuple[int, str]]] = None,
                 entries_lost: int = 0, too_deep: int = 0, names_lost: int = 0,
                 dropped: Optional[Dict[str, Tuple[int, str]]] = None,
                 records_mixed: bool = False, names_unread: int = 0) -> None:
        self.ring_full = ring_full
        self.spool_past = spool_past
        self.spool_limit = spool_limit
        self.spool_refused = spool_refused
        self.spool_error = spool_error
        self.interrupted = interrupted
        self.unwritten: Dict[str, Tuple[int, str]] = dict(unwritten or {})
        self.entries_lost = entries_lost
        self.too_deep = too_deep
        self.names_lost = names_lost
        self.names_unread = min(names_unread, names_lost)
        self.dropped: Dict[str, Tuple[int, str]] = dict(dropped or {})
        self.records_mixed = records_mixed

    @property
    def total(self) -> int:
        """Calls lost to the output that lost the most (each output misses the calls lost
        before it, and its own)."""
        own = max([count for count, _ in self.unwritten.values()] or [0])
        return (self.ring_full + self.too_deep + self.spool_past + self.spool_refused
                + self.interrupted + sum(n for n, _ in self.dropped.values()) + own)

    def causes(self) -> List[str]:
        """Each cause with its count, in words."""
        why = []
        if self.ring_full:
            why.append("%d with the ring buffer full (try --ring-size)" % self.ring_full)
        if self.too_deep:
            why.append("%d calls nested deeper than %d on one thread"
                       % (self.too_deep, record.TASK_DEPTH))
        for stage, (count, reason) in sorted(self.dropped.items()):
            if count:
                why.append("%d dropped by %s (%s)" % (count, stage, reason))
        if self.spool_past:
            why.append("%d past the spool's %s (try --spool-size)"
                       % (self.spool_past, self.spool_limit or "limit"))
        if self.spool_refused:
            why.append("%d not spooled: %s (the spool's file; --spool-size 0 does without)"
                       % (self.spool_refused, self.spool_error or "refused"))
        if self.interrupted:
            why.append("%d not written: interrupted" % self.interrupted)
        for name, (count, error) in sorted(self.unwritten.items()):
            if count:
                why.append("%d not written to %s (%s)" % (count, name, error))
        return why

    def read(self) -> "Losses":
        """What every output misses: the records lost before the outputs (the analyses,
        which write nothing as they go, saw all the others)."""
        return Losses(self.ring_full, self.spool_past, self.spool_limit, self.spool_refused,
                      self.spool_error, self.interrupted, entries_lost=self.entries_lost,
                      too_deep=self.too_deep, names_lost=self.names_lost,
                      dropped=self.dropped, records_mixed=self.records_mixed,
                      names_unread=self.names_unread)

    def sentence(self) -> str:
        """The "events lost" line (without the `ebpf-cuda: ` prefix), with the kernel names
        lost; "" when none."""
        said = []
        if self.total:
            what = "records (entries and calls)" if self.records_mixed else "events"
            said.append("%d %s lost: %s" % (self.total, what, ", ".join(self.causes())))
        if self.entries_lost:
            said.append("%d entry records lost with the ring buffer full (try --ring-size; "
                        "their calls are counted apart)" % self.entries_lost)
        if self.names_lost:
            said.append("%d kernel names lost: %s" % (self.names_lost,
                                                       ", ".join(self.name_causes())))
        return "; ".join(said)

    def name_causes(self) -> List[str]:
        """Why kernel names were lost, each cause with its count, in words."""
        let_go = self.names_lost - self.names_unread
        why = []
        if let_go:
            why.append("%d let go by the probes' names map before the reader came to their "
                       "calls (try --ring-size: the map grows with the ring)" % let_go)
        if self.names_unread:
            why.append("%d unreadable when their calls returned, in no file mapped "
                       "read-only" % self.names_unread)
        return why

    # -- in saved traces -------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"ring_full": self.ring_full, "spool_past": self.spool_past,
                "spool_refused": self.spool_refused, "interrupted": self.interrupted,
                "too_deep": self.too_deep, "entries_lost": self.entries_lost,
                "entries": self.records_mixed,
                "names_lost": self.names_lost, "names_unread": self.names_unread,
                "dropped": {stage: list(value) for stage, value in self.dropped.items()}}

    @classmethod
    def from_json(cls, obj) -> "Losses":
        """From a saved trace's trailer; ValueError when it is not such an object."""
        if not isinstance(obj, dict):
            raise ValueError("its losses are not an object")
        counts = {}
        for key in ("ring_full", "spool_past", "spool_refused", "interrupted", "too_deep",
                    "names_lost", "names_unread", "entries_lost"):
            value = obj.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError("its loss count %s is not a count" % key)
            counts[key] = value
        dropped = obj.get("dropped", {})
        if not isinstance(dropped, dict) or not all(
                isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)
                and not isinstance(v[0], bool) and v[0] >= 0 and isinstance(v[1], str)
                for v in dropped.values()):
            raise ValueError("its dropped records are not (count, reason) by stage")
        return cls(records_mixed=obj.get("entries") is True,
                   dropped={stage: (v[0], v[1]) for stage, v in dropped.items()}, **counts)
