"""NCCL communicators as a trace sees them: pure logic fed by the events of NCCL calls.

A communicator is a handle (`ncclComm_t`) in one process. The calls that make one tie it to
its rank, its size and an id that is the same on every rank of it:
- ncclCommInitRank, ncclCommInitRankConfig, ncclCommInitRankScalable: the hash of the
  ncclUniqueId every rank is given (their `commId` argument);
- ncclCommSplit: the parent's id, the color and how many splits the parent had made before
  (every rank splits its parent in the same order); its rank and size are learned when the
  program asks ncclCommUserRank and ncclCommCount;
- ncclCommInitAll: one process holds every rank; the first communicator (rank 0) is tied.
Every later call on it shows `comm_id`, `rank`, `nranks` (and `device`, once ncclCommCuDevice
told it) among its arguments, and each collective (the table's category "collective") a
`seq`: its number among the collectives entered on that communicator, 1 first, counted at
entry whatever the call returns; the k-th collective of one rank is the k-th of every other
rank, which is how NCCL itself pairs them.

`Communicators.annotate_batch` takes decoded events in the order of the trace (whoever
decodes them for the outputs calls it: the live stream, stream.py, and the saved-trace reader,
savefile.py; the decoder itself stays pure). Failed calls make nothing; calls on a
communicator made before the trace began show only their `seq` (counted from the trace's
start).
"""
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ..spec.apis import BY_NAME, NCCL, TABLE, Api
from .events import EXIT, Event
from .values import unique_id_hash

_NCCL_NAMES = frozenset(api.name for api in TABLE if api.library == NCCL)
COLLECTIVE = "collective"  # the category of the rows that are collectives (apis.py)
INIT_RANK = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable")
FREES = ("ncclCommDestroy", "ncclCommAbort")
# Calls that tell something of their communicator: out-parameter -> what it is.
LEARNS = {"ncclCommUserRank": ("rank", "rank"), "ncclCommCount": ("count", "nranks"),
          "ncclCommCuDevice": ("device", "device")}
PENDING_PER_THREAD = 8  # entries seen alone (--entries, -r) kept per thread for their exit


class Communicator:
    """What is known of one communicator handle of one process."""

    def __init__(self, comm_id: Optional[str] = None, rank: Optional[int] = None,
                 nranks: Optional[int] = None) -> None:
        self.comm_id = comm_id
        self.rank = rank
        self.nranks = nranks
        self.device: Optional[int] = None
        self.seq = 0  # collectives entered so far
        self.splits = 0  # communicators split off it so far

    def shown(self) -> Dict[str, Any]:
        """The values its calls show (only the known ones)."""
        values = {"comm_id": self.comm_id, "rank": self.rank, "nranks": self.nranks,
                  "device": self.device}
        return {k: v for k, v in values.items() if v is not None}


class Entered(NamedTuple):
    """An NCCL call whose entry came in a record of its own, waiting for its exit."""

    api: str
    seq: Optional[int]


def split_id(parent: str, color: int, nth: int) -> str:
    """The id of the communicator a split of `parent` makes: equal on the ranks of one color."""
    return unique_id_hash(("split %s %d %d" % (parent, color, nth)).encode())


def init_all_id(pid: int, ts_ns: int) -> str:
    """The id of the communicators one ncclCommInitAll makes (they live in one process)."""
    return unique_id_hash(("initall %d %d" % (pid, ts_ns)).encode())


