"""What per-process keys would cost the monitor: one probe that adds to a per-CPU array entry
(as the in-kernel aggregates do per function) against the same plus a hash-map entry keyed
by (pid, function), updated atomically (what per-process call counts would need).

Attaches each variant at the entry of cudaGetDevice of the stand-in runtime, runs
bench/native/callloop (a tight loop of cudaGetDevice calls) and prints ns per call: the
difference of the two variants is the price of per-process keys on every call. Needs root
and gcc.

    sudo python3 bench/monitor_perpid.py [--calls 2000000] [--reps 5] [--rounds 3]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import DW, R0, R1, R2, asm  # noqa: E402

from ebpf_cuda.asm import R3, R4, R6, W, Helper  # noqa: E402
from ebpf_cuda.targets.elf import ElfFile  # noqa: E402
from ebpf_cuda.bpf.maps import HashMap, PerCpuArrayMap  # noqa: E402
from ebpf_cuda.bpf.programs import Program  # noqa: E402
from ebpf_cuda.bpf.uprobe import attach_uprobe  # noqa: E402

FN_ID = 9  # any constant: one function


def per_cpu_add() -> list:
    """agg[FN_ID].count += 1; .total += 1 (the shape of the aggregates' per-call adds)."""
    return [
        asm.st(W, asm.FP, -4, FN_ID), asm.ld_map(R1, "agg"), asm.mov(R2, asm.FP),
        asm.add(R2, -4), asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "agg_done"),
        asm.ldx(DW, R1, R0, 0), asm.add(R1, 1), asm.stx(DW, R0, 0, R1),
        asm.ldx(DW, R1, R0, 8), asm.add(R1, 1), asm.stx(DW, R0, 8, R1),
        asm.Label("agg_done"),
    ]


def per_pid_add() -> list:
    """calls[(pid, FN_ID)] += 1 atomically, the entry created when missing."""
    return [
        asm.call(Helper.GET_CURRENT_PID_TGID), asm.rsh(R0, 32), asm.lsh(R0, 32),
        asm.or_(R0, FN_ID), asm.stx(DW, asm.FP, -16, R0), asm.st(DW, asm.FP, -24, 1),
        asm.ld_map(R1, "calls"), asm.mov(R2, asm.FP), asm.add(R2, -16),
        asm.call(Helper.MAP_LOOKUP_ELEM), asm.jeq(R0, 0, "create"),
        asm.mov(R1, 1), asm.atomic_add(DW, R0, 0, R1), asm.ja("pid_done"),
        asm.Label("create"),
        asm.ld_map(R1, "calls"), asm.mov(R2, asm.FP), asm.add(R2, -16),
        asm.mov(R3, asm.FP), asm.add(R3, -24), asm.mov(R4, 1),
        asm.call(Helper.MAP_UPDATE_ELEM),
        asm.Label("pid_done"),
    ]


VARIANTS = {
    "per-cpu": lambda: per_cpu_add(),
    "per-cpu+per-pid": lambda: per_cpu_add() + per_pid_add(),
}


def measure(built, args, variant) -> float:
    agg = PerCpuArrayMap(16, 16, "agg")
    calls = HashMap(8, 8, 16384, "calls")
    links, program = [], None
    try:
        if variant is not None:
            code = [asm.mov(R6, R1)] + VARIANTS[variant]() + [asm.mov(R0, 0), asm.exit()]
            program = Program(code, {"agg": agg, "calls": calls}, name="perpid").load()
            offset = ElfFile(str(built.lib)).symbol_offset("cudaGetDevice")
            links.append(attach_uprobe(program, str(built.lib), offset, what="cudaGetDevice"))
        result = common.run_plain(common.loop_args(built, calls=args.calls, reps=args.reps,
                                                   cpu=0))
        return result.ns_per_call
    finally:
        for link in links:
            link.close()
        if program is not None:
            program.close()
        agg.close()
        calls.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2_000_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    common.need_root()
    built = common.build()
    print(common.machine())
    figures = {name: [] for name in ("untraced", *VARIANTS)}
    for _ in range(args.rounds):  # (alternated: drift of the machine is shared)
        for name in figures:
            figures[name].append(measure(built, args, None if name == "untraced" else name))
    for name, values in figures.items():
        print("%-16s ns/call %s" % (name, common.spread(values)))
    extra = [b - a for a, b in zip(figures["per-cpu"], figures["per-cpu+per-pid"])]
    print("per-pid keys add %.1f ns per call (median of %d rounds)"
          % (statistics.median(extra), args.rounds))


if __name__ == "__main__":
    main()
