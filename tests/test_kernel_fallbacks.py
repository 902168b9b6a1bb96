"""The paths older kernels take, forced on this one (issue 19): every fallback is chosen by
what the kernel was found to do (ebpf_cuda/features.py, uprobe.attach_path), so each can be
made to happen here by making a probe answer as an older kernel's would.

- follow: sched_process_exit without `group_dead` (6.1, 6.12): a process is forgotten when
  its leader thread exits;
- attach: no uprobe_multi (before 6.6): perf-event uprobes; a uprobe_multi link refused at
  attach time: the same programs through perf-event links, function ids in cookies;
- the uretprobe/seccomp hazard (6.11 until the February 2025 fix): return probes refused
  for a seccomp-filtered target, a warning system-wide;
- `-v` names the path taken.
"""
import errno
import json
import resource
import subprocess
import sys

import pytest

from ebpf_cuda.bpf import features, uprobe
from ebpf_cuda import session
from ebpf_cuda.errors import AttachError, UnsupportedKernelError
from ebpf_cuda.decode.events import EXIT
from ebpf_cuda.tracer import Tracer
from fakecuda import SEED_FUNCTIONS
from helpers import REPO, cli_env, trace_command

pytestmark = pytest.mark.kernel

NO_GROUP_DEAD = """
from ebpf_cuda.bpf import tracepoints
_real = tracepoints.find_all
def _find_all(wanted):
    return [p._replace(fields={k: v for k, v in p.fields.items() if k != "group_dead"})
            for p in _real(wanted)]
tracepoints.find_all = _find_all
"""
NO_UPROBE_MULTI = """
import ebpf_cuda.bpf.features
ebpf_cuda.bpf.features._cache["uprobe_multi"] = False
"""
NO_TASK_FIELDS = """
import ebpf_cuda.bpf.features
ebpf_cuda.bpf.features._cache["task_fields"] = None
"""
MULTI_REFUSED = """
import errno
from ebpf_cuda import session
from ebpf_cuda.errors import AttachError
def _refuse(*args, **kwargs):
    raise AttachError("creating a uprobe_multi link failed: refused", errno.EINVAL)
session.attach_uprobe_multi = _refuse
"""


def run_patched(patches: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """`ebpf-cuda ARGS` in a Python that first runs `patches` (the kernel made to look
    older)."""
    script = patches + "\nimport sys\nfrom ebpf_cuda.cli.main import main\nmain(sys.argv[1:])\n"
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=cli_env(), cwd=str(REPO),
                          stdin=subprocess.DEVNULL)


def exits_by_pid(path) -> dict:
    counts: dict = {}
    with open(path) as f:
        for line in f:
            event = json.loads(line)
            if event.get("phase") == "exit":
                counts[event["pid"]] = counts.get(event["pid"], 0) + 1
    return counts


def pid_of(stdout: str, who: str) -> int:
    line = next(line for line in stdout.splitlines() if line.startswith(who + " pid="))
    return int(line.split("=", 1)[1])


# -- following processes without group_dead ----------------------------------------------


@pytest.mark.parametrize("patches", [NO_GROUP_DEAD, NO_GROUP_DEAD + NO_UPROBE_MULTI],
                         ids=["uprobe_multi", "perf_links"])
def test_children_are_followed_without_group_dead(root, robust, tmp_path, patches):
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_patched(patches, "-v", "--json", "-o", out, "--functions", "cudaMemcpy", "--",
                       prog, "fork", 300, 200)
    assert done.returncode == 0, done.stderr
    assert "when its leader thread exits" in done.stderr
    assert "not traced" not in done.stderr
    assert exits_by_pid(out) == {pid_of(done.stdout, "child"): 300,
                                 pid_of(done.stdout, "parent"): 200}


def test_threads_of_a_followed_process_are_traced_without_group_dead(root, robust, tmp_path):
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_patched(NO_GROUP_DEAD, "--json", "-o", out, "--functions", "cudaMemcpy", "--",
                       prog, "threads", 4, 50)
    assert done.returncode == 0, done.stderr
    assert sum(exits_by_pid(out).values()) == 200


# -- task_struct's fields ----------------------------------------------------------------


@pytest.mark.parametrize("mode", [[], ["-r"]], ids=["returns", "entries-only"])
@pytest.mark.parametrize("patches", ["", NO_TASK_FIELDS], ids=["task_fields", "helpers"])
def test_records_carry_pids_and_comm_read_either_way(root, robust, tmp_path, patches, mode):
    """pid, tid and comm loaded through the task's pointer (features.task_fields), or, on a
    kernel whose BTF does not give them, by the helpers: the same in every record."""
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_patched(patches, *mode, "--json", "-o", out, "--functions", "cudaMemcpy",
                       "--", prog, "fork", 30, 20)
    assert done.returncode == 0, done.stderr
    with open(out) as f:
        events = [json.loads(line) for line in f]
    phase = "enter" if mode else "exit"
    counts: dict = {}
    for event in events:
        if event["phase"] == phase:
            counts[event["pid"]] = counts.get(event["pid"], 0) + 1
            assert event["tid"] == event["pid"], event  # (one thread a process)
            assert event["comm"] == prog.name[:15], event
    assert counts == {pid_of(done.stdout, "child"): 30, pid_of(done.stdout, "parent"): 20}


