"""names.py: the one store of kernel names, fed by teaching calls and process snapshots."""
import os

from ebpf_cuda.spec import record
from ebpf_cuda.decode.events import ENTER
from ebpf_cuda.decode.names import KernelNamer
from helpers import event
from records import pack_frame


def _frames_of(pids) -> bytes:
    """A hello record of each process."""
    return b"".join(pack_frame(record.HELLO_FN, 0, exit_ts=0, phase=record.PHASE_HELLO, pid=pid,
                               comm=b"p") for pid in pids)


def test_a_teaching_call_names_its_handle_from_what_the_probe_stored():
    stored = {(7, 0x51): "_Z6vecAddPfS_"}
    names = KernelNamer(probe_names=lambda pid, handle, when: stored.get((pid, handle)))
    get = event("cuModuleGetFunction", pid=7, ret=0, outs={"function": 0x51})
    names.learn([get])
    assert get.outs["kernel_name"] == "_Z6vecAddPfS_"  # as the probe read it
    assert names.learned(7, 0x51) == "_Z6vecAddPfS_"
    assert names.name_for(7, "cuLaunchKernel", 0x51) == "vecAdd(float*, float*)"  # demangled
    assert names.name_for(8, "cuLaunchKernel", 0x51) is None  # handles are per process


def test_failed_and_entry_events_teach_nothing():
    names = KernelNamer(probe_names=lambda pid, handle, when: "k")
    failed = event("cuModuleGetFunction", ret=500, outs={"function": 0x51})
    entry = event("cuModuleGetFunction", phase=ENTER)
    names.learn([failed, entry])
    assert names.learned(4242, 0x51) is None and "kernel_name" not in failed.outs


def test_an_alias_handle_runs_the_same_kernel():
    names = KernelNamer(probe_names=lambda pid, handle, when: "lib_kernel" if handle == 0x90
                        else None)
    names.learn([event("cuLibraryGetKernel", ret=0, outs={"kernel": 0x90}),
                 event("cuKernelGetFunction", ret=0, args={"kernel": 0x90},
                       outs={"function": 0x91})])
    assert names.name_for(4242, "cuLaunchKernel", 0x91) == "lib_kernel"


def test_a_cuda13_kernel_handle_is_named_by_its_stub():
    """__cudaGetKernel ties a cudaKernel_t to the host stub's address: the launch is named
    from the symbol at that address (here, a function of this very process)."""
    import ctypes

    libc = ctypes.CDLL(None)
    address = ctypes.cast(libc.getpid, ctypes.c_void_p).value
    names = KernelNamer()
    names.learn([event("__cudaGetKernel", pid=os.getpid(), ret=0, args={"entry": address},
                       outs={"kernel": 0x7777})])
    assert names.name_for(os.getpid(), "cudaLaunchKernel", 0x7777) in ("getpid", "__getpid")


def test_annotate_shows_a_learned_name_on_events_decoded_again():
    names = KernelNamer(probe_names=lambda pid, handle, when: "vec_add")
    names.learn([event("cuModuleGetFunction", ret=0, outs={"function": 0x51})])
    again = event("cuModuleGetFunction", ret=0, outs={"function": 0x51})
    names.annotate([again])
    assert again.outs["kernel_name"] == "vec_add"


def test_found_names_are_a_read_only_view_that_sees_later_names():
    names = KernelNamer(probe_names=lambda pid, handle, when: "late")
    view = names.found_names()
    assert view.name_for(4242, "cuLaunchKernel", 0x51) is None
    names.learn([event("cuModuleGetFunction", ret=0, outs={"function": 0x51})])
    assert names.name_for(4242, "cuLaunchKernel", 0x51) == "late"
    assert view.name_for(4242, "cuLaunchKernel", 0x51) == "late"
    assert not hasattr(view, "learn")


