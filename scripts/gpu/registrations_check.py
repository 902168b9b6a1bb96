"""What registrations.py reads from the CUDA libraries of the GPU host: for each file of
torch/lib (and any FILE given), the kernels it registers, the CUDA 13 handle variables, how
many of its `__cudaLaunchKernel` call sites name their kernel, and the time taken. One JSON
line per file.

    python3 scripts/gpu/registrations_check.py [FILE...]
"""
import glob
import json
import os
import re
import struct
import sys
import time

from ebpf_cuda.targets import registrations


def launch_sites(path: str):
    """Return addresses of the calls to __cudaLaunchKernel's PLT entry in .text."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as stream:
        elf = ELFFile(stream)
        text = elf.get_section_by_name(".text")
        target = registrations._plt_entry(elf, "__cudaLaunchKernel")
        if text is None or target is None:
            return []
        code, base = text.data(), text["sh_addr"]
    found = []
    for call in re.finditer(rb"\xe8", code):
        at = call.start()
        if at + 5 <= len(code) and \
                base + at + 5 + struct.unpack_from("<i", code, at + 1)[0] == target:
            found.append(base + at + 5)
    return found


def main() -> int:
    files = sys.argv[1:]
    if not files:
        import torch

        files = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*.so*")))
    for path in files:
        start = time.monotonic()
        found = registrations.registrations(path)
        took = time.monotonic() - start
        if not found.kernels:
            continue
        sites = launch_sites(path)
        named = sum(1 for site in sites if found.launch_site_kernel(site))
        print(json.dumps({"file": path, "registered": len(found.kernels),
                          "handle_variables": len(found.handles), "read_s": round(took, 2),
                          "launch_sites": len(sites), "launch_sites_named": named}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
