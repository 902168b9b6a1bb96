"""Runtimes loaded after the trace began: a traced process (the command's, -d PID's) that
dlopens a CUDA library from a folder the start-up search never saw has it probed as its
dynamic loader maps it (a uprobe on _dl_debug_state, late_loads.py), one probe set per
file however often it is loaded. tests/native/late_dlopen.c is the program."""
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from fakecuda import device_ptr
from helpers import REPO, cli_argv, cli_env, run_cli, slowdown
from records import pack_frame
from ebpf_cuda import late_loads
from ebpf_cuda.decode import notices
from ebpf_cuda.probes.loader import LOADER_MARK
from ebpf_cuda.targets import late_files, loaders
from ebpf_cuda.spec import record

LATE = re.compile(r"probed late: (\S+) \(\d+ functions\), mapped by process (\d+).*?"
                  r"(?:probes on ([\d.]+) ms after its loader's notice)?$", re.M)


@pytest.fixture(scope="session")
def late_prog(cc):
    return cc.executable("late_dlopen.c", "late_dlopen", extra=["-ldl"])


@pytest.fixture(scope="session")
def static_module(cc):
    """The stand-in runtime and late_module.c in one library exporting module_* alone."""
    from conftest import NATIVE
    from fakecuda import LIB_FLAGS

    script = cc.outdir / "late_module.map"
    script.write_text("{\n  global: module_*;\n  local: *;\n};\n")
    flags = [f for f in LIB_FLAGS if not f.startswith("-Wl,-soname")]
    return cc.shared("fakecudart.c", "late_module.so",
                     extra=[str(NATIVE / "late_module.c"), *flags,
                            "-Wl,--version-script=" + str(script)])


@pytest.fixture
def folder(lib, tmp_path):
    """A folder only the program's command line names, holding a copy of the stand-in."""
    where = tmp_path / "vendored" / "lib"
    where.mkdir(parents=True)
    shutil.copy(lib, where / "libcudart.so.12")
    return where


def _exits(out) -> list:
    events = [json.loads(line) for line in out.read_text().splitlines()]
    return [e for e in events if e["phase"] == "exit" and e["api"] == "cudaMalloc"]


def _late_lines(stderr: str) -> list:
    return LATE.findall(stderr)


# -- kernel-backed -------------------------------------------------------------------------

@pytest.mark.kernel
def test_a_runtime_dlopened_from_a_folder_named_at_run_time_is_probed(root, late_prog,
                                                                      folder, tmp_path):
    out = tmp_path / "t.jsonl"
    done = run_cli("-v", "--json", "-o", out, "--functions", "cudaMalloc", "--", late_prog,
                   folder, 500, 1, 300)
    assert done.returncode == 0, done.stderr
    start = [l for l in done.stderr.splitlines() if l.startswith("ebpf-cuda: probing")]
    assert start and str(folder) not in start[0]  # the start-up search did not know it
    late = _late_lines(done.stderr)
    assert [path for path, _, _ in late] == [str(folder / "libcudart.so.12")]
    # the late file's return probe goes on before its entry (session._link_groups says why)
    lines = done.stderr.splitlines()
    after = next(i for i, l in enumerate(lines) if "probing %s" % (folder / "libcudart.so.12")
                 in l)
    kinds = [l.split()[0] for l in lines[after:] if l.strip().startswith(("uprobe ", "uretprobe "))]
    assert kinds[:2] == ["uretprobe", "uprobe"], lines[after:]
    exits = _exits(out)
    assert [e["args"]["size"] for e in exits] == list(range(1, 501))
    assert {e["pid"] for e in exits} == {int(late[0][1])}
    assert all(e["ret"] == 0 for e in exits)
    assert [e["ptr"] for e in exits] == [device_ptr(k) for k in range(500)]


