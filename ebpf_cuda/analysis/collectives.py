"""NCCL collectives: the NCCL table of the summary, and the ranks of one job merged offline.

Both read what the decoder added to NCCL calls (decode/nccl.py): each call's `comm_id`
(the same on every rank of a communicator), `rank`, `nranks` and, on collectives, `seq`.

`merge(paths)` reads saved traces (one per rank, or several ranks in one) and aligns the
collectives of each communicator by (comm_id, seq), as NCCL pairs them: the k-th collective
entered on one rank is the k-th on every other. It reports the collectives some rank never
entered (the hang question), with the last one each rank did; a rank that skipped some
(its later calls are the others' later ones); arguments that differ between ranks (function,
count, datatype, op, root); and the arrival spread of the collectives every rank entered
(host side: when each rank called it, which rank came last, how often, by how much).

Clocks: each saved trace records its wall-clock minus CLOCK_MONOTONIC offset. That offset is
the wall-clock time of the host's boot, so traces whose offsets agree (within CLOCK_SLACK_NS)
come from one host and are aligned on its monotonic clock (exactly); traces of other hosts
are aligned by their wall clocks, as good as those hosts' clock synchronisation.
"""
from collections import Counter, defaultdict
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ..decode.events import EXIT, Event
from ..decode.nccl import COLLECTIVE
from ..spec.apis import BY_NAME, NCCL
from ._table import clock, decimal, integer, table
from .statistics import stats

NCCL_CALLS = (COLLECTIVE, "p2p")  # the categories the NCCL table counts
CLOCK_SLACK_NS = 1_000_000  # offsets closer than this: one host's clock
MB = 1e6
SHOWN_MISMATCHES = 20  # per communicator; the rest are counted
WIDEST_SHOWN = 3


# -- the NCCL table of the summary -----------------------------------------------------------

def communicator_label(event: Event) -> str:
    """How the tables name an NCCL call's communicator: its id, else its handle and pid."""
    comm_id = event.args.get("comm_id")
    if comm_id:
        return str(comm_id)
    return "0x%x (pid %d)" % (event.args.get("comm") or 0, event.pid)


class CollectiveSummary:
    """Calls, bytes and host-side time of the NCCL collectives and point-to-point calls per
    function and communicator (completed calls; nsys's nccl_sum in spirit)."""

    def __init__(self) -> None:
        self.durations: Dict[Tuple[str, str], List[int]] = defaultdict(list)
        self.bytes: Counter = Counter()
        self.ranks: Dict[Tuple[str, str], set] = defaultdict(set)

    def add(self, event: Event) -> None:
        """Count a completed NCCL call (other events are ignored)."""
        api = BY_NAME.get(event.api)
        if event.phase != EXIT or api is None or api.library != NCCL \
                or api.category not in NCCL_CALLS:
            return
        key = (event.api, communicator_label(event))
        self.durations[key].append(event.duration_ns or 0)
        self.bytes[key] += event.args.get("bytes") or 0
        self.ranks[key].add((event.pid, event.args.get("rank")))

    def __bool__(self) -> bool:
        return bool(self.durations)

    HEADERS = ("Num Calls", "Total (MB)", "Total Time (ns)", "Avg (ns)", "Med (ns)",
               "Min (ns)", "Max (ns)", "Ranks", "Name", "Communicator")

    def rows(self) -> List[Tuple[str, ...]]:
        """The table's rows (as HEADERS), the most time first (the text and HTML tables)."""
        rows = []
        for key, values in sorted(self.durations.items(),
                                  key=lambda item: (-sum(item[1]), item[0])):
            s = stats(values)
            rows.append((integer(s.count), decimal(self.bytes[key] / MB, 3), integer(s.total),
                         decimal(s.mean), decimal(s.median), integer(s.minimum),
                         integer(s.maximum), integer(len(self.ranks[key])), key[0], key[1]))
        return rows

    def table(self) -> str:
        title = " ** NCCL Summary (nccl_sum: host-side time of the calls):\n\n"
        if not self.durations:
            return title + " (no NCCL collectives)"
        return title + table(self.HEADERS, self.rows(), left=(8, 9))


