"""Coverage-guided fuzzing of the ELF symbol reader or the record decoder with atheris
(libFuzzer for Python). Optional: `pip install atheris`; not part of the test suite.

    python3 bench/fuzz_atheris.py elf SEED_ELF [libFuzzer options, e.g. -max_total_time=300]
    python3 bench/fuzz_atheris.py decoder -max_len=2000 -len_control=0 [libFuzzer options]

`elf` starts from SEED_ELF (any small shared library, e.g. the stand-in libcudart the tests
build) and mutates it; each input is written to a file in /dev/shm and read the way the tracer
reads a library. `decoder` feeds batches of ring frames to `Decoder.decode_frames`. Any
exception other than ElfError / DecodeError is a crash: libFuzzer saves the input as
crash-<sha1>; turn it into a regression entry in tests/fuzz_corpus/.
"""
import os
import sys
import tempfile

import atheris

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

with atheris.instrument_imports():
    from ebpf_cuda.targets.elf import ElfFile
    from ebpf_cuda.errors import DecodeError, ElfError
    from ebpf_cuda.decode.events import Decoder
    from ebpf_cuda.spec.record import SIZE

FRAME = 8 + SIZE
NAMES = ("cudaMemcpy", "cudaGetDevice", "cudaMalloc", "cudaLaunchKernel", "nope")
SCRATCH = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir(),
                       "ebpf-cuda-fuzz-%d.so" % os.getpid())


def read_elf(data: bytes) -> None:
    with open(SCRATCH, "wb") as f:
        f.write(data)
    try:
        elf = ElfFile(SCRATCH)
        functions = elf.functions()
        for name in list(functions)[:40] + list(NAMES):
            try:
                elf.symbol_offset(name)
            except ElfError:
                pass
        for address in list(functions.values())[:40]:
            elf.symbolize(address)
    except ElfError:
        pass


def decode(data: bytes) -> None:
    data = data[:len(data) - len(data) % FRAME]  # whole frames: reach past the length check
    try:
        for event in Decoder(clock_offset_ns=0).decode_frames(data):
            event.to_json()
    except DecodeError:
        pass


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("elf", "decoder"):
        sys.exit(__doc__)
    target = sys.argv[1]
    args = [sys.argv[0]] + sys.argv[2:]
    if target == "elf":
        if len(sys.argv) < 3:
            sys.exit("elf needs a seed ELF file")
        seed_dir = tempfile.mkdtemp(prefix="ebpf-cuda-fuzz-seed-")
        with open(sys.argv[2], "rb") as src, open(os.path.join(seed_dir, "seed"), "wb") as dst:
            dst.write(src.read())
        args = [sys.argv[0]] + sys.argv[3:] + [seed_dir]
    atheris.Setup(args, read_elf if target == "elf" else decode)
    try:
        atheris.Fuzz()
    finally:
        if os.path.exists(SCRATCH):
            os.unlink(SCRATCH)


if __name__ == "__main__":
    main()