@pytest.mark.kernel
def test_calls_right_after_the_dlopen_are_seen_once_the_probes_are_on(root, late_prog,
                                                                      folder, tmp_path):
    """No pause after the dlopen: the calls made before the probes went on are not seen
    (nothing can count them); every call from the first seen on is, to the last."""
    calls, spacing_us = 6000, 50  # 300 ms of calls
    out = tmp_path / "t.jsonl"
    done = run_cli("-v", "--json", "-o", out, "--functions", "cudaMalloc", "--", late_prog,
                   folder, calls, 1, 0, 200, spacing_us)
    assert done.returncode == 0, done.stderr
    sizes = [e["args"]["size"] for e in _exits(out)]
    assert sizes, done.stderr
    first = sizes[0]
    assert sizes == list(range(first, calls + 1))  # a contiguous run to the last call
    missed_ms = (first - 1) * spacing_us / 1000
    assert missed_ms < 150, "probes on %.1f ms after the dlopen" % missed_ms
    late = _late_lines(done.stderr)
    assert len(late) == 1 and late[0][2], done.stderr
    print("late probe: first call seen %.1f ms after the dlopen; the tracer says %s ms after "
          "the loader's notice" % (missed_ms, late[0][2]))


@pytest.mark.kernel
def test_a_runtime_inside_a_library_of_another_name_is_probed(root, late_prog, folder,
                                                              static_module, tmp_path):
    """As CuPy's extension modules carry the runtime statically (runtime.cpython-*.so, the
    runtime's functions local symbols): found by its symbols, not its name."""
    module = folder / "runtime.cpython-312-x86_64-linux-gnu.so"
    shutil.copy(static_module, module)
    out = tmp_path / "t.jsonl"
    done = run_cli("-v", "--json", "-o", out, "--functions", "cudaMalloc", "--", late_prog,
                   module, 300, 1, 300)
    assert done.returncode == 0, done.stderr
    assert [path for path, _, _ in _late_lines(done.stderr)] == [str(module)]
    assert [e["args"]["size"] for e in _exits(out)] == list(range(1, 301))


@pytest.mark.kernel
def test_a_running_process_traced_by_pid_has_its_later_runtime_probed(root, late_prog,
                                                                       folder, tmp_path):
    out = tmp_path / "t.jsonl"
    # The dlopen comes 3 s after the start (times the machine's slowness: the tracer starts
    # in seconds under emulation): the tracer is on by then.
    delay_ms = int(3000 * slowdown())
    proc = subprocess.Popen([str(late_prog), str(folder), "400", "1", "300", str(delay_ms)],
                            stdout=subprocess.PIPE, text=True)
    try:
        done = run_cli("-v", "--json", "-o", out, "--functions", "cudaMalloc", "-d", proc.pid)
        printed = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    assert done.returncode == 0, done.stderr
    assert "opened 0" in printed and "called 0 400" in printed
    late = _late_lines(done.stderr)
    assert [(path, int(pid)) for path, pid, _ in late] == \
        [(str(folder / "libcudart.so.12"), proc.pid)]
    assert late[0][2]  # from a loader notice, not the scan at the start
    exits = _exits(out)
    assert [e["args"]["size"] for e in exits] == list(range(1, 401))
    assert {e["pid"] for e in exits} == {proc.pid}


@pytest.mark.kernel
def test_a_library_dlopened_again_after_dlclose_has_one_probe_set(root, late_prog, folder,
                                                                  tmp_path):
    from ebpf_cuda.tracer import Tracer

    logs = []
    rounds, calls = 3, 200
    tracer = Tracer(command=[str(late_prog), str(folder), str(calls), str(rounds), "300"],
                    functions=["cudaMalloc"], log=logs.append)
    try:
        with open(os.devnull, "w") as null:
            saved = os.dup(1)
            os.dup2(null.fileno(), 1)
            try:
                tracer.start()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
        exits = [e for e in tracer.events(timeout=30) if e.phase == "exit"]
        assert tracer.exit_status == 0
        path = str(folder / "libcudart.so.12")
        late = [m for m in logs if m.startswith("probed late: %s " % path)]
        assert len(late) == 1, logs
        assert [(p, pid) for p, pid, _ in tracer.late_loads] == [(path, tracer.child_pid)]
        sets = [(a.api, a.retprobe) for a in tracer.attachments if a.path == path]
        assert sorted(sets) == [("cudaMalloc", False), ("cudaMalloc", True)]
        assert tracer.session.late.watch.links  # (the loader is watched)
    finally:
        tracer.close()
    # Each call once (a second probe set would show every call twice).
    assert [e.args["size"] for e in exits] == [(r << 20) + s + 1 for r in range(rounds)
                                               for s in range(calls)]


