"""CuPy's own runtime calls, known counts: N cudaMalloc, N cudaFree, N cudaDeviceSynchronize
through cupy.cuda.runtime; prints which CUDA runtime files the process maps, then `ok N`.
CuPy's runtime is linked into its own extension modules, loaded after the tracer started:
run.sh's `late-load` check traces this and compares (gpucheck.py late-load).

    python3 ebpf-cuda.pyz --json -o cupy.jsonl --api runtime -- python3 cupy_prog.py 50
"""
import sys
import cupy
n = int(sys.argv[1])
rt = cupy.cuda.runtime
rt.getDeviceCount()
ptrs = [rt.malloc(1 << 20) for _ in range(n)]
for p in ptrs:
    rt.free(p)
for _ in range(n):
    rt.deviceSynchronize()
x = cupy.arange(1 << 20, dtype=cupy.float32)
float((x * 2).sum())
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "cudart" in l or "libcuda." in l or "cupy_backends" in l})
print("maps:", " ".join(maps))
print("ok", n)
