"""The GPU's state beside a traced PyTorch training loop (issue 37; run.sh's `nvml`), checked
against what PyTorch and nvidia-smi say.

    python3 scripts/gpu/nvml_check.py [--out DIR] [--turns N]        (as root)

The tracer is $TRACER (run.sh: `python3 ebpf-cuda.pyz`), else `python3 -m ebpf_cuda`.

The target (this file with --target) trains an MLP on cuda:0 for BUSY_S seconds, sleeps
SLEEP_S seconds (time.sleep: no CUDA call), trains BUSY_S seconds more, and writes what it
knows (target.json): its pid, the wall-clock times of the phases (after synchronising),
torch.cuda.memory_reserved() and memory_allocated() during the sleep, nvidia-smi's
memory.used at the same moment, and its step times. It is traced with
`--json -o trace.jsonl --summary --gpu-samples 10`. Checks:
1. samples: device 0 sampled about 10 times a second;
2. process memory: the live device allocations the trace saw for the target during the sleep
   = memory_reserved() (PyTorch's cache is what it cudaMalloc'ed); NVML's memory of the target
   then = that + the gap, the gap (the CUDA context, cuBLAS workspaces) between 16 MiB and
   4 GiB; the summary's gap table has the target's row;
3. device memory: the sample nearest nvidia-smi's reading = its memory.used (within 64 MiB:
   other processes may allocate between the two reads);
4. utilisation: mean >= 50 % over the samples inside the busy phases (1 s margin: NVML
   averages over up to a second), <= 10 % inside the sleep, whose edges are the traced
   calls around it (the last launch before it, the first after);
5. GPM (Hopper and newer, compute capability >= 9.0): sm_active present and > 0 in the busy
   phases; SKIP on older GPUs;
6. cost: the target in --cost mode (fixed steps) traced with --gpu-samples 10 and 0 in
   alternating turns; INFO the ratio of median step times, PASS at most 1.03.
Results: one JSON object per line in DIR/nvml_check.jsonl. Exit 1 on any FAIL.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucheck  # noqa: E402

BUSY_S = 4.0
SLEEP_S = 3.0
MARGIN_S = 1.0
COST_STEPS = 300
MIB = 1 << 20


# ---- the target ------------------------------------------------------------------------------

def _train(seconds: float, steps: int = 0):
    import torch

    model = _train.model
    optimizer, x = _train.optimizer, _train.x
    times, end = [], time.time() + seconds
    while (time.time() < end) if not steps else len(times) < steps:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def _smi_used() -> int:
    done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                           "nounits", "-i", "0"], capture_output=True, text=True)
    return int(done.stdout.split()[0]) * MIB if done.returncode == 0 else -1


def target(outdir: str, cost: bool) -> None:
    import torch

    torch.cuda.set_device(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
    _train.model = torch.nn.Sequential(*layers).cuda()
    _train.optimizer = torch.optim.SGD(_train.model.parameters(), lr=1e-4)
    _train.x = torch.randn(2048, 4096, device="cuda")
    _train(0, steps=5)  # warm-up
    if cost:
        print(json.dumps({"step_ms": [t * 1e3 for t in _train(0, steps=COST_STEPS)]}))
        return
    phases = {"busy1_start": time.time()}
    steps = _train(BUSY_S)
    phases["sleep_start"] = time.time()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    smi_at, smi = time.time(), _smi_used()
    time.sleep(SLEEP_S)
    phases["sleep_end"] = time.time()
    steps += _train(BUSY_S)
    phases["busy2_end"] = time.time()
    with open(os.path.join(outdir, "target.json"), "w") as f:
        json.dump({"pid": os.getpid(), "phases": phases, "reserved": reserved,
                   "allocated": allocated, "smi_used": smi, "smi_at": smi_at,
                   "capability": list(torch.cuda.get_device_capability(0)),
                   "name": torch.cuda.get_device_name(0), "steps": len(steps)}, f)


# ---- the checks ------------------------------------------------------------------------------

def live_at(events, pid: int, ts: float) -> int:
    """Device bytes the target had cudaMalloc'ed and not cudaFree'd at wall time `ts` (the
    runtime's calls: PyTorch's caching allocator makes them; the driver's cuMemAlloc inside
    each is the same allocation)."""
    live, sizes = 0, {}
    for e in events:
        if e.get("pid") != pid or e.get("phase") != "exit" or e["ts"] > ts or e.get("ret"):
            continue
        if e["api"] == "cudaMalloc":
            sizes[e["ptr"]] = e["args"]["size"]
            live += e["args"]["size"]
        elif e["api"] == "cudaFree":
            live -= sizes.pop(e["args"]["ptr"], 0)
    return live


def check_run(v, outdir: str, stdout: str) -> None:
    known = json.load(open(os.path.join(outdir, "target.json")))
    objects = [json.loads(l) for l in open(os.path.join(outdir, "trace.jsonl"))
               if l.startswith("{")]
    calls = [o for o in objects if "type" not in o]
    samples = [o for o in objects if o.get("type") == "gpu_sample" and o["device"] == 0]
    pid, ph = known["pid"], known["phases"]
    span = ph["busy2_end"] - ph["busy1_start"]
    v.add("samples", len(samples) >= 8 * span, "%d samples of device 0 over the %.1f s run "
          "(10 a second asked)" % (len(samples), span))
    # the process's memory during the sleep
    sleeping = [s for s in samples if ph["sleep_start"] + 0.2 < s["ts"] < ph["sleep_end"] - 0.2]
    mine = [p for s in sleeping for p in s["processes"] if p["pid"] == pid and "memory" in p]
    live = live_at(calls, pid, ph["sleep_start"] + 0.1)
    v.add("live allocations", live == known["reserved"], "trace %d bytes live in cudaMalloc "
          "blocks during the sleep, torch.cuda.memory_reserved() %d" % (live, known["reserved"]))
    if mine:
        nvml = mine[len(mine) // 2]["memory"]
        gap = nvml - live
        v.add("process memory", 16 * MIB <= gap <= 4096 * MIB,
              "NVML %d MiB = memory_reserved() %d MiB + gap %d MiB (context, workspaces)"
              % (nvml // MIB, known["reserved"] // MIB, gap // MIB))
    else:
        v.add("process memory", False, "no sample lists pid %d with its memory" % pid)
    v.add("gap table", any(line.split()[:2] == [str(pid), "0"] for line in stdout.splitlines()),
          "the summary's GPU Memory Gap table has pid %d's row" % pid)
    # device memory against nvidia-smi
    near = min(samples, key=lambda s: abs(s["ts"] - known["smi_at"]), default=None)
    if near is not None and known["smi_used"] >= 0:
        diff = abs(near["mem_used"] - known["smi_used"])
        v.add("device memory", diff <= 64 * MIB, "sample %d MiB, nvidia-smi memory.used %d MiB "
              "(%.2f s apart)" % (near["mem_used"] // MIB, known["smi_used"] // MIB,
                                 abs(near["ts"] - known["smi_at"])))
    # utilisation: busy, then the dip between the calls around the sleep
    launches = [c["ts"] for c in calls if c.get("pid") == pid and c.get("phase") == "exit"
                and gpucheck.is_launch(c["api"])]
    before = max((t for t in launches if t < ph["sleep_start"] + 0.05), default=ph["sleep_start"])
    after = min((t for t in launches if t > ph["sleep_end"] - 0.05), default=ph["sleep_end"])
    busy = [s["gpu_util"] for s in samples if "gpu_util" in s and (
        ph["busy1_start"] + MARGIN_S < s["ts"] < ph["sleep_start"]
        or ph["sleep_end"] + MARGIN_S < s["ts"] < ph["busy2_end"])]
    idle = [s["gpu_util"] for s in samples if "gpu_util" in s
            and before + MARGIN_S < s["ts"] < after]
    v.add("busy utilisation", bool(busy) and statistics.mean(busy) >= 50,
          "mean %.0f %% over %d samples of the loop" % (statistics.mean(busy or [0]), len(busy)))
    v.add("idle utilisation", bool(idle) and statistics.mean(idle) <= 10,
          "mean %.1f %% over %d samples between the last launch before the sleep and the "
          "first after it (%.2f s apart)" % (statistics.mean(idle or [0]), len(idle),
                                             after - before))
    # NVLink (a one-GPU loop sends nothing over it: shown, not judged)
    nvlink = [s for s in samples if "nvlink_tx_kbs" in s]
    v.info("NVLink", "nvlink_tx_kbs/rx in %d of %d samples, max %d/%d KB/s" % (
        len(nvlink), len(samples), max([s["nvlink_tx_kbs"] for s in nvlink] or [0]),
        max([s["nvlink_rx_kbs"] for s in nvlink] or [0])) if nvlink else
        "none in %d samples (no NVLink on device 0, or NVML does not expose it: the "
        "tracer's stderr says which)" % len(samples))
    if tuple(known["capability"]) >= (9, 0):
        active = [s["sm_active"] for s in samples if "sm_active" in s
                  and ph["busy1_start"] + MARGIN_S < s["ts"] < ph["sleep_start"]]
        v.add("GPM", bool(active) and max(active) > 0, "sm_active in %d busy samples, max "
              "%.1f %%, tensor_active max %.1f %% (%s)" % (
                  len(active), max(active or [0]), max([s.get("tensor_active", 0)
                                                        for s in samples] or [0]),
                  known["name"]))
    else:
        v.skip("GPM", "%s has compute capability %s (GPM: Hopper and newer)"
               % (known["name"], known["capability"]))


def check_cost(v, tracer, turns: int, timeout: float) -> dict:
    me = os.path.abspath(__file__)
    steps = {"10": [], "0": []}
    for _ in range(turns):
        for hz in ("10", "0"):
            done = subprocess.run(tracer + ["--summary", "--gpu-samples", hz, "--", sys.executable,
                                            me, "--target", "/tmp", "--cost"],
                                  capture_output=True, text=True, timeout=timeout)
            lines = [l for l in done.stdout.splitlines() if l.startswith('{"step_ms"')]
            if done.returncode != 0 or not lines:
                v.add("cost", False, "a run exited %d (%s)" % (done.returncode,
                                                               gpucheck.tail(done.stderr)))
                return {}
            steps[hz] += json.loads(lines[0])["step_ms"]
    on, off = statistics.median(steps["10"]), statistics.median(steps["0"])
    v.add("cost", on / off <= 1.03, "median step %.3f ms with samples at 10 Hz, %.3f ms "
          "without: %.4fx (%d turns of %d steps each)" % (on, off, on / off, turns, COST_STEPS))
    return {"on_ms": on, "off_ms": off}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/ebpf-cuda-nvml"))
    parser.add_argument("--turns", type=int, default=3, help="cost turns (0: none)")
    parser.add_argument("--timeout", type=float, default=300, help="s, per run")
    parser.add_argument("--target", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--cost", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.target:
        target(args.target, args.cost)
        return 0
    v = gpucheck.Verdicts("nvml")
    if not gpucheck.has_module("torch"):
        v.skip("all", "PyTorch is not installed here")
        return v.status()
    tracer, outdir = gpucheck.tracer_command(), args.out
    os.makedirs(outdir, exist_ok=True)
    trace = os.path.join(outdir, "trace.jsonl")
    done = subprocess.run(tracer + ["--json", "-o", trace, "--summary", "--gpu-samples", "10",
                                    "--", sys.executable, os.path.abspath(__file__),
                                    "--target", outdir],
                          capture_output=True, text=True, timeout=args.timeout)
    with open(os.path.join(outdir, "summary.txt"), "w") as f:
        f.write(done.stdout + "\n--- stderr\n" + done.stderr)
    if done.returncode != 0 or not os.path.exists(os.path.join(outdir, "target.json")):
        v.add("traced run", False, "exited %d (%s)" % (done.returncode,
                                                       gpucheck.tail(done.stderr)))
        return v.status()
    for line in done.stderr.splitlines():
        if "GPU state" in line:
            v.info("sampler", line)
    check_run(v, outdir, done.stdout)
    cost = check_cost(v, tracer, args.turns, args.timeout) if args.turns else {}
    with open(os.path.join(outdir, "nvml_check.jsonl"), "a") as f:
        f.write(json.dumps({"when": time.time(), "cost": cost, "counts": dict(v.counts)}) + "\n")
    return v.status()


if __name__ == "__main__":
    sys.exit(main())
