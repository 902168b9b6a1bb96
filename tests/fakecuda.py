"""The stand-in CUDA runtime for end-to-end tests: building it and reading the driver program.

`build_fake_cuda(cc)` builds tests/native/fakecudart.c as `libcudart.so.12` (its own folder,
soname and symbol version `libcudart.so.12` like NVIDIA's) and tests/native/cuda_driver_prog.c
linked against it. The driver program prints one line per CUDA call; `run_driver` runs it and
`parse_output` turns the lines into `Call`s. The deterministic values the stand-in produces are
the constants below (fakecudart.c's header comment is the full specification).
"""
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

SONAME = "libcudart.so.12"
DEVICE_BASE = 0x7F0000000000   # k-th device allocation: DEVICE_BASE + k * ALLOC_STRIDE
HOST_BASE = 0x7E0000000000     # k-th host allocation: HOST_BASE + k * ALLOC_STRIDE
ALLOC_STRIDE = 0x100000
STREAM_BASE = 0x5000           # k-th stream: STREAM_BASE + k
EVENT_BASE = 0xE000
GRAPH_BASE = 0x6000
EXEC_BASE = 0x7000
NODE_BASE = 0x8000             # k-th graph node: NODE_BASE + k
DEVICE_COUNT = 2
MEM_FREE = 76 << 30
MEM_TOTAL = 80 << 30
ELAPSED_MS = 1.5

SEED_FUNCTIONS = (
    "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaLaunchKernel", "cudaStreamCreate",
    "cudaStreamSynchronize", "cudaEventCreate", "cudaEventRecord", "cudaEventSynchronize",
    "cudaGetDevice", "cudaSetDevice",
)
MORE_FUNCTIONS = (
    "cudaMallocManaged", "cudaMallocHost", "cudaHostAlloc", "cudaFreeHost", "cudaMallocAsync",
    "cudaFreeAsync", "cudaMallocPitch", "cudaMemcpyAsync", "cudaMemcpy2D", "cudaMemcpy2DAsync",
    "cudaMemcpyPeer", "cudaMemset", "cudaMemsetAsync", "cudaDeviceSynchronize",
    "cudaDeviceReset", "cudaGetDeviceCount", "cudaMemGetInfo", "cudaStreamCreateWithFlags",
    "cudaStreamCreateWithPriority", "cudaStreamDestroy", "cudaStreamWaitEvent",
    "cudaStreamQuery", "cudaEventCreateWithFlags", "cudaEventDestroy", "cudaEventQuery",
    "cudaEventElapsedTime", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
    "cudaGraphLaunch", "cudaGraphInstantiate", "cudaStreamBeginCapture", "cudaStreamEndCapture",
    "cudaGetLastError", "cudaPeekAtLastError", "cudaGetKernel", "cudaHostRegister",
    "cudaHostUnregister",
)
VARIANT_FUNCTIONS = (
    "cudaLaunchKernel_ptsz", "cudaMemcpy_ptds", "cudaMemcpyAsync_ptsz", "cudaMemsetAsync_ptsz",
    "cudaStreamSynchronize_ptsz", "cudaEventRecord_ptsz",
)
GRAPH_FUNCTIONS = (
    "cudaStreamBeginCaptureToGraph", "cudaStreamBeginCaptureToGraph_ptsz",
    "cudaThreadExchangeStreamCaptureMode", "cudaGraphCreate", "cudaGraphAddKernelNode",
    "cudaGraphAddMemcpyNode", "cudaGraphAddMemcpyNode1D", "cudaGraphAddMemcpyNodeToSymbol",
    "cudaGraphAddMemcpyNodeFromSymbol", "cudaGraphAddMemsetNode", "cudaGraphAddChildGraphNode",
    "cudaGraphAddEmptyNode", "cudaGraphAddEventRecordNode", "cudaGraphAddEventWaitNode",
    "cudaGraphInstantiateWithFlags", "cudaGraphInstantiateWithParams",
    "cudaGraphInstantiateWithParams_ptsz", "cudaGraphExecKernelNodeSetParams",
    "cudaGraphExecUpdate", "cudaGraphDestroy", "cudaGraphExecDestroy",
)
FAKE_FUNCTIONS = SEED_FUNCTIONS + MORE_FUNCTIONS + VARIANT_FUNCTIONS + GRAPH_FUNCTIONS

# Keep every exported function's first instruction `push %rbp` (fakecudart.c repeats these
# as a pragma) and give the symbols NVIDIA's version node.
LIB_FLAGS = ("-fcf-protection=none", "-fno-shrink-wrap", "-fno-ipa-icf",
             "-fno-optimize-sibling-calls", "-Wl,-soname," + SONAME)
