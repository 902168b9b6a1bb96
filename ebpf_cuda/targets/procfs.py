"""The late-load watch's door to /proc: a process's maps (as bytes: a framework's process maps
thousands of files, and most lines are never split), its auxv, whether it lives, every pid.
(discovery.py reads the maps as `Mapping`s, for the start-up search.)
"""
import os
import struct
from typing import List, Optional, Sequence

from ..errors import ProcessError

AT_BASE = 7  # auxv: where the interpreter (the dynamic loader) is mapped


def maps_lines(pid: int) -> List[bytes]:
    """The lines of /proc/PID/maps; ProcessError when it has exited."""
    try:
        with open("/proc/%d/maps" % pid, "rb") as stream:
            return stream.readlines()
    except OSError as err:
        raise ProcessError("cannot read the mappings of process %d: %s"
                           % (pid, err.strerror or err)) from None


def maps_text(pid: int) -> Optional[bytes]:
    """The whole of /proc/PID/maps, or None when it cannot be read (gone)."""
    try:
        with open("/proc/%d/maps" % pid, "rb") as stream:
            return stream.read()
    except OSError:
        return None


def at_base(pid: int) -> int:
    """Where process `pid`'s dynamic loader is mapped (auxv AT_BASE); 0 for a static
    executable or a process gone."""
    try:
        with open("/proc/%d/auxv" % pid, "rb") as stream:
            data = stream.read()
    except OSError:
        return 0
    return dict(struct.iter_unpack("<QQ", data[:len(data) // 16 * 16])).get(AT_BASE, 0)


def loader_line(pid: int, lines: Sequence[bytes]) -> Optional[bytes]:
    """The maps line (of `lines`, process `pid`'s) of its dynamic loader's first mapping."""
    base = at_base(pid)
    if not base:
        return None
    prefix = b"%x-" % base
    return next((line for line in lines if line.startswith(prefix)), None)


def is_alive(pid: int) -> bool:
    """Whether process `pid` is there (as this /proc numbers them)."""
    return os.path.exists("/proc/%d" % pid)


def all_pids() -> List[int]:
    """Every process of the machine (as this /proc numbers them)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]
