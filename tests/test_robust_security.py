"""Security properties of the command (docs/robustness.md has the threat model).

- Output files are created with the invoking user's umask (mode 0666 & ~umask).
- As root, a symbolic link owned by another user is never followed for writing (the /tmp
  symlink attack: someone plants /tmp/trace.txt -> /etc/shadow and waits for root's -o); links
  of our own or of root are followed; a link swapped in after the check fails (O_NOFOLLOW).
- The package never runs code from the traced files and reads the traced process's memory only
  through BPF helpers: checked here on its source (no dlopen of traced files, no ptrace,
  /proc/PID/mem or process_vm_readv; the only programs started are the user's command and the
  system's `ldconfig -p`).
"""
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from ebpf_cuda.errors import UsageError
from helpers import REPO
from test_robust_support import run_cli

NOBODY = 65534


def _trace_to(robust, output, umask=None) -> subprocess.CompletedProcess:
    lib, prog = robust
    preexec = (lambda: os.umask(umask)) if umask is not None else None
    return run_cli(["-p", lib, "--functions", "cudaMemcpy", "-o", output, "--", prog,
                    "threads", 1, 3], preexec_fn=preexec)


@pytest.mark.kernel
@pytest.mark.parametrize("umask, mode", [(0o077, 0o600), (0o022, 0o644), (0o027, 0o640)])
def test_output_file_mode_follows_the_umask(root, robust, tmp_path, umask, mode):
    out = tmp_path / "trace.txt"
    done = _trace_to(robust, out, umask)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert out.read_text().count("cudaMemcpy") == 6


@pytest.mark.kernel
def test_symlink_of_another_user_is_refused(root, robust, tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    link = tmp_path / "trace.txt"
    link.symlink_to(precious)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    done = _trace_to(robust, link)
    assert done.returncode == UsageError.exit_code
    assert done.stderr.splitlines() == [done.stderr.strip()] and "symbolic link" in done.stderr
    assert "uid %d" % NOBODY in done.stderr
    assert precious.read_text() == "keep me\n"


@pytest.mark.kernel
def test_dangling_symlink_of_another_user_creates_nothing(root, robust, tmp_path):
    target = tmp_path / "created-by-root"
    link = tmp_path / "trace.txt"
    link.symlink_to(target)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    done = _trace_to(robust, link)
    assert done.returncode == UsageError.exit_code
    assert not target.exists()


@pytest.mark.kernel
def test_own_symlink_is_followed(root, robust, tmp_path):
    target = tmp_path / "real.txt"
    link = tmp_path / "trace.txt"
    link.symlink_to(target)
    done = _trace_to(robust, link)
    assert done.returncode == 0, done.stderr
    assert target.read_text().count("cudaMemcpy") == 6


@pytest.mark.kernel
def test_dev_stdout_still_works(root, robust):
    """/dev/stdout is a link owned by root: allowed."""
    done = _trace_to(robust, "/dev/stdout")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("cudaMemcpy") >= 6


def _package_sources():
    return sorted((REPO / "ebpf_cuda").rglob("*.py"))


def _code_lines(path: Path):
    for number, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        if code.strip():
            yield number, code


def test_no_way_to_read_target_memory_but_bpf_helpers():
    forbidden = re.compile(r"process_vm_readv|ptrace|/mem\b|PTRACE_")
    hits = ["%s:%d" % (p.name, n) for p in _package_sources() for n, code in _code_lines(p)
            if forbidden.search(code)]
    assert hits == []


def test_only_the_users_command_and_ldconfig_are_run():
    """Programs started by the package: the command given after `--` (command.py) and the
    system's `ldconfig -p` (discovery.py); building the zipapp (bundle.py, never a trace)
    runs its own interpreter, sys.executable, to list a start's imports. Libraries loaded with ctypes: libc, the C++
    runtime's demangler and the driver's NVML (gpu/nvml.py, and gpu/__init__.py's check that it
    loads: by its soname, in the host's driver folders, or the user's --nvml PATH), never a
    traced file."""
    runs = re.compile(r"\bsubprocess\.(run|Popen|call|check_output|check_call)\b|"
                      r"\bos\.(exec\w*|system|popen|spawn\w*|posix_spawn\w*)\b")
    found = sorted({p.name for p in _package_sources() for _, code in _code_lines(p)
                    if runs.search(code)})
    assert found == ["bundle.py", "command.py", "discovery.py"]
    bundle = (REPO / "ebpf_cuda" / "bundle.py").read_text()
    assert len(runs.findall(bundle)) == 1 and "subprocess.run([sys.executable, " in bundle
    loads = [(p.name, code.strip()) for p in _package_sources() for _, code in _code_lines(p)
             if "CDLL(" in code]
    assert all(re.search(r"CDLL\((None|name)\b", code) or (name, code) in (
        ("nvml.py", "return ctypes.CDLL(candidate), candidate"),
        ("__init__.py", "ctypes.CDLL(candidate)"))  # (gpu/: nvml_findable, the same search)
        for name, code in loads), loads


@pytest.mark.kernel
def test_save_refuses_a_symlink_of_another_user(root, robust, tmp_path):
    lib, prog = robust
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    link = tmp_path / "trace.save"
    link.symlink_to(precious)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    done = run_cli(["-p", lib, "--functions", "cudaMemcpy", "--save", link, "-o", os.devnull,
                    "--", prog, "threads", 1, 3])
    if "No such option" in done.stderr:
        pytest.skip("no --save option")
    assert done.returncode == UsageError.exit_code, done.stderr
    assert "symbolic link" in done.stderr and precious.read_text() == "keep me\n"