VERSION_SCRIPT = SONAME + " {\n  global: cuda*; __cuda*;\n  local: *;\n};\n"


def device_ptr(k: int) -> int:
    """The k-th (0-based) device pointer the stand-in hands out in a fresh process."""
    return DEVICE_BASE + k * ALLOC_STRIDE


def host_ptr(k: int) -> int:
    """The k-th (0-based) host pointer the stand-in hands out in a fresh process."""
    return HOST_BASE + k * ALLOC_STRIDE


def wheel_libcudart() -> Optional[Path]:
    """NVIDIA's libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel, if installed where
    the running interpreter imports from (importlib finds the `nvidia.cuda_runtime` package,
    which has no __init__ in some versions of the wheel; sys.path is searched too)."""
    import importlib.util

    folders = []
    try:
        spec = importlib.util.find_spec("nvidia.cuda_runtime")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        folders += [Path(folder) for folder in spec.submodule_search_locations]
    folders += [Path(entry or ".") / "nvidia" / "cuda_runtime" for entry in sys.path]
    for folder in folders:
        candidate = folder / "lib" / SONAME
        if candidate.is_file():
            return candidate
    return None


def build_fake_cuda(cc) -> Tuple[Path, Path]:
    """Builds the stand-in and the driver program with the `cc` fixture; (lib path, prog path).

    The library lies alone in its folder (`<session dir>/fakecuda/libcudart.so.12`), so that
    folder can be put on LD_LIBRARY_PATH or in an rpath without shadowing anything else.
    """
    folder = cc.outdir / "fakecuda"
    folder.mkdir(exist_ok=True)
    version_script = folder / "libcudart.map"
    version_script.write_text(VERSION_SCRIPT)
    lib = cc.shared("fakecudart.c", "fakecuda/" + SONAME,
                    extra=[*LIB_FLAGS, "-Wl,--version-script=" + str(version_script)])
    return lib, build_driver_prog(cc, lib, "fakecuda/cuda_driver_prog")


def build_driver_prog(cc, lib: Path, name: str) -> Path:
    """Builds tests/native/cuda_driver_prog.c against the libcudart.so.12 at `lib`.

    Works for the stand-in and for NVIDIA's library (e.g. the nvidia-cuda-runtime-cu12 wheel's);
    the rpath makes the program load exactly that file.
    """
    folder = str(Path(lib).resolve().parent)
    return cc.executable("cuda_driver_prog.c", name,
                         extra=["-L", folder, "-l:" + Path(lib).name, "-Wl,-rpath," + folder,
                                "-lpthread"])


@dataclass
class Call:
    """One line of the driver program's output."""

    op: str
    ret: int
    out: Optional[int]            # None when the function has no out-parameter
    fn: str                       # the CUDA function called
    fields: Dict[str, str] = field(default_factory=dict)   # the other name=value pairs

    def number(self, name: str) -> int:
        """A field as a number (0x-hex or decimal)."""
        return int(self.fields[name], 0)


def dims(text: str) -> tuple:
    """A dim3 field of a line ("2,3,4") as a tuple."""
    return tuple(int(x) for x in text.split(","))


def numbers(*names: str, **renamed: str) -> Callable[[Call], Dict[str, Any]]:
    """The expected arguments of a call whose values are numbers in the program's line
    (renamed: event name=line name)."""
    def expect(call: Call) -> Dict[str, Any]:
        values = {name: call.number(name) for name in names}
        values.update((name, call.number(field)) for name, field in renamed.items())
        return values
    return expect


_LINE = re.compile(r"^(?P<op>\S+) ret=(?P<ret>-?\d+) out=(?P<out>0x[0-9a-f]+|-) fn=(?P<fn>\S+)"
                   r"(?P<rest>( \S+=\S*)*)$")


def parse_output(text: str) -> List[Call]:
    """The calls in the driver program's stdout; other lines (`ready pid=…`) are skipped."""
    calls = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        out = match["out"]
        pairs = dict(pair.split("=", 1) for pair in match["rest"].split())
        calls.append(Call(match["op"], int(match["ret"]), None if out == "-" else int(out, 16),
                          match["fn"], pairs))
    return calls


def run_driver(prog: Path, ops: Sequence[str], options: Sequence[str] = (),
               timeout: float = 60) -> List[Call]:
    """Runs the driver program to completion and returns its calls (raises if it fails)."""
    done = subprocess.run([str(prog), *options, *ops], capture_output=True, text=True,
                          timeout=timeout, check=True)
    return parse_output(done.stdout)
