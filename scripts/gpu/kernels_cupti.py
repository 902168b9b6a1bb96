"""Kernel names against CUPTI, framework by framework (issue 40): PyTorch eager, CUDA graphs,
torch.compile, Triton, CuPy, JAX and numba, each traced from its start.

    python3 scripts/gpu/kernels_cupti.py [--out DIR] [--timeout S] [CASE ...]   (as root)
    python3 scripts/gpu/kernels_cupti.py --list

The tracer is $TRACER (run.sh: `python3 ebpf-cuda.pyz`), else `python3 -m ebpf_cuda`.
Each case is this file run again as the target (`--target CASE DIR`) under
`TRACER --json -o DIR/CASE.jsonl`: it warms its workload up (compiles, loads modules,
makes handles), then runs a window of steps under torch.profiler (CUPTI, in the same
process: it records the kernels of CuPy, JAX, numba and Triton too) and writes the window's
wall-clock bounds, its pid and device and CUPTI's record (gpucheck.cupti_from_profile) to
DIR/CASE.json. The check, on the target's launches in the window:

- launches: the tracer's GPU launches (counted once across the runtime and driver layers;
  launches captured into a graph are not launches) equal CUPTI's launch API calls, and its
  graph launches CUPTI's graph launch calls;
- named: every kernel has a name (graph nodes too), and no graph launch has unknown nodes;
- kernels: the kernels (name, grid, block) of the eager launches and of the graph launches'
  nodes equal CUPTI's kernels as multisets (the names as CUPTI demangles them);
- device: every launch and graph launch carries the device the target ran on
  (torch.cuda.current_device()).

A case whose framework is not installed (or JAX without a GPU backend) is SKIPped, and says
why; one the tracer lost events in fails. Exit status 0 when every case run passed, 1 on
any failure, 77 when every case was skipped.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucheck  # noqa: E402

HERE = os.path.abspath(__file__)


# -- the workloads (in the target) -------------------------------------------------------------

class Work:
    """A case's workload: `step()` once per step, `sync()` waits for the GPU."""

    def __init__(self, step, sync, warmup: int, window: int, what: str) -> None:
        self.step, self.sync, self.warmup, self.window, self.what = (step, sync, warmup,
                                                                     window, what)


class Skip(Exception):
    """The case cannot run here (the reason)."""


