"""Shared pieces of the robustness tests (issue 8), and checks of the workload itself.

The `robust` fixture (conftest.py, helpers.build_robust) builds tests/native/robust_stub.c as
a libcudart.so.12 stand-in whose functions never touch their pointer arguments, and
tests/native/robust_load.c (the workloads) linked against it. Helpers run the real
`ebpf-cuda` command in a subprocess, read its JSON Lines output, and list the kernel's BPF
links (to prove that no probe outlives the tracer).
"""
import ctypes
import json
import os
import select
import signal
import struct
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Sequence

from ebpf_cuda import syscalls
from ebpf_cuda.errors import KernelError
import helpers
from helpers import cli_argv, cli_env

CLI = cli_argv()
BPF_LINK_GET_FD_BY_ID = 30
BPF_LINK_GET_NEXT_ID = 31
STUB_FUNCTIONS = ("cudaMemcpy", "cudaGetDevice", "cudaMalloc", "cudaFree", "cudaSetDevice")


class Workload:
    """A stdin-driven workload process (`robust_load bursts`, `robust_dlopen PATH`)."""

    def __init__(self, argv: Sequence[str], **kwargs) -> None:
        self.proc = subprocess.Popen([str(a) for a in argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, **kwargs)
        ready = read_line(self.proc.stdout, 10)
        assert ready.startswith("ready pid="), ready
        self.pid = self.proc.pid

    def ask(self, line: str, timeout: float = 60) -> str:
        """Sends one line and returns the workload's answer."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return read_line(self.proc.stdout, timeout).strip()

    def calls(self, count: int, timeout: float = 60) -> None:
        answer = self.ask(str(count), timeout)
        assert answer.startswith("done %d" % count), answer

    def finish(self, timeout: float = 30) -> int:
        """Closes stdin (the workload exits) and returns its exit status."""
        self.proc.stdin.close()
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout: float = 60):
    """Signals a started tracer and returns (exit status, stdout, stderr)."""
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def run_cli(args: Sequence[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Runs `ebpf-cuda ARGS` to completion (helpers.run_cli, the arguments as one list)."""
    return helpers.run_cli(*args, timeout=timeout, **kwargs)


def start_cli(args: Sequence[str], **kwargs) -> subprocess.Popen:
    """Starts `ebpf-cuda ARGS` and returns once its probes are attached (the start line)."""
    kwargs.setdefault("env", cli_env())
    proc = subprocess.Popen([*CLI, *map(str, args)], stdout=kwargs.pop("stdout", subprocess.PIPE),
                            stderr=subprocess.PIPE, text=True, **kwargs)
    line = read_line(proc.stderr, 30)
    if "probing" not in line:
        proc.kill()
        raise AssertionError("tracer did not start: %r %s" % (line, proc.stderr.read()))
    return proc


def read_line(stream, timeout: float) -> str:
    """One line from a pipe, or AssertionError after `timeout` seconds."""
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        raise AssertionError("no line within %g s" % timeout)
    return stream.readline()


def json_events(path: Path) -> List[dict]:
    """The events of a JSON Lines trace file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def exits(events: List[dict], api: str = "cudaMemcpy") -> List[dict]:
    """Exit events of one function (one per complete call)."""
    return [e for e in events if e["phase"] == "exit" and e["api"] == api]


def lost_from_stderr(stderr: str) -> int:
    """The number in the CLI's `N events lost` line (0 when there is none)."""
    for line in stderr.splitlines():
        if "events lost" in line:
            return int(line.split("ebpf-cuda: ", 1)[1].split()[0])
    return 0


def _next_link_id(start: int) -> Optional[int]:
    attr = ctypes.create_string_buffer(16)
    struct.pack_into("<I", attr, 0, start)
    res, _ = syscalls.bpf_raw(BPF_LINK_GET_NEXT_ID, attr)
    return None if res < 0 else struct.unpack_from("<I", attr, 4)[0]


def links_on(path: Path) -> List[syscalls.LinkInfo]:
    """Every uprobe BPF link in the kernel (any process) whose file is `path`. Kernels before
    6.6 do not say which file a perf-event link probes (`details`): there every perf-event
    link of an ebpf-cuda program (named cuda*) counts."""
    real, found, link_id = os.path.realpath(path), [], 0
    while True:
        link_id = _next_link_id(link_id)
        if link_id is None:
            return found
        attr = ctypes.create_string_buffer(16)
        struct.pack_into("<I", attr, 0, link_id)
        fd, _ = syscalls.bpf_raw(BPF_LINK_GET_FD_BY_ID, attr)
        if fd < 0:
            continue  # went away meanwhile
        try:
            info = syscalls.link_info(fd)
        except KernelError:
            continue
        finally:
            os.close(fd)
        if info.path == real or (not info.details and _ours(info)):
            found.append(info)


BPF_PROG_GET_FD_BY_ID = 13


def _ours(info: syscalls.LinkInfo) -> bool:
    """A perf-event link of an ebpf-cuda program."""
    if info.type != syscalls.BPF_LINK_TYPE_PERF_EVENT:
        return False
    attr = ctypes.create_string_buffer(16)
    struct.pack_into("<I", attr, 0, info.prog_id)
    fd, _ = syscalls.bpf_raw(BPF_PROG_GET_FD_BY_ID, attr)
    if fd < 0:
        return False
    try:
        return syscalls.prog_info(fd).name.startswith("cuda")
    except KernelError:
        return False
    finally:
        os.close(fd)


def wait_for(predicate, timeout: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


# -- the workload itself, untraced --------------------------------------------------------


def test_stub_exports_the_functions(robust):
    lib, _ = robust
    from ebpf_cuda.targets.elf import open_elf
    assert set(STUB_FUNCTIONS) <= set(open_elf(str(lib)).functions())


def test_workload_threads_untraced(robust):
    _, prog = robust
    out = subprocess.run([str(prog), "threads", "4", "1000"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    assert "made=4000" in out and out.count("tid=") == 4


def test_badptrs_untraced(robust):
    _, prog = robust
    out = subprocess.run([str(prog), "badptrs"], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    assert out.count("ret=0") == 9 and "device=7" in out and "ptr=0x1234" in out
