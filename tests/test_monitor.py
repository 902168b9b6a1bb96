"""`ebpf-cuda monitor` with real probes: stand-in processes started before and after the
monitor (also in a container-like mount namespace) make known calls, and the metrics say
exactly those counts, bytes, errors and launches; exited processes' series go once seen."""
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

from ebpf_cuda.bpf import features, uprobe
from ebpf_cuda.spec import layout
from ebpf_cuda.monitor import prometheus
from ebpf_cuda.spec.apis import BY_NAME, FN_ID
from ebpf_cuda.monitor.agent import DEFAULT_SAMPLE_RETURNS, TICK_S, Monitor, MonitorOptions
from ebpf_cuda.monitor.cuda_files import cuda_files
from ebpf_cuda.monitor.metrics import histogram
from ebpf_cuda.monitor.processes import OTHER_KERNEL, Process
from helpers import run_cli
from kernel_fds import bpf_link_types
from monitor_support import (AFTER, BEFORE, KERNEL, Held, MonitorCli, parse_metrics,
                             running_monitor, scrape, settle, value)

pytestmark = pytest.mark.kernel



def check_totals(samples, sampled: bool = False) -> None:
    """The counts both processes make together (see BEFORE and AFTER). `sampled`: the launch
    rows' returns were sampled (uprobe sessions): the one failed launch's error is seen
    only if its return was taken."""
    calls = "ebpf_cuda_api_calls_total"
    assert value(samples, calls, api="cudaMalloc", layer="runtime") == 51
    assert value(samples, calls, api="cudaSetDevice") == 3
    assert value(samples, calls, api="cudaMemcpy") == 4
    assert value(samples, calls, api="cudaLaunchKernel") == 9
    errors = "ebpf_cuda_api_errors_total"
    assert value(samples, errors, api="cudaMalloc", error="cudaErrorMemoryAllocation") == 1
    assert value(samples, errors, api="cudaSetDevice", error="cudaErrorInvalidDevice") == 1
    launch_errors = value(samples, errors, api="cudaLaunchKernel",
                          error="cudaErrorInvalidConfiguration")
    assert launch_errors == 1 or (sampled and launch_errors == 0)
    assert value(samples, errors) == 2 + launch_errors
    timed = value(samples, "ebpf_cuda_api_duration_seconds_count", api="cudaLaunchKernel")
    assert timed == 9 or (sampled and launch_errors <= timed < 9)
    sampling = value(samples, "ebpf_cuda_api_return_sampling", api="cudaLaunchKernel")
    assert sampling == (DEFAULT_SAMPLE_RETURNS if sampled else 0)
    copies = "ebpf_cuda_memcpy_bytes_total"
    assert value(samples, copies, kind="HostToDevice") == 2000
    assert value(samples, copies, kind="DeviceToHost") == 300
    assert value(samples, copies, kind="DeviceToDevice") == 50
    assert value(samples, "ebpf_cuda_memset_bytes_total", api="cudaMemset") == 64
    assert value(samples, "ebpf_cuda_alloc_bytes_total", api="cudaMalloc") == 40 * 4096 + 1000
    histogram = "ebpf_cuda_api_duration_seconds"
    assert value(samples, histogram + "_count", api="cudaMalloc") == 51
    assert value(samples, histogram + "_bucket", api="cudaMalloc", le="+Inf") == 51
    assert 0 < value(samples, histogram + "_sum", api="cudaMalloc") < 1
    assert value(samples, "ebpf_cuda_events_lost_total") == 0


def check_per_process(samples, before: int, after: int, sampled: bool) -> None:
    """The calls, errors and API time of each process (BEFORE's and AFTER's)."""
    calls, errors = "ebpf_cuda_process_api_calls_total", "ebpf_cuda_process_api_errors_total"
    seconds = "ebpf_cuda_process_api_seconds_total"
    for pid, mallocs, malloc_errors, setdevices, setdevice_errors, launches in (
            (before, 40, 0, 2, 1, 5), (after, 11, 1, 1, 0, 4)):
        mine = dict(pid=str(pid), comm="cuda_driver_pro")
        assert value(samples, calls, api="cudaMalloc", layer="runtime", **mine) == mallocs
        assert value(samples, errors, api="cudaMalloc", **mine) == malloc_errors
        assert value(samples, calls, api="cudaSetDevice", **mine) == setdevices
        assert value(samples, errors, api="cudaSetDevice", **mine) == setdevice_errors
        assert value(samples, calls, api="cudaLaunchKernel", **mine) == launches
        assert 0 < value(samples, seconds, api="cudaMalloc", **mine) < 1
        has_launch_errors = any(name == errors and ("api", "cudaLaunchKernel") in labels
                                and ("pid", str(pid)) in labels for name, labels in samples)
        assert has_launch_errors == (not sampled)  # (sampled returns are not by process)
    if not sampled:
        assert value(samples, errors, api="cudaLaunchKernel", pid=str(after)) == 1
    assert value(samples, calls) == value(samples, "ebpf_cuda_api_calls_total")


