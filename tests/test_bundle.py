"""The one-file zipapp: what it holds, that it runs with a bare python3 (a fresh virtual
environment without pip, isolated mode, no site), traces the stand-in, and is importable."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ebpf_cuda import bundle

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "ebpf-cuda.pyz"
    subprocess.run([sys.executable, "-m", "ebpf_cuda.bundle", "-o", str(out)], check=True,
                   cwd=str(REPO), capture_output=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """The python of a fresh virtual environment with no pip and nothing installed."""
    env = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   timeout=120)
    python = str(env / "bin" / "python3")
    missing = subprocess.run([python, "-I", "-S", "-c", "import click"], capture_output=True)
    assert missing.returncode != 0  # nothing but the standard library
    return python


def run(python: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-I", "-S", *args], capture_output=True, text=True,
                          timeout=120)


def test_holds_the_package_its_dependencies_and_a_main(pyz):
    with zipfile.ZipFile(str(pyz)) as archive:
        names = set(archive.namelist())
    assert {"__main__.py", "ebpf_cuda/cli.py", "ebpf_cuda/asm/assemble.py",
            "elftools/elf/elffile.py", "click/core.py"} <= names
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]
    assert any(n.startswith("licenses/click/") for n in names)
    assert any(n.startswith("licenses/pyelftools/") for n in names)
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert os.stat(str(pyz)).st_mode & 0o111


def test_builds_are_reproducible(pyz, tmp_path):
    again = tmp_path / "again.pyz"
    bundle.build(str(again))
    assert again.read_bytes() == pyz.read_bytes()


def test_runs_with_a_bare_python(pyz, bare_python):
    done = run(bare_python, str(pyz), "--list-functions")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "cudaMalloc"
    helped = run(bare_python, str(pyz), "report", "--help")
    assert helped.returncode == 0 and "FILE" in helped.stdout


def test_errors_keep_their_exit_codes(pyz, bare_python):
    done = run(bare_python, str(pyz), "report", "/nonexistent/file")
    assert done.returncode == 2 and "cannot read" in done.stderr


def test_importable_as_a_vendored_library(pyz, bare_python):
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import ebpf_cuda\n"
            "assert 'click' not in sys.modules\n"
            "from elftools.elf.elffile import ELFFile\n"
            "print(ebpf_cuda.Tracer.__module__, ebpf_cuda.__file__)\n" % str(pyz))
    done = run(bare_python, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ebpf_cuda.tracer", str(pyz / "ebpf_cuda" / "__init__.py")]


def test_traces_the_stand_in_with_a_bare_python(root, cc, pyz, bare_python):
    from fakecuda import build_fake_cuda, device_ptr

    _, prog = build_fake_cuda(cc)
    done = run(bare_python, str(pyz), "-t", "--", str(prog), "malloc:4000", "free")
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if " cuda" in line]
    traced = [(words[2], words[3]) for words in lines if words[2].startswith("cuda")]
    assert traced == [("cudaMalloc", "[ENTER]"), ("cudaMalloc", "[EXIT]"),
                      ("cudaFree", "[ENTER]"), ("cudaFree", "[EXIT]")]
    assert "ptr=0x%x" % device_ptr(0) in done.stdout


def test_missing_dependency_is_reported(tmp_path):
    with pytest.raises(ImportError, match="no_such_package"):
        bundle.build(str(tmp_path / "x.pyz"), packages=("no_such_package",))
