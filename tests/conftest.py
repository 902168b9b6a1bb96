"""Shared fixtures: building small C programs and libraries with gcc; the `kernel` marker.

Tests that load BPF programs, create maps, attach probes or run the tracer are marked
`kernel` (setup.cfg registers the markers): they are skipped unless running as root, and
`pytest -m "not kernel"` runs only the pure-logic tests. A test that requests the `root`
fixture is marked `kernel` too, in case its module forgot. Helpers that are not fixtures
are in helpers.py.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT_REASON, build_robust, is_root, need_root

NATIVE = Path(__file__).parent / "native"


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skipif(not is_root(), reason=ROOT_REASON)
    for item in items:
        if "root" in item.fixturenames and item.get_closest_marker("kernel") is None:
            item.add_marker(pytest.mark.kernel)
        if item.get_closest_marker("kernel") is not None:
            # First, before other skipif conditions (which may ask the kernel something).
            item.add_marker(skip, append=False)


@pytest.fixture(scope="session", autouse=True)
def _own_cache_home(tmp_path_factory):
    """The suite's caches (programs, tracepoints, BTF, zipapp folders) in a folder of its
    own, not the user's: a suite's ~1,000 trace configurations would otherwise stay in the
    program cache that the user's later starts read."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture
def root():
    """Skip the test unless running as root (and mark it `kernel`)."""
    need_root()


class Builder:
    """Compiles C sources from tests/native (or inline text) into a per-session folder."""

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir

    def _src(self, source) -> Path:
        path = NATIVE / source
        if path.exists():
            return path
        raise FileNotFoundError(path)

    def _stale(self, out: Path, source: str) -> bool:
        """Not built yet, or built before its source changed (the benches keep their
        builds in a fixed folder across checkouts)."""
        return not out.exists() or out.stat().st_mtime < self._src(source).stat().st_mtime

    def shared(self, source: str, name: str, extra=()) -> Path:
        """Build tests/native/<source> as lib<name>.so; returns its path."""
        out = self.outdir / name
        if self._stale(out, source):
            subprocess.run(["gcc", "-O2", "-g", "-shared", "-fPIC", "-fno-omit-frame-pointer",
                            "-o", str(out), str(self._src(source)), *extra], check=True)
        return out

    def executable(self, source: str, name: str, extra=()) -> Path:
        """Build tests/native/<source> as an executable; `extra` may add -L/-l/-Wl,-rpath flags."""
        out = self.outdir / name
        if self._stale(out, source):
            subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", str(out),
                            str(self._src(source)), *extra], check=True)
        return out

    def from_text(self, text: str, name: str, shared: bool = False, extra=()) -> Path:
        """Build inline C text; for one-off programs in a single test."""
        src = self.outdir / (name + ".c")
        src.write_text(text)
        out = self.outdir / name
        flags = ["-shared", "-fPIC"] if shared else []
        subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", *flags, "-o", str(out),
                        str(src), *extra], check=True)
        return out


@pytest.fixture(scope="session")
def cc(tmp_path_factory) -> Builder:
    """A gcc builder whose outputs live for the whole test session."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    return Builder(tmp_path_factory.mktemp("native"))


# The stand-in libcudart (tests/native/fakecudart.c) and the program that drives it, built once.
@pytest.fixture(scope="session")
def fake(cc):
    from fakecuda import build_fake_cuda

    return build_fake_cuda(cc)


@pytest.fixture(scope="session")
def lib(fake):
    return fake[0]


@pytest.fixture(scope="session")
def prog(fake):
    return fake[1]


# The robustness tests' stub runtime and workloads (test_robust_support.py).
@pytest.fixture(scope="session")
def robust(cc):
    """(stub libcudart.so.12, robust_load program): see helpers.build_robust."""
    return build_robust(cc)


@pytest.fixture(scope="session")
def dlopener(cc) -> Path:
    """tests/native/robust_dlopen.c: loads a library by path only when told to."""
    return cc.executable("robust_dlopen.c", "robust/robust_dlopen", extra=["-ldl"])
