"""`ebpf-cuda monitor` detaches the probes of a file probed after its start once no process
maps it any more (late_loads.LateLoads.sweep, Session.detach), forgets it, and probes it
again when a process maps it again; the counts made meanwhile stay.

The monitor here starts on a file that defines one function only (`start_lib`), so that the
functions of the late copies (the stand-in runtime's) are probed in those copies alone: their
aggregates must stay once the copy is detached. Its sweep runs every SWEEP_S (30 s by
default). The kernel's own record of the links (bpf_link_info of every link this process
holds, the file each is on) says whether a file's probes are on."""
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ebpf_cuda.monitor import prometheus
from ebpf_cuda import syscalls
from ebpf_cuda.bpf.uprobe import UPROBE_MULTI, attach_path
from monitor_support import parse_metrics, value
from test_monitor_late import CALLS, PAUSE_MS, counts, exact, fresh_copy, late_of, run

pytestmark = pytest.mark.kernel

SWEEP_S = 0.2


@pytest.fixture(scope="session")
def dlopen_prog(cc):
    return cc.executable("late_calls.c", "late_calls_dlopen", extra=["-ldl"])


@pytest.fixture(scope="session")
def start_lib(cc):
    """A library with one CUDA function of the runtime: the only file of the start."""
    return cc.from_text("int cudaGetDeviceCount(int *count) { *count = 1; return 0; }\n",
                        "libcudart_start.so", shared=True)


@pytest.fixture
def monitor(root, start_lib):
    """A monitor of `start_lib` that also watches for later files, sweeping every SWEEP_S;
    its reader in a thread, its -v lines in `monitor.lines`."""
    from ebpf_cuda.monitor.agent import Monitor, MonitorOptions

    lines = []
    started = Monitor(MonitorOptions(paths=(str(start_lib),), late=True), log=lines.append)
    started.add_exporter("")  # (the tests collect as one, from the start)
    started.start()
    started.lines = lines
    assert started.watch is not None, lines
    started.watch.sweep_every = SWEEP_S
    reader = threading.Thread(target=started.run, daemon=True)
    reader.start()
    try:
        yield started
    finally:
        started.stop()
        reader.join(10)
        started.close()


