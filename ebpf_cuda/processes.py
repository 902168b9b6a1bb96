"""Which processes descend from a traced command (for following its children)."""
import os
from typing import Dict, Iterable, Optional


def parent_pid(pid: int) -> Optional[int]:
    """The parent of `pid` from /proc/PID/stat, or None if it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:
        return int(stat.rsplit(b")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


class ProcessTree:
    """The processes started from `roots`, learned lazily from /proc.

    A process that has already exited when first asked about cannot be placed: it counts
    as outside (and `unplaced` counts it), so nothing foreign is ever attributed. An orphan
    whose parent exited is reparented away from the tree and is no longer followed."""

    def __init__(self, roots: Iterable[int]) -> None:
        self._inside: Dict[int, bool] = {pid: True for pid in roots}
        self.unplaced = 0

    def contains(self, pid: int) -> bool:
        known = self._inside.get(pid)
        if known is not None:
            return known
        chain, inside, current = [], False, pid
        while current is not None and current > 1:
            cached = self._inside.get(current)
            if cached is not None:
                inside = cached
                break
            chain.append(current)
            current = parent_pid(current)
        if current is None and not chain[1:]:
            self.unplaced += 1
        for member in chain:
            self._inside[member] = inside
        return inside

