"""Tracer memory with a large library (issue 36: VmHWM 374 MB tracing JAX, 422 MB attached to
a PyTorch loop, against 57-64 MB for the others): the peak resident set of the CLI while it
probes and names the kernels of a library as large as a framework's.

The library is synthetic, assembled once into BUILD/large: FUNCTIONS local functions with
long C++-like names (a large .symtab and .strtab), FILL_MB of filler code in .text and of
data in .rodata, REGISTERED kernels registered as nvcc's start-up code does (`mov $-1,%r8d`,
rip-relative `lea`s, `call __cudaRegisterFunction@PLT`: what registrations.py reads in the
file), and the stand-in runtime (tests/native/fakecudart.c) linked in, as a plugin with a
static runtime carries it. A program linked with it registers, then launches some of those
kernels every 10 ms. Two runs, each sampled every 10 ms from /proc/PID/status (VmHWM, the
peak, is what counts; RssAnon is the heap, RssFile mapped file pages):

- `command`: `ebpf-cuda -p LIB -o /dev/null -- app SECONDS` (the library is a static runtime
  to probe: its symbols are looked up, like a JAX plugin's);
- `attach`: the app started first, then `ebpf-cuda -d PID -p LIB --functions
  cudaLaunchKernel`: kernels registered before the trace, named from the file's
  registration code (a PyTorch loop attached with -d).

    sudo python3 bench/large_library.py [--functions 600000] [--fill-mb 150] [--tree DIR]

`--tree DIR` runs another checkout's CLI on the same library (a before/after pair).
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

BUILD = common.BUILD / "large"
KEYS = ("VmHWM", "VmRSS", "RssAnon", "RssFile")
PAUSE_NS = [10 * 1000 * 1000]  # the app's pause between launches (--pause-us)
LAUNCHED = 64  # kernels the app launches, in turn
NAME = "_ZN3big6module%07dIN5eigen6TensorIfLi4ELi1ElEENS_15reduction_helperILi128EEEEvPKT_PS6_iii"

LAUNCH_C = r"""
typedef struct { unsigned x, y, z; } dim3;
int cudaLaunchKernel(const void *, dim3, dim3, void **, unsigned long, void *);
extern void *const big_stub_table[];
int big_launch(unsigned i) {
    static int n = 1;
    void *args[1] = {&n};
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    return cudaLaunchKernel(big_stub_table[i %% %d], grid, block, args, 0, (void *)0);
}
""" % LAUNCHED

APP_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int big_launch(unsigned i);
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1;
    long pause_ns = argc > 2 ? atol(argv[2]) : 10 * 1000 * 1000;
    struct timespec pause = {0, pause_ns}, start, now;
    printf("ready\n");
    fflush(stdout);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned i = 0;; i++) {
        if (big_launch(i))
            return 1;
        if (pause_ns)
            nanosleep(&pause, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) / 1e9 > seconds)
            return 0;
    }
}
"""


def _assembly(functions: int, registered: int, fill_mb: int) -> str:
    """The large part of the library, as GNU assembler."""
    out = ['\t.section .text.big,"ax",@progbits']
    for i in range(functions):
        out.append("\t.p2align 4\n\t.type %s,@function\n%s:\n\tret\n\t.size %s,1"
                   % ((NAME % i,) * 3))
    out.append("\t.fill %d,1,0xcc" % (fill_mb << 20))
    out.append("\t.p2align 4\nbig_register_all:\n\tpush %rbp\n\tmov %rsp,%rbp")
    for k in range(registered):
        out.append("\tlea big_fatbin(%%rip),%%rdi\n\tlea %s(%%rip),%%rsi\n"
                   "\tlea .Lname%d(%%rip),%%rdx\n\tmov %%rdx,%%rcx\n\tmov $-1,%%r8d\n"
                   "\txor %%r9d,%%r9d\n\tcall __cudaRegisterFunction@PLT" % (NAME % k, k))
    out.append("\tpop %rbp\n\tret")
    out.append('\t.section .init_array,"aw"\n\t.p2align 3\n\t.quad big_register_all')
    out.append('\t.section .rodata.bignames,"a",@progbits')
    out += ['.Lname%d:\n\t.asciz "%s"' % (k, NAME % k) for k in range(registered)]
    out.append('\t.section .rodata.bigfill,"a",@progbits\n\t.fill %d,1,7' % (fill_mb << 20))
    out.append('\t.section .data.rel.ro,"aw"\n\t.p2align 3\n\t.globl big_stub_table\n'
               "big_stub_table:")
    out += ["\t.quad %s" % (NAME % k) for k in range(LAUNCHED)]
    out.append('\t.bss\n\t.p2align 4\nbig_fatbin:\n\t.zero 16')
    out.append('\t.section .note.GNU-stack,"",@progbits')
    return "\n".join(out) + "\n"