def test_each_process_is_snapshotted_once_at_its_first_batch():
    class Resolver:
        def __init__(self):
            self.observed = []

        def observe(self, pid):
            self.observed.append(pid)

    resolver = Resolver()
    names = KernelNamer(resolver=resolver)
    for batch in ([10, 11, 10], [11, 12], [10, 11, 12]):
        names.observe_frames(_frames_of(batch))
    assert sorted(resolver.observed[:2]) == [10, 11] and resolver.observed[2:] == [12]


def test_an_exec_starts_another_image_named_by_record_time():
    """Names learned before an exec name the launches before it; those after, the launches
    after (the store asks the probes for each call's own name, by its time)."""
    execs = {7: [5000]}  # process 7 exec'd at kernel time 5000
    asked = []

    def probe_names(pid, handle, when):
        asked.append((pid, handle, when))
        return "old_k" if when < 5000 else "new_k"

    names = KernelNamer(probe_names=probe_names,
                        exec_times=lambda pid, known: execs.get(pid, [])[known:])
    names.observe_pids([7])
    names.learn([event("cuModuleGetFunction", pid=7, ts_ns=4000, ret=0,
                       outs={"function": 0x51}),
                 event("cuModuleGetFunction", pid=7, ts_ns=6000, ret=0,
                       outs={"function": 0x51})])
    assert asked == [(7, 0x51, 4000), (7, 0x51, 6000)]
    assert names.name_for(7, "cuLaunchKernel", 0x51, 4500) == "old_k"
    assert names.name_for(7, "cuLaunchKernel", 0x51, 7000) == "new_k"
    assert names.name_for(7, "cuLaunchKernel", 0x51) == "new_k"  # now: the new program
    assert names.image(7, 4500) == 7 and names.image(7, 7000) == 7 | 1 << 32
    view = names.found_names()  # the lines thread's view tells them apart the same way
    assert view.name_for(7, "cuLaunchKernel", 0x51, 4500) == "old_k"
    assert view(event("cuLaunchKernel", pid=7, ts_ns=8000), 0x51) == "new_k"
    names.forget(7)
    assert names.name_for(7, "cuLaunchKernel", 0x51, 4500) is None and not names.execs


def test_execs_seen_later_retire_the_mappings_of_the_program_before():
    class Resolver:
        def __init__(self):
            self.observed, self.forgotten, self.maps = [], [], {}

        def observe(self, pid):
            self.observed.append(pid)
            self.maps[pid] = object()

        def snapshot(self, pid):
            return None  # (nothing to freeze: the old program's launches stay unnamed)

        def forget(self, pid):
            self.forgotten.append(pid)

    execs = {9: []}
    resolver = Resolver()
    names = KernelNamer(resolver=resolver,
                        exec_times=lambda pid, known: execs.get(pid, [])[known:])
    names.observe_frames(_frames_of([9]))
    execs[9].append(100)
    names.observe_frames(_frames_of([9]))  # the exec is noted: the new program is read
    assert resolver.observed == [9, 9] and resolver.forgotten == [9]
    assert names._resolver(names.image(9, 50)) is None  # the old program's: gone
    assert names._resolver(names.image(9, 150)) is resolver


def test_mappings_read_while_an_exec_is_in_flight_wait_for_its_tracepoint(monkeypatch):
    """The kernel installs an exec's program (mappings, name) before the exec tracepoint
    runs: mappings read in that moment, with the name no longer the records', are not taken
    for the old program's; the exec's time is waited for (it arrives on the third look)."""
    import os

    from ebpf_cuda.decode import names

    looks = []

    def exec_times(pid, known):
        looks.append(known)
        return [123] if len(looks) >= 3 and known == 0 else []

    monkeypatch.setattr(names, "_comm_now", lambda pid: b"beta")
    namer = names.KernelNamer(exec_times=exec_times)
    namer._snapshot(os.getpid(), comm=b"alpha")
    assert namer.execs[os.getpid()] == [123]
    assert namer._snapshot_of[os.getpid()] == 1  # (the new program's generation)


