"""The monitor's launch rows on kernels with uprobe sessions (Options.sample_returns,
probes.session_program): one program runs at entry and, for 1 call in N and every call made
while its process captures, at return. Calls and launches are counted exactly at entry (a
failed launch too: its return is not seen); durations and errors come from the sampled
returns, whose count is the histogram's."""
import signal
import subprocess
import time

import pytest

from ebpf_cuda.bpf import features
from ebpf_cuda.errors import UsageError
from ebpf_cuda.tracer import Tracer
from fakecuda import build_fake_cuda
from helpers import run_cli
from monitor_support import Held, MonitorCli, parse_metrics, scrape, value

pytestmark = pytest.mark.kernel

N = 4096  # launches; sampled 1 in 64: 64 expected, 8 the standard deviation


@pytest.fixture(scope="module")
def fake(cc):
    if features.session_is_return_id() is None:
        pytest.skip("this kernel has no uprobe sessions (Linux 6.13)")
    return build_fake_cuda(cc)


def traced(fake, ops, sample=64):
    lib, prog = fake
    with Tracer(command=[str(prog), *ops], library=[str(lib)], aggregate=True, emit=False,
                sample_returns=sample) as tracer:
        records = [e for e in tracer.events() if e.phase == "exit"]
        sampled = tracer.sampled_returns()
        links = list(tracer.session._links)
        aggregates = tracer.aggregates()
        stats = tracer.stats()
    return records, sampled, aggregates, stats, links


def by_api(aggregates):
    return {f.api: f for f in aggregates.functions}


def test_launches_are_counted_at_entry_and_returns_sampled(fake):
    records, sampled, agg, stats, links = traced(
        fake, ["loop:%d:launch:2,1,1:64,1,1" % N, "loop:10:malloc:64"])
    # the fake runtime's launch rows (the others keep their return probes)
    assert sampled == ["cudaLaunchCooperativeKernel", "cudaLaunchKernel", "cudaLaunchKernelExC"]
    f = by_api(agg)
    launch = f["cudaLaunchKernel"]
    assert launch.count == N  # every call, sampled or not
    timed = sum(launch.histogram)
    assert 16 <= timed <= 160, timed  # 64 expected (6 standard deviations either way)
    assert launch.total_ns > 0 and launch.min_ns > 0 and launch.errors == 0
    # the launch map: every launch by its geometry, counted at entry
    assert [(api, n) for _pid, api, _cells, n, _ns in agg.launches] == [("cudaLaunchKernel", N)]
    # rows that are not launches keep a return probe on every call
    assert f["cudaMalloc"].count == 10 == sum(f["cudaMalloc"].histogram)
    assert "cudaMalloc" not in sampled
    assert records == [] and stats["lost"] == 0 and stats["unpaired"] == 0, stats
    assert all(link.closed for link in links)


def test_failed_launches_are_counted_and_their_errors_sampled(fake):
    _, _, agg, _, _ = traced(fake, ["loop:%d:launch:0,1,1:64,1,1" % N])  # (grid 0: an error)
    launch = by_api(agg)["cudaLaunchKernel"]
    assert launch.count == N
    assert launch.errors == sum(launch.histogram) and 16 <= launch.errors <= 160
    assert sum(agg.errors.values()) == launch.errors
    assert [n for *_, n, _ns in agg.launches] == [N]  # (attempts: the entry cannot know)


def test_every_launch_made_while_capturing_takes_its_return(fake):
    """A process capturing a graph: each launch's return runs (its record written, for the
    graph tracker; the kernel leaves it out of the launch map), however few are sampled."""
    records, _, agg, _, _ = traced(fake, ["streamcreate", "capture:last",
                                          "loop:40:launch:2,1,1:64,1,1", "endcapture:last",
                                          "loop:100:launch:2,1,1:64,1,1"])
    captured = [e for e in records if e.api == "cudaLaunchKernel"]
    assert len(captured) == 40 and all(e.ret == 0 for e in captured)
    launch = by_api(agg)["cudaLaunchKernel"]
    assert launch.count == 140 and sum(launch.histogram) >= 40
    assert [n for *_, n, _ns in agg.launches] == [100]


