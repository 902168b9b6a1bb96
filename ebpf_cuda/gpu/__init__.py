"""The GPU's own state beside the calls: NVML read through ctypes (`nvml.py`), the Xid
catalogue (`xid.py`), the sample and event records (`records.py`) and the threads that take
them (`sampler.py`)."""
import ctypes
import os

SONAME = "libnvidia-ml.so.1"
# Where drivers install it, after the loader's own search (LD_LIBRARY_PATH, the ld cache):
# distributions, the CUDA containers' driver mount, the GPU operator's root, WSL.
FOLDERS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/aarch64-linux-gnu",
           "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib",
           "/run/nvidia/driver/usr/lib/x86_64-linux-gnu", "/usr/lib/wsl/lib")


def nvml_findable() -> bool:
    """Whether libnvidia-ml loads, looked for as nvml.Nvml() looks (a host without it needs
    neither nvml.py, whose ctypes structures cost 1-8 ms of a start, nor the sampler)."""
    for candidate in [SONAME] + [os.path.join(folder, SONAME) for folder in FOLDERS]:
        if candidate != SONAME and not os.path.exists(candidate):
            continue
        try:
            ctypes.CDLL(candidate)
            return True
        except OSError:
            pass
    return False
