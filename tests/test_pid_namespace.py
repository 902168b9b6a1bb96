"""The tracer inside a PID namespace of its own (issue 15): `unshare --pid --fork
--mount-proc ebpf-cuda ...` traces every call of `-- cmd` and its children, with the
default outputs and with `--summary` alone (in-kernel aggregates), `-d` takes a pid of the
tracer's namespace, and every event shows pids as that namespace numbers them: the pids the
program prints of itself (robust_load prints getpid() and gettid(); its calls carry its
thread id in `dst`). The probes read those pids with bpf_get_ns_current_pid_tgid; children
are followed through the `forked` map (follow.py).
"""
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers import REPO, cli_argv, cli_env

pytestmark = pytest.mark.kernel

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]
CALLS = 200


@pytest.fixture(autouse=True)
def _needs_unshare(root):
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")


def in_namespace(argv, timeout: float = 120, mount_proc: bool = True
                 ) -> subprocess.CompletedProcess:
    """`argv` run as the first process of a new PID namespace (with its own /proc)."""
    unshare = UNSHARE if mount_proc else UNSHARE[:-1]
    return subprocess.run(unshare + [str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(), cwd=str(REPO),
                          stdin=subprocess.DEVNULL)


def trace_in_namespace(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return in_namespace(cli_argv(*args), timeout)


def printed(stdout: str, key: str) -> int:
    """The pid or tid robust_load printed of itself ("tid=T", "made=N pid=P" lines)."""
    pattern = r"^tid=(\d+)$" if key == "tid" else r"^made=\d+ pid=(\d+)$"
    found = re.findall(pattern, stdout, re.MULTILINE)
    assert len(found) == 1, stdout
    return int(found[0])


def json_exits(path: Path):
    with open(path) as f:
        events = [json.loads(line) for line in f if line.strip()]
    return [e for e in events if e["phase"] == "exit" and e["api"] == "cudaMemcpy"]


def test_the_pids_here_are_not_the_kernels():
    """The premise: in the namespace a process's pid is not its kernel pid."""
    done = in_namespace([sys.executable, "-c", "import os; print(os.getpid(), "
                         "os.stat('/proc/self/ns/pid').st_ino)"])
    pid, ino = map(int, done.stdout.split())
    assert pid == 1 and ino != os.stat("/proc/self/ns/pid").st_ino


def test_a_command_in_a_pid_namespace_has_every_call_seen_in_json(robust, tmp_path):
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = trace_in_namespace("--json", "-o", out, "--functions", "cudaMemcpy", "--", prog,
                              "threads", 1, CALLS)
    assert done.returncode == 0, done.stderr
    pid, tid = printed(done.stdout, "pid"), printed(done.stdout, "tid")
    calls = json_exits(out)
    assert len(calls) == CALLS
    assert {(e["pid"], e["tid"]) for e in calls} == {(pid, tid)}
    assert [e["args"]["dst"] for e in calls] == [tid] * CALLS  # the thread's own gettid()
    assert [e["args"]["src"] for e in calls] == list(range(CALLS))


def test_a_command_in_a_pid_namespace_has_every_call_seen_in_text(robust):
    _, prog = robust
    done = trace_in_namespace("--functions", "cudaMemcpy", "--", prog, "threads", 1, CALLS)
    assert done.returncode == 0, done.stderr
    pid, tid = printed(done.stdout, "pid"), printed(done.stdout, "tid")
    exits = [line.split() for line in done.stdout.splitlines() if "[EXIT]" in line]
    assert len(exits) == CALLS
    # TIME PROCESS PID EVENT [EXIT] returned=... (a thread other than the main one: tid=)
    assert {(int(f[2]), f[1]) for f in exits} == {(pid, "robust_load")}
    assert {f[-1] for f in exits} == {"tid=%d" % tid}  # (its one thread is no main thread)


def test_children_in_a_pid_namespace_are_followed_by_their_pids_there(robust, tmp_path):
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = trace_in_namespace("--json", "-o", out, "--functions", "cudaMemcpy", "--", prog,
                              "fork", 300, 200)
    assert done.returncode == 0, done.stderr
    child = int(re.search(r"child pid=(\d+)", done.stdout).group(1))
    parent = int(re.search(r"parent pid=(\d+)", done.stdout).group(1))
    assert Counter(e["pid"] for e in json_exits(out)) == {child: 300, parent: 200}


def test_grandchildren_in_a_pid_namespace_are_followed(robust, tmp_path):
    """A child that makes no traced call before it forks: its own child is followed too
    (the fork program looks the parent up in `forked` as well)."""
    lib, prog = robust
    out = tmp_path / "trace.jsonl"
    script = "%s fork 30 20; %s fork 40 10" % (prog, prog)
    done = trace_in_namespace("-p", lib, "--json", "-o", out, "--functions", "cudaMemcpy",
                              "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    children = [int(p) for p in re.findall(r"child pid=(\d+)", done.stdout)]
    parents = [int(p) for p in re.findall(r"parent pid=(\d+)", done.stdout)]
    assert Counter(e["pid"] for e in json_exits(out)) == {
        children[0]: 30, parents[0]: 20, children[1]: 40, parents[1]: 10}


def summary_calls(stdout: str, function: str = "cudaMemcpy") -> int:
    """Num Calls of `function` in the CUDA API Summary table."""
    table = stdout.split("CUDA API Summary", 1)[1].split("\n\n", 2)[1]
    for line in table.splitlines():
        fields = line.split()
        if fields and fields[-1] == function:
            return int(fields[2].replace(",", ""))
    raise AssertionError(stdout)


def test_summary_alone_in_a_pid_namespace_counts_every_call(robust):
    _, prog = robust
    done = trace_in_namespace("--summary", "--functions", "cudaMemcpy", "--", prog, "fork",
                              300, 200)
    assert done.returncode == 0, done.stderr
    assert "in-kernel aggregates" in done.stdout
    assert summary_calls(done.stdout) == 500


DRIVER = r'''
import json, select, signal, subprocess, sys
prog, out = sys.argv[1], sys.argv[2]
work = subprocess.Popen([prog, "bursts"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        text=True)
ready = work.stdout.readline()
pid = int(ready.split("pid=")[1])
tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "-d", str(pid), "--json",
                           "-o", out, "--functions", "cudaMemcpy"],
                          stderr=subprocess.PIPE, text=True)
line = ""
while "probing" not in line:
    assert select.select([tracer.stderr], [], [], 60)[0], "the tracer did not start"
    line = tracer.stderr.readline()
    assert line, "the tracer ended: " + tracer.stderr.read()
work.stdin.write("250\n"); work.stdin.flush()
done = work.stdout.readline()
tracer.send_signal(signal.SIGINT)
_, err = tracer.communicate(timeout=60)
work.stdin.close(); work.wait(30)
print(json.dumps({"pid": pid, "done": done, "rc": tracer.returncode, "err": err}))
'''


def test_d_takes_a_pid_of_the_tracers_namespace(robust, tmp_path):
    _, prog = robust
    out, driver = tmp_path / "trace.jsonl", tmp_path / "driver.py"
    driver.write_text(DRIVER)
    done = in_namespace([sys.executable, driver, prog, out])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["done"].startswith("done 250"), result
    assert result["rc"] in (0, 130), result
    calls = json_exits(out)
    assert len(calls) == 250
    assert {e["pid"] for e in calls} == {result["pid"]}
    assert {e["tid"] for e in calls} == {result["pid"]}  # its one thread


def test_d_refuses_a_proc_of_another_namespace():
    """Without --mount-proc, /proc is the host's: a pid of the tracer's namespace names
    another process there. One line, the usage exit code."""
    done = in_namespace(cli_argv("-d", 1, "--functions", "cudaMemcpy"), mount_proc=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "another PID namespace" in lines[0], done.stderr


def test_processes_outside_the_tracers_namespace_are_not_traced(robust, tmp_path):
    """System-wide (-p FILE) inside the namespace: a process of the host calling the same
    file is not the tracer's to see (it has no pid there); one in the namespace is."""
    lib, prog = robust
    out, script = tmp_path / "trace.jsonl", tmp_path / "both.py"
    script.write_text(r'''
import select, signal, subprocess, sys
lib, prog, out = sys.argv[1:4]
tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "-p", lib, "--json", "-o", out,
                           "--functions", "cudaMemcpy"], stderr=subprocess.PIPE, text=True)
line = ""
while "probing" not in line:
    assert select.select([tracer.stderr], [], [], 60)[0], "the tracer did not start"
    line = tracer.stderr.readline()
    assert line, "the tracer ended: " + tracer.stderr.read()
print("ready", flush=True)
sys.stdin.readline()  # the host's process has made its calls
inside = subprocess.run([prog, "threads", "1", "70"], capture_output=True, text=True)
tracer.send_signal(signal.SIGINT)
tracer.communicate(timeout=60)
print(inside.stdout, flush=True)
''')
    ns = subprocess.Popen(UNSHARE + [sys.executable, str(script), str(lib), str(prog),
                                     str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=str(REPO))
    try:
        assert ns.stdout.readline().strip() == "ready"
        host = subprocess.run([str(prog), "threads", "1", "30"], capture_output=True,
                              text=True, timeout=60)
        assert host.returncode == 0
        stdout, stderr = ns.communicate("go\n", timeout=120)
    finally:
        if ns.poll() is None:
            ns.kill()
            ns.wait()
    assert ns.returncode == 0, stderr
    inside_pid = printed(stdout, "pid")
    assert Counter(e["pid"] for e in json_exits(out)) == {inside_pid: 70}


@pytest.mark.parametrize("variant", [
    dict(follow=True, task_storage=True),
    dict(follow=True, task_storage=False),
    dict(follow=False, task_storage=True, emit_entry=True),
    dict(follow=True, task_storage=True, aggregate=True, emit=False),
    dict(follow=True, task_storage=False, stash=False),
], ids=["follow", "inflight", "entries", "aggregate", "no-returns"])
def test_every_program_in_namespace_mode_passes_the_verifier(variant):
    """Each row's entry and return programs with pids read in a PID namespace (fixed
    device and inode: the verifier checks the code, not the namespace), one program per
    function (ids as constants) for the main option sets."""
    from ebpf_cuda.spec import apis, layout
    from ebpf_cuda.probes import calls as probes
    from ebpf_cuda.arch import current
    from ebpf_cuda.bpf.programs import Program
    from ebpf_cuda.session import create_map

    options = probes.ProbeOptions(pid_ns=(4, 0xF0000001), **variant)
    specs = layout.map_specs(1 << 16, len(apis.TABLE), False, options.aggregate,
                             options.follow, pid_ns=True)
    if not options.task_storage:
        specs = [s for s in specs if s.name != layout.TASKS] + [layout.inflight_fallback()]
    made = {spec.name: create_map(spec) for spec in specs}
    try:
        for fn_id, api in enumerate(apis.TABLE):
            kinds = (False, True) if options.stash else (False,)
            for retprobe in kinds:
                generate = probes.return_program if retprobe else probes.entry_program
                with Program(generate(api, fn_id, current(), options), made,
                             name=probes.program_name(fn_id, retprobe)).load():
                    pass
    finally:
        for m in made.values():
            m.close()


@pytest.mark.parametrize("as_found", [True, False], ids=["as_found", "leader_exit"])
def test_the_followers_namespace_programs_load_with_either_exit_rule(as_found, monkeypatch):
    """The fork and exit programs of a follower in a PID namespace pass the verifier and
    attach, with this kernel's sched_process_exit (group_dead where it has the field: 6.16+)
    and with one lacking group_dead."""
    from ebpf_cuda.probes import follow
    from ebpf_cuda.bpf import tracepoints

    has_field = "group_dead" in tracepoints.find("sched", "sched_process_exit").fields
    if not as_found:
        real = tracepoints.find_all
        monkeypatch.setattr(tracepoints, "find_all", lambda wanted: [
            p._replace(fields={k: v for k, v in p.fields.items() if k != "group_dead"})
            for p in real(wanted)])
    follower = follow.ProcessFollower(pid_ns=(4, 0xF0000001))
    try:
        assert follower.forked is not None
        assert follower.exit_rule == (follow.GROUP_DEAD if as_found and has_field
                                      else follow.LEADER_EXIT)
    finally:
        follower.close()


def test_a_proc_of_another_namespace_is_warned_of_and_calls_still_seen(robust, tmp_path):
    """`unshare --pid --fork` without --mount-proc: the command's calls are all seen, by
    their pids in the namespace, and a warning says that /proc is not this namespace's."""
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = in_namespace(cli_argv("--json", "-o", out, "--functions", "cudaMemcpy", "--",
                                 prog, "threads", 1, CALLS), mount_proc=False)
    assert done.returncode == 0, done.stderr
    assert "warning: /proc is another PID namespace's" in done.stderr
    pid = printed(done.stdout, "pid")
    assert Counter(e["pid"] for e in json_exits(out)) == {pid: CALLS}
