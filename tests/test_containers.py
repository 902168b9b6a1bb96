"""Each event names its process's container (issue 15): containers.py reads the container
id from /proc/PID/cgroup once per process (Docker, containerd, CRI-O, podman: a 64-hex id in
the cgroup path), JSON events carry it as `container`, text lines end with
`container=<id>` (unless it is the tracer's own container).

A process may exit before the reader reads its first records, so each thread's hello record
carries its cgroup v2 id, and the container is found from the id when /proc has nothing left
to tell.

The kernel tests make a cgroup v2 directory named like systemd's Docker scopes,
`docker-<64 hex>.scope`, move a traced process into it before its calls, and remove it at
the end.
"""
import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from ebpf_cuda.bpf import features
from ebpf_cuda.spec import record
from ebpf_cuda.targets import containers
from ebpf_cuda.targets.containers import Cgroups, Containers, container_in
from ebpf_cuda.tracer import Tracer
from helpers import event, run_cli

ID = "3f9c2a7be41d" + "0123456789abcdef" * 3 + "5a6b"  # 64 hex digits
SHORT = ID[:12]


# -- the id in a cgroup path ------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "0::/system.slice/docker-%s.scope\n" % ID,  # Docker with systemd
    "12:memory:/docker/%s\n0::/docker/%s\n" % (ID, ID),  # Docker with cgroupfs
    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c3d4e_aaaa_bbbb"
    "_cccc_123456789abc.slice/cri-containerd-%s.scope\n" % ID,  # containerd (Kubernetes)
    "0::/kubepods.slice/kubepods-pod1.slice/crio-%s.scope\n" % ID,  # CRI-O
    "0::/machine.slice/libpod-%s.scope/container\n" % ID,  # podman
    "0::/docker/%s/docker/%s\n" % ("e" * 64, ID),  # a container in a container: the inner
], ids=["docker-systemd", "docker-cgroupfs", "containerd", "crio", "podman", "nested"])
def test_runtimes_cgroup_paths_name_the_container(text):
    assert container_in(text) == SHORT


@pytest.mark.parametrize("text", [
    "0::/\n",
    "0::/user.slice/user-1000.slice/session-2.scope\n",
    "4:memory:/process_api/9e8910beb70fc0dc25500dbcc133663e\n0::/\n",  # 32 hex: no id
    "0::/x/%sf.scope\n" % ID,  # 65 hex digits: no id either
], ids=["root", "session", "32-hex", "65-hex"])
def test_other_cgroup_paths_name_none(text):
    assert container_in(text) == ""


def test_the_unified_line_wins_over_v1_lines():
    text = "4:memory:/docker/%s\n0::/system.slice/docker-%s.scope\n" % ("a" * 64, ID)
    assert container_in(text) == SHORT


def test_each_process_is_read_once_and_freed_when_forgotten(monkeypatch):
    reads = Counter()

    def fake(pid):
        reads[pid] += 1
        return SHORT if pid == 11 else ""

    monkeypatch.setattr(containers, "container_of", fake)
    known = Containers()
    known.observe([11, 12])
    known.observe([11, 12])
    assert (known.of(11), known.of(12)) == (SHORT, None)
    events = [event("cudaMalloc", pid=11), event("cudaMalloc", pid=12)]
    known.annotate(events)
    assert [e.container for e in events] == [SHORT, None]
    assert reads == {11: 1, 12: 1, os.getpid(): 1}  # (the tracer's own, once)
    known.forget(11)
    assert len(known) == 1
    assert events[0].to_json()["container"] == SHORT and "container" not in events[1].to_json()


def test_exited_processes_are_dropped_past_the_bound(monkeypatch):
    monkeypatch.setattr(containers, "container_of", lambda pid: "")
    monkeypatch.setattr(containers, "MAX_PROCESSES", 8)
    known = Containers()
    dead = [4 << 22 | k for k in range(8)]  # past pid_max: no such processes
    known.observe(dead)
    known.observe([os.getpid()])
    assert len(known) == 1 and known.of(os.getpid()) is None


# -- real processes in a container's cgroup ---------------------------------------------------

def cgroup2_root() -> Path:
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[2] == "cgroup2":
                return Path(fields[1])
    pytest.skip("no cgroup v2 hierarchy mounted")


@pytest.fixture
def scope(root):
    """A cgroup v2 directory named as Docker's systemd scopes are; removed at the end (once
    the processes moved there have exited)."""
    path = cgroup2_root() / ("docker-%s.scope" % ID)
    path.mkdir()
    try:
        yield path
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def script(prog, scope: Path) -> str:
    """7 calls from a process outside the container, then 5 from one moved into it before
    its first call (the shell moves itself, then execs the program)."""
    return "%s threads 1 7; echo $$ > %s/cgroup.procs; exec %s threads 1 5" % (
        prog, scope, prog)


def pids_of(stdout: str):
    return [int(p) for p in re.findall(r"^made=\d+ pid=(\d+)$", stdout, re.MULTILINE)]