@pytest.mark.kernel
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_the_tracer_in_a_pid_namespace_probes_a_later_runtime(root, late_prog, folder,
                                                              tmp_path):
    """The notice carries the pid as the tracer's namespace numbers it: the one whose
    /proc/PID/maps the reader reads there."""
    out = tmp_path / "t.jsonl"
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *cli_argv(
        "-v", "--json", "-o", out, "--functions", "cudaMalloc", "--", late_prog, folder, 300,
        1, 300)], capture_output=True, text=True, env=cli_env(), cwd=str(REPO), timeout=60)
    assert done.returncode == 0, done.stderr
    late = _late_lines(done.stderr)
    assert [path for path, _, _ in late] == [str(folder / "libcudart.so.12")], done.stderr
    exits = _exits(out)
    assert [e["args"]["size"] for e in exits] == list(range(1, 301))
    assert {e["pid"] for e in exits} == {int(late[0][1])}


@pytest.mark.kernel
def test_notices_a_full_ring_cannot_take_are_counted(root, late_prog, folder):
    """Nothing drains a one-page ring while the process dlopens and dlcloses 40 times: the
    notices in the ring and those counted as lost add up to every consistent link map."""
    from ebpf_cuda.bpf.maps import RingBufMap
    from ebpf_cuda.bpf.ringbuf import RingBuffer

    rounds = 40
    proc = subprocess.Popen([str(late_prog), str(folder), "0", str(rounds), "0", "1000"],
                            stdout=subprocess.DEVNULL)
    try:
        with RingBufMap(4096, name="events") as ring:
            watch = late_loads.LoaderWatch({"events": ring}, pid=proc.pid)
            try:
                assert watch.watch(loaders.process_loader(proc.pid))
                assert proc.wait(30) == 0
                lost = watch.lost_since()
                assert watch.lost_since() == 0  # (counted once)
                reader = RingBuffer(ring.fd, 4096)
                frames = reader.drain_frames(record.SIZE)
                reader.close()
            finally:
                watch.close()
    finally:
        proc.kill()
        proc.wait()
    marks = record.frame_column(frames, record.ARGS, "Q")
    pids = set(record.frame_column(frames, record.PID_TGID + 4, "I"))
    kept = marks.count(LOADER_MARK)
    assert kept == len(marks) and pids == {proc.pid}
    assert lost > 0 and kept + lost == 2 * rounds - 1  # each dlopen, each dlclose but the last


OLDER_KERNEL = """
import ebpf_cuda.bpf.features
ebpf_cuda.bpf.features._cache["uprobe_multi"] = False
ebpf_cuda.bpf.features._cache["perf_links"] = %s
"""


