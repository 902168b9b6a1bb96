"""The kernel objects (bpf and perf fds) this test process holds, to check that closing frees
them."""
import os
from typing import List, Set

import pytest


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


def perf_links() -> bool:
    """Whether probes are joined to their programs by BPF links here (5.15+ for perf-event
    uprobes; before, by PERF_EVENT_IOC_SET_BPF: no link to count or query)."""
    from ebpf_cuda.bpf import uprobe
    return uprobe.uprobe_multi_supported() or uprobe.perf_links_supported()


def require_perf_links() -> None:
    """Skip a test about BPF links on a kernel that attaches probes without them."""
    if not perf_links():
        pytest.skip("no BPF links for perf-event uprobes on this kernel (before 5.15)")


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
