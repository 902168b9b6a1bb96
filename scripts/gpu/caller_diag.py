"""Diagnostic for issue 14: what calls cudaLaunchKernel in a warmed-up PyTorch process, as
the launch probes see it (the caller's return address, symbolized). Prints JSON lines.

    python3 scripts/gpu/caller_diag.py OUTDIR        (as root, the tracer importable)
"""
import collections
import json
import os
import subprocess
import sys
import time

from ebpf_cuda.tracer import Tracer

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    for name in ("ready", "go", "cupti.json"):
        if os.path.exists(os.path.join(outdir, name)):
            os.unlink(os.path.join(outdir, name))
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "attach_check.py"), "--target",
                             "eager", outdir])
    while not os.path.exists(os.path.join(outdir, "ready")):
        time.sleep(0.05)
    callers = collections.Counter()
    funcs = collections.Counter()
    with Tracer(pid=proc.pid, functions=["cudaLaunchKernel", "__cudaGetKernel"]) as tracer:
        deadline = time.monotonic() + 3
        for frames in tracer.frames(timeout=3):
            for fn_id, pid, tid, enter, exit_, func, caller in tracer.decoder.launches(frames):
                frame = tracer.names.resolver.frame(pid, caller, return_address=True)
                callers[str(frame) if frame else "0x%x" % caller] += 1
                funcs[hex(func)] += 1
            if time.monotonic() > deadline:
                break
    open(os.path.join(outdir, "go"), "w").close()
    proc.wait(timeout=300)
    print(json.dumps({"callers": callers.most_common(10), "funcs": funcs.most_common(5),
                      "attachments": sorted({a.path for a in tracer.attachments})}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
