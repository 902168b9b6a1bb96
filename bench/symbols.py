"""Symbols per second: pyelftools iteration against elf.py's bulk reader.

    python3 bench/symbols.py               # builds a synthetic .so with 100k functions
    python3 bench/symbols.py --count 20000
    python3 bench/symbols.py --path /usr/lib/x86_64-linux-gnu/libLLVM-15.so.1

The synthetic library is cached in the temp folder between runs.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from elftools.elf.elffile import ELFFile  # noqa: E402

from ebpf_cuda.elf import ElfFile  # noqa: E402


def synthetic_library(count: int) -> str:
    """A shared library with `count` tiny functions (long C++-like names, like libtorch)."""
    out = os.path.join(tempfile.gettempdir(), "ebpf_cuda_bench_%d.so" % count)
    if os.path.exists(out):
        return out
    source = out[:-3] + ".c"
    with open(source, "w") as stream:
        for i in range(count):
            stream.write("int _ZN5torch4cuda6kernel%dEv_impl_%d(int x) { return x + %d; }\n"
                         % (i % 977, i, i))
    print("compiling %d functions with gcc ..." % count, flush=True)
    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-o", out, source], check=True)
    return out


def pyelftools_functions(path: str) -> int:
    """Iterate the full symbol table (.symtab, else .dynsym) through pyelftools."""
    count = 0
    with open(path, "rb") as stream:
        elf = ELFFile(stream)
        section = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
        for sym in section.iter_symbols():
            if sym["st_info"]["type"] == "STT_FUNC" and sym["st_shndx"] != "SHN_UNDEF":
                count += 1
    return count


def bulk_symbol_offset(path: str) -> int:
    """Open and resolve one symbol: what attaching a probe costs."""
    elf = ElfFile(path)
    names = elf.function_names()
    elf.symbol_offset(names[len(names) // 2])
    return len(names)


def bulk_everything(path: str) -> int:
    """Open, build the address index (symbolize) and map every function to its offset."""
    elf = ElfFile(path)
    elf.symbolize(0)
    return len(elf.functions())


def measure(label: str, func, path: str, repeat: int = 3) -> None:
    """Best of `repeat` runs."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        count = func(path)
        best = min(best, time.perf_counter() - start)
    elapsed = best
    print("%-28s %8d functions in %6.3f s = %10.0f functions/s"
          % (label, count, elapsed, count / elapsed if elapsed else 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100000)
    parser.add_argument("--path", help="an existing ELF file instead of a synthetic one")
    args = parser.parse_args()
    path = args.path or synthetic_library(args.count)
    print(path, "%.1f MB" % (os.path.getsize(path) / 1e6))
    measure("bulk: open + symbol_offset", bulk_symbol_offset, path)
    measure("bulk: + symbolize + offsets", bulk_everything, path)
    measure("pyelftools iteration", pyelftools_functions, path, repeat=1)


if __name__ == "__main__":
    main()
