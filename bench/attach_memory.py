"""Tracer memory attached to a real PyTorch process (issue 36's memory row: VmHWM <= 64 MB;
D37 on the H100 host: 89.7-100.7 MB attached with -d to a PyTorch loop).

A PyTorch venv (a CUDA build: libtorch_cuda, libcublasLt, libnccl, libcudart mapped by
`import torch`) runs a loop that launches flat out through torch's own libcudart
(`cudaLaunchKernel`, ~1M calls/s; without a driver each launch returns 35, the probes see
it all the same) with host functions that libtorch_cuda.so registers and, unless
`--no-cublaslt`, one that libcublasLt registers: the tracer names them by reading those
files' registration code (registrations.py), the largest reads it makes. With `--driver`
the stand-in driver (tests/native/fakecuda_driver.c, built as libcuda.so.1) is loaded too,
so the tracer probes a libcuda, and the loop also calls its `cuLaunchKernel` with a
function handle made before the attach (unnamed: counted, as cuBLAS's are on the GPU host).

The tracer is attached with `-d PID -o /dev/null` (the default trace) and its
/proc/PID/status is sampled every 10 ms; the loop is stopped SECONDS after the probes are
on and the tracer ends with it. Each round runs every tree (this one, `--tree BASE`) and
every `--env` variant in turn. `--smaps` prints, at each tree's highest VmHWM, where the
anonymous memory was: glibc's main heap, other arenas (64 MiB-aligned heaps), 1 MiB
mappings (pymalloc's arenas), other mmaps (large malloc blocks).

    sudo python3 bench/attach_memory.py --torch /tmp/vtorch [--rounds 3] [--tree BASE]
        [--driver] [--env MALLOC_ARENA_MAX=1] [--python python3.12] [--smaps]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

from ebpf_cuda.targets.registrations import registered_kernels  # noqa: E402

BUILD = common.BUILD / "attach_memory"
KEYS = ("VmHWM", "RssAnon", "RssFile")
ARENA = 64 << 20  # a glibc heap of a thread arena: 64 MiB-aligned (HEAP_MAX_SIZE)

LOOP = r'''
import ctypes, os, sys, time
seconds, driver, targets = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
cu = ctypes.CDLL(driver) if driver != "-" else None
import torch  # noqa: F401  (maps libtorch_cuda, libcublasLt, libcudart, libnccl ...)

def mapped(part):
    rows = [l.split() for l in open("/proc/self/maps")]
    rows = [r for r in rows if len(r) > 5 and part in os.path.basename(r[5])]
    path = rows[0][5]
    return path, min(int(r[0].split("-")[0], 16) for r in rows if r[5] == path and int(r[2], 16) == 0)

class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]

hosts = [mapped(t.rsplit(":", 1)[0])[1] + int(t.rsplit(":", 1)[1]) for t in targets]
launch = ctypes.CDLL(mapped("libcudart.so")[0]).cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
grid, block = Dim3(4, 1, 1), Dim3(128, 1, 1)
driver_launch = None
if cu is not None:
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuModuleLoadData(ctypes.byref(module), b"image") == 0
    assert cu.cuModuleGetFunction(ctypes.byref(function), module, b"gemm_kernel") == 0
    driver_launch = cu.cuLaunchKernel
    driver_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    handle = function.value
print("ready", os.getpid(), flush=True)
end, n = time.time() + seconds, 0
while time.time() < end:
    for host in hosts:
        for _ in range(500):
            launch(host, grid, block, None, 0, None)
    n += 500 * len(hosts)
    if driver_launch is not None:
        for _ in range(100):
            driver_launch(handle, 4, 1, 1, 128, 1, 1, 0, None, None, None)
        n += 100
print("launched", n, flush=True)
'''


def library(venv: Path, name: str) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages/**/" + name))
    if not found:
        sys.exit("no %s in %s" % (name, venv))
    return found[0]


def targets(venv: Path, cublaslt: bool) -> List[str]:
    """`libname:hostFun` of the kernels the loop launches: the first that libtorch_cuda.so
    registers (and libcublasLt's)."""
    names = ["libtorch_cuda.so"] + (["libcublasLt.so"] if cublaslt else [])
    out = []
    for name in names:
        path = library(venv, name + "*")
        kernels = registered_kernels(str(path))
        if not kernels:
            sys.exit("%s registers no kernel this tree can read" % path)
        out.append("%s:%d" % (path.name, min(kernels)))
    return out


def build_driver() -> Path:
    from fakecuda_driver import LIB_FLAGS, SONAME

    folder = BUILD / "driver"
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / SONAME
    source = common.TEST_NATIVE / "fakecuda_driver.c"
    if not lib.exists() or lib.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *LIB_FLAGS, "-o", str(lib),
                        str(source)], check=True)
    return lib


def smaps(pid: int) -> Dict[str, int]:
    """Resident KiB of the anonymous mappings of `pid`, by kind (see the docstring)."""
    kinds: Dict[str, int] = {}
    kind: Optional[str] = None
    try:
        with open("/proc/%d/smaps" % pid) as f:
            for line in f:
                fields = line.split()
                if not fields[0].endswith(":"):
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    name = fields[5] if len(fields) > 5 else ""
                    kind = _kind(start, end, name)
                elif fields[0] == "Rss:" and kind is not None:
                    kinds[kind] = kinds.get(kind, 0) + int(fields[1])
    except (OSError, ValueError, IndexError):
        pass
    return kinds


