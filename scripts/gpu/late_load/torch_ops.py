"""Which CPU op each CUPTI cudaMalloc / cudaMemsetAsync of the warm-up falls in; and the cost
of the static-runtime look at each file the warm-up's process maps."""
import collections, json, os, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ebpf-cuda.pyz"))
import torch
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
ev = json.load(open(path))["traceEvents"]
ops = [e for e in ev if e.get("cat") == "cpu_op"]
where = collections.Counter()
for e in ev:
    if e.get("name") in ("cudaMalloc", "cudaMemsetAsync") and e.get("cat") == "cuda_runtime":
        inner = [o for o in ops if o["tid"] == e["tid"] and o["ts"] <= e["ts"] <= o["ts"] + o.get("dur", 0)]
        inner.sort(key=lambda o: o.get("dur", 0))
        where[(e["name"], " < ".join(o["name"] for o in inner[:3]) or "-")] += 1
for k, v in sorted(where.items()):
    print(v, k)
from ebpf_cuda.probes import loader as loader_watch
from ebpf_cuda.targets import discovery
files = sorted({l.split()[-1] for l in open("/proc/self/maps") if " r-xp " in l and "/" in l})
rows = []
for f in files:
    t = time.perf_counter(); cheap = loader_watch.may_carry_runtime(f); t1 = time.perf_counter()
    full = discovery.is_static_cudart(f) if cheap else None; t2 = time.perf_counter()
    rows.append((t1 - t + t2 - t1, f, cheap, full, (t1 - t) * 1e3, (t2 - t1) * 1e3))
rows.sort(reverse=True)
print("files", len(files), "total ms %.0f" % (sum(r[0] for r in rows) * 1e3))
for r in rows[:8]:
    print("%.1f ms cheap=%s full=%s (%.1f + %.1f) %s" % (r[0] * 1e3, r[2], r[3], r[4], r[5], r[1]))
print("static:", [os.path.basename(r[1]) for r in rows if r[3]])
