"""The `memory` check (issue 36): the tracer's peak resident set and the kernel names of
framework imports.

    python3 scripts/gpu/memory_check.py --out DIR [CASE ...]     (cases: torch jax attach)

Each case runs the tracer ($TRACER, else `python3 -m ebpf_cuda`) with `-o /dev/null` and
samples its /proc/PID/status every 20 ms until it ends: VmHWM, the kernel's own high-water
mark of the tracer's resident set (heap and mapped file pages), must be <= 64 MB (it was 374
MB tracing JAX and 422 MB attached to a PyTorch loop, D34), run with `--gpu-samples 0`: the
tracer's own memory. Each case runs again as users run it, the GPU's state sampled through
NVML (the default): that figure is INFO (libnvidia-ml's own ~18 MB: D36). Traced from their start, the
PyTorch and JAX programs' imports register tens of thousands of kernels: the tracer must not
say "kernel names lost" (every PyTorch run said "20014 kernel names lost"). Cases:

- `torch`: a PyTorch matmul loop (50 steps) traced from its start;
- `jax`: the same in JAX, traced from its start;
- `attach`: `-d PID` to a running PyTorch loop, ended 8 s after the probes are on.
- `attach-profile` (a diagnostic, not judged): `attach` with `--gpu-samples 0` under
  heap_profile.py (tracemalloc): where the Python heap stood at its peak, and the largest
  mappings, in DIR/heap-attach.txt. Needs the zipapp ($TRACER).

A framework that is not installed gives SKIP. Ground truth: the kernel's VmHWM; the bound
from the issue.
"""
import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpucheck  # noqa: E402
import heap_profile  # noqa: E402

BOUND_KIB = 64 * 1024
STEPS = {
    "torch": "import torch\nx = torch.randn(256, 256, device='cuda')\n"
             "for _ in range(50):\n    x = torch.tanh(x @ x)\ntorch.cuda.synchronize()\n",
    "jax": "import jax, jax.numpy as jnp\nx = jnp.ones((256, 256))\n"
           "for _ in range(50):\n    x = jnp.tanh(x @ x)\nx.block_until_ready()\n",
}
LOOP = ("import sys, time, torch\nx = torch.randn(256, 256, device='cuda')\n"
        "for _ in range(20):\n    x = torch.tanh(x @ x)\ntorch.cuda.synchronize()\n"
        "print('ready', flush=True)\nend = time.time() + 60\nwhile time.time() < end:\n"
        "    x = torch.tanh(x @ x)\n    torch.cuda.synchronize()\n")


def _status(pid: int) -> Dict[str, int]:
    try:
        with open("/proc/%d/status" % pid) as f:
            return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f)
                    if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}
    except (OSError, ValueError, IndexError):
        return {}


def _run(argv: List[str], log: str, target: Optional[subprocess.Popen] = None,
         seconds: float = 8.0) -> Dict[str, object]:
    """Run the tracer, sampling it. With `target` (attached to), the target is ended
    `seconds` after the tracer says it is probing, and the tracer then ends by itself."""
    with open(log + ".err", "w") as err:
        tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        peak: Dict[str, int] = {}
        end: Optional[float] = None
        deadline = time.monotonic() + 600
        while tracer.poll() is None:
            status = _status(tracer.pid)
            if status.get("VmHWM", 0) > peak.get("VmHWM", 0) + 2048:  # (where it went)
                peak["mappings"] = heap_profile.mappings(tracer.pid, 6)  # type: ignore
            for key, value in status.items():
                peak[key] = max(peak.get(key, 0), value)
            if target is not None and end is None:
                with open(log + ".err") as f:
                    if "probing" in f.read():
                        end = time.monotonic() + seconds
            if target is not None and end is not None and time.monotonic() > end:
                target.kill()
                target = None
            if time.monotonic() > deadline:
                tracer.send_signal(signal.SIGTERM)
            time.sleep(0.02)
    with open(log + ".err") as f:
        stderr = f.read()
    return {"rc": tracer.returncode, "peak": peak, "stderr": stderr}


