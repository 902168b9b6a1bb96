"""The traced processes' last launches, kept while GPU state is sampled: a device event (an
Xid) carries those that came before it, the calls that were running when the GPU faulted."""
from collections import deque
from typing import Any, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

KEEP = 8  # launches kept per process
SHOWN = 5  # launches an event carries


class LastLaunches:
    """Fed with each batch's launches (events.Decoder.launches and their names)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._by_pid: Dict[int, Deque[Tuple[int, int, int, str, Optional[str]]]] = {}

    def add(self, launches: Sequence[tuple], named: Sequence[tuple], table: Sequence) -> None:
        for (fn_id, pid, tid, enter, _, _, _), (_, _, kernel) in zip(launches, named):
            kept = self._by_pid.get(pid)
            if kept is None:
                kept = self._by_pid[pid] = deque(maxlen=self._keep)
            kept.append((enter, pid, tid, table[fn_id].name, kernel))

    def forget(self, pid: int) -> None:
        self._by_pid.pop(pid, None)

    def before(self, ts_ns: int, pids: Optional[Iterable[int]] = None,
               offset_ns: int = 0) -> List[Dict[str, Any]]:
        """The last SHOWN launches that began before `ts_ns` (of `pids` when given), oldest
        first; `offset_ns` turns their times to wall-clock seconds."""
        wanted = set(pids) if pids is not None else None
        found = [launch for pid, kept in self._by_pid.items()
                 if wanted is None or pid in wanted for launch in kept if launch[0] <= ts_ns]
        found.sort()
        return [{"ts": (enter + offset_ns) / 1e9, "ts_ns": enter, "pid": pid, "tid": tid,
                 "api": api, "kernel": kernel} for enter, pid, tid, api, kernel in found[-SHOWN:]]