# -- attach paths ------------------------------------------------------------------------


def test_v_names_the_kernel_features_and_the_attach_path(root, robust, tmp_path):
    _, prog = robust
    done = run_patched("", "-v", "-o", tmp_path / "t", "--functions", "cudaMemcpy", "--",
                       prog, "threads", 1, 3)
    assert done.returncode == 0, done.stderr
    assert "ring buffer yes" in done.stderr and "uprobe_multi " in done.stderr
    assert "attach path: " + uprobe.PATHS[uprobe.attach_path()] in done.stderr
    done = run_patched(NO_UPROBE_MULTI, "-v", "-o", tmp_path / "t", "--functions",
                       "cudaMemcpy", "--", prog, "threads", 1, 3)
    assert done.returncode == 0, done.stderr
    expected = uprobe.PERF_LINK if uprobe.perf_links_supported() else uprobe.PERF_IOCTL
    assert "attach path: " + uprobe.PATHS[expected] in done.stderr


COUNT_FD_RAISES = """
import atexit, sys
from ebpf_cuda import syscalls
_raised = []
def _raise_fd_limit(_real=syscalls.raise_fd_limit):
    _raised.append(_real())
    return _raised[-1]
syscalls.raise_fd_limit = _raise_fd_limit
atexit.register(lambda: sys.stderr.write("fd limit raised %d times\\n" % sum(_raised)))
"""