def _judge(v: gpucheck.Verdicts, case: str, run: Dict[str, object], names: bool,
           with_gpu: Optional[Dict[str, object]] = None) -> None:
    """The tracer's own memory (no GPU state: NVML's library is not loaded) against the
    bound; with `with_gpu`, the same run with the GPU's state sampled (the default), INFO:
    what libnvidia-ml adds (monitor's nvml_memory.py measures it step by step)."""
    peak, stderr = run["peak"], str(run["stderr"])
    hwm = peak.get("VmHWM", 0)  # type: ignore[union-attr]
    v.add(case + " rss", run["rc"] == 0 and 0 < hwm <= BOUND_KIB,
          "--gpu-samples 0: tracer exited %s; VmHWM %d KiB (bound %d), at its peak RssAnon "
          "%d, RssFile %d: %s"
          % (run["rc"], hwm, BOUND_KIB, peak.get("RssAnon", 0),  # type: ignore[union-attr]
             peak.get("RssFile", 0), gpucheck.tail(stderr, 3)))  # type: ignore[union-attr]
    v.info(case + " mappings", "the largest at the tracer's last VmHWM rise: %s"
           % "; ".join(peak.get("mappings", [])))  # type: ignore[union-attr]
    if with_gpu is not None:
        gpu = with_gpu["peak"]
        v.info(case + " rss with the GPU's state",
               "default (NVML sampled): tracer exited %s; VmHWM %d KiB (+%d over the run "
               "without), RssAnon %d, RssFile %d"
               % (with_gpu["rc"], gpu.get("VmHWM", 0),  # type: ignore[union-attr]
                  gpu.get("VmHWM", 0) - hwm, gpu.get("RssAnon", 0),  # type: ignore[union-attr]
                  gpu.get("RssFile", 0)))  # type: ignore[union-attr]
    if names:
        lost = [line for line in stderr.splitlines() if "kernel names lost" in line]
        v.add(case + " names", not lost, "; ".join(lost) or "no kernel name said lost")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("cases", nargs="*", default=["torch", "jax", "attach"])
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    v = gpucheck.Verdicts("memory")
    tracer = gpucheck.tracer_command() + ["-o", os.devnull]
    own = tracer + ["--gpu-samples", "0"]
    for case in args.cases:
        module = "jax" if case == "jax" else "torch"
        if not gpucheck.has_module(module):
            v.skip(case, "%s not installed here" % module)
            continue
        log = os.path.join(args.out, "memory-" + case)
        if case in STEPS:
            command = ["--", sys.executable, "-c", STEPS[case]]
            _judge(v, case, _run(own + command, log), names=True,
                   with_gpu=_run(tracer + command, log + "-gpu"))
            continue
        if case == "attach-profile":
            _profiled(v, own, args.out)
            continue
        runs = [_attached(argv, log + suffix) for argv, suffix in ((own, ""), (tracer, "-gpu"))]
        if None in runs:
            v.add(case, False, "the PyTorch loop did not start")
            continue
        _judge(v, case, runs[0], names=False, with_gpu=runs[1])
    return v.status()


def _profiled(v: gpucheck.Verdicts, own: List[str], out: str) -> None:
    """The attach case under heap_profile.py: its report in OUT/heap-attach.txt (INFO)."""
    python, program = own[0], own[1] if len(own) > 1 else ""
    if not program.endswith(".pyz"):
        v.skip("attach-profile", "needs the zipapp ($TRACER): %s" % " ".join(own[:2]))
        return
    report = os.path.join(out, "heap-attach.txt")
    here = os.path.dirname(os.path.abspath(__file__))
    argv = [python, os.path.join(here, "heap_profile.py"), "--report", report, "--"] + own[1:]
    run = _attached(argv, os.path.join(out, "memory-attach-profile"))
    if run is None:
        v.add("attach-profile", False, "the PyTorch loop did not start")
        return
    with open(report) as f:
        head = f.readline().strip()
    v.info("attach-profile", "tracer exited %s; VmHWM %d KiB; %s (the rest: %s)"
           % (run["rc"], run["peak"].get("VmHWM", 0), head, report))  # type: ignore


def _attached(tracer: List[str], log: str) -> Optional[Dict[str, object]]:
    """`_run` attached (-d) to a PyTorch loop started for it; None if it did not start."""
    loop = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE, text=True)
    try:
        assert loop.stdout is not None
        if loop.stdout.readline().strip() != "ready":
            return None
        return _run(tracer + ["-d", str(loop.pid)], log, loop)
    finally:
        loop.kill()
        loop.wait()


if __name__ == "__main__":
    sys.exit(main())