@pytest.mark.kernel
@pytest.mark.parametrize("extra", [[], ["--summary"]], ids=["json-lines", "json-events"])
def test_json_events_name_the_container_of_their_process(robust, scope, tmp_path, extra):
    """JSON straight from the records, and JSON from decoded events (with another output)."""
    lib, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_cli("-p", lib, "--json", "-o", out, "--functions", "cudaMemcpy", *extra, "--",
                   "sh", "-c", script(prog, scope))
    assert done.returncode == 0, done.stderr
    outside, inside = pids_of(done.stdout)
    with open(out) as f:
        events = [json.loads(line) for line in f if line.strip()]
    assert Counter((e["pid"], e.get("container")) for e in events) == {
        (outside, None): 14, (inside, SHORT): 10}
    keys = list(next(e for e in events if e["pid"] == inside))
    assert keys[:7] == ["ts", "pid", "tid", "comm", "container", "device", "api"]


@pytest.mark.kernel
def test_the_summary_by_container_counts_each_containers_calls(robust, scope):
    lib, prog = robust
    done = run_cli("-p", lib, "--functions", "cudaMemcpy", "--summary", "--by-container",
                   "--", "sh", "-c", script(prog, scope))
    assert done.returncode == 0, done.stderr
    parts = done.stdout.split(" ==== ")[1:]
    calls = {}
    for part in parts:
        title, tables = part.split(" ====", 1)
        rows = [line.split() for line in tables.split(" ** ")[1].splitlines()
                if line.split()[-1:] == ["cudaMemcpy"]]
        calls[title] = int(rows[0][2])
    assert calls == {"Container " + SHORT: 5, "No container": 7}


@pytest.mark.kernel
def test_text_lines_end_with_the_container(robust, scope):
    lib, prog = robust
    done = run_cli("-p", lib, "--functions", "cudaMemcpy", "--", "sh", "-c",
                   script(prog, scope))
    assert done.returncode == 0, done.stderr
    outside, inside = pids_of(done.stdout)
    calls = [line.split() for line in done.stdout.splitlines() if "cudaMemcpy" in line]
    named = Counter((int(f[2]), f[-1] if f[-1].startswith("container=") else None)
                    for f in calls)
    assert named == {(outside, None): 14, (inside, "container=" + SHORT): 10}


@pytest.mark.kernel
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_records_decoded_the_slow_way_name_the_container_too(robust, scope, tmp_path,
                                                             as_json):
    """Calls whose out-parameters could not be read take the writer's own formatting
    (output/lines.py's slow path): their lines name the container as the others do."""
    lib, prog = robust
    out = tmp_path / "trace.out"
    done = run_cli("-p", lib, *(["--json"] if as_json else []), "-o", out, "--functions",
                   "cudaGetDevice,cudaMalloc", "--", "sh", "-c",
                   "echo $$ > %s/cgroup.procs; exec %s badptrs" % (scope, prog))
    assert done.returncode == 0, done.stderr
    lines = [line for line in out.read_text().splitlines() if "cuda" in line]
    assert len(lines) == 18  # 9 calls, two events each
    if as_json:
        events = [json.loads(line) for line in lines]
        assert {e["container"] for e in events} == {SHORT}
        assert any(e.get("faults") for e in events)  # (some did take the slow path)
    else:
        assert {line.split()[-1] for line in lines} == {"container=" + SHORT}
        assert any("<unreadable>" in line for line in lines)


@pytest.mark.kernel
def test_a_process_gone_before_the_reader_looks_is_known_by_its_hellos_cgroup(robust, scope):
    """The hello record of the process moved into the container carries the container's
    cgroup id (a cgroup v2 id is its directory's inode number); once the process has exited
    (/proc has nothing of it) that id still names its container."""
    lib, prog = robust
    if not features.task_storage():
        pytest.skip("no hello records without task storage (5.11)")
    command = ["sh", "-c", "echo $$ > %s/cgroup.procs; exec %s threads 2 3" % (scope, prog)]
    cgroups, batches = {}, []
    with Tracer(library=[str(lib)], functions=["cudaMemcpy"], command=command) as tracer:
        for frames in tracer.frames():
            cgroups.update(record.hello_cgroups(frames))
            batches.append(frames)
        child = tracer.child_pid
    assert cgroups == {child: os.stat(str(scope)).st_ino}
    assert not Path("/proc/%d" % child).exists()
    assert containers.container_of(child) == ""  # (/proc cannot tell any more)
    assert Cgroups().container(cgroups[child]) == SHORT
    known = Containers()
    known.observe([child], b"".join(batches))
    assert known.of(child) == SHORT


def test_a_cgroup_id_that_names_no_cgroup_leaves_it_to_proc(monkeypatch):
    monkeypatch.setattr(containers, "container_of", lambda pid: "f" * 12)
    assert Cgroups().container((1 << 63) + 12345) is None
    known = Containers()
    known.observe([7], _hello(7, (1 << 63) + 12345))
    assert known.of(7) == "f" * 12


def _hello(pid: int, cgroup: int) -> bytes:
    """The frame of a hello record of process `pid` in cgroup `cgroup`."""
    body = bytearray(record.SIZE)
    body[record.PID_TGID:record.PID_TGID + 8] = (pid << 32 | pid).to_bytes(8, "little")
    body[record.FN_ID:record.FN_ID + 2] = record.HELLO_FN.to_bytes(2, "little")
    body[record.PHASE] = record.PHASE_HELLO
    body[record.HELLO_CGROUP:record.HELLO_CGROUP + 8] = cgroup.to_bytes(8, "little")
    return bytes(record.FRAME_HEADER) + bytes(body)


def test_a_hello_record_gives_its_process_cgroup():
    assert record.hello_cgroups(_hello(7, 4321) + _hello(8, 0)) == {7: 4321}
