"""Diagnostic (issue 17, D23 in docs/gpu-results.md): the torch.compile target of
graphs_check.py under in-kernel aggregates (as `--summary` alone), through the Tracer API:
the records that came (captures, captured launches), the launches the kernel counted by
process and function, the per-function aggregates, and the capture state left in the
kernel's maps at the end.

    PYTHONPATH=$PWD/ebpf-cuda.pyz OUT=/tmp/out python3 scripts/gpu/graphs_alone_diag.py
"""
import collections, os, sys
from ebpf_cuda.tracer import Tracer
from ebpf_cuda.spec import layout
from ebpf_cuda.analysis.kernel_summary import launches
out = os.environ["OUT"]
target = [sys.executable, "scripts/gpu/graphs_check.py", "--target", "compile", out]
t = Tracer(command=target, aggregate=True, emit=False)
t.start()
seen = collections.Counter()
for ev in t.events():
    if ev.phase == "exit" and ev.api.startswith(("cuLaunch", "cudaLaunch")):
        seen[(ev.pid, bool(ev.outs.get("captured")), ev.ret)] += 1
    if ev.phase == "exit" and "Capture" in ev.api:
        seen[(ev.api, ev.ret)] += 1
agg = t.aggregates()
inkernel = collections.Counter()
for l in launches(agg):
    inkernel[(l.pid, l.api)] += l.count
print("records:", dict(seen))
print("in-kernel launches:", dict(inkernel))
cap = t.session.maps.get(getattr(layout, "CAPTURING", "x"))
print("capturing map:", dict(cap.items()) if cap is not None else None)
anyc = t.session.maps.get(getattr(layout, "CAPTURING_ANY", "x"))
print("capturing_any:", dict(anyc.items()) if anyc is not None else None)
print("stats", t.stats(), "pids", sorted({p for p, *_ in [k for k in seen if isinstance(k[0], int)]}))
t.close()
print("agg launch functions:", [(f.api.name if hasattr(f.api, "name") else f.api, f.count, f.errors) for f in agg.functions if "Launch" in str(getattr(f.api, "name", f.api)) and f.count])