def test_sampling_every_call_or_none_is_the_ordinary_pair(fake):
    _, sampled, agg, _, _ = traced(fake, ["loop:300:launch:2,1,1:64,1,1"], sample=1)
    assert sampled == []
    launch = by_api(agg)["cudaLaunchKernel"]
    assert launch.count == 300 == sum(launch.histogram)


def test_the_sampling_must_be_a_power_of_two():
    with pytest.raises(UsageError, match="power of two"):
        Tracer(library=["/nonexistent"], aggregate=True, emit=False, sample_returns=48).start()


def test_the_cli_says_what_it_samples_and_refuses_other_than_powers_of_two(fake):
    lib, prog = fake
    bad = run_cli("monitor", "-p", lib, "--return-sampling", "48")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "ebpf-cuda: --return-sampling takes a power of two, not 48"]
    cli = MonitorCli("-p", lib, "--return-sampling", "16", "--prometheus", "127.0.0.1:0")
    try:
        held = Held(prog, ["loop:64:launch:2,1,1:64,1,1", "loop:3:malloc:64"]).go()
        held.wait()
        time.sleep(1.5)  # (the monitor's ticks have seen its exit)
        samples = parse_metrics(scrape(cli.metrics_port)[1])
    finally:
        assert cli.stop(signal.SIGTERM) == 0, cli.lines
    said = [line for line in cli.lines if line.startswith("ebpf-cuda: returns sampled")]
    assert said == ["ebpf-cuda: returns sampled, 1 call in 16 (uprobe sessions): "
                    "cudaLaunchCooperativeKernel cudaLaunchKernel cudaLaunchKernelExC"]
    assert value(samples, "ebpf_cuda_api_return_sampling", api="cudaLaunchKernel") == 16
    assert value(samples, "ebpf_cuda_api_return_sampling", api="cudaMalloc") == 0
    assert value(samples, "ebpf_cuda_api_calls_total", api="cudaLaunchKernel") == 64
    assert value(samples, "ebpf_cuda_kernel_launches_total", api="cudaLaunchKernel") == 64
    timed = value(samples, "ebpf_cuda_api_duration_seconds_count", api="cudaLaunchKernel")
    assert timed == value(samples, "ebpf_cuda_api_duration_seconds_bucket",
                          api="cudaLaunchKernel", le="+Inf") and timed < 64
    assert value(samples, "ebpf_cuda_api_duration_seconds_count", api="cudaMalloc") == 3


def test_the_kfunc_is_found_in_the_kernels_btf(fake):
    from ebpf_cuda.bpf import kernel_btf

    type_id, params = kernel_btf.function("bpf_session_is_return")
    assert features.session_is_return_id() == type_id > 0
    assert params in (0, 1)  # (void before 6.19; the context since)
    assert kernel_btf.function("bpf_no_such_function_here") is None
    assert "uprobe sessions yes (the monitor's sampled launch returns)" in features.report()


def test_the_kernels_btf_is_parsed_once_per_kernel_build(monkeypatch, tmp_path):
    """What was found in vmlinux's BTF is kept in the user's cache directory, in a file
    named after the kernel's build: a later start reads it instead of parsing the BTF."""
    import marshal
    import os

    from ebpf_cuda.bpf import kernel_btf

    if not os.path.exists(kernel_btf.VMLINUX):
        pytest.skip("this kernel has no BTF")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_btf, "_cache", {})
    found = kernel_btf.function("bpf_session_is_return")
    offset = kernel_btf.thread_pointer_offset()
    assert found[0] > 0 and offset is not None and offset > 0
    [stored] = (tmp_path / "ebpf-cuda").iterdir()
    assert marshal.loads(stored.read_bytes()) == {
        "function\0bpf_session_is_return": list(found),
        "member\0task_struct\0thread\0fsbase": offset}
    # A new process (the memory cache empty) takes the file's word, without the BTF.
    stored.write_bytes(marshal.dumps({"function\0bpf_session_is_return": [7, 1]}))
    monkeypatch.setattr(kernel_btf, "_cache", {})
    assert kernel_btf.function("bpf_session_is_return") == (7, 1)
    # Another kernel build (its version string) has a file of its own.
    real = os.uname()

    class Rebuilt:
        release, version = real.release, real.version + " again"
    monkeypatch.setattr(os, "uname", lambda: Rebuilt)
    other = kernel_btf._disk_file(kernel_btf.VMLINUX)
    assert other is not None and other != str(stored)
    monkeypatch.setattr(os, "uname", lambda: real)
    # A file others may write is not taken at its word: the BTF is parsed again.
    os.chmod(str(stored), 0o666)
    monkeypatch.setattr(kernel_btf, "_cache", {})
    assert kernel_btf.function("bpf_session_is_return") == found


