"""Symbols per second: pyelftools iteration against elf.py's bulk reader; what reading a
file's structure (headers, segments, dynamic tags, with struct: elf_raw.py) costs, the part a
start pays for every file it opens; and what importing pyelftools would add to a start (it
is no longer on a start's path).

    python3 bench/symbols.py               # builds a synthetic .so with 100k functions
    python3 bench/symbols.py --count 20000
    python3 bench/symbols.py --path /usr/lib/x86_64-linux-gnu/libLLVM-15.so.1 --path ...

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

from ebpf_cuda.targets.elf import ElfFile  # noqa: E402


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


def headers_only(path: str) -> int:
    """Open without reading symbols: ELF header, segments, section headers, dynamic tags."""
    elf = ElfFile(path, allow_stripped=True)
    return len(elf.needed)


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


def measure_open(path: str, repeat: int = 50) -> None:
    """Best and median ms of opening the file for its structure only."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        headers_only(path)
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    print("%-28s %8.2f ms best, %.2f median (headers, segments, dynamic tags)"
          % ("open: structure only", times[0], times[len(times) // 2]))


def pyelftools_import_ms(repeat: int = 5) -> str:
    """ms to import what elf_headers.py used of pyelftools until 2026-12-07 in a fresh
    interpreter that has already imported the CLI (what a start paid on top), best and
    median of `repeat`."""
    code = ("import time, ebpf_cuda.cli.main, ebpf_cuda.tracer\n"
            "t = time.perf_counter()\n"
            "from elftools.elf import enums; from elftools.elf.elffile import ELFFile\n"
            "print((time.perf_counter() - t) * 1000)\n")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    values = sorted(float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                         text=True, check=True, cwd=root).stdout)
                    for _ in range(repeat))
    return "%.1f ms best, %.1f median" % (values[0], values[len(values) // 2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100000)
    parser.add_argument("--path", action="append",
                        help="an existing ELF file instead of a synthetic one (repeatable)")
    args = parser.parse_args()
    print("pyelftools import after the CLI's (off a start's path): %s"
          % pyelftools_import_ms())
    for path in args.path or [synthetic_library(args.count)]:
        print(path, "%.1f MB" % (os.path.getsize(path) / 1e6))
        measure_open(path)
        measure("bulk: open + symbol_offset", bulk_symbol_offset, path)
        measure("bulk: + symbolize + offsets", bulk_everything, path)
        measure("pyelftools iteration", pyelftools_functions, path, repeat=1)


if __name__ == "__main__":
    main()