class Communicators:
    """The communicators of one trace, by (pid, handle): see the module's docstring."""

    def __init__(self) -> None:
        self.comms: Dict[Tuple[int, int], Communicator] = {}
        self._entered: Dict[Tuple[int, int], List[Entered]] = {}

    def get(self, pid: int, handle: int) -> Optional[Communicator]:
        return self.comms.get((pid, handle))

    def forget(self, pid: int) -> None:
        """Drop the communicators and pending entries of a process that exited."""
        for table in (self.comms, self._entered):  # (list(): a copy taken at once)
            for key in [key for key in list(table) if key[0] == pid]:
                table.pop(key, None)

    def annotate_batch(self, events: List[Event]) -> None:
        """Decoded events of any calls, in order: those of NCCL calls get their
        communicator. The two events of one record (an entry and its exit) share one
        arguments dict, which is how they are told from an entry record and the exit record
        that follows it."""
        i, count = 0, len(events)
        while i < count:
            event = events[i]
            if event.api not in _NCCL_NAMES:
                i += 1
                continue
            pair = (i + 1 < count and event.phase != EXIT
                     and events[i + 1].args is event.args)
            self.annotate(events[i:i + 2] if pair else [event])
            i += 2 if pair else 1

    def annotate(self, events: List[Event]) -> None:
        """The events of one NCCL record: an entry and its exit (one arguments dict), an
        entry alone (--entries, -r) or an exit alone (its entry came before)."""
        first = events[0]
        api = BY_NAME.get(first.api)
        if api is None or api.library != NCCL:
            return
        if first.phase == EXIT:  # its entry was annotated when it came
            entered = self._take_entered(first)
            if entered is None:  # (its entry record was lost: the call is counted now)
                self._enter(api, first)
            else:
                self._show(first)
                if entered.seq is not None:
                    first.args["seq"] = entered.seq
            self._exited(api, first)
            return
        seq = self._enter(api, first)
        if len(events) == 1:
            self._remember_entered(first, Entered(api.name, seq))
        else:
            self._exited(api, events[-1])

    # -- entry -----------------------------------------------------------------------------

    def _enter(self, api: Api, event: Event) -> Optional[int]:
        """Number a collective on its communicator; show the communicator. The sequence
        number, if any."""
        handle = event.args.get("comm")
        seq = None
        if api.category == COLLECTIVE and handle:
            comm = self.comms.setdefault((event.pid, handle), Communicator())
            comm.seq += 1
            seq = comm.seq
        self._show(event)
        if seq is not None:
            event.args["seq"] = seq
        return seq

    def _show(self, event: Event) -> None:
        comm = self.comms.get((event.pid, event.args.get("comm")))
        if comm is not None:
            event.args.update(comm.shown())

    def _remember_entered(self, event: Event, entered: Entered) -> None:
        stack = self._entered.setdefault((event.pid, event.tid), [])
        stack.append(entered)
        del stack[:-PENDING_PER_THREAD]  # (-r: entries whose exits never come)

    def _take_entered(self, event: Event) -> Optional[Entered]:
        stack = self._entered.get((event.pid, event.tid), [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i].api == event.api:
                return stack.pop(i)
        return None

    # -- exit: what the call made ----------------------------------------------------------

    def _exited(self, api: Api, event: Event) -> None:
        if event.phase != EXIT or event.ret != 0:
            return
        args, outs, key = event.args, event.outs, (event.pid, event.args.get("comm"))
        if api.name in INIT_RANK and outs.get("comm"):
            self._made(event, outs["comm"], Communicator(args.get("commId"), args.get("rank"),
                                                         args.get("nranks")))
        elif api.name == "ncclCommInitAll" and outs.get("comm"):
            self._made(event, outs["comm"], Communicator(
                init_all_id(event.pid, event.ts_ns - (event.duration_ns or 0)), 0,
                args.get("ndev")))
        elif api.name == "ncclCommSplit" and outs.get("newcomm"):
            parent = self.comms.setdefault(key, Communicator())
            parent.splits += 1
            comm_id = (split_id(parent.comm_id, args.get("color", 0), parent.splits)
                       if parent.comm_id else None)
            self.comms[(event.pid, outs["newcomm"])] = Communicator(comm_id)
        elif api.name in LEARNS and key in self.comms and LEARNS[api.name][0] in outs:
            out, attribute = LEARNS[api.name]
            setattr(self.comms[key], attribute, outs[out])
        elif api.name in FREES:
            self.comms.pop(key, None)

    def _made(self, event: Event, handle: int, comm: Communicator) -> None:
        self.comms[(event.pid, handle)] = comm
        if comm.comm_id is not None:
            event.args["comm_id"] = comm.comm_id