IN_NAMESPACE = r'''
import json, sys
from ebpf_cuda.tracer import Tracer
lib, prog, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Tracer(command=[prog, "loop:%d:launch:2,1,1:64,1,1" % n, "loop:5:malloc:64"],
            library=[lib], aggregate=True, emit=False, sample_returns=64) as tracer:
    for _ in tracer.frames():
        pass
    agg = tracer.aggregates()
    print(json.dumps({"sampled": tracer.sampled_returns(), "pid_ns": tracer.session.pid_ns,
                      "command": tracer.session.command.pid,
                      "counts": {f.api: [f.count, sum(f.histogram)] for f in agg.functions},
                      "launches": [[pid, n] for pid, _a, _c, n, _ns in agg.launches]}))
'''


def test_sampled_returns_in_a_pid_namespace_of_the_tracers_own(fake):
    """In a PID namespace (a container): the session program's namespace checks and its
    followed-process check take the namespace's pids; every launch is counted, by the
    command's pid as the namespace numbers it."""
    import json
    import shutil
    import subprocess
    import sys

    from helpers import REPO, cli_env

    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    lib, prog = fake
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                           IN_NAMESPACE, str(lib), str(prog), str(N)], capture_output=True,
                          text=True, timeout=120, env=cli_env(), cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["pid_ns"] is not None and "cudaLaunchKernel" in found["sampled"]
    count, timed = found["counts"]["cudaLaunchKernel"]
    assert count == N and 16 <= timed <= 160
    assert found["counts"]["cudaMalloc"] == [5, 5]
    [[pid, launches]] = found["launches"]
    assert launches == N and pid == found["command"]  # (as the namespace numbers it)
    assert pid < 100  # (a namespace's pid, not the host's)


# -- where the entry counts the launches: an array slot, else the launch map ---------------

def _slots_and_map(tracer):
    """The owned launch slots (pid, api, func, count) and the launch map's entries."""
    from ebpf_cuda.decode import aggregates as sums
    from ebpf_cuda.spec import apis, layout

    maps = tracer.session.maps
    slots = [(pid, apis.TABLE[fn_id].name, func, count)
             for _, pid, fn_id, func, count in sums.owned_slots_of(
                 maps[layout.LAUNCH_SLOTS])]
    hashed = []
    for key, raw in maps[layout.LAUNCHES].items():
        pid, fn_id, *cells = layout.LAUNCH_KEY.unpack(key)
        hashed.append((pid, apis.TABLE[fn_id].name, cells, layout.LAUNCH_VALUE.unpack(raw)[0]))
    return slots, hashed


def _host_wide(fake, ops, before=None):
    """Run the fake program with `ops` under a host-wide sampled Tracer (`before(tracer)`
    first): (pid, owned slots, launch map entries, aggregates)."""
    lib, prog = fake
    with Tracer(library=[str(lib)], aggregate=True, emit=False, sample_returns=64) as tracer:
        if before is not None:
            before(tracer)
        proc = subprocess.Popen([str(prog), *ops], stdout=subprocess.DEVNULL)
        assert proc.wait(120) == 0
        slots, hashed = _slots_and_map(tracer)
        agg = tracer.aggregates()
    return proc.pid, slots, hashed, agg


