"""A few training steps of a small MLP with Adam, with torch.profiler (CUPTI) counting the
GPU kernels of the same steps, for comparing with a trace (issue 5).

    python3 -m ebpf_cuda --json -o torch.jsonl -- python3 scripts/gpu/torch_profile_compare.py

Warm-up steps run first (not profiled); the profiled steps lie between `window_start=` and
`window_end=` (wall-clock seconds). Prints `profiler_kernels=` (kernel executions CUPTI saw),
`profiler_launch_calls=` (runtime/driver launch API calls CUPTI saw, graph launches apart),
`profiler_kernel_names=` (JSON: name -> count) and `ok`.
"""
import json
import os
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

STEPS = 5
WARMUP = 3


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10)).cuda()


def step(model, optimizer, x, y) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def kernel_counts(trace_path: str):
    """(kernel executions by name, launch API calls) from a Chrome trace of the profiler."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    names = {}
    launch_calls = 0
    for event in events:
        category = event.get("cat", "")
        if category == "kernel":
            names[event["name"]] = names.get(event["name"], 0) + 1
        elif category in ("cuda_runtime", "cuda_driver") and "Launch" in event.get("name", "") \
                and "Graph" not in event.get("name", ""):
            launch_calls += 1
    return names, launch_calls


def main() -> int:
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    for _ in range(WARMUP):
        step(model, optimizer, x, y)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.time()
        for _ in range(STEPS):
            loss = step(model, optimizer, x, y)
        torch.cuda.synchronize()
        end = time.time()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        names, launch_calls = kernel_counts(path)
    finally:
        os.unlink(path)
    print("steps=%d warmup=%d loss=%.4f" % (STEPS, WARMUP, float(loss)))
    print("window_start=%.6f" % start)
    print("window_end=%.6f" % end)
    print("profiler_kernels=%d" % sum(names.values()))
    print("profiler_launch_calls=%d" % launch_calls)
    print("profiler_kernel_names=%s" % json.dumps(names, sort_keys=True))
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
