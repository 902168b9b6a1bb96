"""`ebpf-cuda monitor` and the CUDA files that appear after it started (monitor/system_watch.py's
SystemWatch): a runtime dlopen'ed from a fresh folder, a program exec'd from a fresh file
with its folder's libcudart as DT_NEEDED, a program carrying the runtime statically, a
dynamic loader met only when a new program execs, and one file reached by two paths: each
probed once, within milliseconds, and every call made after that counted exactly.

Other programs on this machine may map other CUDA files the monitor then probes (it watches
the whole host), so counts are checked per process: its launches (the kernel's launches map)
and its live device memory (its allocation records), never the host-wide totals alone.
tests/native/late_calls.c is the program."""
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ebpf_cuda import late_loads
from ebpf_cuda.monitor import system_watch
from ebpf_cuda.targets import late_files, loaders
from ebpf_cuda.monitor import prometheus
from monitor_support import parse_metrics, settle, value

pytestmark = pytest.mark.kernel

CALLS = 400
PAUSE_MS = 300  # between the runtime being at hand and the first call: probes are on by then
LAUNCHES = "ebpf_cuda_kernel_launches_total"


@pytest.fixture(scope="session")
def dlopen_prog(cc):
    return cc.executable("late_calls.c", "late_calls_dlopen", extra=["-ldl"])


@pytest.fixture(scope="session")
def linked_prog(cc, lib):
    """late_calls linked against libcudart.so.12 found in its own folder ($ORIGIN)."""
    return cc.executable("late_calls.c", "late_calls_linked",
                         extra=["-DLINKED", "-L", str(Path(lib).parent), "-l:libcudart.so.12",
                                "-Wl,-rpath,$ORIGIN"])


@pytest.fixture(scope="session")
def static_prog(cc):
    """late_calls with the stand-in runtime linked into the executable (its functions in
    .symtab only, as nvcc's default static cudart)."""
    from conftest import NATIVE
    from fakecuda import LIB_FLAGS

    flags = [f for f in LIB_FLAGS if not f.startswith("-Wl,-soname")]
    return cc.executable("late_calls.c", "late_calls_static",
                         extra=["-DLINKED", str(NATIVE / "fakecudart.c"), *flags, "-lpthread"])


@pytest.fixture
def monitor(root, lib):
    """A monitor of the session's stand-in runtime that also watches for later files (as
    without -p), its reader in a thread; its -v lines in `monitor.lines`."""
    from ebpf_cuda.monitor.agent import Monitor, MonitorOptions

    lines = []
    started = Monitor(MonitorOptions(paths=(str(lib),), late=True), log=lines.append)
    started.add_exporter("")  # (the tests collect as one, from the start)
    started.start()
    started.lines = lines
    reader = threading.Thread(target=started.run, daemon=True)
    reader.start()
    try:
        assert started.watch is not None and started.watch.execs is not None, lines
        yield started
    finally:
        started.stop()
        reader.join(10)
        started.close()


def fresh_copy(lib, folder: Path, name: str = "libcudart.so.12") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(lib, folder / name)
    return folder / name


def run(argv, timeout: float = 60) -> dict:
    """Run a late_calls program to its end: its pid and printed times."""
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, (proc.returncode, out)
    found = dict(re.findall(r"^(\w+) (\d+)$", out, re.M))
    return {"pid": proc.pid, **{k: int(v) for k, v in found.items()}}


def counts(monitor, *pids: int) -> list:
    """(launches, device bytes allocated) the monitor counted for each of `pids`, once its
    reader has published what the kernel counted. One look for all: a process that exited
    is dropped once an exporter collected its last values."""
    settle(monitor)
    memory = [monitor.memory.held(pid) for pid in pids]  # (before the collect: see above)
    samples = parse_metrics(prometheus.render(monitor.collect()).decode())
    return [(int(value(samples, LAUNCHES, pid=str(pid))), held)
            for pid, held in zip(pids, memory)]