def test_a_launch_counts_in_its_slot_and_a_null_kernel_in_the_launch_map(fake):
    """The launch path takes no hash-map helper: a kernel's launches count in the array
    slot its (process, function, kernel) hashes to; a null kernel (a launch that fails)
    goes to the launch map. The aggregates add both up."""
    pid, slots, hashed, agg = _host_wide(fake, ["loop:500:launch:2,1,1:64,1,1",
                                                "loop:7:launchnull:2,1,1:64,1,1"])
    assert len(slots) == 1 and hashed == [(pid, "cudaLaunchKernel", [0] * 10, 7)], (slots,
                                                                                   hashed)
    (owner, api, func, count), = slots
    assert (owner, api, count) == (pid, "cudaLaunchKernel", 500) and func != 0
    assert sorted((p, a, max(cells), n) for p, a, cells, n, _ in agg.launches) == [
        (pid, "cudaLaunchKernel", 0, 7), (pid, "cudaLaunchKernel", func, 500)]
    assert by_api(agg)["cudaLaunchKernel"].count == 507


def test_launches_whose_slot_another_owns_count_in_the_launch_map(fake):
    """Every slot held by another owner (as by colliding processes and kernels): the
    launches all go to the launch map, counted exactly; the slots stay as they were."""
    from ebpf_cuda.spec import apis, layout

    foreign = apis.FN_ID["cudaLaunchKernel"] << 32 | 1  # (pid 1's: it launches nothing)

    def take_every_slot(tracer):
        slots = tracer.session.maps[layout.LAUNCH_SLOTS]
        for index in range(layout.LAUNCH_SLOT_ENTRIES):
            slots.set(index, (foreign, 0xDEAD0000 + index, 0))

    pid, slots, hashed, agg = _host_wide(fake, ["loop:300:launch:2,1,1:64,1,1"],
                                         take_every_slot)
    assert len(slots) == layout.LAUNCH_SLOT_ENTRIES
    assert {(p, count) for p, _, _, count in slots} == {(1, 0)}
    assert [(p, a, n) for p, a, _, n in hashed] == [(pid, "cudaLaunchKernel", 300)]
    assert [(p, n) for p, _, _, n, _ in agg.launches] == [(pid, 300)]  # (no empty slot)


def test_a_launch_whose_slot_another_holds_counts_in_one_of_the_next(fake):
    """Three slots in every four held by another owner (as by colliding processes and
    kernels on a busy host): a kernel's launches count in the first free slot after the
    one it hashes to (linear probing, SLOT_PROBES slots), none in the launch map."""
    from ebpf_cuda.decode import aggregates as sums
    from ebpf_cuda.probes import aggregates
    from ebpf_cuda.spec import apis, layout

    launch = apis.FN_ID["cudaLaunchKernel"]
    foreign = launch << 32 | 1  # (pid 1's: it launches nothing)

    def take_three_in_four(tracer):
        slots = tracer.session.maps[layout.LAUNCH_SLOTS]
        for index in range(layout.LAUNCH_SLOT_ENTRIES):
            if index % 4 != 3:
                slots.set(index, (foreign, 0xDEAD0000 + index, 0))

    with Tracer(library=[str(fake[0])], aggregate=True, emit=False,
                sample_returns=64) as tracer:
        take_three_in_four(tracer)
        proc = subprocess.Popen([str(fake[1]), "loop:300:launch:2,1,1:64,1,1"],
                                stdout=subprocess.DEVNULL)
        assert proc.wait(120) == 0
        owned = sums.owned_slots_of(tracer.session.maps[layout.LAUNCH_SLOTS])
        _, hashed = _slots_and_map(tracer)
        agg = tracer.aggregates()
    (index, pid, fn_id, func, count), = [s for s in owned if s[1] == proc.pid]
    assert (pid, fn_id, count, hashed) == (proc.pid, launch, 300, [])
    owner = launch << 32 | proc.pid  # (where the entry program starts looking: its hash)
    home = ((owner ^ func) * 0x9E3779B97F4A7C15 % (1 << 64)) >> (64 - layout.LAUNCH_SLOT_BITS)
    assert index % 4 == 3 and (index - home) % layout.LAUNCH_SLOT_ENTRIES < aggregates.SLOT_PROBES
    assert [(p, n) for p, _, _, n, _ in agg.launches] == [(proc.pid, 300)]


