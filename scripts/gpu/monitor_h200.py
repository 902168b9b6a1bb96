"""Issue 21 on a GPU host: `ebpf-cuda monitor` beside a PyTorch training loop, a
torch.compile loop and a CuPy loop, all started after the monitor.

    python3 -m ebpf_cuda.bundle -o ebpf-cuda.pyz        # (where the repository is)
    sudo OUT=/tmp/out python3 scripts/gpu/monitor_h200.py --pyz ebpf-cuda.pyz

(run.sh's `monitor` runs `--parts counts,parallel`.) Needs root, CUDA, PyTorch (with CUPTI:
torch.profiler) and CuPy; the tracer comes from the zipapp only (no pyelftools or click
needed). Writes JSON lines to $OUT/monitor_h200.jsonl
(and prints them):

- `{"part": "counts", "workload": ...}`: the monitor's per-process kernel launches (sum of
  ebpf_cuda_kernel_launches_total{pid}) against CUPTI's launch API calls (torch.profiler) or
  the loop's known count (CuPy); a JAX jit loop (XLA launches through `_ptsz` exports that
  reach the plain ones: each counted once, issue 40) against CUPTI's; the cudaMalloc calls and bytes the monitor counted while the
  workload ran against PyTorch's allocator statistics (segments and reserved bytes
  allocated); the kernel names of both.
- `{"part": "overhead", ...}`: MLP training step (ms) and tiny-op loop (us per op) untraced,
  with bare counting entry probes at the places the monitor probes (the floor any probe
  pays), and with the monitor, alternated in the same run; the ratios the issue bounds
  (step <= 1.02x untraced; tiny op <= 1.02x the bare floor).
- `{"part": "stats"}` (`--parts stats`): with kernel.bpf_stats_enabled=1, the programs'
  own time (no trap) per tiny op under the bare probes and under each monitor mode: runs
  per op and ns per run of each program, read around the timed loop only.
- `{"part": "windows", ...}` (`--parts windows`): one child looping all along (tiny ops,
  then MLP steps) while the modes take turns under it, `--window` seconds each, `--rounds`
  rounds; each round's window medians give a ratio (the median of those is the figure),
  and each mode's 10th percentiles.
- `{"part": "parallel", ...}` (`--parts parallel`): `--parallel` MLP children started at
  once (ranks of one job starting together: each registers PyTorch's ~30,000 kernels in the
  same second), each child's launches and unnamed launches against its CUPTI count, and the
  events lost meanwhile by cause.
- `{"part": "monitor"}`: its scrape time and resident memory (VmRSS, and its anonymous,
  file, BPF-map and NVML-library shares); the same memory figures idle, after its start, in
  `"start"`, with the idle scrape time.
- `{"part": "gpu-memory"}` (`--parts gpu-memory`): the same monitor started again with
  `--no-gpu`, idle: its memory and scrape time against the first one's idle figures (GPU
  state on, the default): what the GPU's state costs (issue 37's follow-up; D35: 32.1 MB
  idle without, 54.8 MB with, scrapes 2.7 and 50 ms). PASS when the idle scrape with the GPU
  state takes at most 1.5x the one without plus 2 ms (a scrape serves the sampler's last
  round, no NVML call); the memory is INFO (scripts/gpu/nvml_memory.py splits it by step).

The counts and parallel parts also print PASS/FAIL lines (`monitor/...`): launches equal
CUPTI's launch calls (torch.compile: at least CUPTI's, which saw the profiled part only;
CuPy: the loop's own count), cudaMalloc calls and bytes equal PyTorch's allocator
statistics (segments, reserved bytes allocated), and, for the children started at once,
each one's launches equal its CUPTI count with no launch unnamed; a workload whose framework
is missing is SKIPped. The exit status is 1 when one of those failed. Memory and scrape
times are INFO lines (no bound is checked).

`--modes` picks the overhead modes (default: untraced, bare-entry, monitor,
monitor-every-return); `monitor-old` runs the monitor of `--old-pyz` (an A/B of two builds
in one run).

Each workload is this script run again as a child (`--child NAME`), printing one JSON line.
`--smoke LIB PROG` runs the same plumbing on a CPU machine with the tests' stand-in runtime
(LIB) and driver program (PROG) in place of the GPU workloads.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucheck  # noqa: E402

HERE = os.path.abspath(__file__)
V = gpucheck.Verdicts("monitor")  # (the counts' and parallel part's PASS/FAIL lines)
OUT = os.environ.get("OUT", "/tmp/ebpf-cuda-monitor-h200")


# -- the workloads (children) ---------------------------------------------------------------

def _cupti_counts(prof) -> dict:
    """Launch API calls and kernel executions by name from a torch.profiler run."""
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    kernels, launches = {}, 0
    for event in events:
        category, name = event.get("cat", ""), event.get("name", "")
        if category == "kernel":
            kernels[name] = kernels.get(name, 0) + 1
        elif category in ("cuda_runtime", "cuda_driver") and "Launch" in name \
                and "Graph" not in name and "Host" not in name:
            launches += 1
    return {"cupti_launch_calls": launches, "cupti_kernels": sum(kernels.values()),
            "cupti_kernel_names": kernels}


def _allocator(torch) -> dict:
    stats = torch.cuda.memory_stats()
    return {"segments_allocated": stats.get("segment.all.allocated", 0),
            "reserved_bytes_allocated": stats.get("reserved_bytes.all.allocated", 0)}


def child_mlp(steps: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                    torch.nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(256, 1024, device="cuda")
        y = torch.randn(256, 1024, device="cuda")
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        torch.cuda.synchronize()
    return dict(_cupti_counts(prof), **_allocator(torch))


def child_compile(steps: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    @torch.compile
    def f(a, b):
        return torch.nn.functional.gelu(a @ b + 1.0).sum(dim=0)

    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    f(a, b)  # (compiled before the profiled part: the compiler's own launches too)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            f(a, b)
        torch.cuda.synchronize()
    counts = _cupti_counts(prof)
    counts["profiled_part_only"] = True  # CUPTI saw the loop; the monitor saw it all
    return dict(counts, **_allocator(torch))


def child_cupy(steps: int) -> dict:
    import cupy

    x = cupy.zeros(1 << 16, dtype=cupy.float32)
    x += 1  # (compiles and loads the kernel)
    cupy.cuda.runtime.deviceSynchronize()
    for _ in range(steps):
        x += 1
    cupy.cuda.runtime.deviceSynchronize()
    return {"loop_launches": steps + 1, "value": float(x[0])}


def child_jax(steps: int) -> dict:
    """XLA launches through the driver's `_ptsz` exports, which reach the plain ones (issue
    40): with sampled returns the monitor must count each launch once. Everything JAX does
    runs under the profiler (torch.profiler: CUPTI records JAX's launches too), so CUPTI's
    launch calls are the whole process's."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        import jax
        import jax.numpy as jnp

        @jax.jit
        def f(x, w):
            return jnp.sum(jnp.tanh(x @ w) * 2 + jnp.sin(x))

        x = jnp.ones((256, 256), dtype=jnp.float32)
        w = jnp.full((256, 256), 0.01, dtype=jnp.float32)
        for _ in range(steps):
            value = f(x, w)
        value.block_until_ready()
    return dict(_cupti_counts(prof), backend=jax.default_backend())


def mlp_step():
    """One training step of the MLP (a function; the model made once)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    y = torch.randn(256, 1024, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return step


def child_time_mlp(steps: int, reps: int) -> dict:
    import torch

    step = mlp_step()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3 / steps)
    return {"value": statistics.median(times), "unit": "ms per step", "all": times}


def child_time_tiny(ops: int, reps: int) -> dict:
    import torch

    if hasattr(os, "sched_setaffinity") and os.environ.get("TINY_CPU"):
        os.sched_setaffinity(0, {int(os.environ["TINY_CPU"])})  # (one core: less noise)

    x = torch.zeros(16, device="cuda")
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(ops):
            x.add_(1)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6 / ops)
    return {"value": statistics.median(times), "min": min(times), "unit": "us per op",
            "all": times}


def child_stats_tiny(ops: int, reps: int) -> dict:
    """The tiny-op loop between two lines on stdin ("ready", then "done" on stdout): the
    orchestrator reads the programs' statistics around the loop alone."""
    import torch

    if hasattr(os, "sched_setaffinity") and os.environ.get("TINY_CPU"):
        os.sched_setaffinity(0, {int(os.environ["TINY_CPU"])})
    x = torch.zeros(16, device="cuda")
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for _ in range(ops * reps):
        x.add_(1)
    torch.cuda.synchronize()
    took = (time.perf_counter() - t0) * 1e6 / (ops * reps)
    print("done", flush=True)
    sys.stdin.readline()
    return {"value": took, "ops": ops * reps, "unit": "us per op"}


def child_loop(what: str, ops: int) -> None:
    """Reps of `ops` tiny ops (what "tiny") or MLP steps ("mlp") until killed, one line
    each: the rep's end (CLOCK_MONOTONIC, s) and its us per op (ms per step)."""
    import torch

    if hasattr(os, "sched_setaffinity") and os.environ.get("TINY_CPU"):
        os.sched_setaffinity(0, {int(os.environ["TINY_CPU"])})
    if what == "tiny":
        x = torch.zeros(16, device="cuda")

        def step():
            x.add_(1)
        scale = 1e6
    else:
        step = mlp_step()
        scale = 1e3
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    while True:
        t0 = time.perf_counter()
        for _ in range(ops):
            step()
        torch.cuda.synchronize()
        took = (time.perf_counter() - t0) * scale / ops
        print("%.6f %.6f" % (time.monotonic(), took), flush=True)


CHILDREN = {
    "mlp": lambda a: child_mlp(a.steps),
    "compile": lambda a: child_compile(a.steps),
    "cupy": lambda a: child_cupy(a.steps * 10),
    "jax": lambda a: child_jax(a.steps * 10),
    "time-mlp": lambda a: child_time_mlp(a.steps, a.reps),
    "time-tiny": lambda a: child_time_tiny(a.ops, a.reps),
    "stats-tiny": lambda a: child_stats_tiny(a.ops, a.reps),
}


# -- the orchestrator -----------------------------------------------------------------------

def emit(record: dict) -> None:
    line = json.dumps(record, sort_keys=True)
    print(line, flush=True)
    with open(os.path.join(OUT, "monitor_h200.jsonl"), "a") as f:
        f.write(line + "\n")


class Monitor:
    """`python3 PYZ monitor --prometheus 127.0.0.1:0 ARGS`, until close()."""

    def __init__(self, pyz: str, args, profile: bool = False) -> None:
        wrapper = [os.path.join(os.path.dirname(HERE), "memory_profile.py")] if profile else []
        self.proc = subprocess.Popen([sys.executable, *wrapper, pyz, "monitor", "--prometheus",
                                      "127.0.0.1:0", *args], stderr=subprocess.PIPE, text=True)
        self.profile = profile
        self.lines = []
        self.port = None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            found = re.search(r"metrics at http://127.0.0.1:(\d+)/", line)
            if found:
                self.port = int(found.group(1))
                break
        if self.port is None:
            raise SystemExit("the monitor did not start: %s" % "\n".join(self.lines))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())

    def fetch(self) -> bytes:
        """The page now (what a scrape costs the monitor: the request and its answer)."""
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port) as answer:
            return answer.read()

    def scrape(self) -> dict:
        """(name, labels) -> value of the page now."""
        text = self.fetch().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                head, value = line.rsplit(" ", 1)
                name, _, labels = head.partition("{")
                samples[(name, labels.rstrip("}"))] = float(value)
        return samples

    def rss_kib(self) -> int:
        with open("/proc/%d/status" % self.proc.pid) as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def memory_kib(self) -> dict:
        """VmRSS, VmHWM, RssAnon, RssFile and the resident KiB of its BPF-map mappings (the
        ring buffer)."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            status = f.read()
        found = {key: int(re.search(key + r":\s+(\d+)", status).group(1))
                 for key in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}
        maps_kib, nvml_kib, name = 0, 0, ""
        with open("/proc/%d/smaps" % self.proc.pid) as f:
            for line in f:
                if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                    name = line.split()[-1] if len(line.split()) > 5 else ""
                elif line.startswith("Rss:") and name == "anon_inode:bpf-map":
                    maps_kib += int(line.split()[1])
                elif line.startswith("Rss:") and "libnvidia-ml" in name:
                    nvml_kib += int(line.split()[1])
        found["bpf_map_mappings"] = maps_kib
        found["nvml_library"] = nvml_kib
        return found

    def profile_now(self, when: str) -> None:
        """A line in $OUT/memory_profile.jsonl (with --memory-profile): where its memory is."""
        if self.profile:
            with open(os.path.join(OUT, "memory_profile.jsonl"), "a") as f:
                f.write(json.dumps({"when": when}) + "\n")
            os.kill(self.proc.pid, signal.SIGUSR2)
            time.sleep(3)  # (tracemalloc's snapshot of a big heap takes a moment)

    def close(self) -> int:
        self.proc.terminate()
        return self.proc.wait(60)


def total(samples: dict, name: str, *must: str) -> float:
    return sum(v for (n, labels), v in samples.items()
               if n == name and all(m in labels for m in must))


def kernel_names(samples: dict, pid: int) -> dict:
    names = {}
    for (n, labels), v in samples.items():
        if n == "ebpf_cuda_kernel_launches_total" and 'pid="%d"' % pid in labels:
            kernel = re.search(r'kernel="((?:[^"\\]|\\.)*)"', labels).group(1)
            names[kernel] = names.get(kernel, 0) + v
    return names


def run_child(name: str, args, smoke) -> dict:
    """The child workload's JSON line (and its pid)."""
    if smoke is not None:
        lib, prog = smoke
        ops = ["setdevice:0", "sleep:300", "loop:%d:malloc:4096" % 7,
               "loop:%d:launch:4,1,1:256,1,1" % args.steps, "sleep:200"]
        proc = subprocess.Popen([prog, *ops], stdout=subprocess.DEVNULL)
        proc.wait()
        return {"pid": proc.pid, "loop_launches": args.steps, "segments_allocated": 7,
                "reserved_bytes_allocated": 7 * 4096}
    proc = subprocess.Popen([sys.executable, HERE, "--child", name, "--steps", str(args.steps),
                             "--ops", str(args.ops), "--reps", str(args.reps)],
                            stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        return {"pid": proc.pid, "error": "exit status %d" % proc.returncode}
    result = json.loads(out.strip().splitlines()[-1])
    result["pid"] = proc.pid
    return result


NEEDS = {"mlp": "torch", "compile": "triton", "cupy": "cupy", "jax": "jax"}


def counts_part(monitor: Monitor, args, smoke) -> None:
    for name in (["smoke"] if smoke else ["mlp", "compile", "cupy", "jax"]):
        if not smoke and not (gpucheck.has_module("torch") and gpucheck.has_module(NEEDS[name])):
            V.skip("counts %s" % name, "%s not installed here" % NEEDS[name])
            continue
        before = monitor.scrape()
        result = run_child(name, args, smoke)
        time.sleep(2.0)  # three reader ticks: the exited process's launches are published
        after = monitor.scrape()
        pid = result["pid"]
        launches = total(after, "ebpf_cuda_kernel_launches_total", 'pid="%d"' % pid)
        mallocs = (total(after, "ebpf_cuda_api_calls_total", 'api="cudaMalloc"')
                   - total(before, "ebpf_cuda_api_calls_total", 'api="cudaMalloc"'))
        failed = (total(after, "ebpf_cuda_api_errors_total", 'api="cudaMalloc"')
                  - total(before, "ebpf_cuda_api_errors_total", 'api="cudaMalloc"'))
        malloc_bytes = (total(after, "ebpf_cuda_alloc_bytes_total", 'api="cudaMalloc"')
                        - total(before, "ebpf_cuda_alloc_bytes_total", 'api="cudaMalloc"'))
        expected = result.get("cupti_launch_calls", result.get("loop_launches"))
        record = {"part": "counts", "workload": name, "pid": pid,
                  "monitor_launches": launches, "expected_launches": expected,
                  "launches_match": launches == expected if "profiled_part_only" not in result
                  else launches >= expected,
                  "monitor_cudaMalloc_ok": mallocs - failed,
                  "monitor_cudaMalloc_bytes": malloc_bytes,
                  "monitor_kernel_names": kernel_names(after, pid),
                  "lost": total(after, "ebpf_cuda_events_lost_total")}
        record.update({k: v for k, v in result.items() if k != "pid"})
        if "segments_allocated" in result:
            record["allocator_match"] = (
                record["monitor_cudaMalloc_ok"] == result["segments_allocated"]
                and record["monitor_cudaMalloc_bytes"] == result["reserved_bytes_allocated"])
        emit(record)
        V.add("counts %s launches" % name, bool(record["launches_match"])
              and "error" not in result,
              "monitor %d launches of pid %d; %s %s%s; %d kernel names; lost %d (counted)"
              % (launches, pid, "CUPTI's launch calls" if "cupti_launch_calls" in result
                 else "the loop's own count", expected,
                 " (CUPTI saw the profiled part only: at least that)"
                 if "profiled_part_only" in result else "",
                 len(record["monitor_kernel_names"]), record["lost"])
              if "error" not in result else "the workload failed: %s" % result["error"])
        if "allocator_match" in record:
            V.add("counts %s allocator" % name, record["allocator_match"],
                  "monitor cudaMalloc %d calls, %d bytes; PyTorch's allocator %d segments, %d "
                  "bytes" % (record["monitor_cudaMalloc_ok"], record["monitor_cudaMalloc_bytes"],
                             result["segments_allocated"], result["reserved_bytes_allocated"]))


def parallel_part(monitor: Monitor, args) -> None:
    before = monitor.scrape()
    procs = [subprocess.Popen([sys.executable, HERE, "--child", "mlp", "--steps",
                               str(args.steps)], stdout=subprocess.PIPE, text=True)
             for _ in range(args.parallel)]
    results = []
    for proc in procs:
        out, _ = proc.communicate()
        result = (json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0
                  else {"error": "exit status %d" % proc.returncode})
        results.append(dict(result, pid=proc.pid))
    time.sleep(2.0)  # (three reader ticks)
    after = monitor.scrape()
    children = []
    for result in results:
        names = kernel_names(after, result["pid"])
        launches = sum(names.values())
        children.append({"pid": result["pid"], "monitor_launches": launches,
                         "cupti_launch_calls": result.get("cupti_launch_calls"),
                         "launches_match": launches == result.get("cupti_launch_calls"),
                         "unnamed_launches": names.get("unnamed", 0),
                         "kernels": len(names), "error": result.get("error")})
    lost = {}
    for (n, labels), v in after.items():
        if n == "ebpf_cuda_events_lost_total":
            lost[labels] = v - before.get((n, labels), 0)
    record = {"part": "parallel", "children": children, "lost": lost,
              "all_match": all(c["launches_match"] for c in children),
              "unnamed": sum(c["unnamed_launches"] for c in children)}
    emit(record)
    V.add("parallel", record["all_match"] and record["unnamed"] == 0,
          "%d MLP children started at once: launches %s, CUPTI %s; %d unnamed; lost %s"
          % (len(children), [c["monitor_launches"] for c in children],
             [c["cupti_launch_calls"] for c in children], record["unnamed"],
             {k: v for k, v in lost.items() if v}))


def entry_sites(pyz: str, files) -> list:
    """(path, offset) of every entry probe the monitor attaches (its default set)."""
    sys.path.insert(0, pyz)
    from ebpf_cuda.tracer import Tracer

    with Tracer(library=list(files)) as tracer:
        return sorted({(a.path, a.offset) for a in tracer.attachments if not a.retprobe})


def probe_sites(pyz: str, files) -> tuple:
    """(entry sites, return sites): (path, offset) of every probe the tracer's default set
    attaches (its returns too)."""
    sys.path.insert(0, pyz)
    from ebpf_cuda.tracer import Tracer

    with Tracer(library=list(files)) as tracer:
        return (sorted({(a.path, a.offset) for a in tracer.attachments if not a.retprobe}),
                sorted({(a.path, a.offset) for a in tracer.attachments if a.retprobe}))


class BareProbes:
    """A counting program (one atomic add) at each entry site: the floor. `multi`: through
    one uprobe_multi link per file (as the monitor attaches), else a perf-event uprobe
    each. `returns`: (path, offset) sites of counting return probes too (the floor of a
    traced call, entry and return: trace_turns.py)."""

    def __init__(self, sites, multi: bool = False, returns=()) -> None:
        from ebpf_cuda import asm
        from ebpf_cuda.asm import DW, R0, R1, R2
        from ebpf_cuda.bpf.maps import ArrayMap
        from ebpf_cuda.bpf.programs import EXPECTED_UPROBE_MULTI, Program
        from ebpf_cuda.bpf.uprobe import attach_uprobe, attach_uprobe_multi

        self.counts = ArrayMap(8, 1, "bare_counts")
        code = [asm.ld_map_value(R1, "counts", 0), asm.mov(R2, 1),
                asm.atomic_add(DW, R1, 0, R2), asm.mov(R0, 0), asm.exit()]
        self.program = Program(code, {"counts": self.counts}, name="bare_cnt",
                               expected_attach_type=EXPECTED_UPROBE_MULTI if multi else 0
                               ).load()
        if multi:
            by_file = {}
            for path, offset in sites:
                by_file.setdefault(path, []).append(offset)
            self.links = [attach_uprobe_multi(self.program, path, offsets, what="bare")
                          for path, offsets in sorted(by_file.items())]
        else:
            self.links = [attach_uprobe(self.program, path, offset, what="bare")
                          for path, offset in sites]
        self.links += [attach_uprobe(self.program, path, offset, retprobe=True,
                                     what="bare-return") for path, offset in returns]

    def close(self) -> int:
        hits = int.from_bytes(self.counts[0][:8], "little")
        for link in self.links:
            link.close()
        self.program.close()
        self.counts.close()
        return hits


# The overhead modes, alternated each round: no probe, the floor, the monitor as it runs by
# default (launch returns sampled 1 in 64 where the kernel has uprobe sessions), and the
# monitor taking every return (--return-sampling 1: D21's figure).
MODES = ("untraced", "bare-entry", "monitor", "monitor-every-return")
MODES_CHOSEN = MODES  # (--modes)


def start_mode(mode: str, pyz: str, args, monitor_args, sites):
    """(bare probes or None, a Monitor or None) for one overhead mode."""
    bare = (BareProbes(sites, multi=mode == "bare-multi") if mode.startswith("bare")
            else None)
    extra = ["--return-sampling", "1"] if mode == "monitor-every-return" else []
    which = args.old_pyz if mode == "monitor-old" else pyz
    monitor = Monitor(which, monitor_args + extra) if mode.startswith("monitor") else None
    return bare, monitor


def program_stats() -> dict:
    """(runs, ns) of every BPF program loaded now, by (id, name)."""
    from ebpf_cuda import syscalls

    found = {}
    for prog_id in syscalls.prog_ids():
        try:
            fd = syscalls.prog_fd_by_id(prog_id)
        except Exception:  # (gone meanwhile)
            continue
        try:
            info = syscalls.prog_info(fd.value)
        finally:
            fd.close()
        found[(prog_id, info.name)] = (info.run_cnt, info.run_time_ns)
    return found


def _bpf_stats(on: bool) -> None:
    with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
        f.write("1" if on else "0")


def stats_part(pyz: str, files, args, monitor_args) -> None:
    """The programs' own time per tiny op, read around the timed loop (stats-tiny)."""
    sites = entry_sites(pyz, files)
    record = {"part": "stats", "entry_sites": len(sites), "modes": {}}
    for _ in range(args.rounds):
        for mode in [m for m in MODES_CHOSEN if m != "untraced"]:
            bare, monitor = start_mode(mode, pyz, args, monitor_args, sites)
            child = subprocess.Popen(
                [sys.executable, HERE, "--child", "stats-tiny", "--ops", str(args.ops),
                 "--reps", str(args.reps)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True)
            try:
                assert child.stdout.readline().strip() == "ready"
                _bpf_stats(True)
                before = program_stats()
                child.stdin.write("\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "done"
                after = program_stats()
                _bpf_stats(False)
                child.stdin.write("\n")
                child.stdin.flush()
                result = json.loads(child.stdout.readline())
                child.wait(60)
            finally:
                _bpf_stats(False)
                if bare is not None:
                    bare.close()
                if monitor is not None:
                    monitor.close()
            ops = result["ops"]
            programs = {}
            for key, (runs, ns) in after.items():
                runs0, ns0 = before.get(key, (0, 0))
                if runs > runs0:
                    programs[key[1]] = {"runs_per_op": (runs - runs0) / ops,
                                        "ns_per_run": (ns - ns0) / (runs - runs0),
                                        "ns_per_op": (ns - ns0) / ops}
            record["modes"].setdefault(mode, []).append({
                "us_per_op_with_stats": result["value"], "programs": programs,
                "program_ns_per_op": sum(p["ns_per_op"] for p in programs.values())})
    emit(record)


class LoopChild:
    """A child_loop child; its (end, value) lines gathered by a thread."""

    def __init__(self, what: str, ops: int) -> None:
        self.proc = subprocess.Popen([sys.executable, HERE, "--child", "loop-" + what,
                                      "--ops", str(ops)], stdout=subprocess.PIPE, text=True)
        self.reps = []
        threading.Thread(target=self._gather, daemon=True).start()

    def _gather(self) -> None:
        for line in self.proc.stdout:
            end, value = line.split()
            self.reps.append((float(end), float(value)))

    def within(self, start: float, end: float) -> list:
        return [v for t, v in list(self.reps) if start <= t <= end]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def windows_part(pyz: str, files, args, monitor_args) -> None:
    """One child looping all along (tiny ops, then MLP steps); the probe modes take turns
    under it, `--window` seconds each (the reps ending inside a mode's window are its
    own), `--rounds` rounds: slow drift of the host hits neighbouring windows alike, so
    each round's window medians give a ratio, and the median of those is the figure."""
    sites = entry_sites(pyz, files)
    for what, ops in (("tiny", 2000), ("mlp", 20)):
        if what not in args.workloads:
            continue
        child = LoopChild(what, ops)
        windows = {mode: [] for mode in MODES_CHOSEN}
        try:
            while len(child.reps) < 5:  # (warm: imports done, first reps out)
                time.sleep(0.2)
            for _ in range(args.rounds):
                for mode in MODES_CHOSEN:
                    bare, monitor = start_mode(mode, pyz, args, monitor_args, sites)
                    try:
                        time.sleep(0.3)  # (a rep begun before the mode ends after it)
                        start = time.monotonic()
                        time.sleep(args.window)
                        windows[mode].append(child.within(start, time.monotonic()))
                    finally:
                        if bare is not None:
                            bare.close()
                        if monitor is not None:
                            monitor.close()
        finally:
            child.close()
        medians = {m: [statistics.median(w) if w else None for w in ws]
                   for m, ws in windows.items()}
        record = {"part": "windows", "workload": what, "ops_per_rep": ops,
                  "window_s": args.window, "window_medians": medians,
                  "reps_per_window": {m: [len(w) for w in ws] for m, ws in windows.items()},
                  "p10": {m: statistics.median([sorted(w)[len(w) // 10] for w in ws if w])
                          for m, ws in windows.items() if any(ws)}}
        base = "untraced" if what == "mlp" else "bare-entry"
        for mode in MODES_CHOSEN:
            pairs = [a / b for a, b in zip(medians[mode], medians.get(base, []))
                     if a and b]
            if mode != base and pairs:
                record["ratio %s/%s" % (mode, base)] = statistics.median(pairs)
                record["ratios %s/%s" % (mode, base)] = pairs
        emit(record)


def overhead_part(pyz: str, files, args, monitor_args) -> None:
    sites = entry_sites(pyz, files)
    workloads = args.workloads.split(",")
    MODES = MODES_CHOSEN
    figures = {(what, mode): [] for what in workloads for mode in MODES}
    best = {mode: [] for mode in MODES}  # the tiny loop's fastest rep in each run
    said = {}
    for _ in range(args.rounds):
        for mode in MODES:
            bare, monitor = start_mode(mode, pyz, args, monitor_args, sites)
            if monitor is not None:
                said[mode] = [line for line in monitor.lines if "sampled" in line]
            try:
                for what in workloads:
                    result = run_child(what, args, None)
                    figures[(what, mode)].append(result.get("value"))
                    if what == "time-tiny":
                        best[mode].append(result.get("min"))
            finally:
                if bare is not None:
                    bare.close()
                if monitor is not None:
                    monitor.close()
    median = {key: statistics.median(v) for key, v in figures.items() if None not in v}
    record = {"part": "overhead", "entry_sites": len(sites), "monitor_said": said,
              "figures": {"%s %s" % key: v for key, v in figures.items()},
              "tiny_fastest_rep": best}
    for mode in MODES:  # (the ratios the issue bounds, for each monitor mode)
        if not mode.startswith("monitor"):
            continue
        if "time-tiny" in workloads and best["bare-entry"] and best[mode]:
            record["tiny_fastest_ratio %s/bare-entry" % mode] = (
                min(best[mode]) / min(best["bare-entry"]))
        tiny = [median.get(("time-tiny", m)) for m in (mode, "bare-entry")]
        if None not in tiny:
            record["tiny_median_ratio %s/bare-entry" % mode] = tiny[0] / tiny[1]
        mlp = [median.get(("time-mlp", m)) for m in (mode, "untraced")]
        if None not in mlp:
            record["mlp_median_ratio %s/untraced" % mode] = mlp[0] / mlp[1]
    emit(record)


def scrape_times(monitor: Monitor, n: int = 50) -> tuple:
    """The milliseconds of `n` fetches of the page, and the last page."""
    times, page = [], b""
    for _ in range(n):
        t0 = time.perf_counter()
        page = monitor.fetch()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, page


def gpu_memory_part(pyz: str, monitor_args, idle: dict, idle_scrape: list) -> None:
    """A monitor without the GPU's state, idle, against the first one's idle figures."""
    bare = Monitor(pyz, monitor_args + ["--no-gpu"])
    try:
        time.sleep(2)  # (as the first: its start-up's garbage gone)
        memory = bare.memory_kib()
        times, page = scrape_times(bare)
    finally:
        bare.close()
    with_gpu, without = statistics.median(idle_scrape), statistics.median(times)
    record = {"part": "gpu-memory", "idle_memory_kib": {"gpu": idle, "no_gpu": memory},
              "scrape_ms_median": {"gpu": with_gpu, "no_gpu": without},
              "page_bytes_no_gpu": len(page)}
    emit(record)
    V.info("gpu-memory", "idle VmRSS %d KiB with the GPU's state (NVML's library %d KiB of "
           "it, anon %d, file %d), %d KiB without (anon %d, file %d): %+d KiB (issue 21's "
           "bound: 40 MB)" % (idle["VmRSS"], idle.get("nvml_library", 0), idle["RssAnon"],
                              idle["RssFile"], memory["VmRSS"], memory["RssAnon"],
                              memory["RssFile"], idle["VmRSS"] - memory["VmRSS"]))
    V.add("gpu-scrape", with_gpu <= 1.5 * without + 2.0,
          "idle scrape median %.2f ms with the GPU's state, %.2f ms without (bound: 1.5x "
          "+ 2 ms; D35, NVML read at the scrape: 50.3 against 2.73)" % (with_gpu, without))


def monitor_part(monitor: Monitor) -> None:
    times, page = scrape_times(monitor)
    parsed = []  # (the fetch, then with this script's parsing too)
    for _ in range(50):
        t0 = time.perf_counter()
        monitor.scrape()
        parsed.append((time.perf_counter() - t0) * 1e3)
    record = {"part": "monitor", "scrape_ms_median": statistics.median(times),
              "scrape_ms_max": max(times), "page_bytes": len(page),
              "scrape_and_parse_ms_median": statistics.median(parsed),
              "rss_kib": monitor.rss_kib(), "memory_kib": monitor.memory_kib(),
              "stderr": monitor.lines[:4]}
    emit(record)
    V.info("memory", "monitor VmRSS %d KiB now, VmHWM %d KiB (issue 21's bound: 40 MB; not "
           "checked); scrape of a %d-byte page: median %.2f ms, max %.2f"
           % (record["memory_kib"]["VmRSS"], record["memory_kib"]["VmHWM"], len(page),
              record["scrape_ms_median"], record["scrape_ms_max"]))


def cpu_facts() -> dict:
    """The host's CPU model and the mitigations that make calls and returns dear."""
    facts = {}
    with open("/proc/cpuinfo") as f:
        found = re.search(r"model name\s*:\s*(.*)", f.read())
        facts["model"] = found.group(1) if found else None
    where = "/sys/devices/system/cpu/vulnerabilities"
    for name in ("spec_rstack_overflow", "retbleed", "spectre_v2"):
        try:
            with open(os.path.join(where, name)) as f:
                facts[name] = f.read().strip()
        except OSError:
            pass
    return facts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyz", default="ebpf-cuda.pyz")
    parser.add_argument("--child", choices=sorted(CHILDREN) + ["loop-tiny", "loop-mlp"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="of the overhead modes")
    parser.add_argument("--parts", default="counts,overhead")
    parser.add_argument("--workloads", default="time-mlp,time-tiny",
                        help="of the overhead part")
    parser.add_argument("--smoke", nargs=2, metavar=("LIB", "PROG"))
    parser.add_argument("--modes", default=",".join(MODES), help="of the overhead part")
    parser.add_argument("--old-pyz", help="the zipapp of mode monitor-old")
    parser.add_argument("--window", type=float, default=5.0, help="s (windows part)")
    parser.add_argument("--monitor-args", default="", help="more options of the monitor")
    parser.add_argument("--parallel", type=int, default=4, help="MLP children at once")
    parser.add_argument("--memory-profile", action="store_true",
                        help="the monitor under memory_profile.py: a report at each part")
    args = parser.parse_args()
    global MODES_CHOSEN
    MODES_CHOSEN = tuple(args.modes.split(","))
    if args.child and args.child.startswith("loop-"):
        child_loop(args.child[5:], args.ops)
        return 0
    if args.child:
        print(json.dumps(CHILDREN[args.child](args)), flush=True)
        return 0
    if not args.smoke and not gpucheck.has_module("torch"):
        V.skip("all", "PyTorch not installed here (the workloads are PyTorch's)")
        return gpucheck.SKIP_STATUS
    os.makedirs(OUT, exist_ok=True)
    pyz = os.path.abspath(args.pyz)
    monitor_args = (["--kernel-labels", "200"] + args.monitor_args.split()
                    + (["-p", args.smoke[0]] if args.smoke else []))
    monitor = Monitor(pyz, monitor_args, args.memory_profile)
    files = re.search(r"monitoring \d+ functions in (.*)", "\n".join(monitor.lines)).group(1)
    time.sleep(2)  # (its start-up's garbage gone: the idle figure)
    idle = monitor.memory_kib()
    idle_scrape, _ = scrape_times(monitor)
    emit({"part": "start", "files": files.split(", "), "stderr": monitor.lines,
          "cpu": cpu_facts(), "idle_memory_kib": idle,
          "idle_scrape_ms_median": statistics.median(idle_scrape)})
    V.info("start", "monitoring %s; VmRSS %d KiB idle, scrape median %.2f ms" % (
        files, idle["VmRSS"], statistics.median(idle_scrape)))
    monitor.profile_now("idle")
    try:
        if "counts" in args.parts:
            counts_part(monitor, args, args.smoke)
            monitor.profile_now("after counts")
        if "parallel" in args.parts and not args.smoke:
            parallel_part(monitor, args)
            monitor.profile_now("after parallel")
        monitor_part(monitor)
    finally:
        status = monitor.close()
    emit({"part": "stopped", "exit_status": status, "stderr": monitor.lines[-3:]})
    if "gpu-memory" in args.parts:
        gpu_memory_part(pyz, monitor_args, idle, idle_scrape)
    if "windows" in args.parts and not args.smoke:
        windows_part(pyz, files.split(", "), args, monitor_args)
    if "stats" in args.parts and not args.smoke:
        stats_part(pyz, files.split(", "), args, monitor_args)
    if "overhead" in args.parts and not args.smoke:
        overhead_part(pyz, files.split(", "), args, monitor_args)
    return 1 if V.counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
