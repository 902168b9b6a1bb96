"""Tracer memory under process churn: the resident set of a system-wide trace
(`ebpf-cuda -p LIB -o /dev/null`, or --json / --summary) while thousands of short-lived
CUDA processes come and go. Each process's state (its mappings snapshot, learned kernel
handles, stubs, thread columns, graph and NCCL state) must go when it exits: issue 15's
target is RSS within 5 MB of where it started after 10,000 processes. Prints VmRSS every
REPORT processes and the growth per 1,000 processes over the second half. Needs root, gcc.

    sudo python3 bench/trace_memory.py [--procs 10000] [--parallel 4] [--mode text|json|summary]
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
BUILD = Path(os.environ.get("EBPF_CUDA_BENCH_BUILD", "/tmp/ebpf-cuda-bench")) / "trace"

from churn import churn, growth_line  # noqa: E402
from conftest import Builder  # noqa: E402
from fakecuda import build_fake_cuda  # noqa: E402

MODES = {"text": ["-o", os.devnull], "json": ["--json", "-o", os.devnull],
         "summary": ["--summary"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=10000)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--kernels", type=int, default=5)
    parser.add_argument("--report", type=int, default=500)
    parser.add_argument("--mode", choices=sorted(MODES), default="text")
    args = parser.parse_args()
    BUILD.mkdir(parents=True, exist_ok=True)
    lib, prog = build_fake_cuda(Builder(BUILD))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    tracer = subprocess.Popen([sys.executable, "-m", "ebpf_cuda", "-p", str(lib),
                               *MODES[args.mode]], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=env)
    for line in tracer.stderr:
        if line.startswith("ebpf-cuda: probing"):
            break
    else:
        sys.exit("the tracer did not start")
    ops = ["setdevice:0", "loop:20:malloc:64"] + [
        "launch:%d,1,1:32,1,1" % (k + 1) for k in range(args.kernels)]
    print("trace memory (%s): %d processes, %d at a time" % (args.mode, args.procs,
                                                             args.parallel), flush=True)
    try:
        samples = churn(tracer.pid, [str(prog), *ops], args.procs, args.parallel, args.report,
                        note=lambda line: print(line, flush=True))
    finally:
        tracer.terminate()
        tracer.communicate(timeout=60)
    print(growth_line(samples, args.procs))


if __name__ == "__main__":
    main()
