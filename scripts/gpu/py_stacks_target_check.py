"""The CI test's Python-stack target on the GPU host (run.sh's `lines`, second part):
tests/pystacks/target.py (nested functions, a method, a generator called from C, a lambda,
a multi-line expression, a thread, an asyncio task, recursion) calls this host's libcudart
under `--py-stacks`; every call's py_stack must equal the stack the interpreter itself
recorded (as tests/test_py_stacks_e2e.py checks on the CI machine).

    python3 scripts/gpu/py_stacks_target_check.py [--lib LIBCUDART] [--out DIR]

--lib defaults to the libcudart a PyTorch process maps; the tracer is $TRACER (run.sh:
`python3 ebpf-cuda.pyz`), else `python3 -m ebpf_cuda`. One PASS/FAIL line; exit status 1
on FAIL, 77 (SKIP) when no libcudart is found.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucheck  # noqa: E402

TARGET = os.path.join(gpucheck.REPO, "tests", "pystacks", "target.py")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", help="the libcudart to call (default: PyTorch's)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/ebpf-cuda-py-target"))
    args = parser.parse_args(argv)
    v = gpucheck.Verdicts("lines")
    lib = args.lib or (gpucheck.torch_cudart() if gpucheck.has_module("torch") else None)
    if not lib:
        v.skip("target", "no libcudart found (give --lib; PyTorch's is the default)")
        return v.status()
    os.makedirs(args.out, exist_ok=True)
    truth, events = os.path.join(args.out, "truth.json"), os.path.join(args.out, "target.jsonl")
    for path in (truth, events):
        if os.path.exists(path):
            os.unlink(path)
    run = subprocess.run(gpucheck.tracer_command() + [
        "--json", "-o", events, "--py-stacks", "--functions", "cudaGetDeviceCount", "-p", lib,
        "--",
        sys.executable, TARGET, lib, truth], capture_output=True, text=True, timeout=300)
    if run.returncode != 0 or not os.path.exists(truth) or not os.path.exists(events):
        v.add("target", False, "the traced target exited %d (%s)" % (
            run.returncode, gpucheck.tail(run.stderr)))
        return v.status()
    exits = [e for e in gpucheck.load_events(events) if e["phase"] == "exit"]
    with open(truth) as f:
        calls = json.load(f)
    good, diffs = 0, []
    for tid in {c["tid"] for c in calls}:
        seen = [e for e in exits if e["tid"] == tid]
        for event, call in zip(seen, [c for c in calls if c["tid"] == tid]):
            got = [[f["file"], f["line"], f["function"]] for f in event.get("py_stack") or []]
            good += got == call["stack"]
            if got != call["stack"] and len(diffs) < 3:
                diffs.append("traced %s, interpreter %s" % (got, call["stack"]))
    v.add("target", good == len(calls) == len(exits),
          "%d of %d calls' py_stack equal the interpreter's own stack (%d events; %s)%s"
          % (good, len(calls), len(exits), lib, "; " + " || ".join(diffs) if diffs else ""))
    return v.status()


if __name__ == "__main__":
    raise SystemExit(main())