def test_perf_uprobes_past_the_soft_fd_limit_raise_it(root, fake, tmp_path):
    """Perf-event uprobes take two descriptors each, their programs one or two (6.1: the
    quick start passed the usual soft limit of 1024, and the limit was not raised: importing
    `resource` at that moment needed a descriptor too, and program loads, which run beside
    the attaches, did not try). Under a soft limit of 128 the default set of the stand-in
    runtime (64 functions: ~440 descriptors) is loaded and attached anyway, and traced."""
    lib, prog = fake
    out = tmp_path / "trace.jsonl"
    script = (NO_UPROBE_MULTI + COUNT_FD_RAISES +
              "\nimport sys\nfrom ebpf_cuda.cli.main import main\nmain(sys.argv[1:])\n")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip("a hard descriptor limit of %d: no room to raise the soft one" % hard)
    done = subprocess.run(["prlimit", "--nofile=128:%s" % (
                               "unlimited" if hard == resource.RLIM_INFINITY else hard),
                           sys.executable, "-c", script,
                           "-v", "--json", "-o", str(out), "-p", str(lib), "--", str(prog),
                           "malloc:4000", "memcpy:4000:1", "free"],
                          capture_output=True, text=True, timeout=300, env=cli_env(),
                          cwd=str(REPO), stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    perf = uprobe.PERF_LINK if uprobe.perf_links_supported() else uprobe.PERF_IOCTL
    assert "attach path: " + uprobe.PATHS[perf] in done.stderr
    raised = int(done.stderr.split("fd limit raised ")[1].split()[0])
    assert raised >= 1, done.stderr
    with open(out) as f:
        exits = [e["api"] for e in map(json.loads, f) if e["phase"] == "exit"]
    assert exits == ["cudaMalloc", "cudaMemcpy", "cudaFree"]


def test_a_low_locked_memory_limit_is_raised_for_the_tracer_not_the_command(root, fake,
                                                                           tmp_path):
    """Kernels before 5.11 charge maps and programs to RLIMIT_MEMLOCK (5.10 refused the ring
    buffer with EPERM under the usual 8 MiB): the tracer raises it and tries again; the
    command it starts still gets the limit it was given (here 64 KiB)."""
    lib, prog = fake
    out, limits = tmp_path / "trace.jsonl", tmp_path / "limits"
    inner = 'grep "Max locked memory" /proc/self/limits > %s; exec "$@"' % limits
    done = subprocess.run(["prlimit", "--memlock=65536:65536", sys.executable, "-m",
                           "ebpf_cuda", "--json", "-o", str(out), "-p", str(lib), "--",
                           "sh", "-c", inner, "sh", str(prog), "malloc:4000", "free"],
                          capture_output=True, text=True, timeout=300, env=cli_env(),
                          cwd=str(REPO), stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    with open(out) as f:
        exits = [e["api"] for e in map(json.loads, f) if e["phase"] == "exit"]
    assert exits == ["cudaMalloc", "cudaFree"]
    assert limits.read_text().split()[3:5] == ["65536", "65536"]


def test_refused_uprobe_multi_link_falls_back_to_perf_uprobes(root, robust, tmp_path):
    if not uprobe.uprobe_multi_supported():
        pytest.skip("no uprobe_multi on this kernel: nothing to fall back from")
    _, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_patched(MULTI_REFUSED, "-v", "--json", "-o", out, "--functions",
                       "cudaMemcpy,cudaGetDevice", "--", prog, "fork", 30, 20)
    assert done.returncode == 0, done.stderr
    assert "uprobe_multi link refused" in done.stderr
    assert exits_by_pid(out) == {pid_of(done.stdout, "child"): 30,
                                 pid_of(done.stdout, "parent"): 20}


def test_shared_programs_keep_their_function_ids_through_perf_links(root, fake, monkeypatch):
    """Programs loaded for uprobe_multi (shared by functions of one shape, the function id
    from the cookie) attached as perf-event uprobes when the link is refused: each call
    still carries its own function."""
    if not uprobe.uprobe_multi_supported():
        pytest.skip("no uprobe_multi on this kernel")
    if not uprobe.perf_links_supported():
        pytest.skip("no perf-event links: cookies need them")
    lib, prog = fake

    def refuse(*args, **kwargs):
        raise AttachError("creating a uprobe_multi link failed: refused", errno.EINVAL)

    monkeypatch.setattr(session, "attach_uprobe_multi", refuse)
    with Tracer(library=[str(lib)], functions=list(SEED_FUNCTIONS)) as tracer:
        assert len({id(p) for p in tracer.programs.values()}) < len(tracer.programs)  # shared
        assert {a.api for a in tracer.attachments} == set(SEED_FUNCTIONS)
    ops = ["malloc:4000", "getdevice", "setdevice:1", "streamcreate", "free"]
    events, calls, tracer = trace_command([prog, *ops], library=[str(lib)],
                                          functions=list(SEED_FUNCTIONS))
    exits = [e for e in events if e.phase == EXIT]
    assert [e.api for e in exits] == [c.fn for c in calls]
    assert tracer.stats_at_end == {"lost": 0, "unpaired": 0, "too_deep": 0, "entries_lost": 0}


# -- the uretprobe / seccomp hazard ------------------------------------------------------


def test_the_hazard_probe_answers_on_this_kernel(root):
    assert isinstance(features.uretprobe_syscall_filtered(), bool)
    assert features.seccomp_mode() in (0, 1, 2)


@pytest.fixture
def hazard(monkeypatch):
    """This kernel made to look like one whose seccomp filters see the uretprobe call, this
    process like one under a filter."""
    monkeypatch.setattr(features, "uretprobe_syscall_filtered", lambda: True)
    monkeypatch.setattr(features, "seccomp_mode", lambda pid=None: 2)


def test_return_probes_are_refused_for_a_filtered_command(root, fake, hazard):
    lib, prog = fake
    tracer = Tracer(command=[str(prog), "getdevice"], library=[str(lib)],
                    functions=["cudaGetDevice"])
    with pytest.raises(UnsupportedKernelError) as info:
        tracer.start()
    tracer.close()
    assert "seccomp" in str(info.value) and "-r" in str(info.value)
    events, calls, _ = trace_command([prog, "getdevice"], library=[str(lib)],
                                     functions=["cudaGetDevice"], return_probes=False)
    assert [e.api for e in events] == ["cudaGetDevice"] == [c.fn for c in calls]


def test_system_wide_tracing_warns_of_the_hazard(root, fake, hazard):
    lib, _ = fake
    with Tracer(library=[str(lib)], functions=["cudaGetDevice"]) as tracer:
        assert any("seccomp" in failure for failure in tracer.failures)


def test_refusal_sentence_names_the_process(monkeypatch):
    monkeypatch.setattr(features, "uretprobe_syscall_filtered", lambda: True)
    monkeypatch.setattr(features, "seccomp_mode", lambda pid=None: 2 if pid == 42 else 0)
    assert "process 42" in features.return_probe_hazard(42, False)
    assert features.return_probe_hazard(None, True) is None  # this process: no filter
    monkeypatch.setattr(features, "uretprobe_syscall_filtered", lambda: False)
    assert features.return_probe_hazard(42, False) is None
    assert features.return_probe_hazard(None, False) is None


# -- the probes themselves ---------------------------------------------------------------


def test_feature_probes_agree_with_what_the_tracer_uses(root):
    features.forget()
    assert features.ring_buffer() is True  # every event goes through it
    assert features.task_storage() == (features.task_storage_reason() is None)
    if features.task_storage():
        assert features.kernel_btf()
    if uprobe.uprobe_multi_supported():
        assert uprobe.perf_links_supported() and features.attach_cookies()
    line = features.report()
    for name in ("ring buffer", "BTF", "task storage", "uprobe_multi", "uprobe PMU",
                 "perf-event links", "cookies", "uprobe sessions"):
        assert name in line