# -- the ranks of one job, merged --------------------------------------------------------------

class Call(NamedTuple):
    """One collective entered by one rank."""

    seq: int
    api: str
    count: Optional[int]
    datatype: Optional[str]
    op: Optional[str]
    root: Optional[int]
    t_ns: int  # entry time, on the merged clock (wall-clock ns)
    ret: Optional[int] = None

    @property
    def signature(self) -> Tuple[Any, ...]:
        return (self.api, self.count, self.datatype, self.op, self.root)

    def describe(self) -> str:
        """`ncclAllReduce (count 1024, ncclFloat32, ncclSum)`."""
        parts = ["%s %d" % (BY_NAME[self.api].count or "count", self.count)
                 if self.count is not None else None, self.datatype, self.op,
                 "root %d" % self.root if self.root is not None else None]
        return "%s (%s)" % (self.api, ", ".join(p for p in parts if p))


class Rank:
    """One rank of one communicator: the collectives one process entered on one handle."""

    def __init__(self, source: str, pid: int, handle: int) -> None:
        self.source = source
        self.pid = pid
        self.handle = handle
        self.comm_id: Optional[str] = None
        self.rank: Optional[int] = None
        self.nranks: Optional[int] = None
        self.calls: Dict[int, Call] = {}

    @property
    def last(self) -> int:
        return max(self.calls) if self.calls else 0

    @property
    def name(self) -> str:
        return "rank %d" % self.rank if self.rank is not None else \
            "pid %d comm 0x%x" % (self.pid, self.handle)

    def where(self) -> str:
        return "%s pid %d" % (self.source, self.pid)


FIELDS = ("function", "count", "datatype", "op", "root")  # the parts of Call.signature


class Mismatch(NamedTuple):
    seq: int
    field: str
    groups: List[Tuple[Any, List[Rank]]]  # value -> the ranks with it, most ranks first


class Skip(NamedTuple):
    rank: Rank
    seq: int  # the first collective it skipped
    skipped: int  # how many
    until: int  # its last collective, the others' until + skipped


class Missing(NamedTuple):
    rank: Rank
    seq: int  # the first collective it never entered
    entered_by: List[Rank]


class Arrival(NamedTuple):
    seq: int
    spread_ns: int
    last: Rank


class Communicator:
    """The merged view of one communicator (see `merge`)."""

    def __init__(self, comm_id: str, ranks: List[Rank]) -> None:
        self.comm_id = comm_id
        self.ranks = sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.source, r.pid))
        self.nranks = max((r.nranks for r in ranks if r.nranks), default=None)
        self.max_seq = max(r.last for r in ranks)
        self.skips = [skip for skip in (_skip(r, self.ranks) for r in self.ranks) if skip]
        shifted = {id(s.rank): s.seq for s in self.skips}
        self.missing = [Missing(r, r.last + 1, [o for o in self.ranks if o.last > r.last
                                                and r.last + 1 < shifted.get(id(o), o.last + 1)])
                        for r in self.ranks if r.last < self.max_seq and id(r) not in shifted]
        self.mismatches = _mismatches(self.ranks, shifted)
        self.arrivals = _arrivals(self.ranks, shifted)

    @property
    def absent(self) -> List[int]:
        """Ranks of the communicator's size that no trace holds."""
        seen = {r.rank for r in self.ranks}
        return [k for k in range(self.nranks or 0) if k not in seen]


def _reference(seq: int, ranks: Sequence[Rank], but: Rank) -> Optional[Tuple[Any, ...]]:
    """The signature most of the other ranks have at `seq`."""
    found = Counter(r.calls[seq].signature for r in ranks if r is not but and seq in r.calls)
    return found.most_common(1)[0][0] if found else None


