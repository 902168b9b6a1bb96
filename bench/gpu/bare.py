"""Bare counting probes where ebpf-cuda's default set probes: the floor for a real workload.

    sudo python3 bench/gpu/bare.py [-p LIB ...] [--entry-only] -- COMMAND [ARGS...]

Asks a `Tracer` (default function set, these files) where it would probe, closes it, then
attaches at each of those (file, offset) pairs a program that only adds 1 to a counter, at
entry and (unless --entry-only) at return, runs COMMAND with its output passed through and
prints the hits to stderr. No tracer can cost a workload less than this: traced.py's `bare`
and `bare-entry` sets compare it with the untraced run and with the tracer's own sets.
"""
import argparse
import os
import subprocess
import sys
from typing import List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from common import counter_program  # noqa: E402

from ebpf_cuda.bpf.maps import ArrayMap  # noqa: E402
from ebpf_cuda.bpf.programs import Program  # noqa: E402
from ebpf_cuda.tracer import Tracer  # noqa: E402
from ebpf_cuda.bpf.uprobe import attach_uprobe  # noqa: E402


def probe_sites(libs: List[str]) -> List[tuple]:
    """(path, offset, function) of every entry probe the tracer's default set attaches."""
    with Tracer(library=libs) as tracer:  # (entering starts it: probes found and attached)
        return sorted({(a.path, a.offset, a.api) for a in tracer.attachments if not a.retprobe})


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--lib", action="append", default=[])
    parser.add_argument("--entry-only", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    sites = probe_sites(args.lib)
    counts = ArrayMap(16, 1, "bare_counts")
    kinds = [False] if args.entry_only else [False, True]
    programs = [Program(counter_program(i), {"counts": counts}, name="bare_cnt%d" % i).load()
                for i in range(len(kinds))]
    links = [attach_uprobe(programs[i], path, offset, retprobe=ret, what=api)
             for path, offset, api in sites for i, ret in enumerate(kinds)]
    try:
        status = subprocess.call(command)
    finally:
        raw = counts[0]
        print("bare: %d functions, %d entry hits, %d return hits" % (
            len(sites), int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:16], "little")),
            file=sys.stderr)
        for link in links:
            link.close()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