@pytest.mark.parametrize("sampling", [1, DEFAULT_SAMPLE_RETURNS])
def test_counts_of_processes_started_before_and_after_it(prog, lib, sampling):
    """Every return taken (1), and the default: launch returns sampled where the kernel has
    uprobe sessions (launches then counted at entry: AFTER's failed one too)."""
    sampled = sampling > 1 and features.session_is_return_id() is not None
    before = Held(prog, BEFORE)
    try:
        with running_monitor(paths=(str(lib),), sample_returns=sampling) as monitor:
            before.go()
            after = Held(prog, AFTER).go()
            assert [c.ret for c in before.wait()][-1] == 0
            after.wait()
            settle(monitor)
            samples = parse_metrics(prometheus.render(monitor.collect()).decode())
            check_totals(samples, sampled)
            launches = "ebpf_cuda_kernel_launches_total"
            assert value(samples, launches, pid=str(before.pid), kernel=KERNEL,
                         comm="cuda_driver_pro", api="cudaLaunchKernel", layer="runtime") == 5
            assert value(samples, launches, pid=str(after.pid), kernel=KERNEL) == 3 + sampled
            assert value(samples, launches) == 8 + sampled
            check_per_process(samples, before.pid, after.pid, sampled)
    finally:
        before.kill()


def test_an_exited_process_stays_until_collected_then_its_state_goes(prog, lib):
    with running_monitor(paths=(str(lib),)) as monitor:
        held = Held(prog, ["setdevice:0", "sleep:300", "loop:7:launch:4,1,1:256,1,1"]).go()
        held.wait()
        settle(monitor)  # the reader has seen the exit
        first = parse_metrics(prometheus.render(monitor.collect()).decode())
        assert value(first, "ebpf_cuda_kernel_launches_total", pid=str(held.pid)) == 7
        assert value(first, "ebpf_cuda_processes") == 0
        settle(monitor)  # a collect saw its last values: the next tick lets it go
        second = parse_metrics(prometheus.render(monitor.collect()).decode())
        assert value(first, "ebpf_cuda_process_api_calls_total", pid=str(held.pid)) == 8
        assert value(second, "ebpf_cuda_kernel_launches_total", pid=str(held.pid)) == 0
        assert value(second, "ebpf_cuda_process_api_calls_total", pid=str(held.pid)) == 0
        assert value(second, "ebpf_cuda_api_calls_total", api="cudaLaunchKernel") == 7
        assert held.pid not in _pids_with_sums(monitor)
        assert held.pid not in monitor.processes
        keys = [struct.unpack_from("<I", key)[0]
                for key in monitor.tracer.session.maps[layout.LAUNCHES].keys()]
        assert held.pid not in keys
        names = monitor.tracer.names
        assert not [k for k in names._found if k[0] == held.pid]
        assert held.pid not in names.resolver._maps
        assert monitor.launch_totals() == {("cuda_driver_pro", "cudaLaunchKernel", KERNEL): 7}


def _pids_with_sums(monitor) -> set:
    """The processes holding sums by process in the kernel: an entry of `proc_calls` or a
    process slot (layout.PROCESS_OWNERS, where the kernel has task storage)."""
    calls = monitor.tracer.session.maps[layout.PROCESS_CALLS]
    pids = {layout.PROCESS_KEY.unpack(k)[0] for k in calls.keys()}
    if layout.PROCESS_OWNERS in monitor.tracer.session.maps:
        pids |= {pid for _, pid in monitor.sums._process_slots.owned()}
    return pids


def _calls_of(monitor, pid: int, exporter: str) -> float:
    """cudaMalloc calls of process `pid` on a page `exporter` collects now."""
    samples = parse_metrics(prometheus.render(monitor.collect(exporter)).decode())
    return value(samples, "ebpf_cuda_process_api_calls_total", pid=str(pid), api="cudaMalloc")


@pytest.fixture
def ticked(prog, lib):
    """(monitor ticked by hand, with exporters "a" and "b"; the pid of a process that made
    3 cudaMalloc calls and exited, known from the first tick on)."""
    monitor = Monitor(MonitorOptions(paths=(str(lib),), late=False))
    monitor.add_exporter("a")
    monitor.add_exporter("b")
    monitor.start()
    try:
        held = Held(prog, ["setdevice:0", "loop:3:malloc:64"]).go()
        held.wait()
        monitor.tick()  # (the process learnt from the kernel's map; its exit not noted yet)
        assert held.pid in monitor.processes
        yield monitor, held.pid
    finally:
        monitor.close()