class HeldRun:
    """late_calls on `copy` with PAUSE_MS -1: the runtime mapped, then held until `go()`."""

    def __init__(self, prog, copy, calls: int) -> None:
        self.proc = subprocess.Popen([str(prog), str(copy), str(calls), "-1"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().startswith("start ")  # (mapped by now)
        self.pid = self.proc.pid

    def go(self, timeout: float = 30) -> None:
        out, _ = self.proc.communicate("\n", timeout=timeout)
        assert self.proc.returncode == 0, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def link_files() -> list:
    """The file of every uprobe link this process holds, as the kernel records it."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + name) != "anon_inode:bpf_link":
                continue
            info = syscalls.link_info(int(name))
        except (OSError, Exception):  # (an fd closed meanwhile, a link of another kind)
            continue
        if info.details:
            found.append(info.path)
    return found


def wait_until(what, timeout: float = 60.0, why: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found or time.monotonic() > deadline:
            assert found, why() if callable(why) else why  # (a callable: said at the end)
            return found
        time.sleep(0.05)


def late_key(monitor, copy: Path):
    """The maps key the watch keeps the late file `copy` by (once its probes are all on)."""
    def key():
        return [k for k, (_, path) in list(monitor.watch.late.files.items())
                if path == str(copy)]
    return wait_until(key, why="not probed late: %s" % monitor.lines)[0]


def said(monitor, copy: Path) -> list:
    """What the monitor said of `copy`, and whether it is known to the watch (tests' help)."""
    st = os.stat(copy)
    late = monitor.watch.late
    return [l for l in monitor.lines if str(copy) in l or "map_files" in l] + [
        "identity probed: %s" % ((st.st_dev, st.st_ino) in late.probed),
        "inode examined: %s" % [k for k in late.examined._keys
                                if k.split(b" ")[1] == b"%d" % st.st_ino]]


def probed(monitor, copy: Path) -> bool:
    return str(copy) in monitor.files


def said_probed(monitor, copy: Path) -> bool:
    """The monitor has said `copy` is probed: every link of it is on."""
    return any(l.startswith("probed late: %s " % copy) for l in list(monitor.lines))


def detached_lines(monitor, copy: Path) -> list:
    return [l for l in monitor.lines if l.startswith("detached: %s " % copy)]


def files_gauge(monitor) -> dict:
    samples = parse_metrics(prometheus.render(monitor.collect()).decode())
    return {state: value(samples, "ebpf_cuda_probed_files", state=state)
            for state in ("start", "late", "detached")}


def calls_of(monitor, api: str) -> float:
    samples = parse_metrics(prometheus.render(monitor.collect()).decode())
    return value(samples, "ebpf_cuda_api_calls_total", api=api)


def sweeps(monitor, n: int = 3) -> None:
    """Let the watch's thread sweep `n` times more."""
    time.sleep(SWEEP_S * (n + 1) + 0.3)


def test_a_late_file_no_process_maps_is_detached_then_probed_again_when_mapped(
        monitor, dlopen_prog, lib, tmp_path):
    copy = fresh_copy(lib, tmp_path / "container" / "lib")
    before = files_gauge(monitor)
    assert before["start"] == 1
    first = HeldRun(dlopen_prog, copy, CALLS)
    try:
        session = monitor.tracer.session
        wait_until(lambda: str(copy) in session._late_links, why="never probed: %s"
                   % monitor.lines)  # (its links all on)
        held = list(session._late_links[str(copy)])
        links = len(held)
        # (the kernel's record of a link's file: uprobe_multi links, perf-event ones from 6.6)
        recorded = attach_path() == UPROBE_MULTI
        assert links > 0 and link_files().count(str(copy)) == (links if recorded else 0)
        sweeps(monitor)  # (it maps it: kept)
        assert probed(monitor, copy) and not any(link.closed for link in held)
        assert files_gauge(monitor)["late"] >= 1  # (the host's other files come and go)
        first.go()
    finally:
        first.kill()
    assert counts(monitor, first.pid) == [exact(CALLS)]
    launches = calls_of(monitor, "cudaLaunchKernel")
    assert launches >= CALLS
    # Its only process has exited: the copy's probes come off, in the kernel too.
    [said] = wait_until(lambda: detached_lines(monitor, copy), why=monitor.lines)
    assert "%d links closed" % links in said
    assert not probed(monitor, copy) and str(copy) not in link_files()
    assert all(link.closed for link in held)
    assert str(copy) not in session._late_links
    assert all(t.path != str(copy) for t in session.targets)
    assert [a for a in monitor.tracer.attachments if a.path == str(copy)] == []
    after = files_gauge(monitor)
    assert after["start"] == 1 and after["detached"] >= before["detached"] + 1
    # The counts stay (the functions of the copy alone are still read).
    assert calls_of(monitor, "cudaLaunchKernel") >= launches
    # A new process mapping the same copy: probed again (a late load of its own), counted.
    again = run([dlopen_prog, copy, 7, PAUSE_MS])
    assert counts(monitor, again["pid"]) == [exact(7)]
    assert [entry[:2] for entry in late_of(monitor, tmp_path)] == [
        (str(copy), first.pid), (str(copy), again["pid"])]
    assert len([l for l in monitor.lines if l.startswith("probed late: %s " % copy)]) == 2
    # ... and detached again once it exited.
    wait_until(lambda: len(detached_lines(monitor, copy)) == 2, why=monitor.lines)
    assert str(copy) not in link_files()
    assert files_gauge(monitor)["detached"] >= before["detached"] + 2


def test_a_file_stays_probed_while_another_process_maps_it(monitor, dlopen_prog, lib,
                                                            tmp_path):
    """Two processes map one copy (the second one's mapping is told by its own notice: the
    copy is not looked at again); the first exiting leaves the probes on for the second."""
    copy = fresh_copy(lib, tmp_path / "shared")
    first = HeldRun(dlopen_prog, copy, CALLS)
    second = None
    try:
        wait_until(lambda: probed(monitor, copy), why="never probed: %s" % monitor.lines)
        second = HeldRun(dlopen_prog, copy, 9)
        mkey = late_key(monitor, copy)
        wait_until(lambda: second.pid in monitor.watch.late.mappers[mkey],
                   why="the second process's mapping was not told of")
        first.go()
        sweeps(monitor)
        assert probed(monitor, copy) and str(copy) in link_files(), monitor.lines
        assert detached_lines(monitor, copy) == []
        second.go()
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert counts(monitor, first.pid, second.pid) == [exact(CALLS), exact(9)]
    wait_until(lambda: detached_lines(monitor, copy), why=monitor.lines)
    assert str(copy) not in link_files()
    assert len(late_of(monitor, tmp_path)) == 1  # (probed once)


FORKER = r"""
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
print("mapped", flush=True)
sys.stdin.readline()
if os.fork():  # the process whose loader mapped the runtime: gone once told
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.01)
    os._exit(0)
p = ctypes.c_void_p()
assert lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1)) == 0  # (a call: now known)
print("child %d" % os.getpid(), flush=True)
sys.stdin.readline()
for k in range(int(sys.argv[2])):
    assert lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(k + 2)) == 0
print("done", flush=True)
"""


def test_a_process_that_inherited_the_mapping_keeps_the_probes_on(monitor, lib, tmp_path):
    """The process that mapped the copy forks and exits; its child (never told of by a
    notice) is known to the monitor by its calls: the sweep finds the copy in its maps, and
    its later calls are counted."""
    copy = fresh_copy(lib, tmp_path / "forked")
    go = tmp_path / "parent-go"
    proc = subprocess.Popen([sys.executable, "-c", FORKER, str(copy), "50", str(go)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "mapped\n"
        mkey = late_key(monitor, copy)  # (all its probes on: the child's first call is seen)
        proc.stdin.write("\n")
        proc.stdin.flush()
        child = int(re.match(r"child (\d+)", proc.stdout.readline()).group(1))
        wait_until(lambda: child in monitor._known, why="the child's calls were not seen")
        go.touch()
        proc.wait(10)  # (the parent: gone)
        sweeps(monitor)
        assert probed(monitor, copy) and detached_lines(monitor, copy) == [], monitor.lines
        assert monitor.watch.late.mappers[mkey] == {child}
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        [(_, held)] = counts(monitor, child)
        assert held == sum(range(1, 52))  # (every allocation counted: 1, then 2..51)
    finally:
        proc.stdin.close()
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_until(lambda: detached_lines(monitor, copy), why=monitor.lines)


def test_a_file_replaced_at_the_same_path_is_probed_and_detached_on_its_own(
        monitor, dlopen_prog, lib, tmp_path):
    """A copy replaced by a new file at the same path (a reinstall) while a process still
    maps the old one: the new one is probed through its process's mapping, each one's probes
    come off when its own processes have exited."""
    copy = fresh_copy(lib, tmp_path / "venv")
    old = HeldRun(dlopen_prog, copy, 5)
    new = None
    try:
        # (all its probes on, not only the first link's: a link made after the rename
        # below would resolve the path to the new file)
        wait_until(lambda: said_probed(monitor, copy), why="never probed: %s" % monitor.lines)
        fresh = fresh_copy(lib, tmp_path / "staging")
        os.rename(fresh, copy)  # (a new inode at the old path)
        new = HeldRun(dlopen_prog, copy, 11)
        mapped = "/proc/%d/map_files/" % new.pid
        wait_until(lambda: any(f.startswith(mapped) for f in monitor.files),
                   why=lambda: "the new file was not probed: %s %s" % (
                       said(monitor, copy), monitor.files))
        old.go()
        wait_until(lambda: detached_lines(monitor, copy), why=monitor.lines)
        sweeps(monitor)
        assert any(f.startswith(mapped) for f in monitor.files), said(monitor, copy)
        # (the kernel's path of the new file's links)
        assert str(copy) in link_files(), said(monitor, copy)
        new.go()
    finally:
        old.kill()
        if new is not None:
            new.kill()
    assert counts(monitor, old.pid, new.pid) == [exact(5), exact(11)], (
        said(monitor, copy), monitor.lines)
    wait_until(lambda: not any(f.startswith(mapped) for f in monitor.files),
               why="%s %s" % (monitor.files, said(monitor, copy)))
    assert str(copy) not in link_files()


def test_a_mapping_gone_before_its_probe_leaves_the_file_to_be_looked_at_again(
        monitor, dlopen_prog, lib, tmp_path, monkeypatch):
    """The mapping a replaced file was to be probed through was gone when the probe looked
    (a scan on an exec notice can read the maps while the loader still maps the library:
    its first mapping spans the whole file, then the segments are mapped over it; the test
    above met it one run in six). Simulated: the first look at a map_files link fails. The
    file is then not taken as looked at: the next process's notices probe it, and the
    calls of both are counted (a uprobe is on the file, whoever maps it). Before the fix,
    the file stayed marked as looked at and probed, and was never probed."""
    from ebpf_cuda import late_loads as loader_watch

    copy = fresh_copy(lib, tmp_path / "venv")
    old = HeldRun(dlopen_prog, copy, 5)
    first = second = None
    try:
        wait_until(lambda: said_probed(monitor, copy), why=lambda: monitor.lines)
        os.rename(fresh_copy(lib, tmp_path / "staging"), copy)
        real, failed = loader_watch.identity, []

        def identity(path):
            if "/map_files/" in path and not failed:
                failed.append(path)
                return None
            return real(path)

        monkeypatch.setattr(loader_watch, "identity", identity)
        first = HeldRun(dlopen_prog, copy, 3)
        wait_until(lambda: [l for l in monitor.lines
                            if "another file is probed at that path" in l],
                   why=lambda: monitor.lines)
        assert failed and failed[0].startswith("/proc/%d/map_files/" % first.pid)
        # (the next notice: the first process's own dlopen, when the failed look was on its
        # exec notice, else the second process's)
        second = HeldRun(dlopen_prog, copy, 11)
        wait_until(lambda: any(f.startswith("/proc/%d/map_files/" % run_.pid)
                               for f in monitor.files for run_ in (first, second)),
                   why=lambda: "%s %s" % (said(monitor, copy), monitor.files))
        for run_ in (first, second, old):
            run_.go()
    finally:
        for run_ in (old, first, second):
            if run_ is not None:
                run_.kill()
    assert counts(monitor, old.pid, first.pid, second.pid) == [exact(5), exact(3), exact(11)]


def test_a_library_given_a_deleted_files_inode_is_probed(monitor, dlopen_prog, lib, tmp_path):
    """ext4 gives the inode of a file just deleted to the next file made: a runtime copied in
    where a program the monitor looked at (and found no CUDA in) was deleted comes with an
    inode met before. It is probed all the same (the files looked at are kept by path too)."""
    folder = tmp_path / "venv"
    folder.mkdir()
    tool = folder / "tool"
    shutil.copy("/bin/sleep", tool)
    ino = os.stat(tool).st_ino
    proc = subprocess.Popen([str(tool), "30"])
    try:
        wait_until(lambda: [k for k in monitor.watch.late.examined._keys
                            if k.split(b" ")[1] == b"%d" % ino],
                   why="the program was not looked at: %s" % monitor.lines)
        assert monitor.watch.late.idle()  # (found to carry no runtime: not probed)
    finally:
        proc.kill()
        proc.wait()
    tool.unlink()
    copy = fresh_copy(lib, folder)
    if os.stat(copy).st_ino != ino:
        pytest.skip("this file system gave the new file a new inode")
    done = HeldRun(dlopen_prog, copy, 7)
    try:
        wait_until(lambda: probed(monitor, copy), why="not probed: %s" % said(monitor, copy))
        done.go()
    finally:
        done.kill()
    assert counts(monitor, done.pid) == [exact(7)]


def test_a_file_replaced_while_its_probes_go_on_gets_them_all(monitor, dlopen_prog, lib,
                                                              tmp_path, monkeypatch):
    """A reinstall that lands while a late file's links are being made (one link after the
    other, tens of ms): every link goes to the file the process maps, none to the new file
    at its path (they are made through one descriptor of it)."""
    from ebpf_cuda.session import Session

    copy = fresh_copy(lib, tmp_path / "venv")
    fresh = fresh_copy(lib, tmp_path / "staging")
    real_attach = Session._attach
    renamed = []

    def attach(self, program, path, *args, **kwargs):
        real_attach(self, program, path, *args, **kwargs)
        if path == str(copy) and not renamed:  # (after its first link: the new file in)
            os.rename(fresh, copy)
            renamed.append(os.stat(copy).st_ino)

    monkeypatch.setattr(Session, "_attach", attach)
    run = HeldRun(dlopen_prog, copy, 7)
    try:
        wait_until(lambda: said_probed(monitor, copy), why="never probed: %s" % monitor.lines)
        assert renamed, monitor.lines
        run.go()
    finally:
        run.kill()
    assert counts(monitor, run.pid) == [exact(7)], monitor.lines