@pytest.mark.kernel
@pytest.mark.parametrize("perf_links", [True, False], ids=["perf-links", "perf-ioctl"])
def test_a_later_runtime_is_probed_on_the_older_attach_paths(root, late_prog, folder,
                                                             tmp_path, perf_links):
    """Perf-event uprobes (before 6.6); without perf-event links (before 5.15) there are no
    cookies: every call of the loader's hook is told of, not only consistent link maps."""
    out = tmp_path / "t.jsonl"
    script = OLDER_KERNEL % perf_links + \
        "import sys\nfrom ebpf_cuda.cli.main import main\nmain(sys.argv[1:])\n"
    done = subprocess.run([sys.executable, "-c", script, "-v", "--json", "-o", str(out),
                           "--functions", "cudaMalloc", "--", str(late_prog), str(folder),
                           "200", "2", "300"], capture_output=True, text=True, timeout=60,
                          env=cli_env(), cwd=str(REPO), stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert ("told of consistent link maps" in done.stderr) == perf_links, done.stderr
    assert len(_late_lines(done.stderr)) == 1
    assert [e["args"]["size"] for e in _exits(out)] == [(r << 20) + s + 1 for r in range(2)
                                                       for s in range(200)]


@pytest.mark.kernel
def test_files_named_with_p_are_all_that_is_probed(root, late_prog, folder, lib, tmp_path):
    """-p names the files: nothing is added to them (the loader is not watched)."""
    out = tmp_path / "t.jsonl"
    done = run_cli("-v", "--json", "-o", out, "-p", lib, "--functions", "cudaMalloc", "--",
                   late_prog, folder, 50, 1, 300)
    assert done.returncode == 0, done.stderr
    assert "watching the dynamic loader" not in done.stderr
    assert _late_lines(done.stderr) == [] and _exits(out) == []


# -- pure logic ----------------------------------------------------------------------------

def _frame(fn_id: int, phase: int, pid: int, first_cell: int, ts: int) -> bytes:
    return pack_frame(fn_id, ts, (first_cell,), exit_ts=0, phase=phase, pid=pid, comm=b"x")


def test_loader_notices_are_told_from_hello_records_and_calls():
    frames = b"".join([
        _frame(record.HELLO_FN, record.PHASE_HELLO, 10, 0, 1),  # a thread's hello
        _frame(record.HELLO_FN, record.PHASE_HELLO, 11, LOADER_MARK, 2),
        _frame(3, record.PHASE_CALL, 12, LOADER_MARK, 3),  # a call's argument
        _frame(record.HELLO_FN, record.PHASE_HELLO, 11, LOADER_MARK, 4),
        _frame(record.HELLO_FN, record.PHASE_HELLO, 13, LOADER_MARK, 5),
    ])
    assert notices.notice_times(frames) == {11: 2, 13: 5}
    assert record.call_count(frames) == 1  # notices are no calls


def test_the_interpreter_of_a_program_and_of_a_script(late_prog, tmp_path):
    loader = loaders.interpreter_of(str(late_prog))
    assert loader and os.path.basename(loader).startswith("ld-linux")
    script = tmp_path / "run.sh"
    script.write_text("#!%s\necho\n" % shutil.which("sh"))
    script.chmod(0o755)
    assert late_files.identity(loaders.interpreter_of(str(script))) == \
        late_files.identity(loader)
    assert loaders.interpreter_of(str(tmp_path)) is None


def test_cuda_files_are_told_by_their_names():
    names = ["libcudart.so.12", "libcudart-1a2b3c4d.so.12", "libcuda.so.1", "libnccl.so.2",
             "libcudnn.so.9", "libcuda_helper.so", "libcudart_static.a"]
    kinds = {kind: [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]
             for kind, patterns in late_files.PATTERNS.items()}
    assert kinds == {"runtime": ["libcudart.so.12", "libcudart-1a2b3c4d.so.12"],
                     "driver": ["libcuda.so.1"], "nccl": ["libnccl.so.2"]}


def test_a_runtime_carried_privately_is_told_from_one_imported_or_exported(
        lib, static_module, late_prog):
    assert late_files.may_carry_runtime(str(static_module))  # .symtab alone names it
    assert not late_files.may_carry_runtime(str(lib))  # exported: .dynsym names it
    assert not late_files.may_carry_runtime(str(late_prog))  # no runtime at all
    assert not late_files.may_carry_runtime("/nonexistent")


def test_a_string_table_is_searched_in_pieces_of_one_buffer():
    """late_files._holds reads a table through one reused buffer, keeping the tail of each
    piece for a marker that lies across two: the same answer as a search of the whole, at
    every place a marker may lie, in pieces of 7, 16 and 1 MiB; never past the table."""
    import io

    markers = [b"\0cudaMalloc\0", b"\0cudaGetDevice\0"]
    filler = b"".join(b"_Z%dfunction_name\0" % i for i in range(40))
    for at in range(0, len(filler), 5):
        for marker in (b"cudaMalloc\0", b"cudaGetDevice\0", b"cudaMallocX\0", b"xcudaMalloc\0"):
            table = filler[:at] + b"\0" + marker + filler[at:]
            data = b"junk" + table[1:] + b"\0cudaMalloc\0"  # (a marker after the table)
            whole = any(m in table for m in markers)
            for piece in (7, 16, 1 << 20):
                stream = io.BytesIO(data)
                assert late_files._holds(stream, 4, len(table) - 1, markers, piece) == whole
    assert not late_files._holds(io.BytesIO(b""), 0, 10, markers)
    assert late_files._holds(io.BytesIO(b"cudaMalloc\0"), 0, 11, markers)  # (the first NUL)