def _skip(rank: Rank, ranks: Sequence[Rank]) -> Optional[Skip]:
    """A rank with fewer collectives whose calls, from its first disagreement on, are the
    others' calls k places later: it skipped k collectives."""
    behind = max(r.last for r in ranks) - rank.last
    if behind <= 0:
        return None
    first = next((s for s in sorted(rank.calls)
                  if _reference(s, ranks, rank) not in (None, rank.calls[s].signature)), None)
    if first is None:
        return None
    for k in range(1, behind + 1):
        if all(_reference(s + k, ranks, rank) in (None, rank.calls[s].signature)
               for s in range(first, rank.last + 1) if s in rank.calls):
            return Skip(rank, first, k, rank.last)
    return None


def _values(call: Call) -> Dict[str, Any]:
    return dict(zip(FIELDS, call.signature))


def _mismatches(ranks: Sequence[Rank], shifted: Dict[int, int]) -> List[Mismatch]:
    """Arguments that differ between ranks at one sequence number (a rank that skipped
    collectives is left out from there: its calls are other collectives)."""
    found = []
    for seq in range(1, max(r.last for r in ranks) + 1):
        here = [r for r in ranks if seq in r.calls and seq < shifted.get(id(r), seq + 1)]
        if len(here) < 2:
            continue
        fields = FIELDS if len({r.calls[seq].api for r in here}) == 1 else FIELDS[:1]
        for name in fields:
            groups: Dict[Any, List[Rank]] = {}
            for r in here:
                groups.setdefault(_values(r.calls[seq])[name], []).append(r)
            if len(groups) > 1:
                ordered = sorted(groups.items(), key=lambda item: -len(item[1]))
                found.append(Mismatch(seq, name, ordered))
    return found


def _arrivals(ranks: Sequence[Rank], shifted: Dict[int, int]) -> List[Arrival]:
    """When every rank entered each collective they all entered (none of them shifted)."""
    if len(ranks) < 2:
        return []
    arrivals = []
    for seq in range(1, max(r.last for r in ranks) + 1):
        if all(seq in r.calls and seq < shifted.get(id(r), seq + 1) for r in ranks):
            times = [(r.calls[seq].t_ns, i) for i, r in enumerate(ranks)]
            last_t, last = max(times)
            arrivals.append(Arrival(seq, last_t - min(times)[0], ranks[last]))
    return arrivals


class Clocks:
    """How the traces' times are put on one clock (see the module's docstring)."""

    def __init__(self, offsets: Sequence[int]) -> None:
        self.aligned: List[int] = []  # per trace: the offset its monotonic times get
        hosts: List[List[int]] = []
        for offset in offsets:
            group = next((g for g in hosts if abs(g[0] - offset) <= CLOCK_SLACK_NS), None)
            if group is None:
                hosts.append([offset])
            else:
                group.append(offset)
            self.aligned.append(group[0] if group is not None else offset)
        self.hosts = hosts

    def sentence(self) -> str:
        if len(self.hosts) == 1:
            spread = max(self.hosts[0]) - min(self.hosts[0])
            return ("one host (the traces' clock offsets agree to %s us): aligned on its "
                    "monotonic clock, exactly" % decimal(spread / 1000.0))
        return ("%d hosts (or boots: clock offsets %s apart or more): aligned by their wall "
                "clocks, as well as those are synchronised (NTP: typically a few ms; PTP: "
                "microseconds); arrival spreads between hosts below that say nothing"
                % (len(self.hosts), _duration(CLOCK_SLACK_NS)))


def read_ranks(paths: Sequence[str], traces: Sequence[Any]
               ) -> Tuple[Dict[str, List[Rank]], int, Clocks]:
    """The ranks of each communicator (by id) in saved traces (loaded from `paths`); the
    number of collectives on communicators without an id (made before the trace began); how
    the clocks were aligned."""
    clocks = Clocks([t.clock_offset_ns for t in traces])
    ranks: Dict[Tuple[int, int, int], Rank] = {}
    for index, (path, trace) in enumerate(zip(paths, traces)):
        _read_trace(index, path, trace, clocks.aligned[index], ranks)
    by_comm: Dict[str, List[Rank]] = defaultdict(list)
    unknown = 0
    for rank in ranks.values():
        if rank.comm_id is None:
            unknown += len(rank.calls)
        else:
            by_comm[rank.comm_id].append(rank)
    return dict(by_comm), unknown, clocks