def _kind(start: int, end: int, name: str) -> Optional[str]:
    if name == "[heap]":
        return "heap"
    if name:
        return None  # a file, the stack, a BPF map
    if start % ARENA == 0:
        return "arenas"
    if end - start == 1 << 20:
        return "1MiB"
    return "mmaps"


def run(tree: Path, python: str, venv: Path, seconds: float, driver: Optional[Path],
        launched: List[str], env_extra: Dict[str, str], want_smaps: bool) -> Dict[str, object]:
    loop_path = BUILD / "loop.py"
    loop_path.write_text(LOOP)
    loop = subprocess.Popen([str(venv / "bin" / "python"), str(loop_path), str(seconds + 60),
                             str(driver or "-"), *launched],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert loop.stdout is not None
    line = loop.stdout.readline()
    if not line.startswith("ready"):
        loop.kill()
        raise RuntimeError("the loop did not start: %r" % line)
    time.sleep(1)
    env = dict(os.environ, PYTHONPATH=str(tree), **env_extra)
    err_path = BUILD / "tracer.err"
    with open(err_path, "w") as err:
        tracer = subprocess.Popen([python, "-m", "ebpf_cuda", "-d", str(loop.pid), "-o",
                                   os.devnull], cwd=str(tree), env=env, stderr=err)
    try:
        peak, where = _sample(tracer, loop, err_path, seconds, want_smaps)
    finally:
        loop.kill()
        loop.wait()
        if tracer.poll() is None:
            tracer.wait(timeout=300)
    text = err_path.read_text()
    if tracer.returncode != 0:
        raise RuntimeError("tracer failed (%d): %s" % (tracer.returncode, text[-800:]))
    lost = re.search(r"(\d+) events? lost", text)
    peak["lost"] = int(lost.group(1)) if lost else 0
    peak["smaps"] = where
    return peak


def _sample(tracer: subprocess.Popen, loop: subprocess.Popen, err_path: Path,
            seconds: float, want_smaps: bool) -> Tuple[Dict[str, object], Dict[str, int]]:
    where: Dict[str, int] = {}
    high = [0]  # (the VmHWM of the last smaps reading)
    stop_at: List[float] = []

    def tick(status: Dict[str, int]) -> None:
        if want_smaps and status.get("VmHWM", 0) > high[0] + 256:
            high[0] = status["VmHWM"]
            where.clear()
            where.update(smaps(tracer.pid))
        if not stop_at and "probing" in err_path.read_text():
            stop_at.append(time.monotonic() + seconds)
        if stop_at and time.monotonic() > stop_at[0] and loop.poll() is None:
            loop.send_signal(signal.SIGKILL)

    peak: Dict[str, object] = dict(common.sample_peak(tracer, KEYS, tick))
    return peak, where


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", type=Path, required=True, help="a PyTorch venv")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5,
                        help="the loop's run after the probes are on")
    parser.add_argument("--tree", type=Path, help="another checkout to run in turns")
    parser.add_argument("--driver", action="store_true", help="load the stand-in libcuda")
    parser.add_argument("--no-cublaslt", action="store_true",
                        help="launch libtorch_cuda's kernel only")
    parser.add_argument("--env", action="append", default=[],
                        help="NAME=VALUE[,NAME=VALUE] for the tracer: one more variant")
    parser.add_argument("--python", default=sys.executable, help="the tracer's Python")
    parser.add_argument("--smaps", action="store_true")
    args = parser.parse_args(argv)
    common.need_root()
    BUILD.mkdir(parents=True, exist_ok=True)
    driver = build_driver() if args.driver else None
    launched = targets(args.torch, not args.no_cublaslt)
    version = subprocess.run([args.python, "-V"], capture_output=True, text=True).stdout
    print("attach memory: %s; tracer on %s" % (common.machine(), version.strip()))
    print("loop: %s, launching %s%s; %g s after the probes are on"
          % (args.torch, ", ".join(launched), " + the stand-in driver" if driver else "",
             args.seconds))
    print("\npeak KiB of the tracer (sampled every 10 ms)\n")
    variants = [("", {})] + [(e, dict(p.split("=", 1) for p in e.split(","))) for e in args.env]
    trees = [("this", common.REPO)] + ([(str(args.tree), args.tree)] if args.tree else [])
    print("%-5s %-30s %9s %9s %9s %9s  %s" % ("round", "tree [env]", *KEYS, "lost",
                                             "anon by kind" if args.smaps else ""))
    for round_ in range(args.rounds):
        for label, tree in trees:
            for name, env in variants:
                peak = run(tree, args.python, args.torch, args.seconds, driver, launched,
                           env, args.smaps)
                tag = (label[-18:] + (" " + name if name else ""))[-30:]
                kinds = " ".join("%s=%d" % kv for kv in sorted(peak["smaps"].items()))
                print("%-5d %-30s %s %9d  %s" % (round_ + 1, tag,
                                                 " ".join("%9d" % peak.get(k, 0) for k in KEYS),
                                                 peak["lost"], kinds), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
