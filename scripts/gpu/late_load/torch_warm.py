"""A PyTorch warm-up (model to the GPU, a few steps) under torch.profiler (CUPTI) from before
CUDA starts: prints cupti_cudaMalloc=N (runtime API records named cudaMalloc)."""
import json, os, tempfile, torch
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters())
    for _ in range(3):
        x = torch.randn(256, 1024, device="cuda")
        loss = model(x).square().mean()
        opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
path = tempfile.mktemp(suffix=".json")
prof.export_chrome_trace(path)
events = json.load(open(path))["traceEvents"]
names = {}
for e in events:
    if e.get("cat") in ("cuda_runtime", "cuda_driver"):
        names[e["name"]] = names.get(e["name"], 0) + 1
print("cupti_cudaMalloc=%d" % names.get("cudaMalloc", 0))
mallocs = [(e.get("tid"), e.get("ts"), e.get("args", {}).get("cbid")) for e in events if e.get("name") == "cudaMalloc"]
print("cupti_malloc_threads=%s" % sorted({str(t) for t, _, _ in mallocs}))
print("cupti_calls=" + json.dumps(names, sort_keys=True))
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "cudart" in l or "libcuda." in l})
print("maps:", " ".join(maps))
