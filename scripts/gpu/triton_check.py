"""A small Triton kernel launched a few times, for tracing (issue 5).

    python3 -m ebpf_cuda --json -o triton.jsonl -- python3 scripts/gpu/triton_check.py

Triton loads its compiled kernel with cuModuleLoadData + cuModuleGetFunction and launches it
through the driver (cuLaunchKernel or cuLaunchKernelEx), so the trace should show LAUNCHES
driver launches whose function handle resolves to KERNEL_NAME. Prints `kernel=`,
`launches=`, `window_start=`/`window_end=` (wall-clock seconds around the timed launches, after
one warm-up launch that compiles and loads the kernel) and `ok` or `FAILED ...`.
"""
import time

import torch
import triton
import triton.language as tl

KERNEL_NAME = "add_kernel"
LAUNCHES = 5


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = out.numel()
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


def main() -> int:
    n = 1 << 20
    x = torch.ones(n, device="cuda")
    y = torch.full((n,), 2.0, device="cuda")
    add(x, y)  # warm-up: compile, load the module, first launch
    torch.cuda.synchronize()
    start = time.time()
    out = x
    for _ in range(LAUNCHES):
        out = add(out, y)
    torch.cuda.synchronize()
    end = time.time()
    print("kernel=%s" % KERNEL_NAME)
    print("launches=%d" % LAUNCHES)
    print("window_start=%.6f" % start)
    print("window_end=%.6f" % end)
    expected = 1.0 + 2.0 * LAUNCHES
    if not torch.allclose(out, torch.full_like(out, expected)):
        print("FAILED result %r, expected %r" % (out[:4].tolist(), expected))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
