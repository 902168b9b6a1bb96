"""The stand-in CUDA driver (libcuda.so.1) and the layered stand-in runtime: building them.

`build_fake_driver(cc)` builds tests/native/fakecuda_driver.c as `libcuda.so.1` (alone in
its folder) and tests/native/cu_driver_prog.c against it. `build_layered_runtime(cc)` builds
tests/native/fakecudart_layered.c as a `libcudart.so.12` that calls the stand-in driver, and
tests/native/cuda_driver_prog.c against it. The programs print lines in the format
`fakecuda.parse_output` reads. The constants are the stand-in driver's deterministic values
(fakecuda_driver.c's header comment is the full specification).
"""
from pathlib import Path
from typing import List, Sequence, Tuple

from ebpf_cuda.decode.events import EXIT, Event
from fakecuda import LIB_FLAGS as RUNTIME_LIB_FLAGS
from fakecuda import SONAME as RUNTIME_SONAME
from fakecuda import VERSION_SCRIPT as RUNTIME_VERSION_SCRIPT
from fakecuda import build_driver_prog

SONAME = "libcuda.so.1"
CTX_BASE = 0xC000
DEVICE_BASE = 0x7D0000000000
HOST_BASE = 0x7C0000000000
VA_BASE = 0x7B0000000000
ALLOC_STRIDE = 0x100000
MEMHANDLE_BASE = 0xA000
MODULE_BASE = 0x3000
LIBRARY_BASE = 0x4000
FUNCTION_BASE = 0x10000
KERNEL_BASE = 0x20000
NAMED_STRIDE = 0x10

# Keep every exported function's first instruction `push %rbp` (as for the runtime stand-in).
LIB_FLAGS = tuple(f for f in RUNTIME_LIB_FLAGS if not f.startswith("-Wl,-soname,")) + (
    "-Wl,-soname," + SONAME,)

_MANGLED_PART = "N7cutlass6KernelINS_4gemm6kernel13GemmUniversalIfLi128ELi256EEEE"


def device_ptr(k: int) -> int:
    """The k-th (0-based) device pointer of the stand-in driver in a fresh process."""
    return DEVICE_BASE + k * ALLOC_STRIDE


def host_ptr(k: int) -> int:
    """The k-th host pointer (cuMemHostAlloc) in a fresh process."""
    return HOST_BASE + k * ALLOC_STRIDE


def function_handle(k: int) -> int:
    """The k-th CUfunction handed out (cuModuleGetFunction, cuKernelGetFunction)."""
    return FUNCTION_BASE + k * NAMED_STRIDE


def kernel_handle(k: int) -> int:
    """The k-th CUkernel handed out (cuLibraryGetKernel)."""
    return KERNEL_BASE + k * NAMED_STRIDE


def generated_name(length: int) -> str:
    """The name cu_driver_prog makes for NAME `=length`."""
    body = (_MANGLED_PART * (length // len(_MANGLED_PART) + 1))[:length - 2]
    return "_Z" + body


def build_fake_driver(cc) -> Tuple[Path, Path]:
    """(stand-in libcuda.so.1, cu_driver_prog linked against it), built with the `cc` fixture."""
    folder = cc.outdir / "fakecuda_driver"
    folder.mkdir(exist_ok=True)
    lib = cc.shared("fakecuda_driver.c", "fakecuda_driver/" + SONAME, extra=list(LIB_FLAGS))
    prog = cc.executable("cu_driver_prog.c", "fakecuda_driver/cu_driver_prog",
                         extra=["-L", str(folder), "-l:" + SONAME, "-Wl,-rpath," + str(folder)])
    return lib, prog


def build_layered_runtime(cc) -> Tuple[Path, Path, Path]:
    """(layered libcudart.so.12, the stand-in libcuda.so.1 under it, cuda_driver_prog linked
    against the layered runtime). The runtime lies alone in `<session>/fakecuda_layered/`."""
    driver, _ = build_fake_driver(cc)
    driver_dir = str(driver.parent)
    folder = cc.outdir / "fakecuda_layered"
    folder.mkdir(exist_ok=True)
    version_script = folder / "libcudart.map"
    version_script.write_text(RUNTIME_VERSION_SCRIPT)
    lib = cc.shared("fakecudart_layered.c", "fakecuda_layered/" + RUNTIME_SONAME,
                    extra=[*RUNTIME_LIB_FLAGS, "-Wl,--version-script=" + str(version_script),
                           "-L", driver_dir, "-l:" + SONAME, "-Wl,-rpath," + driver_dir,
                           "-lpthread"])
    prog = build_driver_prog(cc, lib, "fakecuda_layered/cuda_driver_prog")
    return lib, driver, prog


def exits(events: Sequence[Event]) -> List[Event]:
    """The exit events (one per completed call), in order."""
    return [e for e in events if e.phase == EXIT]


def base_name(symbol: str) -> str:
    """The table row a symbol is reported under: `_ptsz`/`_ptds` variants under the base."""
    for suffix in ("_ptsz", "_ptds"):
        if symbol.endswith(suffix):
            return symbol[:-len(suffix)]
    return symbol
