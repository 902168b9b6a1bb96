"""Bad input: one line on stderr, the exit code of the error's class, never a traceback.

Each case runs the real `ebpf-cuda` command in a subprocess. The exit codes come from the
classes in ebpf_cuda/errors.py, so a test fails if a case ends in the wrong class.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import pytest
from elftools.elf.elffile import ELFFile

from ebpf_cuda import syscalls
from ebpf_cuda.targets.elf import open_elf
from ebpf_cuda.errors import (AttachError, ElfError, KernelError, NoCudaSymbolsError,
                              PrivilegeError, ProcessError, UnsupportedKernelError, UsageError)
from helpers import cli_env
from test_robust_support import run_cli

NO_CUDA_C = "int main(void) { return 0; }\n"


def assert_one_line(done: subprocess.CompletedProcess, exit_code: int, *words: str) -> str:
    """The run failed with `exit_code` and exactly one `ebpf-cuda: ...` line on stderr."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ebpf-cuda: "), lines[0]
    assert done.returncode == exit_code, (done.returncode, done.stderr)
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def files(cc, robust, tmp_path_factory):
    """Bad inputs of every kind, made once."""
    lib, _ = robust
    folder = tmp_path_factory.mktemp("bad_inputs")
    nocuda = cc.from_text(NO_CUDA_C, "nocuda")
    stripped = folder / "stripped"
    shutil.copy(nocuda, stripped)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True)
    text = folder / "notes.txt"
    text.write_text("not an ELF file\n")
    header_only = folder / "header_only.so"
    header_only.write_bytes(lib.read_bytes()[:100])
    cut = folder / "cut.so"
    cut.write_bytes(lib.read_bytes()[:3000])
    elf32 = folder / "elf32"
    # A 32-bit little-endian i386 executable's ELF header (52 bytes), then zeros.
    elf32.write_bytes(b"\x7fELF\x01\x01\x01" + bytes(9)
                      + struct.pack("<HHIIIIIHHHHHH", 2, 3, 1, 0, 0, 0, 0, 52, 0, 0, 40, 0, 0)
                      + bytes(4096))
    return {"lib": lib, "nocuda": nocuda, "stripped": stripped, "text": text,
            "header_only": header_only, "cut": cut, "elf32": elf32, "dir": folder}


@pytest.mark.kernel
@pytest.mark.parametrize("case, args, error, words", [
    ("missing", ["-p", "/nonexistent/libcudart.so.12"], ElfError, ["no such file"]),
    ("directory", ["-p", "{dir}"], ElfError, ["directory"]),
    ("not elf", ["-p", "{text}"], ElfError, ["not an ELF file"]),
    ("truncated header", ["-p", "{header_only}"], ElfError, ["truncated"]),
    ("truncated", ["-p", "{cut}"], ElfError, ["truncated"]),
    ("32-bit", ["-p", "{elf32}"], ElfError, ["32-bit"]),
    ("stripped", ["-p", "{stripped}"], ElfError, ["stripped"]),
    ("no cuda", ["-p", "{nocuda}"], NoCudaSymbolsError, ["none"]),
    ("unknown function", ["-p", "{lib}", "--functions", "cudaNoSuchThing"], UsageError,
     ["cudaNoSuchThing"]),
    ("pid and command", ["-d", "1", "--", "true"], UsageError, ["PID or a command"]),
    ("-r and --entries", ["-r", "--entries", "-p", "{lib}"], UsageError, ["--entries", "-r"]),
    ("bad ring size", ["-p", "{lib}", "--ring-size", "3000"], UsageError, ["power of two"]),
    ("ring size text", ["-p", "{lib}", "--ring-size", "lots"], UsageError, ["bad size"]),
    ("unwritable output", ["-p", "{lib}", "-o", "/nonexistent/dir/trace.txt"], UsageError,
     ["cannot write"]),
    ("output is a directory", ["-p", "{lib}", "-o", "{dir}"], UsageError, ["cannot write"]),
    ("no such command", ["--", "/nonexistent/program"], ElfError, ["no such file"]),
])
def test_bad_input(root, files, case, args, error, words):
    done = run_cli([arg.format(**files) for arg in args], timeout=30,
                   stdin=subprocess.DEVNULL)
    assert_one_line(done, error.exit_code, *words)


def test_exit_codes_are_distinct():
    classes = [UsageError, PrivilegeError, UnsupportedKernelError, AttachError, ElfError,
               NoCudaSymbolsError, ProcessError]
    assert len({c.exit_code for c in classes}) == len(classes)
    assert all(c.exit_code not in (0, 1) for c in classes)


@pytest.mark.kernel
def test_pid_that_does_not_exist(root):
    with open("/proc/sys/kernel/pid_max") as f:
        never = int(f.read()) + 1
    assert_one_line(run_cli(["-d", never]), ProcessError.exit_code, str(never))


@pytest.fixture
def public_lib(files):
    """A copy of the stub library that user nobody can read (pytest's folders are 0700)."""
    folder = tempfile.mkdtemp(prefix="ebpf-cuda-public-")
    os.chmod(folder, 0o755)
    lib = os.path.join(folder, "libcudart.so.12")
    shutil.copy(files["lib"], lib)
    os.chmod(lib, 0o644)
    yield lib
    shutil.rmtree(folder)


