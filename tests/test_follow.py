"""Following a command's processes in the kernel (follow.py, tracepoints.py)."""
import os
import subprocess
import sys
import time

import pytest

from ebpf_cuda.probes import follow
from ebpf_cuda.bpf import tracepoints
from ebpf_cuda.probes.follow import ProcessFollower

FORK_FORMAT = """name: sched_process_fork
ID: 366
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:char child_comm[16];\toffset:16;\tsize:16;\tsigned:0;
\tfield:pid_t child_pid;\toffset:32;\tsize:4;\tsigned:1;
"""


def test_format_fields_are_parsed():
    fields = tracepoints.parse_format(FORK_FORMAT)
    assert fields["parent_comm"] == (8, 4)
    assert fields["child_comm"] == (16, 16)
    assert fields["child_pid"] == (32, 4)
    assert fields["common_pid"] == (4, 4)


@pytest.fixture
def nothing_known(tmp_path, monkeypatch):
    """No tracepoint read yet, by this process or (in its cache folder) this boot."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tracepoints, "_known", {})
    monkeypatch.setattr(tracepoints, "_disk_read", False)
    return tmp_path / "ebpf-cuda"


@pytest.mark.kernel
def test_the_fork_tracepoint_is_found_even_without_tracefs_mounted(root, nothing_known):
    before = open("/proc/self/mountinfo").read().count(" tracefs ")
    point = tracepoints.find("sched", "sched_process_fork")
    assert point.id > 0 and "child_pid" in point.fields
    assert open("/proc/self/mountinfo").read().count(" tracefs ") == before  # nothing left


@pytest.mark.kernel
def test_what_was_read_is_read_again_from_this_boots_file(root, nothing_known, monkeypatch):
    """A later process reads this boot's file, not tracefs; one not this user's alone, or
    of another boot, is not read."""
    wanted = [("sched", "sched_process_fork"), ("sched", "sched_process_exit")]
    ahead = tracepoints.ReadAhead(wanted)
    ahead.wait()
    found = tracepoints.find_all(wanted)
    [stored] = nothing_known.iterdir()
    assert stored.name.startswith("tracepoints-") and stored.stat().st_mode & 0o777 == 0o600

    def no_tracefs(wanted):
        raise AssertionError("tracefs read for %s" % wanted)

    monkeypatch.setattr(tracepoints, "_read", no_tracefs)
    monkeypatch.setattr(tracepoints, "_PrivateMount", no_tracefs)
    monkeypatch.setattr(tracepoints, "_known", {})
    monkeypatch.setattr(tracepoints, "_disk_read", False)
    tracepoints.ReadAhead(wanted).wait()
    assert tracepoints.find_all(wanted) == found  # (ids, names and fields)
    os.chmod(str(stored), 0o666)
    for boot in ("writable by others", "another boot"):
        monkeypatch.setattr(tracepoints, "_known", {})
        monkeypatch.setattr(tracepoints, "_disk_read", False)
        with pytest.raises(AssertionError, match="tracefs read"):
            tracepoints.find_all(wanted)
        os.chmod(str(stored), 0o600)
        monkeypatch.setattr(tracepoints, "_disk_file", lambda: str(stored) + ".other")


def without_group_dead(monkeypatch):
    """Make this kernel's sched_process_exit look like 6.1's and 6.12's (no group_dead)."""
    real = tracepoints.find_all

    def find_all(wanted):
        points = real(wanted)
        return [p._replace(fields={k: v for k, v in p.fields.items() if k != "group_dead"})
                for p in points]

    monkeypatch.setattr(tracepoints, "find_all", find_all)


@pytest.fixture(params=["as_found", "without_group_dead"])
def exit_rule(request, monkeypatch):
    """Each test twice: with the kernel's own exit tracepoint, and with it lacking
    group_dead (the fallback: a process is forgotten when its leader thread exits)."""
    if request.param == "without_group_dead":
        without_group_dead(monkeypatch)
        return follow.LEADER_EXIT
    return None


@pytest.mark.kernel
def test_exit_rule_follows_the_tracepoint_format(root, exit_rule):
    follower = ProcessFollower()
    try:
        has_field = "group_dead" in tracepoints.find("sched", "sched_process_exit").fields
        assert follower.exit_rule == (follow.GROUP_DEAD if has_field else follow.LEADER_EXIT)
        if exit_rule is not None:
            assert follower.exit_rule == exit_rule
    finally:
        follower.close()


@pytest.mark.kernel
def test_a_process_stays_followed_while_its_other_threads_exit(root, exit_rule):
    script = ("import sys, threading\n"
              "sys.stdin.readline()\n"
              "threads = [threading.Thread(target=lambda: None) for _ in range(4)]\n"
              "[t.start() for t in threads]; [t.join() for t in threads]\n"
              "print('threads done', flush=True)\n"
              "sys.stdin.readline()\n")
    follower = ProcessFollower()
    try:
        proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        follower.add(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "threads done\n"
        # its threads' exits did not remove it, and took their own entries with them (the
        # fork tracepoint cannot tell a thread from a process: each was added). join()
        # returns before a thread's kernel task has exited: the last entries may go a
        # little later (10 ms and more on an emulated machine).
        deadline = time.monotonic() + 10
        while follower.followed() != [proc.pid] and time.monotonic() < deadline:
            assert proc.pid in follower.followed()
            time.sleep(0.02)
        assert follower.followed() == [proc.pid]
        proc.stdin.write("end\n")
        proc.stdin.close()
        proc.wait(timeout=10)
        time.sleep(0.1)
        assert proc.pid not in follower.followed()
    finally:
        follower.close()


@pytest.mark.kernel
def test_children_and_grandchildren_join_and_leave_the_followed_set(root, exit_rule):
    script = ("import os, sys, time\n"
              "r, w = os.pipe()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    g = os.fork()\n"
              "    if g == 0:\n"
              "        os.write(w, b'%d ' % os.getpid()); time.sleep(0.5); os._exit(0)\n"
              "    os.write(w, b'%d ' % os.getpid()); os.waitpid(g, 0); os._exit(0)\n"
              "print(os.getpid(), flush=True)\n"
              "os.close(w); time.sleep(0.2); print(os.read(r, 100).decode(), flush=True)\n"
              "os.waitpid(pid, 0)\n")
    follower = ProcessFollower()
    try:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(1)\n" + script],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        follower.add(proc.pid)
        proc.stdin.write("x")
        proc.stdin.close()
        top = int(proc.stdout.readline())
        kids = {int(p) for p in proc.stdout.readline().split()}
        assert len(kids) == 2
        assert {top} | kids <= set(follower.followed())
        proc.wait(timeout=10)
        time.sleep(0.1)
        assert not ({top} | kids) & set(follower.followed())  # gone when they exit
    finally:
        follower.close()