def test_a_scrape_during_the_tick_that_notes_an_exit_does_not_let_the_process_go(ticked):
    """A collect that lands while the tick noting the exit computes its series gets the
    series before: the process's series stay until each exporter has collected a later
    one, however many collects the other exporter makes."""
    monitor, pid = ticked
    compute = monitor._launch_series
    during = []

    def scraped_meanwhile(final=False):
        during.append(_calls_of(monitor, pid, "a"))
        return compute(final)

    monitor._launch_series = scraped_meanwhile
    monitor.tick()  # (notes the exit; "a" collects the series before it meanwhile)
    monitor._launch_series = compute
    assert during == [3] and monitor.processes[pid].exited is not None
    for _ in range(3):  # ("b" has collected nothing since its exit)
        monitor.tick()
        assert _calls_of(monitor, pid, "a") == 3
    assert _calls_of(monitor, pid, "b") == 3
    monitor.tick()  # (both have collected its last values: it goes)
    assert pid not in monitor.processes
    assert _calls_of(monitor, pid, "a") == 0 and _calls_of(monitor, pid, "b") == 0
    assert pid not in _pids_with_sums(monitor)


def test_launches_held_back_a_tick_at_the_exit_are_collected_before_the_process_goes(
        prog, lib):
    """The tick that notes the exit first sees the process's launches and holds them back
    (their kernel's name not read yet): its end is in the next series, which an exporter
    must collect before the process goes."""
    monitor = Monitor(MonitorOptions(paths=(str(lib),), late=False))
    monitor.add_exporter("a")
    monitor.start()
    try:
        held = Held(prog, ["setdevice:0", "sleep:1500", "loop:3:launch:4,1,1:256,1,1"]).go()
        time.sleep(0.5)
        monitor.tick()  # (known and alive: its first call counted by process)
        held.wait()
        monitor.tick()  # (its exit noted; its launches held back, names unknown)
        assert monitor.processes[held.pid].waiting

        def launches() -> float:
            samples = parse_metrics(prometheus.render(monitor.collect("a")).decode())
            return value(samples, "ebpf_cuda_kernel_launches_total", pid=str(held.pid))

        assert launches() == 0
        monitor.tick()  # (published now)
        monitor.tick()  # ("a" has not collected them: the process stays)
        assert launches() == 3
        monitor.tick()
        assert held.pid not in monitor.processes
    finally:
        monitor.close()


def test_without_exporters_an_exited_process_goes_once_its_end_is_published(prog, lib):
    """(a monitor with only a profile or a flight recorder: no process is kept for ever,
    and the launches of processes gone free the kernel's maps and stay in the totals)"""
    monitor = Monitor(MonitorOptions(paths=(str(lib),), late=False)).start()
    try:
        held = Held(prog, ["setdevice:0", "loop:4:launch:4,1,1:256,1,1"]).go()
        held.wait()
        monitor.tick()  # (learnt)
        monitor.tick()  # (its exit noted, its end published)
        assert monitor.processes[held.pid].exited is not None
        monitor.tick()
        assert held.pid not in monitor.processes
        assert sum(monitor.launch_totals().values()) == 4
    finally:
        monitor.close()


def test_an_exporter_that_never_collects_holds_an_exited_process_hold_s_at_most(
        ticked, monkeypatch):
    from ebpf_cuda.monitor import agent as module

    monitor, pid = ticked
    monitor.tick()  # (its exit noted)
    _calls_of(monitor, pid, "a")
    monitor.tick()
    assert pid in monitor.processes  # ("b" has not collected)
    monkeypatch.setattr(module, "HOLD_S", 0.0)
    monitor.tick()
    assert pid not in monitor.processes


