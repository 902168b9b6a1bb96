"""Check a JSON Lines trace of examples/basic02 against what the program does.

    python3 scripts/check_basic02.py TRACE.jsonl

basic02 makes 3 cudaMalloc of 4000 bytes, 2 cudaMemcpy HostToDevice, one vecAdd launch of
grid (4,1,1) x block (256,1,1) (seen as cudaLaunchKernel, or cuLaunchKernel when the driver is
probed too), 1 cudaMemcpy DeviceToHost and 3 cudaFree of the pointers
cudaMalloc returned. Prints what it found and exits 1 on any mismatch.
"""
import json
import sys


def _geometry(args: dict) -> tuple:
    """(grid, block) of a runtime launch (dim3 values) or a driver launch (gridX...)."""
    if "grid" in args:
        return args["grid"], args["block"]
    return ([args["gridX"], args["gridY"], args["gridZ"]],
            [args["blockX"], args["blockY"], args["blockZ"]])


def main(path: str) -> int:
    # (calls only: a trace also carries the GPU's samples and events, `"type": "gpu_..."`)
    exits = [e for e in map(json.loads, open(path)) if e.get("phase") == "exit"]
    problems = []

    def expect(what, got, want):
        print("%-34s %-40s %s" % (what, got, "ok" if got == want else "WANT %r" % (want,)))
        if got != want:
            problems.append(what)

    mallocs = [e for e in exits if e["api"] == "cudaMalloc"]
    frees = [e for e in exits if e["api"] == "cudaFree"]
    copies = [e for e in exits if e["api"] == "cudaMemcpy"]
    # The runtime's launch when only the runtime is probed; the driver's when both layers are
    # (the default set then probes launches in the driver only).
    launches = [e for e in exits if e["api"] in ("cudaLaunchKernel", "cudaLaunchKernelExC")]
    launches = launches or [e for e in exits if e["api"] in ("cuLaunchKernel", "cuLaunchKernelEx")]
    expect("cudaMalloc sizes", [e["args"]["size"] for e in mallocs], [4000] * 3)
    expect("cudaMalloc results", [e["ret_name"] for e in mallocs], ["cudaSuccess"] * 3)
    pointers = [e.get("ptr") for e in mallocs]
    expect("cudaFree pointers == malloc pointers", sorted(e["args"]["ptr"] for e in frees),
           sorted(pointers))
    expect("cudaMemcpy kinds", [e["args"]["kind"] for e in copies],
           ["HostToDevice", "HostToDevice", "DeviceToHost"])
    expect("cudaMemcpy sizes", [e["args"]["size"] for e in copies], [4000] * 3)
    expect("launch geometry", [_geometry(e["args"]) for e in launches],
           [([4, 1, 1], [256, 1, 1])])
    expect("launch kernel name", [e.get("kernel", "?") for e in launches][:1],
           ["vecAdd(float const*, float const*, float*, int)"])
    expect("all returned cudaSuccess", sorted({e["ret_name"] for e in exits
                                               if e["api"].startswith("cuda")}),
           ["cudaSuccess"])
    print("device pointers:", ", ".join(hex(p) for p in pointers if p is not None))
    print("basic02 trace check:", "PASSED" if not problems else "FAILED: " + ", ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
