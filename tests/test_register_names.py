"""Kernel names decided in the kernel, not by racing the process: nvcc's start-up code
registers each kernel (`__cudaRegisterFunction(handle, stub, name, name, ...)`), the probe
stores the name under (pid, stub) while the call's memory is there, and launches of that stub
are named from it: in stripped binaries, and for processes that exit right after launching,
however loaded the machine and however late the reader runs."""
import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import cli_env, trace_command

pytestmark = pytest.mark.kernel

MANGLED = "_Z14vec_add_kernelPKfS0_Pfi"
DEMANGLED = "vec_add_kernel(float const*, float const*, float*, int)"


@pytest.fixture(scope="module")
def stripped(fake, tmp_path_factory):
    """The driver program without its symbol table: vec_add_kernel has no symbol left."""
    _, prog = fake
    out = tmp_path_factory.mktemp("stripped") / "cuda_driver_prog"
    shutil.copy(prog, out)
    subprocess.run(["strip", "--strip-all", str(out)], check=True)
    assert b"vec_add_kernel" not in subprocess.run(["nm", "-D", str(out)], capture_output=True
                                                   ).stdout
    return out


def _launch_names(events, tracer):
    return [tracer.names.name_for(e.pid, e.api, e.args["func"]) for e in events
            if e.api == "cudaLaunchKernel" and e.phase == "exit"]


def test_the_registration_names_the_launch_and_wins_over_the_symbol(root, fake):
    lib, prog = fake
    events, calls, tracer = trace_command(
        [prog, "register:" + MANGLED, "launch:2:64"], library=[str(lib)],
        functions=["__cudaRegisterFunction", "cudaLaunchKernel"])
    (register,) = [e for e in events if e.api == "__cudaRegisterFunction" and e.phase == "exit"]
    assert register.args == {"stub": int(calls[0].fields["stub"], 16)}
    assert register.ret == 0 and register.outs["kernel_name"] == MANGLED  # a void call
    assert _launch_names(events, tracer) == [DEMANGLED]  # the symbol says "vec_add_kernel"


def test_a_stripped_program_is_named_by_its_registration(root, fake, stripped):
    lib, _ = fake
    events, _, tracer = trace_command([stripped, "register:" + MANGLED, "launch:2:64"],
                                      library=[str(lib)])
    assert _launch_names(events, tracer) == [DEMANGLED]


def test_without_registration_a_stripped_program_says_why(root, fake, stripped):
    lib, _ = fake
    events, _, tracer = trace_command([stripped, "launch:2:64"], library=[str(lib)])
    assert _launch_names(events, tracer) == [None]
    assert tracer.unnamed_launches() == ("not named: 1 launches of 1 kernels at addresses no "
                                         "symbol names")


@pytest.mark.parametrize("runs", [30, pytest.param(100, marks=pytest.mark.slow)])
def test_short_lived_processes_traced_system_wide_have_every_launch_named(root, fake,
                                                                          stripped, tmp_path,
                                                                          runs):
    """A stripped program registers, launches and exits at once, `runs` times, with two
    busy loops beside it: every launch named, whenever the reader gets to it."""
    RUNS = runs
    lib, _ = fake
    out = tmp_path / "t.jsonl"
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "--json", "-o", str(out),
                               "-p", str(lib)], stderr=subprocess.PIPE, text=True,
                              env=cli_env())
    try:
        assert "probing" in tracer.stderr.readline()
        for _ in range(RUNS):
            subprocess.run([str(stripped), "register:" + MANGLED, "launch:2:64"],
                           capture_output=True, check=True, timeout=30)
        time.sleep(0.3)
    finally:
        tracer.send_signal(signal.SIGINT)
        _, stderr = tracer.communicate(timeout=60)
        for loop in busy:
            loop.kill()
    assert tracer.returncode == 0, stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    launches = [e for e in events if e["api"] == "cudaLaunchKernel" and e["phase"] == "exit"]
    assert len(launches) == RUNS and len({e["pid"] for e in launches}) == RUNS
    assert [e.get("kernel") for e in launches] == [DEMANGLED] * RUNS
    assert "not named" not in stderr


def test_a_trace_counts_the_names_its_names_map_let_go(root, fake, monkeypatch):
    """A trace of a burst of 5,000 registrations with a names map of 256 entries: every
    registration's exit event arrives, the names the map let go before the reader came to
    them are the trace's `names_lost`, and the others carry their names."""
    from ebpf_cuda.spec import layout

    monkeypatch.setattr(layout, "name_entries", lambda ring_size: 256)
    lib, prog = fake
    events, _, tracer = trace_command([prog, "registermany:5000:64"], library=[str(lib)],
                                      functions=["__cudaRegisterFunction"])
    exits = [e for e in events if e.api == "__cudaRegisterFunction" and e.phase == "exit"]
    named = [e for e in exits if e.outs.get("kernel_name")]
    losses = tracer.losses()
    assert len(exits) + losses.ring_full == 5000
    assert losses.names_lost > 0 and len(named) + losses.names_lost == len(exits)
    assert ("%d kernel names lost" % losses.names_lost) in losses.sentence()