@pytest.mark.kernel
def test_non_root_user_is_told_which_capabilities(root, public_lib):
    """Started as root, the child drops to nobody (65534) before the CLI runs: the python under
    /root cannot be run by nobody directly."""
    lib = public_lib
    # nobody cannot read this Python's library under /root either: what click imports on
    # first use (locale for gettext, difflib for option errors) is imported before the
    # privileges go. (No pyelftools: the files are read with struct, elf_raw.py.)
    script = ("import os, sys\n"
              "import ebpf_cuda.cli.main, difflib, locale\n"
              "os.setgroups([]); os.setresgid(65534, 65534, 65534)\n"
              "os.setresuid(65534, 65534, 65534)\n"
              "ebpf_cuda.cli.main.main(sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-c", script, "-p", str(lib), "--functions",
                           "cudaMemcpy"], capture_output=True, text=True, timeout=30,
                          env=cli_env(), cwd="/", stdin=subprocess.DEVNULL)
    assert_one_line(done, PrivilegeError.exit_code, "CAP_BPF", "CAP_PERFMON")


@pytest.mark.kernel
def test_kernel_without_uprobe_pmu(root, files):
    """EBPF_CUDA_SYSFS_UPROBE points the PMU lookup at a missing folder. uprobe_multi links
    (Linux 6.6+) need no PMU, so the tracer is also made to believe the kernel lacks them, as
    an older kernel would: then it must say the PMU is missing, in one line, exit code 7."""
    script = ("import sys\n"
              "import ebpf_cuda.bpf.features\n"
              "ebpf_cuda.bpf.features._cache['uprobe_multi'] = False  # as on a kernel before 6.6\n"
              "from ebpf_cuda.cli.main import main\n"
              "main(sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-c", script, "-p", str(files["lib"])],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                          env=cli_env(EBPF_CUDA_SYSFS_UPROBE="/nonexistent"))
    assert_one_line(done, UnsupportedKernelError.exit_code, "uprobe", "/nonexistent")


@pytest.mark.kernel
def test_missing_pmu_does_not_matter_with_uprobe_multi(root, files):
    """On this kernel the tracer attaches with uprobe_multi links, which need no PMU."""
    from ebpf_cuda.bpf.uprobe import uprobe_multi_supported
    if not uprobe_multi_supported():
        pytest.skip("no uprobe_multi on this kernel")
    proc = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "-p", str(files["lib"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=cli_env(EBPF_CUDA_SYSFS_UPROBE="/nonexistent"))
    try:
        assert "probing" in proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0


def _semaphore_offset(lib) -> int:
    """File offset of robust_stub.c's `robust_semaphore` (a harmless ref_ctr_offset)."""
    with open(lib, "rb") as f:
        symbol = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name(
            "robust_semaphore")[0]
    return open_elf(str(lib)).vaddr_to_offset(symbol["st_value"])


@pytest.fixture
def conflicting_probe(files):
    """Another tracer's uprobe on cudaMemcpy with a reference counter (as a USDT probe with a
    semaphore has): the kernel refuses any other probe there with a different one (EINVAL)."""
    lib = str(files["lib"])
    offset = open_elf(lib).symbol_offset("cudaMemcpy")
    # A tracer an earlier test ran may still be detaching (its forked closer lets go after
    # the tracer exits), and its probe there has no reference counter: wait for it to go.
    deadline = time.monotonic() + 20
    while True:
        try:
            fd = syscalls.perf_event_open_uprobe(lib, offset,
                                                 ref_ctr_offset=_semaphore_offset(lib))
            break
        except KernelError as e:
            if "EINVAL" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    syscalls.perf_event_enable(fd.value)
    yield
    fd.close()


@pytest.mark.kernel
def test_probe_refused_by_the_kernel_is_named_and_the_rest_traced(root, robust, files,
                                                                  conflicting_probe, tmp_path):
    lib, prog = robust
    out = tmp_path / "trace.jsonl"
    done = run_cli(["-p", lib, "--functions", "cudaMemcpy,cudaGetDevice", "--json", "-o", out,
                    "--", prog, "badptrs"])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings and all("cudaMemcpy" in line and "EINVAL" in line for line in warnings)
    assert out.read_text().count('"api":"cudaGetDevice","phase":"exit"') == 7


@pytest.mark.kernel
def test_every_probe_refused_is_one_line(root, files, conflicting_probe):
    done = run_cli(["-p", files["lib"], "--functions", "cudaMemcpy"], timeout=30)
    assert_one_line(done, AttachError.exit_code, "cudaMemcpy", "EINVAL")


@pytest.mark.kernel
def test_root_that_may_not_inspect_the_process_is_told_why(root):
    """Root without CAP_SYS_PTRACE may not read another process's maps: "run as root" would
    be no help."""
    from ebpf_cuda.errors import ProcessError

    done = subprocess.run(["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace",
                           sys.executable, "-m", "ebpf_cuda", "-d", "1"], capture_output=True,
                          text=True, timeout=30, env=cli_env(), stdin=subprocess.DEVNULL)
    line = assert_one_line(done, ProcessError.exit_code, "process 1", "CAP_SYS_PTRACE")
    assert "run as root" not in line
