"""Issue 20 on one GPU: each event's `device`, and what torch's reduce_scatter_tensor runs
with world_size 1.

    python3 scripts/gpu/devices_check.py TRACER OUTDIR      (as root; TRACER e.g.
                                                            "python3 ebpf-cuda.pyz")

The target (this file with --target) selects cuda:0, makes a one-rank NCCL process group,
runs a few ops, and one reduce_scatter_tensor under torch.profiler (CUPTI): which kernels and
copies it ran. Traced with --json: every event of the process has `device` 0 (one GPU, traced
from its start), the NCCL calls seen, CUPTI's activity names of the reduce-scatter. One JSON
line.
"""
import json
import os
import shlex
import socket
import subprocess
import sys
from collections import Counter


def target(outdir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE="1")
    torch.cuda.set_device(0)
    device = torch.device("cuda:0")
    dist.init_process_group("nccl", device_id=device)
    x = torch.ones(1 << 16, device=device)
    (x * 2).sum().item()
    d = torch.ones(2048, dtype=torch.float32, device=device)
    out = torch.empty(2048, dtype=d.dtype, device=device)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dist.reduce_scatter_tensor(out, d)
        torch.cuda.synchronize()
    names = Counter(e.name for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA)
    dist.destroy_process_group()
    with open(os.path.join(outdir, "reduce_scatter_cupti.json"), "w") as f:
        json.dump(dict(names), f)


def main() -> int:
    if sys.argv[1] == "--target":
        target(sys.argv[2])
        return 0
    tracer, outdir = shlex.split(sys.argv[1]), sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    trace = os.path.join(outdir, "devices.jsonl")
    done = subprocess.run(tracer + ["--json", "-o", trace, "--", sys.executable, __file__,
                                    "--target", outdir], capture_output=True, text=True,
                          timeout=300)
    events = [json.loads(line) for line in open(trace)]
    devices = Counter(str(e.get("device")) for e in events)
    nccl = Counter(e["api"] for e in events if e["api"].startswith("nccl")
                   and e["phase"] == "exit")
    cupti = json.load(open(os.path.join(outdir, "reduce_scatter_cupti.json")))
    print(json.dumps({"tracer_exit": done.returncode, "events": len(events),
                      "devices": dict(devices), "nccl_exits": dict(nccl),
                      "set_device": [e["args"] for e in events
                                     if e["api"] == "cudaSetDevice" and e["phase"] == "exit"][:3],
                      "reduce_scatter_cupti": cupti,
                      "stderr_tail": done.stderr.splitlines()[-3:]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
