"""The kernel objects (bpf and perf fds) this test process holds, to check that closing frees
them."""
import os
from typing import Set


def open_fds() -> Set[str]:
    """This process's bpf/perf fds (anon inodes), by number."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + name).startswith("anon_inode:"):
                fds.add(name)
        except OSError:
            pass  # the fd listdir itself used
    return fds