def exact(calls: int) -> tuple:
    """What `counts` gives for a late_calls process all of whose calls were counted: one
    launch per call, and allocations of 1..calls bytes."""
    return (calls, calls * (calls + 1) // 2)


def late_of(monitor, under: Path) -> list:
    """The monitor's late loads of files under `under` (other tests' files are left out)."""
    return [entry for entry in monitor.late_loads if entry[0].startswith(str(under))]


def test_a_runtime_dlopened_from_a_folder_the_monitor_never_saw_is_probed(
        monitor, dlopen_prog, lib, tmp_path):
    copy = fresh_copy(lib, tmp_path / "venv" / "lib")
    assert str(copy) not in monitor.files
    # (the dlopen 300 ms after the start: its exec was looked at long before)
    done = run([dlopen_prog, copy, CALLS, PAUSE_MS, 0, 300])
    assert counts(monitor, done["pid"]) == [exact(CALLS)]
    [(path, pid, ms, why)] = late_of(monitor, tmp_path)
    assert (path, pid, why) == (str(copy), done["pid"], late_loads.WHY_LOADER)
    assert 0 < ms < PAUSE_MS
    assert str(copy) in monitor.files
    said = [l for l in monitor.lines if l.startswith("probed late: %s " % copy)]
    assert len(said) == 1 and "mapped by process %d" % pid in said[0], monitor.lines
    assert late_loads.WHY_LOADER in said[0]


def test_a_program_execd_from_a_new_file_with_its_own_libcudart_is_probed(
        monitor, linked_prog, lib, tmp_path):
    app = tmp_path / "app"
    copy = fresh_copy(lib, app)
    exe = app / "late_calls"
    shutil.copy(linked_prog, exe)
    done = run([exe, CALLS, PAUSE_MS])
    assert counts(monitor, done["pid"]) == [exact(CALLS)]
    [(path, pid, ms, why)] = late_of(monitor, tmp_path)
    assert (path, pid) == (str(copy), done["pid"])
    # Its exec's notice or its loader's (mapping DT_NEEDED before main), whichever the
    # reader took first.
    assert why in (late_loads.WHY_EXEC, late_loads.WHY_LOADER)


def test_a_program_carrying_the_runtime_statically_is_probed_at_its_exec(
        monitor, static_prog, tmp_path):
    exe = tmp_path / "bin" / "trainer"
    exe.parent.mkdir()
    shutil.copy(static_prog, exe)
    done = run([exe, CALLS, PAUSE_MS])
    assert counts(monitor, done["pid"]) == [exact(CALLS)]
    [(path, pid, ms, why)] = late_of(monitor, tmp_path)
    assert (path, pid) == (str(exe), done["pid"])
    assert why.endswith(late_loads.WHY_STATIC)
    # A second run of the same file: nothing read again, nothing probed again.
    again = run([exe, 7, PAUSE_MS])
    assert counts(monitor, again["pid"]) == [exact(7)]
    assert len(late_of(monitor, tmp_path)) == 1


def test_one_file_reached_by_two_paths_is_probed_once(monitor, dlopen_prog, lib, tmp_path):
    copy = fresh_copy(lib, tmp_path / "one")
    other = tmp_path / "two" / "libcudart.so.12"
    other.parent.mkdir()
    os.link(copy, other)  # the same inode under another name
    first = run([dlopen_prog, copy, CALLS, PAUSE_MS])
    second = run([dlopen_prog, other, 9, PAUSE_MS])
    # (probed twice, each call would count twice)
    assert counts(monitor, first["pid"], second["pid"]) == [exact(CALLS), exact(9)]
    assert [entry[:2] for entry in late_of(monitor, tmp_path)] == [(str(copy), first["pid"])]
    probed = [a for a in monitor.tracer.attachments if a.path in (str(copy), str(other))]
    assert len(probed) == len({(a.api, a.offset, a.retprobe) for a in probed})


def test_a_dynamic_loader_met_only_at_an_exec_is_watched(monitor, cc, lib, tmp_path):
    """A program whose PT_INTERP is a loader file no running process used (a container's
    image started later): its exec has that loader watched, so a runtime the program
    dlopens later comes through that loader's notice."""
    folder = tmp_path / "image"
    folder.mkdir()
    loader = loaders.own_loader()
    fresh = folder / "ld-linux.so"
    shutil.copy(loader, fresh)
    prog = cc.executable("late_calls.c", "late_calls_interp_%d" % os.getpid(),
                         extra=["-ldl", "-Wl,--dynamic-linker=" + str(fresh)])
    exe = folder / "late_calls"
    shutil.copy(prog, exe)
    copy = fresh_copy(lib, folder / "lib")
    done = run([exe, copy, CALLS, PAUSE_MS, 0, 500])  # (the dlopen 500 ms after the start)
    assert counts(monitor, done["pid"]) == [exact(CALLS)]
    watched = [l for l in monitor.lines if l.startswith("watching the dynamic loader ")
               and str(fresh) in l]
    assert len(watched) == 1, monitor.lines
    [(path, pid, ms, why)] = late_of(monitor, folder / "lib")
    assert (path, pid, why) == (str(copy), done["pid"], late_loads.WHY_LOADER)


def test_a_runtime_dlopened_in_another_mount_namespace_is_probed(monitor, dlopen_prog, lib,
                                                                 tmp_path):
    """A container started after the monitor, its runtime at a path no other mount
    namespace sees (a tmpfs of its own): reached through /proc/PID/root."""
    folder = tmp_path / "container-lib"
    folder.mkdir()
    script = ('mount -t tmpfs none "%s" && cp "%s" "%s/" && exec "$0" "$@"'
              % (folder, lib, folder))
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                             str(dlopen_prog), str(folder / "libcudart.so.12"), str(CALLS),
                             str(PAUSE_MS)], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert not (folder / "libcudart.so.12").exists()  # (not from here)
    assert counts(monitor, proc.pid) == [exact(CALLS)]
    [(path, pid, _, _)] = [e for e in monitor.late_loads if e[1] == proc.pid]
    assert path.startswith("/proc/%d/" % proc.pid) and path.endswith(
        "%s/libcudart.so.12" % folder)


