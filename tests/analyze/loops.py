"""Programs with exactly one known problem each, for `ebpf-cuda analyze` (tests/test_analyze_e2e.py):
the stand-in libcudart called through ctypes in a loop of STEPS iterations. The line with the
problem carries a `# <- PROBLEM` marker: the test finds its number there.

    python loops.py SCENARIO LIBCUDART

The stand-in's simulated device (FAKECUDA_DEVICE_US, FAKECUDA_LAUNCH_US in the environment)
makes the synchronising calls wait for the launches' device time.
"""
import ctypes
import sys

STEPS = 6
H2D, D2H = 1, 2
lib = ctypes.CDLL(sys.argv[2])


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


lib.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_void_p]
lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                ctypes.c_void_p]
lib.cudaMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
lib.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
lib.cudaFree.argtypes = [ctypes.c_void_p]
lib.cudaHostAlloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
lib.cudaStreamBeginCapture.argtypes = [ctypes.c_void_p, ctypes.c_int]
lib.cudaStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.cudaGraphInstantiate.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong]
lib.cudaGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
lib.cudaEventElapsedTime.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
ONE, BLOCK = Dim3(1, 1, 1), Dim3(128, 1, 1)
MB = 1 << 20


def launch(kernel: int, stream) -> None:
    assert lib.cudaLaunchKernel(kernel, ONE, BLOCK, None, 0, stream) == 0


def stream():
    handle = ctypes.c_void_p()
    assert lib.cudaStreamCreate(ctypes.byref(handle)) == 0
    return handle


def device(size: int = MB):
    ptr = ctypes.c_void_p()
    assert lib.cudaMalloc(ctypes.byref(ptr), size) == 0
    return ptr


def healthy() -> None:
    s, x = stream(), device()
    for _ in range(STEPS):
        launch(0x1000, s)  # <- healthy
        launch(0x2000, s)
        launch(0x3000, s)
    lib.cudaStreamSynchronize(s)
    lib.cudaFree(x)


def train_step(s) -> None:
    launch(0x1000, s)
    launch(0x2000, s)


def step_function() -> None:
    s = stream()
    for _ in range(STEPS):
        train_step(s)
        launch(0x3000, s)
        launch(0x3000, s)
    lib.cudaStreamSynchronize(s)


def no_loop() -> None:
    s = stream()
    launch(0x1000, s)
    launch(0x2000, s)
    launch(0x3000, s)
    lib.cudaStreamSynchronize(s)
    launch(0x4000, s)


def sync() -> None:
    s = stream()
    for _ in range(STEPS):
        launch(0x1000, s)
        launch(0x2000, s)
        lib.cudaStreamSynchronize(s)  # <- sync


def pageable() -> None:
    s, x = stream(), device()
    pinned, registered = ctypes.c_void_p(), ctypes.create_string_buffer(MB)
    pageable_buffer = ctypes.create_string_buffer(MB)
    assert lib.cudaHostAlloc(ctypes.byref(pinned), MB, 0) == 0
    assert lib.cudaHostRegister(registered, MB, 0) == 0
    for _ in range(STEPS):
        lib.cudaMemcpyAsync(x, pinned, MB, H2D, s)
        lib.cudaMemcpyAsync(x, registered, MB, H2D, s)
        lib.cudaMemcpyAsync(x, pageable_buffer, MB, H2D, s)  # <- pageable
        launch(0x1000, s)
    lib.cudaStreamSynchronize(s)


def churn() -> None:
    s = stream()
    for _ in range(STEPS):
        x = device(4 * MB)  # <- churn
        launch(0x1000, s)
        launch(0x2000, s)
        lib.cudaFree(x)


def launch_bound() -> None:
    s = stream()
    for _ in range(STEPS):
        for kernel in range(30):
            launch(0x1000 + kernel, s)  # <- launches
    lib.cudaStreamSynchronize(s)


def graphs() -> None:
    s, x = stream(), device()
    batch = ctypes.c_void_p()
    assert lib.cudaHostAlloc(ctypes.byref(batch), MB, 0) == 0
    graph, exec_ = ctypes.c_void_p(), ctypes.c_void_p()
    lib.cudaStreamBeginCapture(s, 0)  # <- capture
    for kernel in range(30):
        launch(0x1000 + kernel, s)
    lib.cudaStreamEndCapture(s, ctypes.byref(graph))
    lib.cudaGraphInstantiate(ctypes.byref(exec_), graph, 0)
    for step in range(STEPS):
        lib.cudaMemcpyAsync(x, batch, MB, H2D, s)
        if step == 3:
            for kernel in range(30):
                launch(0x1000 + kernel, s)  # <- fallback
        else:
            lib.cudaGraphLaunch(exec_, s)  # <- replay
    lib.cudaStreamSynchronize(s)


def default_stream() -> None:
    s, x = stream(), device()
    for _ in range(STEPS):
        launch(0x1000, s)
        lib.cudaMemsetAsync(x, 0, MB, None)  # <- default


def error() -> None:
    s, x = stream(), device()
    host = ctypes.create_string_buffer(16)
    for _ in range(STEPS):
        lib.cudaMemcpyAsync(x, host, 16, 7, s)  # <- error
        launch(0x1000, s)


def timed() -> None:
    s = stream()
    start, end = ctypes.c_void_p(), ctypes.c_void_p()
    lib.cudaEventCreate(ctypes.byref(start))
    lib.cudaEventCreate(ctypes.byref(end))
    elapsed = ctypes.c_float()
    lib.cudaEventRecord(start, s)
    for _ in range(4):
        launch(0x1000, s)
    lib.cudaEventRecord(end, s)
    lib.cudaEventSynchronize(end)
    lib.cudaEventElapsedTime(ctypes.byref(elapsed), start, end)
    print("elapsed_ms=%.3f" % elapsed.value)


def attach_sync() -> None:
    """`sync`, once a line comes on stdin (a tracer attached with -d meanwhile)."""
    print("ready", flush=True)
    sys.stdin.readline()
    sync()


if __name__ == "__main__":
    {"attach_sync": attach_sync, "healthy": healthy, "no_loop": no_loop, "step_function": step_function, "sync": sync, "pageable": pageable,
     "churn": churn, "launch_bound": launch_bound, "graphs": graphs,
     "default_stream": default_stream, "error": error, "timed": timed}[sys.argv[1]]()
