"""The stand-in NCCL for end-to-end tests: building it and the rank program, reading its lines.

`build_fake_nccl(cc)` builds tests/native/fakenccl.c as `libnccl.so.2` (its own folder, soname
libnccl.so.2 like NVIDIA's) and tests/native/nccl_rank.c linked against it; `build_rank_prog`
links the rank program against any libnccl.so.2 (NVIDIA's from the nvidia-nccl-cu12 wheel).
The rank program prints one line per call in fakecuda's format (`fakecuda.parse_output`).
fakenccl.c's and nccl_rank.c's header comments are the full specification.
"""
import hashlib
import sys
from pathlib import Path
from typing import Optional, Tuple

SONAME = "libnccl.so.2"
SEND, RECV, STREAM = 0xA0000000, 0xB0000000, 0x5000  # the rank program's buffers and stream
LIB_FLAGS = ("-fcf-protection=none", "-fno-shrink-wrap", "-fno-ipa-icf",
             "-fno-optimize-sibling-calls", "-Wl,-soname," + SONAME)


def unique_id(seed: int) -> bytes:
    """The 128-byte ncclUniqueId the rank program makes from SEED."""
    return bytes((seed * 31 + i) & 0xFF for i in range(128))


def id_hash(data: bytes) -> str:
    """The `commId`/`comm_id` the tracer shows for a unique id: its first 64 bytes hashed
    (values.unique_id_hash), computed here independently."""
    return hashlib.blake2b(data[:64], digest_size=6).hexdigest()


def wheel_libnccl() -> Optional[Path]:
    """NVIDIA's libnccl.so.2 from the nvidia-nccl-cu12 wheel, if installed."""
    for entry in sys.path:
        candidate = Path(entry or ".") / "nvidia" / "nccl" / "lib" / SONAME
        if candidate.is_file():
            return candidate
    return None


def build_fake_nccl(cc) -> Tuple[Path, Path]:
    """(the stand-in <session>/fakenccl/libnccl.so.2, the rank program linked against it)."""
    (cc.outdir / "fakenccl").mkdir(exist_ok=True)
    lib = cc.shared("fakenccl.c", "fakenccl/" + SONAME, extra=list(LIB_FLAGS))
    return lib, build_rank_prog(cc, lib, "fakenccl/nccl_rank")


def build_rank_prog(cc, lib: Path, name: str) -> Path:
    """tests/native/nccl_rank.c against the libnccl.so.2 at `lib` (found through its rpath)."""
    folder = str(Path(lib).resolve().parent)
    return cc.executable("nccl_rank.c", name,
                         extra=["-L", folder, "-l:" + Path(lib).name, "-Wl,-rpath," + folder])
