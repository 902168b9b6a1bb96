"""The kernel objects (bpf and perf fds) this test process holds, to check that closing frees
them."""
import os
from typing import List, Set


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


def bpf_link_types(pid: int) -> List[str]:
    """`link_type` of every BPF link process `pid` holds open (from /proc/PID/fdinfo)."""
    types = []
    folder = "/proc/%d/fdinfo" % pid
    for fd in os.listdir(folder):
        try:
            with open(os.path.join(folder, fd)) as f:
                text = f.read()
        except OSError:
            continue
        types += [line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("link_type:")]
    return types
