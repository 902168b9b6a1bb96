"""Prints the CUDA runtime and driver libraries a process really maps: with `torch`, after
PyTorch initialised CUDA; otherwise NVIDIA's runtime wheel and the system libcuda.so.1.
One path per line (for the CLI's -p)."""
import ctypes
import sys


def mapped(patterns):
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            path = parts[-1] if len(parts) >= 6 else ""
            name = path.rsplit("/", 1)[-1]
            if any(name.startswith(p) for p in patterns) and path not in found:
                found.append(path)
    return found


def main() -> None:
    if sys.argv[1:] == ["torch"]:
        import torch
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    else:
        try:
            import nvidia.cuda_runtime, os  # noqa: E401
            lib = os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib", "libcudart.so.12")
            ctypes.CDLL(lib).cudaFree(None)
        except (ImportError, OSError):
            pass
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            pass
    for path in mapped(["libcudart.so", "libcuda.so"]):
        print(path)


if __name__ == "__main__":
    main()