@pytest.mark.parametrize("how", ["dlopen", "exec"])
def test_the_calls_before_the_probes_are_on_are_the_first_ones_only(
        how, monitor, dlopen_prog, linked_prog, lib, tmp_path):
    """A program that calls at once, every 100 µs: the calls it makes before its file's
    probes are on are missed (nothing can count them), every later one is counted; the
    window is printed (run with -s)."""
    spacing_us, calls = 100, 4000
    folder = tmp_path / how
    copy = fresh_copy(lib, folder)
    if how == "dlopen":
        argv = [dlopen_prog, copy, calls, 0, spacing_us]
    else:
        argv = [folder / "late_calls", calls, 0, spacing_us]
        shutil.copy(linked_prog, argv[0])
    done = run(argv)
    [(seen, held)] = counts(monitor, done["pid"])
    missed = calls - seen
    assert 0 < seen <= calls
    # The allocations counted are the last ones (sizes k+1..calls): none missed after the
    # first counted. (Their probes go on a few ms apart from the launches': one program at
    # a time.)
    tails = {sum(range(k + 1, calls + 1)): k for k in range(calls)}
    assert held in tails
    [(_, _, ms, why)] = late_of(monitor, folder)
    print("\n%s: %d of %d launches, %d allocations (one each every %d us from %.1f ms after "
          "the runtime was at hand) before the probes were on: a window of ~%.1f ms; probes "
          "on %.1f ms after the notice (%s)"
          % (how, missed, calls, tails[held], spacing_us, (done["first"] - done["start"]) / 1e6,
             missed * spacing_us / 1000, ms, why))
    assert missed * spacing_us < 250_000  # (a loaded 2-core machine: normally ~10-30 ms)