def build(functions: int, registered: int, fill_mb: int) -> Dict[str, Path]:
    """(Once per shape) the library and the app, in BUILD/<shape>."""
    folder = BUILD / ("%d-%d-%d" % (functions, registered, fill_mb))
    folder.mkdir(parents=True, exist_ok=True)
    lib, app = folder / "libbig.so", folder / "big_app"
    if not lib.exists():
        (folder / "big.s").write_text(_assembly(functions, registered, fill_mb))
        (folder / "launch.c").write_text(LAUNCH_C)
        script = folder / "big.map"
        script.write_text("{\n  global: cuda*; __cuda*; big_launch;\n  local: *;\n};\n")
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-fcf-protection=none",
                        "-fno-shrink-wrap", "-fno-ipa-icf", "-fno-optimize-sibling-calls",
                        "-Wl,--version-script=" + str(script), "-o", str(lib),
                        str(folder / "big.s"), str(folder / "launch.c"),
                        str(common.TEST_NATIVE / "fakecudart.c")], check=True)
    source = folder / "app.c"
    if not app.exists() or not source.exists() or source.read_text() != APP_C:
        source.write_text(APP_C)
        subprocess.run(["gcc", "-O2", "-o", str(app), str(source), "-L", str(folder),
                        "-lbig", "-Wl,-rpath," + str(folder)], check=True)
    return {"lib": lib, "app": app}


def run(mode: str, built: Dict[str, Path], seconds: float, tree: Optional[Path]
        ) -> Dict[str, int]:
    env = dict(os.environ, PYTHONPATH=str(tree or common.REPO))
    cli = [sys.executable, "-m", "ebpf_cuda", "-p", str(built["lib"]), "-o", os.devnull]
    app: Optional[subprocess.Popen] = None
    if mode == "command":
        argv = cli + ["--", str(built["app"]), str(seconds)]
    else:
        app = subprocess.Popen([str(built["app"]), str(seconds + 30), str(PAUSE_NS[0])],
                               stdout=subprocess.PIPE)
        assert app.stdout is not None and app.stdout.readline() == b"ready\n"
        argv = cli + ["-d", str(app.pid), "--functions", "cudaLaunchKernel"]
    tracer = subprocess.Popen(argv, cwd=str(tree or common.REPO), env=env,
                              stderr=subprocess.PIPE, text=True)
    try:
        if app is not None:
            assert tracer.stderr is not None
            tracer.stderr.readline()  # "probing ...": attached
            killer = [time.monotonic() + seconds]

            def stop(status: Dict[str, int]) -> None:  # once: a second SIGINT abandons the
                if killer and time.monotonic() > killer[0]:  # backlog (counted as lost)
                    tracer.send_signal(signal.SIGINT)
                    killer.clear()
            peak = common.sample_peak(tracer, KEYS, stop)
        else:
            peak = common.sample_peak(tracer, KEYS)
        err = tracer.stderr.read() if tracer.stderr is not None else ""
    finally:
        if app is not None:
            app.kill()
            app.wait()
    if tracer.returncode != 0:
        raise RuntimeError("tracer failed (%d): %s" % (tracer.returncode, err[-800:]))
    peak["unnamed"] = int("not named" in err)
    lost = re.search(r"(\d+) events? lost", err)
    peak["lost"] = int(lost.group(1)) if lost else 0
    return peak


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=600000)
    parser.add_argument("--registered", type=int, default=20000)
    parser.add_argument("--fill-mb", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--pause-us", type=int, default=10000,
                        help="the app's pause between launches (0: flat out)")
    parser.add_argument("--modes", default="command,attach")
    parser.add_argument("--tree", type=Path, help="another checkout to run as well")
    args = parser.parse_args(argv)
    PAUSE_NS[0] = args.pause_us * 1000
    common.need_root()
    built = build(args.functions, args.registered, args.fill_mb)
    size = built["lib"].stat().st_size
    print("large library: %s" % common.machine())
    print("%s: %.0f MB, %d functions, %d registered kernels, %d MB of filler code and data"
          % (built["lib"].name, size / 1e6, args.functions, args.registered, args.fill_mb))
    print("\npeak KiB of the CLI process (sampled every 10 ms)\n")
    print("%-24s %-8s %9s %9s %9s %9s %8s %9s" % ("tree", "mode", *KEYS, "unnamed", "lost"))
    trees = [("this", None)] + ([(str(args.tree), args.tree)] if args.tree else [])
    for mode in args.modes.split(","):
        for label, tree in trees:
            peak = run(mode, built, args.seconds, tree)
            print("%-24s %-8s %s %8d %9d" % (label[-24:], mode,
                                             " ".join("%9d" % peak.get(k, 0) for k in KEYS),
                                             peak["unnamed"], peak["lost"]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
