"""How fast the ring buffer reader drains a pre-filled ring.

A uprobe'd C loop (tests/native/ringbuf_target.c, rb_emit_many) fills a ring (64 MiB by
default) with fixed 64-byte records without consuming; then each way of reading is timed
draining the whole ring. Needs root and gcc.

    sudo python3 bench/ringbuf.py [--ring-mib 64] [--record 64]
"""
import argparse
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
import time
from typing import Callable, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ebpf_cuda import asm  # noqa: E402
from ebpf_cuda.asm import DW, R0, R1, R2, R3, R6, R7, Helper  # noqa: E402
from ebpf_cuda.targets.elf import ElfFile  # noqa: E402
from ebpf_cuda.bpf.maps import ArrayMap, RingBufMap  # noqa: E402
from ebpf_cuda.bpf.programs import Program  # noqa: E402
from ebpf_cuda.bpf.ringbuf import RingBuffer, record_stride  # noqa: E402
from ebpf_cuda.bpf.uprobe import attach_uprobe  # noqa: E402

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "native",
                      "ringbuf_target.c")


def producer(record_size: int) -> list:
    """On rb_emit(seq, _): a `record_size`-byte record of seq, seq+1, ...; drops counted."""
    fill = []
    for k in range(record_size // 8):
        fill += [asm.mov(R1, R7), asm.add(R1, k), asm.stx(DW, R0, 8 * k, R1)]
    return [
        asm.mov(R6, R1),
        asm.ldx(DW, R7, R6, 112),
        asm.ld_map(R1, "events"), asm.mov(R2, record_size), asm.mov(R3, 0),
        asm.call(Helper.RINGBUF_RESERVE),
        asm.jeq(R0, 0, "drop"),
        *fill,
        asm.mov(R1, R0), asm.mov(R2, 0), asm.call(Helper.RINGBUF_SUBMIT),
        asm.ja("out"),
        asm.Label("drop"),
        asm.ld_map_value(R1, "drops"), asm.mov(R2, 1), asm.atomic_add(DW, R1, 0, R2),
        asm.Label("out"),
        asm.mov(R0, 0),
        asm.exit(),
    ]


def build_target(outdir: str) -> str:
    path = os.path.join(outdir, "libringbuf_target.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", path, SOURCE], check=True)
    return path


def time_drain(label: str, fill: Callable[[], int], drain: Callable[[], int]) -> None:
    expected = fill()
    start = time.perf_counter()
    count = drain()
    elapsed = time.perf_counter() - start
    status = "" if count == expected else "  (MISMATCH: expected %d)" % expected
    print("%-38s %9d records in %7.3f s: %12.0f records/s%s"
          % (label, count, elapsed, count / elapsed, status))


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ring-mib", type=int, default=64)
    parser.add_argument("--record", type=int, default=64, help="payload bytes (multiple of 8)")
    args = parser.parse_args(argv)
    size, record = args.ring_mib << 20, args.record
    per_ring = (size - 1) // record_stride(record)

    with tempfile.TemporaryDirectory() as tmp, RingBufMap(size, "rb_bench") as ring, \
            ArrayMap(8, 1, "rb_drops") as drops:
        library = build_target(tmp)
        program = Program(producer(record), {"events": ring, "drops": drops},
                          name="rb_bench").load()
        link = attach_uprobe(program, library, ElfFile(library).symbol_offset("rb_emit"),
                             what="rb_emit")
        lib = ctypes.CDLL(library)
        lib.rb_emit_many.argtypes = [ctypes.c_uint64] * 3
        reader = RingBuffer(ring.fd, ring.size)

        def fill() -> int:
            start = time.perf_counter()
            lib.rb_emit_many(0, per_ring, 0)
            took = time.perf_counter() - start
            print("  filled %d records (%d MiB ring) in %.2f s; producer drops so far: %d"
                  % (per_ring, args.ring_mib, took, struct.unpack("=Q", drops[0])[0]))
            return per_ring

        def consume_noop() -> int:
            return reader.consume(lambda record: None)

        def frames_and_unpack() -> int:
            fmt = "=8x%dQ" % (record // 8)
            return sum(1 for _ in struct.iter_unpack(fmt, reader.drain_frames(record)))

        print("ring %d MiB, %d-byte records (%d bytes each in the ring), %d records per fill"
              % (args.ring_mib, record, record_stride(record), per_ring))
        time_drain("consume(callback)", fill, consume_noop)
        time_drain("read_batch()", fill, lambda: len(reader.read_batch()))
        time_drain("drain_frames()", fill,
                   lambda: len(reader.drain_frames(record)) // record_stride(record))
        time_drain("drain_fixed()", fill, lambda: len(reader.drain_fixed(record)) // record)
        time_drain("drain_frames() + struct.iter_unpack", fill, frames_and_unpack)
        reader.close()
        link.close()
        program.close()


if __name__ == "__main__":
    main(sys.argv[1:])