def test_mappings_of_the_same_name_are_taken_at_once(monkeypatch):
    import os

    from ebpf_cuda.decode import names

    monkeypatch.setattr(names, "_comm_now", lambda pid: b"alpha")
    namer = names.KernelNamer(exec_times=lambda pid, known: [])
    namer._snapshot(os.getpid(), comm=b"alpha")
    assert namer._snapshot_of[os.getpid()] == 0


def test_handle_names_are_kept_per_image_and_forgotten_by_process():
    from ebpf_cuda.decode.names import HandleNames, image_of

    names = HandleNames()
    old, new, other = image_of(42, 0), image_of(42, 1), image_of(7, 0)
    names[(old, 0x10)] = "_Z3fooPf"
    names[(new, 0x10)] = "bar"
    names[(other, 0x10)] = "kernel \u00e9"  # (not ASCII: kept as UTF-8)
    names[(new, 0x10)] = "baz"  # (a handle taught again: the last name)
    assert (old, 0x10) in names and (old, 0x11) not in names and "x" not in names
    assert names[(new, 0x10)] == "baz" and names.get((other, 0x10)) == "kernel \u00e9"
    assert names.get((old, 0x11)) is None and names.get((9, 1), "d") == "d"
    assert names.get((old, None)) is None and (old, None) not in names  # (a failed call's)
    assert len(names) == 3 and sorted(names) == sorted([(old, 0x10), (new, 0x10),
                                                         (other, 0x10)])
    names.forget(42)  # (both of its images)
    assert list(names) == [(other, 0x10)]


def _pairs_brute_force(launches, table):
    """The rule `_pair` follows, by the definition: each driver launch in a runtime launch
    of its thread and process (entered no later, returned no earlier) is nested in it."""
    nested = {}
    for i, (fn, pid, tid, enter, exit_, _, _) in enumerate(launches):
        if not table[fn].driver:
            continue
        around = [(o_enter, o_func) for o_fn, o_pid, o_tid, o_enter, o_exit, o_func, _
                  in launches if not table[o_fn].driver and o_exit and o_tid == tid
                  and o_pid == pid and o_enter <= enter and exit_ <= o_exit]
        if around:
            nested[i] = max(around)[1]  # (the innermost: the latest entered)
    return nested


def test_driver_launches_pair_with_the_runtime_launch_around_them_in_any_batch():
    """Random batches: threads of two processes, runtime launches that never overlap on a
    thread, driver launches inside some of them (the runtime's own) and between them
    (cuBLAS's): `_pair` nests exactly those inside, and names their handles from the
    enclosing launch's kernel; by bisection, so a batch of 2,048 takes linear time."""
    import random

    from ebpf_cuda.spec import apis

    table = apis.TABLE
    runtime = next(i for i, api in enumerate(table) if api.name == "cudaLaunchKernel")
    driver = next(i for i, api in enumerate(table) if api.name == "cuLaunchKernel")
    rng = random.Random(36)
    for _ in range(50):
        launches, t = [], 1000
        for _ in range(rng.randint(1, 300)):
            pid = rng.choice((7, 8))
            tid = pid * 10 + rng.randint(0, 2)
            func = rng.randint(0x100, 0x1ff)
            t += rng.randint(1, 50)
            if rng.random() < 0.6:
                inner = [(driver, pid, tid, t + 5, t + 9, 0x9000 + func, 0)]
                launches += inner if rng.random() < 0.8 else []
                launches.append((runtime, pid, tid, t, t + 20, func, 0))
                t += 21
            else:
                launches.append((driver, pid, tid, t, t + 3, 0x8000 + func, 0))
                t += 4
        rng.shuffle(launches)  # (a batch holds several threads' records interleaved)
        names = KernelNamer()
        names.image = lambda pid, when: pid
        names.name_for = lambda pid, api, func, when: "kernel_%x" % func
        expected = _pairs_brute_force(launches, table)
        assert names._pair(launches, table) == set(expected)
        for i, func in expected.items():
            pid, handle = launches[i][1], launches[i][5]
            assert names.handles[(pid, handle)] == "kernel_%x" % func
