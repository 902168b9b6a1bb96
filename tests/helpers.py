"""Helpers shared by the test modules (fixtures are in conftest.py).

- `need_root()`: the one root check (the `kernel` marker and the `root` fixture use it);
- `cli_env`, `cli_argv`, `run_cli`: the `ebpf-cuda` command (`python3 -m ebpf_cuda`) of this
  checkout in a subprocess;
- `stdout_to`, `trace_command`: a command traced by a `Tracer` to its end, its output kept;
- `event`: an `Event` as the decoder makes it, for the pure-logic tests of its consumers;
- `gcc`: compile with gcc (the test skips where gcc is missing); `build_robust`: the
  robustness tests' stub runtime and workload (the `robust` fixture).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from ebpf_cuda.decode.events import EXIT, Event

REPO = Path(__file__).resolve().parent.parent
ROOT_REASON = "needs root (CAP_BPF, CAP_PERFMON)"


def is_root() -> bool:
    return os.geteuid() == 0


def need_root() -> None:
    """Skip (from a fixture of any scope too) unless running as root."""
    if not is_root():
        pytest.skip(ROOT_REASON)


# -- the command ------------------------------------------------------------------------------

def cli_env(**extra: str) -> Dict[str, str]:
    """This environment with the checkout first on PYTHONPATH, and `extra` variables."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def cli_argv(*args) -> List[str]:
    """`python3 -m ebpf_cuda ARGS` (each argument made a string)."""
    return [sys.executable, "-m", "ebpf_cuda", *map(str, args)]


def run_cli(*args, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Runs `ebpf-cuda ARGS` to completion: stdout and stderr captured as text, stdin empty,
    in the repository root with `cli_env()`; other keyword arguments go to subprocess.run."""
    kwargs.setdefault("env", cli_env())
    kwargs.setdefault("cwd", str(REPO))
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(cli_argv(*args), capture_output=True, text=True, timeout=timeout,
                          **kwargs)


# -- tracing in this process ------------------------------------------------------------------

@contextmanager
def stdout_to(path: str) -> Iterator[None]:
    """Point fd 1 at `path` while a command is forked, so its output can be read back."""
    saved = os.dup(1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 1)  # the command inherits this stdout when it is forked
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(fd)


def trace_command(argv: Sequence[object], timeout: float = 30, **options) -> Tuple[list, list,
                                                                                  object]:
    """Runs `argv` under a `Tracer(command=argv, **options)` to its end; (events, the lines the
    program printed as `fakecuda.Call`s, the closed tracer with `stats_at_end` set)."""
    from ebpf_cuda.tracer import Tracer
    from fakecuda import parse_output

    with tempfile.NamedTemporaryFile("r", suffix=".out") as out:
        tracer = Tracer(command=[str(a) for a in argv], **options)
        try:
            with stdout_to(out.name):
                tracer.start()
            events = list(tracer.events(timeout=timeout))
            tracer.stats_at_end = tracer.stats()  # type: ignore[attr-defined]
        finally:
            tracer.close()
        return events, parse_output(out.read()), tracer


# -- events -----------------------------------------------------------------------------------

def event(api: str, phase: str = EXIT, args: Optional[dict] = None, ts_ns: int = 10**9,
          ts: Optional[float] = None, pid: int = 4242, tid: Optional[int] = None,
          comm: str = "app", **exit_fields) -> Event:
    """An Event of `api`: `ts` (wall clock) is `ts_ns` in seconds unless given, `tid` the
    `pid`; `exit_fields` (ret, ret_name, duration_ns, outs, faults, stack_id) as given."""
    return Event(ts_ns / 1e9 if ts is None else ts, ts_ns, pid, pid if tid is None else tid,
                 comm, api, phase, dict(args or {}), **exit_fields)


# -- building ---------------------------------------------------------------------------------

def gcc(*args: str) -> None:
    """gcc -O2 -g ARGS (output captured); skips the test where gcc is not installed."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    subprocess.run(["gcc", "-O2", "-g", *args], check=True, capture_output=True)


def build_robust(cc) -> Tuple[Path, Path]:
    """(stub libcudart.so.12, robust_load program), in their own folder of the session: the
    stub's functions never touch their pointer arguments (tests/native/robust_stub.c)."""
    from fakecuda import LIB_FLAGS

    folder = cc.outdir / "robust"
    folder.mkdir(exist_ok=True)
    lib = cc.shared("robust_stub.c", "robust/libcudart.so.12", extra=list(LIB_FLAGS))
    prog = cc.executable("robust_load.c", "robust/robust_load",
                         extra=["-L", str(folder), "-l:libcudart.so.12",
                                "-Wl,-rpath," + str(folder), "-lpthread"])
    return lib, prog


def slowdown() -> float:
    """How many times slower than a 2-core VM this machine runs Python (this loop: ~16 ms
    there): ~1 on real machines, tens under emulation (the kernel matrix's TCG guests)."""
    best = float("inf")
    for _ in range(3):
        start, total = time.perf_counter(), 0
        for i in range(200000):
            total += i
        best = min(best, time.perf_counter() - start)
    return max(1.0, best / 0.016)


def pyelftools_tags(tables) -> tuple:
    """(needed, soname, rpath, runpath) of pyelftools' dynamic sections `tables`: the
    reference the tracer's own ELF reader is checked against."""
    needed, soname, rpath, runpath = [], None, [], []
    for table in tables:
        for tag in table.iter_tags():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                needed.append(tag.needed)
            elif kind == "DT_SONAME":
                soname = tag.soname
            elif kind in ("DT_RPATH", "DT_RUNPATH"):
                paths = rpath if kind == "DT_RPATH" else runpath
                paths += [p for p in getattr(tag, kind[3:].lower()).split(":") if p]
    return needed, soname, rpath, runpath