def _read_trace(index: int, path: str, events: Iterable[Event], offset: int,
                ranks: Dict[Tuple[int, int, int], Rank]) -> None:
    for event in events:
        api = BY_NAME.get(event.api)
        seq = event.args.get("seq")
        if api is None or api.category != COLLECTIVE or seq is None:
            continue
        key = (index, event.pid, event.args.get("comm") or 0)
        rank = ranks.get(key)
        if rank is None:
            rank = ranks[key] = Rank(path, event.pid, key[2])
        args = event.args
        rank.comm_id = args.get("comm_id") or rank.comm_id
        rank.rank = args["rank"] if args.get("rank") is not None else rank.rank
        rank.nranks = args["nranks"] if args.get("nranks") is not None else rank.nranks
        call = rank.calls.get(seq)
        if call is None:
            t_ns = event.ts_ns - ((event.duration_ns or 0) if event.phase == EXIT else 0)
            call = Call(seq, event.api, args.get(api.count), args.get("datatype"),
                        args.get("op"), args.get("root"), t_ns + offset)
        if event.phase == EXIT:
            call = call._replace(ret=event.ret)
        rank.calls[seq] = call


def merge(paths: Sequence[str], traces: Sequence[Any]
          ) -> Tuple[List[Communicator], int, Clocks]:
    """The communicators of the saved traces loaded from `paths`, merged (see the module's
    docstring); the number of collectives that could not be merged (no communicator id); the
    clocks."""
    by_comm, unknown, clocks = read_ranks(paths, traces)
    comms = [Communicator(comm_id, ranks) for comm_id, ranks in by_comm.items()]
    return sorted(comms, key=lambda c: (-len(c.ranks), c.comm_id)), unknown, clocks


def merge_report(paths: Sequence[str], traces: Sequence[Any]) -> str:
    """The merged report of `ebpf-cuda report FILE FILE...` (the traces loaded from `paths`),
    as text."""
    comms, unknown, clocks = merge(paths, traces)
    lines = ["NCCL collectives of %d trace%s: %s" % (len(paths), "s" * (len(paths) != 1),
                                                     ", ".join(paths)),
             "Clocks: %s." % clocks.sentence()]
    if unknown:
        lines.append("Not merged: %d collectives on communicators made before the trace "
                     "began (their id is unknown)." % unknown)
    if not comms:
        lines.append("No collective on a communicator whose id is known.")
    for comm in comms:
        lines += [""] + format_communicator(comm)
    return "\n".join(lines)


def format_communicator(comm: Communicator) -> List[str]:
    """The lines of one communicator's part of the merged report."""
    size = " of %d" % comm.nranks if comm.nranks else ""
    lines = ["Communicator %s: %d rank%s%s in the traces, %d collectives" % (
        comm.comm_id, len(comm.ranks), "s" * (len(comm.ranks) != 1), size, comm.max_seq)]
    for r in comm.ranks:
        last = r.calls.get(r.last)
        lines.append("  %s (%s): %d collectives, last #%d %s at %s" % (
            r.name, r.where(), len(r.calls), r.last, last.api if last else "-",
            clock(last.t_ns / 1e9) if last else "-"))
    if comm.absent:
        lines.append("  no trace of rank%s %s" % ("s" * (len(comm.absent) != 1),
                                                  ", ".join(map(str, comm.absent))))
    lines += _missing_lines(comm) + _skip_lines(comm) + _mismatch_lines(comm)
    lines += _arrival_lines(comm)
    return lines


