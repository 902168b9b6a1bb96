#!/usr/bin/env python3
"""Calls NVIDIA's CUDA runtime (libcudart) through ctypes: a target for `ebpf-cuda` that needs
neither a compiler nor a GPU.

    python3 examples/cuda_calls.py [PATH/TO/libcudart.so.N]

The library is the path given, else $CUDART_PATH, else the nvidia-cuda-runtime-cu12 wheel's
`nvidia/cuda_runtime/lib/libcudart.so.12`, else a CUDA toolkit's, else
`ctypes.util.find_library("cudart")`.

Each call prints its result by name. Without a GPU driver every call returns 35
(cudaErrorInsufficientDriver), which is expected. Exit status: 0 when each call succeeded or
failed only for lack of a GPU (34, 35, 100), the launch of a NULL kernel may fail any way;
1 otherwise; 2 when no libcudart is found.
"""
import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Callable, List, Optional

CUDA_MEMCPY_HOST_TO_DEVICE = 1
CUDA_MEMCPY_DEVICE_TO_HOST = 2
NO_GPU_RESULTS = {34: "cudaErrorStubLibrary", 35: "cudaErrorInsufficientDriver",
                  100: "cudaErrorNoDevice"}
NAMES = {0: "cudaSuccess", 1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation",
         98: "cudaErrorInvalidDeviceFunction", 400: "cudaErrorInvalidResourceHandle",
         **NO_GPU_RESULTS}
TOOLKIT_LIBS = ("/usr/local/cuda/targets/x86_64-linux/lib/libcudart.so.13",
                "/usr/local/cuda/targets/x86_64-linux/lib/libcudart.so.12",
                "/usr/local/cuda/lib64/libcudart.so")
SIZE = 4000   # 1000 floats, as in examples/basic02.cu


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def find_libcudart(argv: List[str]) -> Optional[str]:
    """The libcudart to load: argv, $CUDART_PATH, the pip wheel, a toolkit, the loader's."""
    if len(argv) > 1:
        return argv[1]
    if os.environ.get("CUDART_PATH"):
        return os.environ["CUDART_PATH"]
    for entry in sys.path:
        wheel = Path(entry or ".") / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
        if wheel.is_file():
            return str(wheel)
    for path in TOOLKIT_LIBS:
        if os.path.isfile(path):
            return path
    return ctypes.util.find_library("cudart")


class Runtime:
    """Calls into libcudart and remembers whether any result was unexpected."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        # cudaGetErrorName needs no driver; a stand-in library may lack it
        self.error_name = getattr(self.lib, "cudaGetErrorName", None)
        if self.error_name is not None:
            self.error_name.restype = ctypes.c_char_p
            self.error_name.argtypes = [ctypes.c_int]
        self.unexpected = False

    def name(self, code: int) -> str:
        raw = self.error_name(code) if self.error_name is not None else None
        return raw.decode() if raw else NAMES.get(code, "unknown error")

    def call(self, text: str, invoke: Callable[[], int], may_fail: bool = False) -> int:
        code = invoke()
        print("%-44s -> %d %s" % (text, code, self.name(code)))
        if code != 0 and code not in NO_GPU_RESULTS and not may_fail:
            self.unexpected = True
        return code


def declare(lib: ctypes.CDLL) -> None:
    """Real signatures, so ctypes passes 64-bit pointers and dim3 by value."""
    vp, pvp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    size_t, c_int = ctypes.c_size_t, ctypes.c_int
    signatures = {
        "cudaGetDeviceCount": [ctypes.POINTER(c_int)],
        "cudaGetDevice": [ctypes.POINTER(c_int)],
        "cudaSetDevice": [c_int],
        "cudaMalloc": [pvp, size_t],
        "cudaMemcpy": [vp, vp, size_t, c_int],
        "cudaStreamCreate": [pvp],
        "cudaEventCreate": [pvp],
        "cudaEventRecord": [vp, vp],
        "cudaEventSynchronize": [vp],
        "cudaLaunchKernel": [vp, Dim3, Dim3, pvp, size_t, vp],
        "cudaStreamSynchronize": [vp],
        "cudaEventDestroy": [vp],
        "cudaStreamDestroy": [vp],
        "cudaFree": [vp],
    }
    for name, argtypes in signatures.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int


def run(cuda: Runtime) -> None:
    lib = cuda.lib
    count, device = ctypes.c_int(-1), ctypes.c_int(-1)
    dev, stream, event = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    host = (ctypes.c_float * (SIZE // 4))(*range(SIZE // 4))
    args = (ctypes.c_void_p * 1)(ctypes.addressof(dev))

    if cuda.call("cudaGetDeviceCount(&count)",
                 lambda: lib.cudaGetDeviceCount(ctypes.byref(count))) == 0:
        print("    count = %d" % count.value)
    if cuda.call("cudaGetDevice(&device)", lambda: lib.cudaGetDevice(ctypes.byref(device))) == 0:
        print("    device = %d" % device.value)
    cuda.call("cudaSetDevice(0)", lambda: lib.cudaSetDevice(0))
    if cuda.call("cudaMalloc(&dev, %d)" % SIZE,
                 lambda: lib.cudaMalloc(ctypes.byref(dev), SIZE)) == 0:
        print("    dev = %#x" % dev.value)
    cuda.call("cudaMemcpy(dev, host, %d, HostToDevice)" % SIZE,
              lambda: lib.cudaMemcpy(dev, host, SIZE, CUDA_MEMCPY_HOST_TO_DEVICE))
    cuda.call("cudaMemcpy(host, dev, %d, DeviceToHost)" % SIZE,
              lambda: lib.cudaMemcpy(host, dev, SIZE, CUDA_MEMCPY_DEVICE_TO_HOST))
    cuda.call("cudaStreamCreate(&stream)", lambda: lib.cudaStreamCreate(ctypes.byref(stream)))
    cuda.call("cudaEventCreate(&event)", lambda: lib.cudaEventCreate(ctypes.byref(event)))
    cuda.call("cudaEventRecord(event, stream)", lambda: lib.cudaEventRecord(event, stream))
    cuda.call("cudaEventSynchronize(event)", lambda: lib.cudaEventSynchronize(event))
    # No kernel is registered from Python: a NULL function fails, but the call is still traced.
    cuda.call("cudaLaunchKernel(NULL, <<<4, 256>>>)",
              lambda: lib.cudaLaunchKernel(None, Dim3(4, 1, 1), Dim3(256, 1, 1), args, 0, stream),
              may_fail=True)
    cuda.call("cudaStreamSynchronize(stream)", lambda: lib.cudaStreamSynchronize(stream))
    cuda.call("cudaEventDestroy(event)", lambda: lib.cudaEventDestroy(event))
    cuda.call("cudaStreamDestroy(stream)", lambda: lib.cudaStreamDestroy(stream))
    cuda.call("cudaFree(dev)", lambda: lib.cudaFree(dev))


def main(argv: List[str]) -> int:
    path = find_libcudart(argv)
    if path is None:
        print("cuda_calls.py: no libcudart found; pass its path or "
              "`pip install nvidia-cuda-runtime-cu12`", file=sys.stderr)
        return 2
    try:
        cuda = Runtime(path)
    except OSError as err:
        print("cuda_calls.py: cannot load %s: %s" % (path, err), file=sys.stderr)
        return 2
    print("libcudart: %s (pid %d)" % (path, os.getpid()))
    declare(cuda.lib)
    run(cuda)
    return 1 if cuda.unexpected else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