def test_notices_the_full_ring_could_not_take_are_counted_and_the_watch_goes_on(
        monitor, dlopen_prog, lib, tmp_path):
    """The notices' reader held up while programs exec: the notices its ring cannot take are
    counted (events lost, cause notice_ring_full); once it reads again it scans every
    process, and a runtime dlopen'ed after that is probed as before."""
    gate = threading.Event()
    note = monitor.watch.late.note

    def held_up(frames):
        gate.wait(60)
        note(frames)

    monitor.watch.late.note = held_up
    try:
        room = system_watch.NOTICE_RING_SIZE // 160  # (a notice: 8-byte header, 152 bytes)
        for _ in range(room // 2 + 200):  # (two notices each: its exec's and its loader's)
            subprocess.run(["/bin/true"], check=True)
    finally:
        gate.set()
    settle(monitor)
    samples = parse_metrics(prometheus.render(monitor.collect()).decode())
    assert value(samples, "ebpf_cuda_events_lost_total", cause="notice_ring_full") > 0
    copy = fresh_copy(lib, tmp_path / "after")
    done = run([dlopen_prog, copy, CALLS, PAUSE_MS, 0, 300])
    assert counts(monitor, done["pid"]) == [exact(CALLS)]


def test_examined_files_are_bounded_oldest_first():
    seen = late_files.Examined(limit=3)
    for key in [(b"fd:01", b"%d" % i, b"/x") for i in range(5)]:
        seen.add(key)
    assert len(seen) == 3
    assert (b"fd:01", b"0", b"/x") not in seen and (b"fd:01", b"1", b"/x") not in seen
    assert all((b"fd:01", b"%d" % i, b"/x") in seen for i in (2, 3, 4))
    assert (b"fd:01", b"2", b"/x") in seen  # (met again: the least recently met is now 3)
    seen.add((b"fd:01", b"5", b"/x"))
    assert (b"fd:01", b"3", b"/x") not in seen and (b"fd:01", b"2", b"/x") in seen
    # new_mappings takes it as its set: a file met once is not returned again
    lines = [b"7f0000000000-7f0000001000 r-xp 00000000 fd:01 42 /opt/x/libcudart.so.12\n"]
    assert len(late_files.new_mappings(1, ["runtime"], seen, lines)) == 1
    assert late_files.new_mappings(1, ["runtime"], seen, lines) == []


def test_an_inode_reused_at_another_path_is_looked_at_again():
    """ext4 gives a deleted file's inode to the next new file: a library installed after
    another file was deleted can come with an inode met before, under its own path."""
    seen = late_files.Examined()
    line = b"7f0000000000-7f0000001000 r-xp 00000000 fd:01 42 %s\n"
    assert len(late_files.new_mappings(1, ["runtime"], seen, [line % b"/tmp/a/libx.so"])) == 1
    [(m, named)] = late_files.new_mappings(1, ["runtime"], seen,
                                             [line % b"/venv/lib/libcudart.so.12"])
    assert (m.path, m.inode, named) == ("/venv/lib/libcudart.so.12", 42, True)
    seen.add((b"fd:01", b"43", b"/y"))
    seen.discard((b"fd:01", b"42"))  # (detached: under every path it was met at)
    assert len(seen) == 1 and (b"fd:01", b"43", b"/y") in seen
    assert len(late_files.new_mappings(1, ["runtime"], seen, [line % b"/tmp/a/libx.so"])) == 1


def test_the_cli_without_p_probes_a_later_runtime_and_says_so_with_v(root, dlopen_prog, lib,
                                                                      tmp_path):
    """`ebpf-cuda monitor -v` (host-wide): the late file, the process and why are said on
    stderr, and the process's launches are on /metrics."""
    from monitor_support import MonitorCli, scrape

    cli = MonitorCli("-v", "--prometheus", ":0", timeout=120)
    try:
        port = cli.metrics_port
        copy = fresh_copy(lib, tmp_path / "wheel" / "lib")
        done = run([dlopen_prog, copy, CALLS, PAUSE_MS, 0, 300])
        line = cli.wait_for("probed late: %s " % copy)
        assert "mapped by process %d" % done["pid"] in line
        assert late_loads.WHY_LOADER in line
        deadline = time.monotonic() + 30
        while True:  # (the series published are at most one tick old)
            launches = value(parse_metrics(scrape(port)[1]), LAUNCHES, pid=str(done["pid"]))
            if launches >= CALLS or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert launches == CALLS
    finally:
        assert cli.stop() == 0


def test_a_renamed_runtime_a_process_mapped_before_the_start_is_probed(root, dlopen_prog,
                                                                       lib, tmp_path):
    """A runtime under a name the start-up search does not look for (a framework's private
    copy, libcudart-1a2b3c4d.so.12), mapped by a process running when the monitor starts:
    found in its mappings at the start, and its later calls counted."""
    from ebpf_cuda.monitor.agent import Monitor, MonitorOptions
    from ebpf_cuda.monitor.cuda_files import cuda_files

    copy = fresh_copy(lib, tmp_path / "torch" / "lib", "libcudart-1a2b3c4d.so.12")
    proc = subprocess.Popen([str(dlopen_prog), str(copy), str(CALLS), "-1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("start ")  # (mapped: held until a line)
        assert str(copy) not in cuda_files()
        lines = []
        monitor = Monitor(MonitorOptions(paths=(str(lib),), late=True), log=lines.append)
        monitor.add_exporter("")  # (the test collects as one, from the start)
        monitor.start()
        reader = threading.Thread(target=monitor.run, daemon=True)
        reader.start()
        try:
            assert str(copy) in monitor.files
            assert [l for l in lines if l.startswith("probed: %s (" % copy)
                    and l.endswith("mapped by process %d" % proc.pid)], lines
            out, _ = proc.communicate("\n", timeout=60)
            assert proc.returncode == 0, out
            assert counts(monitor, proc.pid) == [exact(CALLS)]
            assert late_of(monitor, tmp_path) == []  # (not late: there at the start)
        finally:
            monitor.stop()
            reader.join(10)
            monitor.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
