"""Which CUDA files a whole host has: every copy of the runtime and the driver the usual search
finds, and those running processes map, whatever their mount namespace (the monitor probes
them all at its start; monitor/system_watch.SystemWatch those that appear later).
"""
import fnmatch
import os
from typing import Callable, List, Optional, Set, Tuple

from ..errors import TracerError
from ..targets import discovery

_CUDA_FILES = ("libcudart.so*", "libcuda.so*")  # the runtime and the driver
Log = Callable[[str], None]


def cuda_files(log: Optional[Log] = None) -> List[str]:
    """Every distinct CUDA runtime and driver file of this machine: every copy the usual
    search finds (discovery.find_library, find_driver_library) and every libcudart.so* and
    libcuda.so* a running process maps, reached through /proc/PID/root when its mount
    namespace (a container) has it at a path we do not see. Deduplicated by inode.

    Renamed copies (libcudart-1a2b3c4d.so.12) and files that carry the runtime statically
    are not looked for here: the late-load watch (monitor/system_watch.SystemWatch) finds those the
    running processes map, at its start, on a side thread."""
    found: List[str] = []
    seen: Set[Tuple[int, int]] = set()
    for path in discovery.find_library() + discovery.find_driver_library():
        _add_file(found, seen, path)
    for pid in _pids():
        for path in _mapped_cuda_files(pid):
            if _add_file(found, seen, path) and log is not None:
                log("%s: mapped by process %d" % (path, pid))
    return found


def _mapped_cuda_files(pid: int) -> List[str]:
    """The libcudart.so* and libcuda.so* files `pid` maps, as paths valid here (through
    /proc/PID/root when its mount namespace has them elsewhere; not resolved further: the
    real path of /proc/PID/root/x is x, which may not exist here)."""
    try:
        mappings = discovery.process_mappings(pid)
    except TracerError:  # gone, or a kernel thread
        return []
    names = {m.path: m.inode for m in mappings if m.is_file
             and any(fnmatch.fnmatch(os.path.basename(m.path), p) for p in _CUDA_FILES)}
    return [discovery.process_file_path(pid, path, inode) for path, inode in names.items()]


def _add_file(found: List[str], seen: Set[Tuple[int, int]], path: str) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    if (info.st_dev, info.st_ino) in seen:
        return False
    seen.add((info.st_dev, info.st_ino))
    found.append(path)
    return True


def _pids() -> List[int]:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