def test_a_kernel_counted_in_two_slots_is_one_series(fake):
    """A kernel that took a later slot while its own was held, and finds its own free once
    the holder has gone (freed at its exit), claims it too: its launches are then in two
    slots, which the readers add up as one (process, function, kernel)."""
    from ebpf_cuda.decode import aggregates as sums
    from ebpf_cuda.spec import apis, layout

    launch = apis.FN_ID["cudaLaunchKernel"]
    foreign = launch << 32 | 1
    with Tracer(library=[str(fake[0])], aggregate=True, emit=False,
                sample_returns=64) as tracer:
        slots = tracer.session.maps[layout.LAUNCH_SLOTS]
        held = [i for i in range(layout.LAUNCH_SLOT_ENTRIES) if i % 4 != 3]
        for index in held:
            slots.set(index, (foreign, 0xDEAD0000 + index, 0))
        proc = subprocess.Popen([str(fake[1]), "loop:100:launch:2,1,1:64,1,1", "sleep:4000",
                                 "loop:200:launch:2,1,1:64,1,1"], stdout=subprocess.DEVNULL)

        def mine():
            return [s for s in sums.owned_slots_of(slots) if s[1] == proc.pid]

        deadline = time.monotonic() + 30
        while not (mine() and mine()[0][4] == 100) and time.monotonic() < deadline:
            time.sleep(0.01)
        (first, _, _, func, _), = mine()
        for index in held:  # (the holders gone: their slots freed)
            sums.free_slot(slots, index, foreign)
        assert [s[4] for s in mine()] == [100], "the second loop began before the slots were freed"
        assert proc.wait(120) == 0
        owner = launch << 32 | proc.pid
        home = ((owner ^ func) * 0x9E3779B97F4A7C15 % (1 << 64)) >> (64 - layout.LAUNCH_SLOT_BITS)
        counted = {index: count for index, _, _, _, count in mine()}
        agg = tracer.aggregates()
    if home == first:  # (its own slot was the free one: nothing to claim later; 1 in 4)
        assert counted == {first: 300}
    else:
        assert counted == {first: 100, home: 200}
    assert [(p, max(cells), n) for p, _, cells, n, _ in agg.launches] == [(proc.pid, func, 300)]


def test_threads_racing_for_a_new_slot_count_every_launch_once(fake):
    """Eight threads launching one kernel at once: one claims the slot, a launch that sees
    it half-claimed goes to the launch map; between them every launch is counted once."""
    _, slots, hashed, agg = _host_wide(fake, ["threads:8:4000:launch:2,1,1:64,1,1"])
    assert [n for *_, n in slots] and len(slots) == 1
    assert sum(n for *_, n in slots) + sum(n for *_, n in hashed) == 32000
    assert [n for *_, n, _ in agg.launches] == [32000]
    assert by_api(agg)["cudaLaunchKernel"].count == 32000


def test_an_exited_processs_slots_are_freed_and_its_launches_stay_counted(fake):
    """The monitor frees the slots of a process gone (its exit seen by an exporter): a
    later process can take them, and the launches of the one gone stay in the counter."""
    from ebpf_cuda.spec import layout
    from ebpf_cuda.monitor.agent import Monitor, MonitorOptions

    lib, prog = fake
    monitor = Monitor(MonitorOptions(paths=(str(lib),), late=False)).start()
    try:
        slots = monitor.tracer.session.maps[layout.LAUNCH_SLOTS]
        proc = subprocess.Popen([str(prog), "loop:250:launch:2,1,1:64,1,1"],
                                stdout=subprocess.DEVNULL)
        assert proc.wait(60) == 0
        owned = [i for i, (owner, _, count) in slots.items() if owner]
        assert len(owned) == 1 and slots[owned[0]][0] & 0xFFFFFFFF == proc.pid

        def launches():
            family, = [f for f in monitor.collect() if f.name == "ebpf_cuda_kernel_launches"]
            return sum(v for labels, v in family.samples if dict(labels).get("pid") in
                       (None, str(proc.pid)))

        monitor.tick()  # (the ring is not read here: their kernel unknown, they wait a tick)
        assert launches() == 0
        monitor.tick()  # (the process's exit noted; its launches published)
        assert launches() == 250
        assert slots[owned[0]][2] == 250
        monitor.tick()  # (pruned: its series go, their values seen by the last collect)
        assert slots[owned[0]] == (0, 0, 0) and launches() == 0
        assert sum(monitor.launch_totals().values()) == 250  # (the run's: not lost)
    finally:
        monitor.close()
