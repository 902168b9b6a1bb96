"""The right file in the right process: a library is probed at a path that reaches the file
the process maps — through /proc/PID/root when the process sees another mount namespace,
through /proc/PID/map_files when the file was replaced or deleted since — and one file is
probed once, however many paths reach it."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from helpers import cli_env, slowdown

pytestmark = pytest.mark.kernel
# ~100 s of calls (40 a second; within one `sh -c` string's limit): the target runs until
# the test ends it, once the tracer has traced a while
OPS = ["malloc:64", "free", "sleep:25"] * 4000


def _attach_and_count(proc: subprocess.Popen, tmp_path, *extra) -> dict:
    """`ebpf-cuda --json -d PID`, the process ended 1.5 s (times the machine's slowness)
    after the tracer's probes are on (its first line: an emulated machine starts it slowly):
    the tracer's exit status, stderr, and the exit events by function."""
    out = tmp_path / "t.jsonl"
    tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "--json", "-o", str(out),
                               "--functions", "cudaMalloc,cudaFree", "-d", str(proc.pid),
                               *extra], stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        first = tracer.stderr.readline()  # "probing ...": the probes are on
        time.sleep(1.5 * slowdown())
    finally:
        proc.kill()
        proc.wait()
    stderr = first + tracer.communicate(timeout=120)[1]
    counts = {}
    if out.exists():
        for line in out.read_text().splitlines():
            event = json.loads(line)
            if event["phase"] == "exit":
                counts[event["api"]] = counts.get(event["api"], 0) + 1
    return {"rc": tracer.returncode, "stderr": stderr, "counts": counts}


def _in_own_mount_namespace(lib, prog, where: str) -> subprocess.Popen:
    """The program in a new mount namespace where `where` is a tmpfs holding the stand-in
    runtime (found there through LD_LIBRARY_PATH); nothing of it is visible to the host."""
    script = ("mount -t tmpfs none {w} && cp {lib} {w}/ && exec env LD_LIBRARY_PATH={w} {prog} "
              "{ops}").format(w=where, lib=lib, prog=prog, ops=" ".join(OPS))
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             script], stdout=subprocess.DEVNULL)


def _wait_mapped(pid: int, name: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/maps" % pid) as f:
                if name in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.02)
    pytest.fail("the process never mapped %s" % name)


def test_a_library_only_inside_the_process_mount_namespace(root, fake, tmp_path):
    lib, prog = fake
    where = tmp_path / "ctr"  # exists on the host, empty: the namespace mounts over it
    where.mkdir()
    proc = _in_own_mount_namespace(lib, prog, str(where))
    try:
        _wait_mapped(proc.pid, str(where / "libcudart.so.12"))
        assert not (where / "libcudart.so.12").exists()  # not on the host
        done = _attach_and_count(proc, tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert done["rc"] in (0, 137), done["stderr"]
    assert "/proc/%d/root" % proc.pid in done["stderr"]
    assert done["counts"].get("cudaMalloc", 0) > 20
    assert abs(done["counts"]["cudaMalloc"] - done["counts"].get("cudaFree", 0)) <= 1


def test_a_different_file_at_the_same_path_on_the_host_is_not_probed(root, fake, tmp_path):
    lib, prog = fake
    where = tmp_path / "ctr"
    where.mkdir()
    impostor = where / "libcudart.so.12"
    shutil.copy(lib, impostor)  # the host's file at that path: another inode
    proc = _in_own_mount_namespace(lib, prog, str(where))
    try:
        _wait_mapped(proc.pid, str(impostor))
        done = _attach_and_count(proc, tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert "/proc/%d/root" % proc.pid in done["stderr"], done["stderr"]
    assert done["counts"].get("cudaMalloc", 0) > 20


def test_a_library_replaced_on_disk_while_mapped_is_still_probed(root, fake, tmp_path):
    lib, prog = fake
    folder = tmp_path / "upgraded"
    folder.mkdir()
    shutil.copy(lib, folder / "libcudart.so.12")
    env = dict(os.environ, LD_LIBRARY_PATH=str(folder))
    proc = subprocess.Popen([str(prog), *OPS], stdout=subprocess.DEVNULL, env=env)
    try:
        _wait_mapped(proc.pid, str(folder / "libcudart.so.12"))
        newer = folder / "libcudart.so.12.new"
        shutil.copy(lib, newer)
        os.replace(newer, folder / "libcudart.so.12")  # an upgrade renames over the file
        done = _attach_and_count(proc, tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert "/proc/%d/map_files/" % proc.pid in done["stderr"], done["stderr"]
    assert done["counts"].get("cudaMalloc", 0) > 20


def test_one_file_through_two_paths_is_probed_once(root, fake, tmp_path):
    lib, prog = fake
    link = tmp_path / "link.so"
    link.symlink_to(lib)
    hard = tmp_path / "hard.so"
    os.link(lib, hard)
    out = tmp_path / "t.jsonl"
    done = subprocess.run([sys.executable, "-m", "ebpf_cuda", "--json", "-o", str(out), "-p",
                           str(lib), "-p", str(link), "-p", str(hard), "--functions",
                           "cudaMalloc", "--", str(prog), "malloc:64", "malloc:64"],
                          capture_output=True, text=True, env=cli_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    exits = [json.loads(l) for l in out.read_text().splitlines() if '"exit"' in l]
    assert len(exits) == 2  # each call once