def _names(ranks: Sequence[Rank]) -> str:
    numbered = [r.rank for r in ranks if r.rank is not None]
    if len(numbered) == len(ranks):
        return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, numbered))
    return ", ".join(r.name for r in ranks)


def _call_of(comm: Communicator, seq: int, ranks: Sequence[Rank]) -> Optional[Call]:
    return next((r.calls[seq] for r in ranks if seq in r.calls), None)


def _missing_lines(comm: Communicator) -> List[str]:
    if not comm.missing:
        return []
    lines = ["  Never entered:"]
    for m in comm.missing:
        call = _call_of(comm, m.seq, m.entered_by)
        last = m.rank.calls.get(m.rank.last)
        lines.append("    %s never entered #%d %s (entered by %s); its last: %s" % (
            m.rank.name, m.seq, call.describe() if call else "", _names(m.entered_by),
            "#%d %s at %s" % (last.seq, last.api, clock(last.t_ns / 1e9)) if last
            else "none"))
    return lines


def _skip_lines(comm: Communicator) -> List[str]:
    if not comm.skips:
        return []
    lines = ["  Skipped:"]
    for s in comm.skips:
        others = [r for r in comm.ranks if r is not s.rank]
        skipped = [_call_of(comm, seq, others) for seq in range(s.seq, s.seq + s.skipped)]
        lines.append("    %s skipped #%s %s: its #%d-#%d are the others' #%d-#%d" % (
            s.rank.name, "-#".join(map(str, sorted({s.seq, s.seq + s.skipped - 1}))),
            "; ".join(c.describe() for c in skipped if c), s.seq, s.until,
            s.seq + s.skipped, s.until + s.skipped))
    return lines


def _mismatch_lines(comm: Communicator) -> List[str]:
    if not comm.mismatches:
        return []
    lines = ["  Mismatched arguments:"]
    for m in comm.mismatches[:SHOWN_MISMATCHES]:
        call = _call_of(comm, m.seq, m.groups[0][1])
        lines.append("    #%d %s %s: %s" % (m.seq, call.api if call else "", m.field, "; ".join(
            "%s %s" % (_names(ranks), value) for value, ranks in reversed(m.groups))))
    if len(comm.mismatches) > SHOWN_MISMATCHES:
        lines.append("    ... and %d more" % (len(comm.mismatches) - SHOWN_MISMATCHES))
    return lines


def _duration(ns: float) -> str:
    if ns >= 1e9:
        return "%s s" % decimal(ns / 1e9, 3)
    if ns >= 1e6:
        return "%s ms" % decimal(ns / 1e6, 3)
    return "%s us" % decimal(ns / 1e3, 1)


def _arrival_lines(comm: Communicator) -> List[str]:
    arrivals = comm.arrivals
    if not arrivals:
        return []
    spreads = stats([a.spread_ns for a in arrivals])
    lines = ["  Arrival spread (host side, %d collectives entered by every rank): median %s, "
             "max %s" % (len(arrivals), _duration(spreads.median), _duration(spreads.maximum))]
    rows = []
    for r in comm.ranks:
        mine = [a for a in arrivals if a.last is r]
        if not mine:
            continue
        worst = max(mine, key=lambda a: a.spread_ns)
        rows.append((r.name, "%d of %d" % (len(mine), len(arrivals)),
                     _duration(sum(a.spread_ns for a in mine) / len(mine)),
                     _duration(worst.spread_ns), "#%d" % worst.seq))
    rows.sort(key=lambda row: -int(row[1].split()[0]))
    lines += ["  " + line for line in table(
        ("Rank", "Last in", "Behind the first: avg", "max", "at"), rows, left=(0,)).splitlines()]
    widest = sorted(arrivals, key=lambda a: -a.spread_ns)[:WIDEST_SHOWN]
    lines.append("   widest: " + ", ".join("#%d %s (last: %s)" % (a.seq, _duration(a.spread_ns),
                                                                     a.last.name)
                                            for a in widest))
    return lines
