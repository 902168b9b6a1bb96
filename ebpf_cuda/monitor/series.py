"""What the monitor's reader publishes every tick (LaunchSeries), and the accounts behind it
(Attribution): which process each launch and call the kernel counted belongs to — those
the maps by process hold, those of processes dropped since, those a stream capture recorded
— and how many belong to none (what the full maps could not take).
"""
from typing import Dict, NamedTuple, Sequence, Set, Tuple

from ..decode.aggregates import Forgotten, FunctionTotals
from ..spec import apis, record
from ..spec.apis import TABLE, Role
from .metrics import Labels
from .processes import UNNAMED_KERNEL, Processes

LaunchKey = Tuple[int, int, int]  # (pid, fn_id, func)


class LaunchSeries(NamedTuple):
    """What the reader publishes every tick: launches by (process labels, function, kernel
    label), the launches the full `launches` map could not take (so far), the live
    processes, and the aggregates it read (exporters render these: a scrape reads no map
    of per-CPU values, and its families agree with each other)."""

    launches: Dict[Tuple[Labels, str, str], int]  # (process labels, api, kernel label)
    map_full: int
    processes: int
    memory: Tuple[Tuple[Labels, int], ...] = ()  # device bytes held, by live process
    # (process labels, function id) -> [calls, errors, API ns] (`proc_calls`; the sampled
    # rows' calls: their launches by process, errors and time None)
    per_process: Dict[Tuple[Labels, int], list] = {}
    totals: Tuple[FunctionTotals, ...] = ()  # every function's aggregates


class Attribution:
    """The counts by process the maps no longer hold, and the high-water marks of what
    they could not take (the reader's: not thread-safe)."""

    def __init__(self) -> None:
        self._retired: Dict[int, int] = {}  # launches of dropped processes, by function id
        # ... and by (comm, api, kernel label), for a profile of the whole run
        self.retired_launches: Dict[Tuple[str, str, str], int] = {}
        self._retired_calls: Dict[int, int] = {}  # calls of dropped processes, by function id
        self._captured: Dict[int, int] = {}  # launches captures recorded, by function id
        self._launch_ids = {i for i, api in enumerate(TABLE) if api.role == Role.LAUNCH}
        self.map_full = 0  # launches counted, not by process (the full `launches`)
        self.process_map_full = 0  # calls counted, not by process (the full `proc_calls`)

    def note_captured(self, frames: bytes) -> None:
        """Launches a stream capture recorded: with aggregates alone their rows write a
        record only while their process captures, and the kernel leaves them out of its
        launch map (aggregates.capturing_gate): work recorded into a graph, not run, not
        "lost" to a full map."""
        ids = record.frame_column(frames, record.FN_ID, "H")
        if self._launch_ids.isdisjoint(ids):
            return
        rets = record.frame_column(frames, record.RET, "Q")
        for fn_id, ret in zip(ids, rets):
            if fn_id in self._launch_ids and not ret & 0xFFFFFFFF:
                self._captured[fn_id] = self._captured.get(fn_id, 0) + 1

    def retire(self, forgotten: Forgotten, processes: Processes) -> None:
        """What dropped processes' entries held (before the processes go)."""
        for pid, fn_id, func, count in forgotten.launches:
            self._retired[fn_id] = self._retired.get(fn_id, 0) + count
            process = processes[pid]
            label = process.labels.get((fn_id, func), UNNAMED_KERNEL)
            series = (process.comm, TABLE[fn_id].name, label)
            self.retired_launches[series] = self.retired_launches.get(series, 0) + count
        for fn_id, calls in forgotten.calls.items():
            self._retired_calls[fn_id] = self._retired_calls.get(fn_id, 0) + calls

    def account(self, totals: Sequence[FunctionTotals], sampled: Set[str],
                launches: Dict[LaunchKey, int],
                per_process: Dict[Tuple[Labels, int], list]) -> None:
        """Raise the high-water marks: the successful launches the aggregates counted
        beyond those the maps hold (and those of processes already dropped) are the ones
        the full `launches` map could not take; so with calls and `proc_calls`."""
        self.map_full = max(self.map_full, self._launches_unattributed(
            totals, sampled, launches))
        self.process_map_full = max(self.process_map_full, self._calls_unattributed(
            [f for f in totals if f.api.name not in sampled], per_process))

    def _launches_unattributed(self, totals: Sequence[FunctionTotals], sampled: Set[str],
                               launches: Dict[LaunchKey, int]) -> int:
        ok = {apis.FN_ID[f.api.name]: f.count - (0 if f.api.name in sampled else f.errors)
              for f in totals if f.api.role == Role.LAUNCH}  # (sampled: every attempt)
        attributed = dict(self._retired)
        for fn_id, count in self._captured.items():  # (in the aggregates, not in the map)
            attributed[fn_id] = attributed.get(fn_id, 0) + count
        for (_, fn_id, _), count in launches.items():
            attributed[fn_id] = attributed.get(fn_id, 0) + count
        return sum(max(n - attributed.get(fn_id, 0), 0) for fn_id, n in ok.items())

    def _calls_unattributed(self, totals: Sequence[FunctionTotals],
                            per_process: Dict[Tuple[Labels, int], list]) -> int:
        """The calls of `totals` (the rows counted by process in `proc_calls`) that no
        process's entry holds, nor one of a process dropped: those the full map could not
        take."""
        held: Dict[int, int] = dict(self._retired_calls)
        for (_, fn_id), values in per_process.items():
            held[fn_id] = held.get(fn_id, 0) + values[0]
        counted: Dict[int, int] = {}
        for f in totals:
            fn_id = apis.FN_ID[f.api.name]
            counted[fn_id] = counted.get(fn_id, 0) + f.count
        return sum(max(n - held.get(fn_id, 0), 0) for fn_id, n in counted.items())

    def launch_totals(self, series: LaunchSeries) -> Dict[Tuple[str, str, str], int]:
        """Launches by (comm, api, kernel label) of the whole run: the processes dropped
        and those of `series`."""
        totals = dict(self.retired_launches)
        for (labels, api, kernel), n in series.launches.items():
            key = (dict(labels)["comm"], api, kernel)
            totals[key] = totals.get(key, 0) + n
        return totals


def calls_by_process(calls: Dict[Tuple[int, int], list], launches: Dict[LaunchKey, int],
                     sampled: Set[str], processes: Processes) -> Dict[Tuple[Labels, int], list]:
    """Calls, errors and API time by (process labels, function) from `proc_calls`
    ((pid, fn_id) -> [calls, errors, ns]); a sampled row's calls are its launches by
    process (`launches`: (pid, fn_id, func) -> count)."""
    found: Dict[Tuple[Labels, int], list] = {}
    for (pid, fn_id), values in calls.items():
        entry = found.setdefault((processes.of(pid).label_set(), fn_id), [0, 0, 0])
        for k, v in enumerate(values):
            entry[k] += v
    for (pid, fn_id, _), count in launches.items():
        if TABLE[fn_id].name in sampled:
            # (no errors nor times: the sampled returns are not by process)
            found.setdefault((processes.of(pid).label_set(), fn_id),
                             [0, None, None])[0] += count
    return found