def _need(module: str, why: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise Skip("%s not installed (%s)" % (why, error))
    except Exception as error:  # (numba 0.6x under NumPy 2.x: AttributeError at import)
        raise Skip("%s does not import here (%s: %s)" % (why, type(error).__name__, error))


def case_eager() -> Work:
    torch = _need("torch", "PyTorch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return Work(step, torch.cuda.synchronize, 3, 5,
                "MLP 256-512-512-10, cross-entropy, Adam: 5 training steps")


def case_cudagraph() -> Work:
    torch = _need("torch", "PyTorch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256)).cuda().eval()
    static_x = torch.randn(64, 512, device="cuda")
    inputs = [torch.randn(64, 512, device="cuda") for _ in range(4)]
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(static_x)
    turn = [0]

    def step():
        turn[0] += 1
        static_x.copy_(inputs[turn[0] % len(inputs)])  # (a copy, no kernel)
        graph.replay()
    return Work(step, torch.cuda.synchronize, 2, 20,
                "torch.cuda.CUDAGraph of a 3-layer MLP's forward: 20 replays")


def case_compile() -> Work:
    torch = _need("torch", "PyTorch")
    _need("triton", "Triton (torch.compile's GPU backend)")

    @torch.compile
    def f(a, b):
        return torch.nn.functional.gelu(a @ b + 1.0).sum(dim=0)

    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    return Work(lambda: f(a, b), torch.cuda.synchronize, 2, 20,
                "torch.compile (default mode) of gelu(a @ b + 1).sum(0): 20 calls")


def case_triton() -> Work:
    torch = _need("torch", "PyTorch")
    triton = _need("triton", "Triton")
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
                 + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    n = 1 << 20
    x = torch.ones(n, device="cuda")
    y = torch.full((n,), 2.0, device="cuda")
    out = torch.empty_like(x)
    return Work(lambda: add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024),
                torch.cuda.synchronize, 2, 10, "a Triton kernel (add_kernel): 10 launches")


def case_cupy() -> Work:
    cupy = _need("cupy", "CuPy")
    x = cupy.arange(1 << 20, dtype=cupy.float32)
    a = cupy.ones((256, 256), dtype=cupy.float32)
    scale = cupy.RawKernel(r'''
extern "C" __global__ void ebpf_cuda_scale(float *x, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}''', "ebpf_cuda_scale")
    n = x.size

    def step():
        y = x * 2 + 1  # (elementwise kernels)
        y.sum()  # (a reduction)
        a @ a  # (cuBLAS)
        scale((n // 256,), (256,), (x, cupy.float32(1.0), cupy.int32(n)))  # (a RawKernel)
    return Work(step, cupy.cuda.runtime.deviceSynchronize, 2, 5,
                "CuPy: elementwise, a reduction, a matmul, a RawKernel: 5 steps")


def case_jax() -> Work:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = _need("jax", "JAX")
    if jax.default_backend() not in ("gpu", "cuda"):
        raise Skip("JAX has no GPU backend here (default backend %s)" % jax.default_backend())
    import jax.numpy as jnp

    @jax.jit
    def f(a, b):
        return jnp.tanh(a @ b + 1.0).sum(axis=0)

    a = jnp.ones((512, 512), dtype=jnp.float32)
    b = jnp.full((512, 512), 0.5, dtype=jnp.float32)
    last = [None]

    def step():
        last[0] = f(a, b)

    def sync():
        if last[0] is not None:
            last[0].block_until_ready()
    return Work(step, sync, 3, 10, "JAX jit of tanh(a @ b + 1).sum(0): 10 calls")


def case_numba() -> Work:
    import numpy

    if not hasattr(numpy, "row_stack"):  # (numba-cuda still registers it; NumPy 2.4 dropped
        numpy.row_stack = numpy.vstack   # it: the workload's shim, the tracer sees none of it)
    _need("numba", "numba")
    cuda = _need("numba.cuda", "numba-cuda")

    if not cuda.is_available():
        raise Skip("numba sees no CUDA device")

    @cuda.jit
    def scale(x, factor):
        i = cuda.grid(1)
        if i < x.size:
            x[i] *= factor

    @cuda.jit
    def shift2d(x, by):
        i, j = cuda.grid(2)
        if i < x.shape[0] and j < x.shape[1]:
            x[i, j] += by

    x = cuda.to_device(numpy.ones(1 << 20, dtype=numpy.float32))
    m = cuda.to_device(numpy.zeros((256, 256), dtype=numpy.float32))

    def step():
        scale[4096, 256](x, 1.0)
        shift2d[(8, 32), (32, 8)](m, 1.0)
    try:
        step()  # (compiles both: a numba that cannot compile here is a SKIP, not a FAIL)
    except Exception as error:
        raise Skip("numba cannot compile a kernel here (%s: %s)" % (type(error).__name__,
                                                                   str(error)[:200]))
    return Work(step, cuda.synchronize, 2, 10,
                "numba @cuda.jit kernels, 1-D (4096x256) and 2-D (8,32)x(32,8): 10 steps")


CASES = {"eager": case_eager, "cudagraph": case_cudagraph, "compile": case_compile,
         "triton": case_triton, "cupy": case_cupy, "jax": case_jax, "numba": case_numba}
NEEDS = {"eager": ["torch"], "cudagraph": ["torch"], "compile": ["torch", "triton"],
         "triton": ["torch", "triton"], "cupy": ["torch", "cupy"], "jax": ["torch", "jax"],
         "numba": ["torch", "numba"]}


def target(case: str, outdir: str) -> int:
    """The traced process: the workload, warmed up, then its window under CUPTI."""
    try:
        torch = _need("torch", "PyTorch (torch.profiler is the ground truth)")
        if not torch.cuda.is_available():
            raise Skip("torch sees no CUDA device")
        torch.zeros(1, device="cuda")  # (the primary context, CUPTI's too)
        torch.cuda.synchronize()
        work = CASES[case]()
    except Skip as why:
        with open(os.path.join(outdir, case + ".skip"), "w") as f:
            f.write(str(why))
        return gpucheck.SKIP_STATUS
    from torch.profiler import ProfilerActivity, profile

    for _ in range(work.warmup):
        work.step()
    work.sync()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.time()
        for _ in range(work.window):
            work.step()
        work.sync()
        torch.cuda.synchronize()
        end = time.time()
    truth = gpucheck.cupti_from_profile(prof)
    truth.update(case=case, what=work.what, window_start=start, window_end=end,
                 pid=os.getpid(), device=torch.cuda.current_device(), torch=torch.__version__,
                 cuda=torch.version.cuda)
    with open(os.path.join(outdir, case + ".json"), "w") as f:
        json.dump(truth, f)
    time.sleep(0.5)  # (the tracer reads the last launches while this process still lives)
    return 0


# -- the check (the orchestrator) --------------------------------------------------------------

def check_case(case: str, outdir: str, timeout: float, v: gpucheck.Verdicts) -> None:
    missing = [m for m in NEEDS[case] if not gpucheck.has_module(m)]
    if missing:
        v.skip(case, "%s not installed here" % ", ".join(missing))
        return
    for suffix in (".json", ".skip", ".jsonl"):
        if os.path.exists(os.path.join(outdir, case + suffix)):
            os.unlink(os.path.join(outdir, case + suffix))
    trace = os.path.join(outdir, case + ".jsonl")
    command = gpucheck.tracer_command() + ["--json", "-o", trace, "--", sys.executable, HERE,
                                           "--target", case, outdir]
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as late:
        rc, stdout, stderr = 124, str(late.stdout or ""), str(late.stderr or "")
    took = time.monotonic() - started
    with open(os.path.join(outdir, case + ".err"), "w") as f:
        f.write(stdout + "\n" + stderr)
    skip = os.path.join(outdir, case + ".skip")
    if os.path.exists(skip):
        with open(skip) as f:
            v.skip(case, f.read())
        return
    truth_path = os.path.join(outdir, case + ".json")
    if rc != 0 or not os.path.exists(truth_path) or not os.path.exists(trace):
        v.add(case, False, "the traced run exited %d after %.0f s (%s)" % (
            rc, took, gpucheck.tail(stderr)))
        return
    with open(truth_path) as f:
        truth = json.load(f)
    events = gpucheck.load_events(trace)
    exits = gpucheck.exits_of(events, truth["pid"], (truth["window_start"],
                                                     truth["window_end"]))
    work = gpucheck.traced_work(exits)
    lost = gpucheck.lost_in(stderr)
    v.info(case, "%s; torch %s, CUDA %s; traced in %.0f s" % (truth["what"], truth["torch"],
                                                             truth["cuda"], took))
    for part, ok, detail in gpucheck.compare_with_cupti(work, truth):
        if lost:
            ok, detail = False, "%s; the tracer lost %d events" % (detail, lost)
        v.add("%s %s" % (case, part), ok, detail)
    devices = {}
    for e in work["launches"] + work["graph_events"]:
        key = str(e.get("device"))
        devices[key] = devices.get(key, 0) + 1
    v.add("%s device" % case, set(devices) == {str(truth["device"])},
          "launches and graph launches by device %s; the target ran on device %d"
          % (devices, truth["device"]))
    if "None" in devices:
        _why_no_device(events, work, os.path.join(outdir, case + ".devices.json"))
    os.unlink(trace)  # (large; kept in DIR/CASE.json: the ground truth)


def _why_no_device(events, work, path: str) -> None:
    """For each thread with a launch that carries no device: the context and device calls
    it made before its first such launch (the last 12), to DIR/CASE.devices.json."""
    firsts = {}
    for e in work["launches"] + work["graph_events"]:
        if e.get("device") is None:
            thread = (e.get("pid"), e.get("tid"))
            firsts[thread] = min(firsts.get(thread, e["ts"]), e["ts"])
    found = {}
    for e in events:
        thread = (e.get("pid"), e.get("tid"))
        if thread in firsts and e.get("ts", 0) < firsts[thread] and (
                "Ctx" in e.get("api", "") or "Device" in e.get("api", "")):
            found.setdefault("%s/%s" % thread, []).append(
                {k: e.get(k) for k in ("api", "phase", "args", "outs", "ret", "device")})
    with open(path, "w") as f:
        json.dump({t: calls[-12:] for t, calls in found.items()}, f, indent=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", metavar="CASE",
                        help="of %s (default: all)" % ", ".join(CASES))
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/ebpf-cuda-kernels"))
    parser.add_argument("--timeout", type=float, default=300, help="s, per case")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--target", nargs=2, metavar=("CASE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.target:
        return target(*args.target)
    if args.list:
        for name, needs in NEEDS.items():
            print("%-10s needs %s" % (name, ", ".join(needs)))
        return 0
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error("unknown case(s) %s; cases: %s" % (", ".join(unknown), ", ".join(CASES)))
    os.makedirs(args.out, exist_ok=True)
    v = gpucheck.Verdicts("kernels")
    for case in args.cases or list(CASES):
        check_case(case, args.out, args.timeout, v)
    return v.status()


if __name__ == "__main__":
    raise SystemExit(main())
