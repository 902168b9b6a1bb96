"""Which container a process runs in, told by its cgroup path.

Container runtimes name each container's cgroup after its 64-hex-digit id: Docker
(`docker-<id>.scope` under systemd, `/docker/<id>` with cgroupfs), containerd
(`cri-containerd-<id>.scope`), CRI-O (`crio-<id>.scope`), podman (`libpod-<id>.scope`).
The id is shown as `docker ps` shows it: its first 12 digits. The path is read from
/proc/PID/cgroup: the unified hierarchy's line first, the innermost id of a path (a
container in a container) winning. A tracer inside a container with a cgroup namespace of
its own sees "/" there, so no id: every process it sees is in its own container.
"""
import os
import re
from typing import Dict, Optional

from . import procfs

CONTAINER_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
SHORT_ID = 12  # digits shown, as `docker ps` does
MAX_PROCESSES = 4096  # processes kept before the exited ones are dropped


def container_in(cgroups: str) -> str:
    """The short container id in the text of a /proc/PID/cgroup file, or ""."""
    lines = cgroups.splitlines()
    for line in [text for text in lines if text.startswith("0::")] + lines:
        found = CONTAINER_ID.findall(line)
        if found:
            return found[-1][:SHORT_ID]
    return ""


def container_of(pid: int) -> str:
    """The short id of the container process `pid` runs in, or "" when it is in none (or
    gone)."""
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            return container_in(f.read())
    except OSError:
        return ""


class Containers:
    """The container of each process the trace shows, read once per pid: `observe` it while
    the process lives (its first record), `of` answers from then on (also for records
    formatted after it exited), `forget` when the process is forgotten. Past MAX_PROCESSES
    processes, those that exited are dropped."""

    def __init__(self) -> None:
        self._of: Dict[int, Optional[str]] = {}
        self.own = container_of(os.getpid()) or None  # the tracer's own, if any

    def observe(self, pids) -> None:
        """Read the container of each of `pids` not known yet."""
        for pid in pids:
            if pid not in self._of:
                self._read(pid)

    def of(self, pid: int) -> Optional[str]:
        """The short container id of process `pid`, or None."""
        try:
            return self._of[pid]
        except KeyError:
            return self._read(pid)

    def shown(self, pid: int) -> Optional[str]:
        """The container to show on a text line: the process's, unless it is the tracer's
        own (every line would say it)."""
        container = self.of(pid)
        return None if container == self.own else container

    def annotate(self, events) -> None:
        """Set each event's `container` (events.Event)."""
        known = self._of
        for event in events:
            container = known.get(event.pid, "")
            event.container = self.of(event.pid) if container == "" else container

    def forget(self, pid: int) -> None:
        self._of.pop(pid, None)

    def __len__(self) -> int:
        return len(self._of)

    def _read(self, pid: int) -> Optional[str]:
        if len(self._of) >= MAX_PROCESSES:
            self._drop_exited()
        container = self._of[pid] = container_of(pid) or None
        return container

    def _drop_exited(self) -> None:
        # (over a copy of the keys: the lines thread behind a spool may read meanwhile)
        for pid in [pid for pid in list(self._of) if not procfs.is_alive(pid)]:
            self._of.pop(pid, None)
        if len(self._of) >= MAX_PROCESSES // 2:  # many live ones: the oldest go (re-read)
            for pid in list(self._of)[:len(self._of) - MAX_PROCESSES // 4]:
                self._of.pop(pid, None)