def test_a_process_is_labelled_with_its_own_name_not_its_calling_thread_s(lib):
    """The first call comes from a thread named otherwise (a data loader's, say)."""
    script = """import ctypes, sys, threading
lib, libc = ctypes.CDLL(sys.argv[1]), ctypes.CDLL(None)
def call():
    libc.prctl(15, b"data-loader-7", 0, 0, 0)  # PR_SET_NAME
    lib.cudaMalloc(ctypes.byref(ctypes.c_void_p()), ctypes.c_size_t(64))
thread = threading.Thread(target=call)
thread.start()
thread.join()
print(open("/proc/self/comm").read().strip(), flush=True)
sys.stdin.readline()
"""
    with running_monitor(paths=(str(lib),)) as monitor:
        proc = subprocess.Popen([sys.executable, "-c", script, str(lib)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            own = proc.stdout.readline().strip()
            settle(monitor)
            samples = parse_metrics(prometheus.render(monitor.collect()).decode())
        finally:
            proc.communicate("\n", timeout=30)
    assert own and own != "data-loader-7"
    assert value(samples, "ebpf_cuda_process_api_calls_total", pid=str(proc.pid),
                 comm=own, api="cudaMalloc") == 1
    assert value(samples, "ebpf_cuda_process_api_calls_total", comm="data-loader-7") == 0


@pytest.fixture(scope="module")
def driver(cc):
    """(stand-in libcuda.so.1, cu_driver_prog)."""
    from fakecuda_driver import build_fake_driver

    return build_fake_driver(cc)


def test_launches_of_a_function_from_cukernelgetfunction_are_named(driver):
    """cuKernelGetFunction's records do not wake the reader (the runtime calls it again
    and again): processes of a few milliseconds that launch right after it, and exit, still
    have every launch named."""
    lib, cu_prog = driver
    ops = ["init", "libraryload", "getkernel:lib_kernel", "kernelfunction", "kernelfunction",
           *["launch:1:32:0:0:@%d" % (n % 2) for n in range(6)]]
    with running_monitor(paths=(str(lib),)) as monitor:
        session = monitor.tracer.session
        assert not session.probe_options(BY_NAME["cuKernelGetFunction"]).wake_now
        assert session.probe_options(BY_NAME["cuLibraryGetKernel"]).wake_now
        runs = [subprocess.Popen([str(cu_prog), *ops], stdout=subprocess.DEVNULL)
                for _ in range(6)]
        assert [run.wait() for run in runs] == [0] * 6
        settle(monitor)
        samples = parse_metrics(prometheus.render(monitor.collect()).decode())
    launches = "ebpf_cuda_kernel_launches_total"
    for run in runs:
        assert value(samples, launches, pid=str(run.pid), kernel="lib_kernel") == 6
    assert value(samples, launches, kernel="lib_kernel") == 36
    assert value(samples, launches) == 36  # (none unnamed)
    assert value(samples, "ebpf_cuda_api_calls_total", api="cuKernelGetFunction") == 12


def test_a_launch_counted_before_its_teaching_record_is_read_waits_for_its_name(driver):
    """A tick that finds launches whose name is not known yet (here: the reader has not
    read the ring at all) holds them back one tick instead of labelling them unnamed for
    good; once the records are read they are published under their name."""
    from ebpf_cuda.monitor.agent import Monitor

    lib, cu_prog = driver
    ops = ["init", "libraryload", "getkernel:lib_kernel", "kernelfunction",
           "launch:1:32:0:0:@0", "launch:1:32:0:0:@0", "launch:1:32:0:0:@0"]
    monitor = Monitor(MonitorOptions(paths=(str(lib),), late=False)).start()
    try:
        run = subprocess.run([str(cu_prog), *ops], stdout=subprocess.DEVNULL, check=True)
        monitor.tick()  # (nothing read from the ring yet)
        launches = "ebpf_cuda_kernel_launches_total"
        first = parse_metrics(prometheus.render(monitor.collect()).decode())
        assert value(first, launches) == 0
        assert value(first, "ebpf_cuda_events_lost_total", cause="launch_map_full") == 0
        reader = threading.Thread(target=monitor.run, daemon=True)
        reader.start()
        settle(monitor)
        samples = parse_metrics(prometheus.render(monitor.collect()).decode())
        monitor.stop()
        reader.join(30)
    finally:
        monitor.close()
    assert run.returncode == 0
    assert value(samples, launches, kernel="lib_kernel") == 3
    assert value(samples, launches) == 3  # (none unnamed)


def test_launches_the_full_map_could_not_take_are_counted_as_lost(prog, lib):
    with running_monitor(paths=(str(lib),)) as monitor:
        maps = monitor.tracer.session.maps
        launches = maps[layout.LAUNCHES]
        # Fill the map with entries of a function not probed here (cuLaunchKernel), and
        # the launch slots (sampled returns) too: a launch finding its slot another's goes
        # to the map.
        cells = [0] * (layout.LAUNCH_KEY.size // 8 - 1)
        for n in range(launches.max_entries):
            cells[0] = n
            launches.set(layout.LAUNCH_KEY.pack(1 << 22, FN_ID["cuLaunchKernel"], *cells),
                         layout.LAUNCH_VALUE.pack(0, 0))
        if layout.LAUNCH_SLOTS in maps:
            owner = FN_ID["cuLaunchKernel"] << 32 | 1 << 22
            for index in range(layout.LAUNCH_SLOT_ENTRIES):
                maps[layout.LAUNCH_SLOTS].set(index, (owner, index + 1, 0))
        Held(prog, ["setdevice:0", "loop:6:launch:4,1,1:256,1,1"]).go().wait()
        settle(monitor)
        samples = parse_metrics(prometheus.render(monitor.collect()).decode())
        assert value(samples, "ebpf_cuda_events_lost_total", cause="launch_map_full") == 6
        assert value(samples, "ebpf_cuda_api_calls_total", api="cudaLaunchKernel") == 6


def test_calls_the_full_process_map_could_not_take_are_counted_as_lost(prog, lib):
    with running_monitor(paths=(str(lib),)) as monitor:
        maps = monitor.tracer.session.maps
        calls = maps[layout.PROCESS_CALLS]
        if layout.PROCESS_OWNERS in maps:  # (every process slot held: the map it is)
            for slot in range(maps[layout.PROCESS_OWNERS].max_entries):
                maps[layout.PROCESS_OWNERS].set(slot, (1 << 23) + slot)
        # Fill the map with entries of a function not probed here (cuMemAlloc_v2).
        index = FN_ID["cuMemAlloc_v2"] * layout.KIND_SLOTS
        for n in range(calls.max_entries):
            calls.set(layout.PROCESS_KEY.pack((1 << 22) + n, index),
                      layout.PROCESS_VALUE.pack(0, 0, 0))
        Held(prog, ["setdevice:0", "loop:5:malloc:64"]).go().wait()
        settle(monitor)
        samples = parse_metrics(prometheus.render(monitor.collect()).decode())
        assert value(samples, "ebpf_cuda_events_lost_total", cause="process_map_full") == 6
        assert value(samples, "ebpf_cuda_api_calls_total", api="cudaMalloc") == 5


def test_kernel_labels_are_given_once_per_process_and_bounded():
    class Namer:
        known = {1: "a", 2: "b", 3: "c", 4: "a"}

        def name_for(self, pid, api, func):
            return self.known.get(func)

    monitor = Monitor(MonitorOptions(kernel_labels=2))
    monitor.tracer = type("T", (), {"names": Namer()})()
    process = Process(os.getpid(), "app")
    labels = [monitor._kernel_label(process, 3, func) for func in (1, 2, 3, 4, 5, 3, 1, 5)]
    # a and b get labels, c does not (two already), func 4 is kernel a again, 5 has no name:
    # it waits a tick (None), then is unnamed
    assert labels == ["a", "b", OTHER_KERNEL, "a", None, OTHER_KERNEL, "a", "unnamed"]
    assert monitor._kernel_label(process, 3, 6) is None  # (then a name is learned meanwhile)
    Namer.known[6] = "b"
    assert monitor._kernel_label(process, 3, 6) == "b" and not process.waiting
    assert monitor._kernel_label(process, 3, 7, wait=False) == "unnamed"  # (the last tick)
    none = Monitor(MonitorOptions(kernel_labels=0))
    none.tracer = monitor.tracer
    assert {none._kernel_label(Process(1, "x"), 3, f) for f in (1, 5)} == {OTHER_KERNEL}


def test_per_cpu_words_are_summed_lane_by_lane():
    """An `agg` value's u64 words summed over CPUs (each CPU's words added as one integer):
    the same as adding word by word, also with words near 2^63."""
    import random

    from ebpf_cuda.decode.aggregates import per_cpu_total

    rng = random.Random(7)
    words = layout.AGG_VALUE.size // 8
    for cpus in (1, 2, 16, 64):
        rows = [[rng.choice((0, 1, rng.randrange(1 << 40), (1 << 63) // cpus - 1))
                 for _ in range(words)] for _ in range(cpus)]
        raw = b"".join(struct.pack("<%dQ" % words, *row) for row in rows)
        assert per_cpu_total(raw) == [sum(column) for column in zip(*rows)]


@pytest.mark.kernel
def test_the_aggregate_reader_sums_called_functions_and_skips_the_rest(root):
    """FunctionReader on a real per-CPU `agg` map: a function called on every CPU comes
    back summed over them; one never called (all zero) is left out; so is one whose only
    non-zero word is not its count (nothing to report)."""
    from ebpf_cuda.spec.apis import TABLE
    from ebpf_cuda.bpf.maps import PerCpuArrayMap, possible_cpus
    from ebpf_cuda.decode.aggregates import FunctionReader

    words = layout.AGG_VALUE.size // 8
    called, idle, odd = FN_ID["cudaMalloc"], FN_ID["cudaFree"], FN_ID["cudaMemset"]
    with PerCpuArrayMap(layout.AGG_VALUE.size, len(TABLE) * layout.KIND_SLOTS,
                        name="agg") as agg:
        cpus = possible_cpus()
        rows = [[cpu + 1, 100 * (cpu + 1)] + [0] * (words - 2) for cpu in range(cpus)]
        agg.set(called * layout.KIND_SLOTS,
                [struct.pack("<%dQ" % words, *row) for row in rows])
        only_time = [0, 5] + [0] * (words - 2)
        agg.set(odd * layout.KIND_SLOTS, struct.pack("<%dQ" % words, *only_time))
        found = FunctionReader(agg, [called, idle, odd]).read()
    assert [(t.api.name, t.count, t.total_ns) for t in found] == [
        ("cudaMalloc", cpus * (cpus + 1) // 2, 100 * cpus * (cpus + 1) // 2)]


def test_histogram_buckets_are_cumulative_at_powers_of_two():
    buckets = [0] * 40
    buckets[7], buckets[8], buckets[20], buckets[39] = 1, 2, 3, 4  # 2^7 ns, 2^8 ns, ...
    h = histogram(buckets, 12345, 10)
    assert h.bounds[0] == 256e-9 and h.bounds[-1] == (1 << 35) / 1e9
    assert h.cumulative[0] == 1  # durations below 256 ns: bucket 7
    assert h.cumulative[1] == 3  # below 512 ns
    assert h.cumulative[h.bounds.index((1 << 21) / 1e9)] == 6
    assert h.cumulative[-1] == 6 and h.count == 10  # the 4 slowest only in +Inf
    assert h.sum == 12345e-9


# -- discovery: every file, whatever the mount namespace ----------------------------------

def namespaced(folder, lib) -> list:
    """A command prefix: a private mount namespace where `folder` is a tmpfs holding a copy
    of `lib` (a path no other namespace sees), found first by the loader."""
    script = ('mount -t tmpfs none "%s" && cp "%s" "%s/" && LD_LIBRARY_PATH="%s" '
              'exec "$0" "$@"' % (folder, lib, folder, folder))
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]


@pytest.fixture
def container(tmp_path, lib, prog):
    """A stand-in in its own mount namespace (held), and the path of its copy of the
    runtime as reached from here."""
    folder = tmp_path / "container-lib"
    folder.mkdir()
    held = Held(prog, ["setdevice:0", "sleep:300", "loop:5:launch:4,1,1:256,1,1",
                       "sleep:300"], prefix=namespaced(folder, lib))
    yield held, "/proc/%d/root%s/libcudart.so.12" % (held.pid, folder)
    held.kill()


def test_files_mapped_in_another_mount_namespace_are_found_once(container, lib, prog):
    held, copy = container
    assert not os.path.exists(os.path.join(os.path.dirname(copy.split("/root", 1)[1]),
                                           "libcudart.so.12"))  # not visible here
    host = Held(prog, ["setdevice:0"])
    try:
        found = cuda_files()
    finally:
        host.go().wait()
    inodes = [(os.stat(p).st_dev, os.stat(p).st_ino) for p in found]
    assert len(inodes) == len(set(inodes))
    assert (os.stat(copy).st_dev, os.stat(copy).st_ino) in inodes
    assert (os.stat(lib).st_dev, os.stat(lib).st_ino) in inodes


def test_processes_in_a_container_are_counted_also_those_started_later(container, prog,
                                                                      tmp_path):
    """Host-wide discovery (no -p): the namespace's own copy of the runtime is found through
    the process that maps it; one started later in that namespace is counted too. Other
    programs on this machine may use the other runtimes found, so only the per-process
    launch counts are checked."""
    held, copy = container
    probed = probed_path(copy)
    if not os.path.exists(probed):
        pytest.skip("targets.py makes %s the real path %s, which does not exist in this "
                    "mount namespace: no probe can go there" % (copy, probed))
    folder = copy.split("/root", 1)[1].rsplit("/", 1)[0]
    with cgroup_of_a_container(held.pid) as container_id:
        with running_monitor() as monitor:
            assert os.path.realpath(copy) in [os.path.realpath(p) for p in monitor.files]
            held.go()
            later = Held(prog, ["setdevice:0", "sleep:300", "loop:3:launch:2,1,1:32,1,1",
                                "sleep:300"],
                         prefix=["nsenter", "-t", str(held.pid), "-m", "--", "env",
                                 "LD_LIBRARY_PATH=" + folder]).go()
            held.wait()
            later.wait()
            settle(monitor)
            samples = parse_metrics(prometheus.render(monitor.collect()).decode())
    launches = "ebpf_cuda_kernel_launches_total"
    assert value(samples, launches, pid=str(held.pid), kernel=KERNEL) == 5
    assert value(samples, launches, pid=str(later.pid), kernel=KERNEL) == 3
    if container_id:
        assert value(samples, launches, pid=str(held.pid), container=container_id[:12]) == 5


def probed_path(path: str) -> str:
    """The path a probe of `path` is attached at."""
    from ebpf_cuda.spec.apis import select
    from ebpf_cuda.targets.selection import find_targets

    return find_targets(select(), [path], None, (), lambda message: None)[0].path


class cgroup_of_a_container:
    """Move a process into a cgroup named as a container runtime names them (docker-<64
    hex>.scope), where a writable cgroup hierarchy allows; gives the id (or None)."""

    ID = "c0ffee" * 10 + "abcd"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.path = None

    def __enter__(self):
        for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
            path = os.path.join(root, "docker-%s.scope" % self.ID)
            try:
                os.mkdir(path)
            except OSError:
                continue
            try:
                with open(os.path.join(path, "cgroup.procs"), "w") as f:
                    f.write(str(self.pid))
            except OSError:
                os.rmdir(path)
                continue
            self.path = path
            return self.ID
        return None

    def __exit__(self, *exc) -> None:
        if self.path is None:
            return
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except OSError:  # (its process is still exiting)
                time.sleep(0.05)


# -- the command line ------------------------------------------------------------------------

def test_cli_serves_the_page_and_stops_cleanly(prog, lib):
    cli = MonitorCli("-p", lib, "--prometheus", "127.0.0.1:0")
    try:
        port = cli.metrics_port
        # the links of the path this kernel takes (6.1: perf-event links; no links by ioctl)
        path = uprobe.attach_path()
        types = bpf_link_types(cli.proc.pid)
        if path == uprobe.PERF_IOCTL:
            assert types == []
        else:
            assert {uprobe.UPROBE_MULTI: "uprobe_multi", uprobe.PERF_LINK: "perf"}[path] in types
        Held(prog, ["setdevice:0", "loop:12:malloc:64"]).go().wait()
        time.sleep(2 * TICK_S + 0.2)  # (the page shows what the reader's last tick read)
        content_type, page = scrape(port)
        assert content_type == prometheus.CONTENT_TYPE
        assert value(parse_metrics(page), "ebpf_cuda_api_calls_total", api="cudaMalloc") == 12
        started = time.monotonic()
    finally:
        status = cli.stop(signal.SIGTERM)
    assert status == 0, cli.lines
    assert time.monotonic() - started < 15
    assert cli.lines[-1].startswith("ebpf-cuda: stopped: ")
    assert not any("Traceback" in line for line in cli.lines)


def test_cli_a_stop_signal_while_starting_unwinds(lib):
    cli = MonitorCli("-p", lib, "-v", ready="probing")
    status = cli.stop(signal.SIGINT)
    assert status in (0, 128 + signal.SIGINT), cli.lines  # (it may have been running already)
    assert not any("Traceback" in line for line in cli.lines)


@pytest.mark.parametrize("args, words", [
    (["--prometheus", "localhost"], "--prometheus takes HOST:PORT"),
    (["--prometheus", "127.0.0.1:99999"], "--prometheus takes HOST:PORT"),
    (["--flight-recorder", "-1"], "positive number of seconds"),
    (["--flight-recorder", "1", "--trigger-error", "cudaErrorNoSuchThing"], "no error family"),
    (["--otlp", "ftp://collector"], "--otlp takes an http://"),
    (["--interval", "0"], "positive number of seconds"),
    (["--kernel-labels", "-1"], "--kernel-labels"),
    (["--flight-recorder", "5", "--flight-dir", "/nonexistent"], "is not a folder"),
    (["--pprof-out", "/nonexistent/p.pb.gz"], "cannot write /nonexistent/p.pb.gz"),
    (["--interval", "nan"], "positive number of seconds"),
    (["--interval", "1e10"], "up to a year"),
    (["--flight-recorder", "inf"], "positive number of seconds"),
    (["--flight-recorder", "nan"], "positive number of seconds"),
    (["--flight-recorder", "5", "--trigger-latency", "inf"], "positive number of seconds"),
    (["--flight-recorder", "5", "--flight-size", "0"], "--flight-size takes at least 1M"),
    (["--prometheus", ":\u00b2"], "--prometheus takes HOST:PORT"),
    (["--otlp", "http://localhost:abc"], "is no URL"),
    (["--otlp", "http://[::1"], "is no URL"),
    (["--return-sampling", str(1 << 65)], "--return-sampling"),
    (["--gpu-samples", "-1"], "--gpu-samples takes 0 (off) to 1000 samples a second"),
    (["--gpu-samples", "nan"], "--gpu-samples takes 0 (off) to 1000 samples a second"),
])
def test_cli_bad_options_are_one_line_and_exit_2(lib, args, words):
    done = run_cli("monitor", "-p", lib, *args)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr


def test_cli_a_file_without_cuda_is_exit_10(prog):
    done = run_cli("monitor", "-p", prog)  # (it calls the runtime, defines none of it)
    assert done.returncode == 10, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_cli_a_port_in_use_is_exit_2(lib):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = run_cli("monitor", "-p", lib, "--prometheus",
                       "127.0.0.1:%d" % taken.getsockname()[1])
    assert done.returncode == 2, done.stderr
    assert "cannot listen on" in done.stderr and "Traceback" not in done.stderr


def _burst(monitor, prog, count: int, length: int):
    """A process registering `count` names of `length` bytes, then sleeping 4 s: (its
    pid, the names learned as {k: name} for its k-th registration, the bytes its store
    keeps, the metrics), the names read while it lives."""
    held = Held(prog, ["sleep:200", "registermany:%d:%d" % (count, length),
                       "sleep:4000"]).go()
    time.sleep(2.5)  # (its registrations made: it sleeps until 4.2 s)
    settle(monitor)
    names = monitor.tracer.names
    stored = [table for image, table in names.handles._by_image.items()
              if image & 0xFFFFFFFF == held.pid]
    assert len(stored) <= 1
    learned = {h: names.learned(held.pid, h) for h in (stored[0].handles() if stored else ())}
    kept = 0
    if stored:
        store = stored[0]
        assert len(store) == len(learned)  # (nothing else taught)
        kept = (len(store._handles) + sum(map(len, store._blocks)) + len(store._tail)
                + store._starts.itemsize * len(store._starts))
    samples = parse_metrics(prometheus.render(monitor.collect()).decode())
    (call,) = [c for c in held.wait() if c.op == "registermany"]
    stub = int(call.fields["stub"], 16)
    assert all(0 <= h - stub < count for h in learned)
    deadline = time.monotonic() + 30
    while [i for i in names.handles._by_image if i & 0xFFFFFFFF == held.pid]:
        assert time.monotonic() < deadline, "its names stayed after it exited"
        time.sleep(0.1)
    return {h - stub: name for h, name in learned.items()}, kept, samples


def test_a_framework_sized_registration_burst_is_named_and_kept_small(prog, lib):
    """PyTorch's start-up registers ~30,000 kernels of a few hundred bytes each: every
    registration reaches the namer or is counted as lost (its record, or its name, gone
    from the probes' names map when the reader came to it), the names take a few dozen
    bytes each of tracer memory, and they go with the process."""
    count, length = 30000, 200
    with running_monitor(paths=(str(lib),)) as monitor:
        learned, kept, samples = _burst(monitor, prog, count, length)
        lost = value(samples, "ebpf_cuda_events_lost_total")
        assert len(learned) + lost == count and len(learned) >= count // 2, lost
        for k in sorted(learned)[::997]:
            assert learned[k].startswith("_Z6k%08dv" % k) and len(learned[k]) == length
        assert kept < 20 * len(learned), kept  # (the names alone are 200 bytes each)


def test_the_names_map_outlasts_what_the_ring_holds():
    from ebpf_cuda.spec import record

    records = layout.DEFAULT_RING_SIZE // (record.FRAME_SIZE + 8)
    assert layout.name_entries(layout.DEFAULT_RING_SIZE) >= 2 * records
    assert layout.name_entries(64 << 10) == layout.NAME_ENTRIES
    assert layout.name_entries(1 << 30) == layout.NAME_ENTRIES_MAX


def test_names_the_names_map_let_go_are_counted(prog, lib, monkeypatch):
    """With a names map of 256 entries the reader cannot keep up with a burst of 5,000
    registrations: the names it comes to too late are counted (cause name_map_full), and
    with the records the ring could not take they make up the whole burst."""
    monkeypatch.setattr(layout, "name_entries", lambda ring_size: 256)
    count = 5000
    with running_monitor(paths=(str(lib),)) as monitor:
        learned, _, samples = _burst(monitor, prog, count, 64)
        evicted = value(samples, "ebpf_cuda_events_lost_total", cause="name_map_full")
        ring = value(samples, "ebpf_cuda_events_lost_total", cause="ring_full")
        assert evicted > 0 and len(learned) + evicted + ring == count, (learned, evicted, ring)
        assert monitor.tracer.losses().names_lost == evicted


def _rss_kib(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def test_the_memory_of_a_process_with_long_kernel_names_leaves_with_it(prog, lib):
    """30,000 names of 1,500 bytes: the monitor's resident set grows while the process
    lives; after it went (scraped, pruned, heap.trim) little more than the ring's pages,
    touched once by the burst, stays (without the trim: ~7 MB here, ~4 MB of it freed
    names the allocator kept)."""
    monitor = MonitorCli("-p", str(lib), "--prometheus", "127.0.0.1:0")
    try:
        port = monitor.metrics_port
        scrape(port)
        idle = _rss_kib(monitor.proc.pid)
        subprocess.run([str(prog), "sleep:100", "registermany:30000:1500", "sleep:300"],
                       check=True, stdout=subprocess.DEVNULL, timeout=60)
        for _ in range(4):  # (seen by a scrape, then pruned at a tick)
            time.sleep(1)
            _, text = scrape(port)
        ring_kib = 4 << 10  # (the monitor's ring, every page of it written by the burst)
        assert _rss_kib(monitor.proc.pid) - idle < ring_kib + 1536, (idle, text[-300:])
    finally:
        assert monitor.stop() == 0
