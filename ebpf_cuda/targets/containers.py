"""Which container a process runs in, told by its cgroup path.

Container runtimes name each container's cgroup after its 64-hex-digit id: Docker
(`docker-<id>.scope` under systemd, `/docker/<id>` with cgroupfs), containerd
(`cri-containerd-<id>.scope`), CRI-O (`crio-<id>.scope`), podman (`libpod-<id>.scope`).
The id is shown as `docker ps` shows it: its first 12 digits. The path is read from
/proc/PID/cgroup: the unified hierarchy's line first, the innermost id of a path (a
container in a container) winning. A tracer inside a container with a cgroup namespace of
its own sees "/" there, so no id: every process it sees is in its own container.

A process may exit before the reader reads its first records: then /proc has nothing to
tell. So each thread's hello record carries its cgroup v2 id (record.HELLO_CGROUP), and the
cgroup's path is found from the id (open_by_handle_at on the cgroup2 mount) while the
container lives; /proc/PID/cgroup is read for processes whose id names none (no hello: a
kernel without task storage; no cgroup2 mount; a container known by its v1 hierarchies only).
"""
import os
import re
from typing import Dict, Iterable, Optional

from .. import syscalls
from ..spec import record
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


def cgroup2_mount() -> Optional[str]:
    """Where the cgroup v2 hierarchy is mounted (the first mount of it), or None."""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return fields[1].replace("\\040", " ")
    except OSError:
        pass
    return None


class Cgroups:
    """The container of each cgroup v2 id, found once from its path (None when the path
    cannot be found: no cgroup2 mount, the cgroup removed, no privilege to open it)."""

    def __init__(self) -> None:
        self._of: Dict[int, str] = {}
        self._mount: Optional[str] = None

    def container(self, cgroup_id: int) -> Optional[str]:
        """The short container id of the cgroup ("" none), or None when its path is not
        known."""
        found = self._of.get(cgroup_id)
        if found is None:
            path = self._path(cgroup_id)
            if path is None:
                return None
            if len(self._of) >= MAX_PROCESSES:
                self._of.clear()
            found = self._of[cgroup_id] = container_in("0::%s\n" % path)
        return found

    def _path(self, cgroup_id: int) -> Optional[str]:
        """The cgroup's path below the mount (once per cgroup: the mount is opened each
        time, so nothing stays open)."""
        if self._mount is None:
            self._mount = cgroup2_mount() or ""
        if not self._mount:
            return None
        try:
            mount_fd = os.open(self._mount, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            path = syscalls.cgroup_path(mount_fd, cgroup_id)
        finally:
            os.close(mount_fd)
        if path is None or not path.startswith(self._mount):
            return None
        return path[len(self._mount):] or "/"


class Containers:
    """The container of each process the trace shows, read once per pid: `observe` it while
    the process lives (its first record), `of` answers from then on (also for records
    formatted after it exited), `forget` when the process is forgotten. Past MAX_PROCESSES
    processes, those that exited are dropped."""

    def __init__(self) -> None:
        self._of: Dict[int, Optional[str]] = {}
        self.own = container_of(os.getpid()) or None  # the tracer's own, if any
        self.cgroups = Cgroups()

    def observe(self, pids: Iterable[int], frames: bytes = b"") -> None:
        """Learn the container of each of `pids` not known yet: from its cgroup v2 id in the
        batch's hello records (record.hello_cgroups, read only when a pid is new) when that
        names one, else from /proc."""
        new = [pid for pid in pids if pid not in self._of]
        cgroups = record.hello_cgroups(frames) if new and frames else {}
        for pid in new:
            cgroup = cgroups.get(pid)
            found = None if cgroup is None else self.cgroups.container(cgroup)
            if found:
                self._keep(pid, found)
            else:  # (a v1 hierarchy may name one: hybrid hosts, cgroupfs drivers)
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
        return self._keep(pid, container_of(pid) or None)

    def _keep(self, pid: int, container: Optional[str]) -> Optional[str]:
        if len(self._of) >= MAX_PROCESSES:
            self._drop_exited()
        self._of[pid] = container
        return container

    def _drop_exited(self) -> None:
        # (over a copy of the keys: the lines thread behind a spool may read meanwhile)
        for pid in [pid for pid in list(self._of) if not procfs.is_alive(pid)]:
            self._of.pop(pid, None)
        if len(self._of) >= MAX_PROCESSES // 2:  # many live ones: the oldest go (re-read)
            for pid in list(self._of)[:len(self._of) - MAX_PROCESSES // 4]:
                self._of.pop(pid, None)
