"""Kernel names decided in the kernel, not by racing the process: nvcc's start-up code
registers each kernel (`__cudaRegisterFunction(handle, stub, name, name, ...)`), the probe
stores the name under (pid, stub) while the call's memory is there, and launches of that stub
are named from it: in stripped binaries, and for processes that exit right after launching,
however loaded the machine and however late the reader runs."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ebpf_cuda.spec import layout
from ebpf_cuda.tracer import Tracer
from helpers import cli_env, stdout_to, trace_command

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


def test_a_trace_counts_exactly_the_names_its_names_map_let_go(root, fake, monkeypatch):
    """A burst of 5,000 registrations whose names are on the program's stack (in no file),
    with a names map of 256 entries, read once the program has ended: the names the map
    still holds are exactly those named (each its own), every other one is counted lost,
    with its cause (the map let it go)."""
    monkeypatch.setattr(layout, "name_entries", lambda ring_size: 256)
    lib, prog = fake
    tracer = Tracer(command=[str(prog), "registermany:5000:64"], library=[str(lib)],
                    functions=["__cudaRegisterFunction"])
    try:
        with stdout_to(os.devnull):
            tracer.start()
        tracer.run()
        assert tracer.session.command.wait() == 0
        held = {layout.NAME_KEY.unpack(raw)[1:] for raw in tracer.session.maps[layout.NAMES]
                .keys()}  # (handle, time) of each name whole in the map (one chunk each)
        events = list(tracer.events(timeout=30))
        losses = tracer.losses()
    finally:
        tracer.close()
    exits = [e for e in events if e.api == "__cudaRegisterFunction" and e.phase == "exit"]
    assert len(exits) == 5000 and losses.ring_full == 0
    first = min(e.args["stub"] for e in exits)
    named = {(e.args["stub"], e.ts_ns): e.outs["kernel_name"] for e in exits
             if e.outs.get("kernel_name")}
    assert set(named) == held and 0 < len(held) <= 256
    assert all(name == _many_name(stub - first) for (stub, _), name in named.items())
    assert (losses.names_lost, losses.names_unread) == (5000 - len(held), 0)
    assert losses.sentence() == (
        "%d kernel names lost: %d let go by the probes' names map before the reader came to "
        "their calls (try --ring-size: the map grows with the ring)" % ((5000 - len(held),) * 2))


def _many_name(i: int) -> str:
    """The name of cuda_driver_prog's registermany:N:64's i-th registration."""
    head = "_Z6k%08dv" % i
    return head + "x" * (64 - len(head))


# -- an import burst: names in a library's .rodata (tests/native/register_burst.c) -----------

BURST = 30000
BURST_PAD = ("_padded_as_a_template_instance_name_is_in_a_framework_library_so_that_"
             "every_name_takes_two_of_the_probes_name_chunks_of_255_bytes_"
             "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789"
             "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz_end")


def _burst_name(i: int) -> str:
    return "burst_kernel_%d%s" % (10000 + i, BURST_PAD)


@pytest.fixture(scope="module")
def burst(cc, fake):
    """(the stand-in runtime, burst_app): a program linked with a library whose constructor
    registers 30,000 kernels, names of 326 bytes in its .rodata."""
    lib, _ = fake
    folder = str(Path(lib).resolve().parent)
    shared = cc.shared("register_burst.c", "libregister_burst.so",
                       extra=["-L", folder, "-l:" + Path(lib).name, "-Wl,-rpath," + folder])
    assert (_burst_name(0) + "\0").encode() in shared.read_bytes()
    app = cc.executable("burst_app.c", "burst_app",
                        extra=["-L", str(shared.parent), "-lregister_burst",
                               "-Wl,-rpath," + str(shared.parent)])
    return lib, app


LAUNCHED = [4, 100, 29999]


def _trace_burst(lib, app):
    events, _, tracer = trace_command(
        [app, *LAUNCHED], library=[str(lib)], ring_size=32 << 20,
        functions=["__cudaRegisterFunction", "cudaLaunchKernel"])
    registered = [e.outs.get("kernel_name") for e in events
                  if e.api == "__cudaRegisterFunction" and e.phase == "exit"]
    return registered, _launch_names(events, tracer), tracer


def test_an_import_burst_is_named_whole_from_the_file_its_names_lie_in(root, burst):
    """30,000 registrations in a burst (PyTorch's import), their names in pages of the
    library not mapped in yet: the probe can read none of them (on the GPU host: "20014
    kernel names lost"); the reader reads each in the file, where it lies. Every
    registration and every launch is named, and nothing is said lost."""
    registered, launched, tracer = _trace_burst(*burst)
    losses = tracer.losses()
    assert registered == [_burst_name(i) for i in range(BURST)]
    assert launched == [_burst_name(i) for i in LAUNCHED]
    assert (losses.ring_full, losses.names_lost, losses.sentence()) == (0, 0, "")
    assert tracer.names.names_from_files == BURST  # (every one unreadable to the probe)
    assert tracer.unnamed_launches() is None


def test_names_the_names_map_let_go_are_read_from_their_file(root, burst, monkeypatch):
    """The same burst with every name read by the program first (the probe reads them
    all) and a names map of 256 entries, far fewer than the burst: what the map let go
    before the reader came to it is read in the file; none lost."""
    monkeypatch.setattr(layout, "name_entries", lambda ring_size: 256)
    monkeypatch.setenv("BURST_READ_NAMES", "1")
    registered, launched, tracer = _trace_burst(*burst)
    losses = tracer.losses()
    assert registered == [_burst_name(i) for i in range(BURST)]
    assert launched == [_burst_name(i) for i in LAUNCHED]
    assert (losses.ring_full, losses.names_lost, losses.sentence()) == (0, 0, "")
    assert 0 < tracer.names.names_from_files < BURST  # (the map held some, let most go)
