"""The processes the monitor has seen making CUDA calls, until it drops them: each one's labels
(pid, name, container), whether it still runs (a reused PID has another start time), when its
exit was noted (the first published series that holds its last values), and the sticky
kernel labels of its launches.
"""
import time
from typing import Dict, Iterator, List, Mapping, Optional, Set, Tuple

from ..spec import record
from ..spec.apis import TABLE
from ..targets.containers import Cgroups, container_of
from .metrics import Labels

OTHER_KERNEL = "other"
UNNAMED_KERNEL = "unnamed"


class Process:
    """A process seen making CUDA calls: its labels, and the sticky kernel labels of its
    launches ((fn_id, func) -> label)."""

    __slots__ = ("pid", "comm", "container", "start", "exited", "exited_at", "labels",
                 "kernels", "waiting")

    def __init__(self, pid: int, comm: str, container: Optional[str] = None) -> None:
        """`comm`: the name of the thread that made the call, the label when the process
        is gone already (else the process's own name, which a thread's may differ from).
        `container`: its container when its cgroup v2 id names one, else read now."""
        self.pid = pid
        own, self.start = _stat(pid)
        self.comm = own if own is not None else comm
        self.container = container or container_of(pid)
        # The first published series that holds its end (its last values), and when.
        self.exited: Optional[int] = None
        self.exited_at = 0.0
        self.labels: Dict[Tuple[int, int], str] = {}
        self.kernels: Set[str] = set()  # kernel names that have a label of their own
        # (fn_id, func) of launches held back a tick, their name unknown (kernel_label)
        self.waiting: Set[Tuple[int, int]] = set()

    def alive(self) -> bool:
        """Still running (the same process: a reused PID has another start time)."""
        _, start = _stat(self.pid)
        return start is not None and start == self.start

    def label_set(self) -> Labels:
        labels = (("pid", str(self.pid)), ("comm", self.comm))
        return labels + ((("container", self.container),) if self.container else ())

    def kernel_label(self, fn_id: int, func: int, names, limit: int,
                     wait: bool = True) -> Optional[str]:
        """The launch's kernel label, decided once per (function, func), so that every
        series only grows: its name (`names.name_for`: a decode.names.KernelNamer) while
        fewer than `limit` names have one, else "other"
        (the first kernels a process launches get the labels). None: not decided yet. A
        launch whose name is not known when first seen waits one tick (`wait`): the call
        that taught it (cuKernelGetFunction, say) came before the launch, but its record
        may have reached the ring after the reader drained it for this tick."""
        label = self.labels.get((fn_id, func))
        if label is not None:
            return label
        name = names.name_for(self.pid, TABLE[fn_id].name, func)
        if name is None and limit and wait and (fn_id, func) not in self.waiting:
            self.waiting.add((fn_id, func))
            return None
        self.waiting.discard((fn_id, func))
        if name is None:
            label = UNNAMED_KERNEL if limit else OTHER_KERNEL
        elif name in self.kernels or len(self.kernels) < limit:
            self.kernels.add(name)
            label = name
        else:
            label = OTHER_KERNEL
        self.labels[(fn_id, func)] = label
        return label


def _stat(pid: int) -> Tuple[Optional[str], Optional[int]]:
    """The process's name and start time in clock ticks since boot (/proc/PID/stat fields
    2 and 22); (None, None) when it has gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
        name, rest = stat[stat.index(b"(") + 1:].rsplit(b")", 1)
        return name.decode("utf-8", "replace"), int(rest.split()[19])
    except (OSError, IndexError, ValueError):
        return None, None


class Processes(Mapping[int, Process]):
    """The processes seen and not dropped yet, by pid (the reader's: not thread-safe)."""

    def __init__(self) -> None:
        self._by_pid: Dict[int, Process] = {}
        self.seen = 0  # processes seen in all
        self._cgroups = Cgroups()

    def __getitem__(self, pid: int) -> Process:
        return self._by_pid[pid]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_pid)

    def __len__(self) -> int:
        return len(self._by_pid)

    def note(self, frames: bytes) -> None:
        """The new processes of a batch of ring frames, named by their first record (their
        container by their hello record's cgroup, when it has one)."""
        pids = record.frame_column(frames, record.PID_TGID + 4, "I")
        new = set(pids).difference(self._by_pid)
        cgroups = record.hello_cgroups(frames) if new else {}
        for pid in new:
            at = pids.index(pid) * record.FRAME_SIZE + record.FRAME_HEADER + record.COMM
            comm = frames[at:at + record.COMM_LEN].split(b"\0", 1)[0]
            cgroup = cgroups.get(pid)
            container = None if cgroup is None else self._cgroups.container(cgroup)
            self._add(Process(pid, comm.decode("utf-8", "replace"), container))

    def of(self, pid: int) -> Process:
        """The process `pid`, noted now if it was not (its hello record was lost: a full
        ring)."""
        process = self._by_pid.get(pid)
        return process if process is not None else self._add(Process(pid, "?"))

    def _add(self, process: Process) -> Process:
        self._by_pid[process.pid] = process
        self.seen += 1
        return process

    def note_exits(self, version: int) -> None:
        """Those that exited since the last look: their end is in series `version`."""
        now = time.monotonic()
        for process in self._by_pid.values():
            if process.exited is None and not process.alive():
                process.exited, process.exited_at = version, now

    def hold_back(self, version: int) -> None:
        """Those that exited with launches held back a tick: their end is in `version`."""
        for process in self._by_pid.values():
            if process.exited is not None and process.waiting:
                process.exited = version

    def gone(self, collected: int, hold_s: float) -> List[int]:
        """The exited processes whose last values are in a series every exporter has
        collected (`collected`: the oldest version collected), or that exited `hold_s`
        ago; not one whose launches wait for their name."""
        held_since = time.monotonic() - hold_s
        return [p.pid for p in self._by_pid.values()
                if p.exited is not None and not p.waiting
                and (p.exited <= collected or p.exited_at < held_since)]

    def drop(self, pid: int) -> None:
        del self._by_pid[pid]

    def live(self) -> List[Process]:
        """Those still running, by pid."""
        return sorted((p for p in self._by_pid.values() if p.exited is None),
                      key=lambda p: p.pid)
