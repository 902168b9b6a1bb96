"""What putting the GPU's records among the calls costs a text or JSON writer (gpu/feed.py):
the time `GpuFeed.split_frames` takes on a batch of ring frames as the lines are written
(output/lines.CHUNK_RECORDS of them), in its three cases.

    python3 bench/gpu_feed.py [--rounds 2000]

Cases: nothing pending (no record since the last batch: most batches), a record pending
that goes after this batch (the writer behind the sampler, e.g. a spool backlog), a record
that goes inside this batch (a cut: about once a sampling round).
"""
import argparse
import os
import struct
import sys
import timeit
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ebpf_cuda.gpu.feed import GpuFeed  # noqa: E402
from ebpf_cuda.output.lines import CHUNK_RECORDS  # noqa: E402
from ebpf_cuda.spec import record  # noqa: E402


def frames(count: int, first_ns: int = 1000) -> bytes:
    """`count` frames of calls ending 1 µs apart."""
    out = bytearray()
    for i in range(count):
        body = bytearray(record.SIZE)
        struct.pack_into("=Q", body, record.TS_ENTER, first_ns + i * 1000 - 500)
        struct.pack_into("=Q", body, record.TS_EXIT, first_ns + i * 1000)
        out += bytes(record.FRAME_HEADER) + body
    return bytes(out)


def per_call_us(feed_for, batch: bytes, rounds: int) -> float:
    """µs a split_frames call, a fresh feed each time (set-up timed apart and taken off)."""
    feeds = [feed_for() for _ in range(rounds)]
    it = iter(feeds)
    total = timeit.timeit(lambda: next(it).split_frames(batch), number=rounds)
    it = iter(feeds)
    empty = timeit.timeit(lambda: next(it), number=rounds)
    return (total - empty) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    batch = frames(CHUNK_RECORDS)
    middle = 1000 + CHUNK_RECORDS // 2 * 1000
    cases = {
        "nothing pending": lambda: GpuFeed([], []),
        "pending, after the batch": lambda: GpuFeed([SimpleNamespace(ts_ns=10 ** 12)], []),
        "a cut inside the batch": lambda: GpuFeed([SimpleNamespace(ts_ns=middle)], []),
    }
    print("%d frames a batch, %d rounds" % (CHUNK_RECORDS, args.rounds))
    for name, feed_for in cases.items():
        print("  %-26s %8.1f us" % (name, min(per_call_us(feed_for, batch, args.rounds)
                                              for _ in range(3))))


if __name__ == "__main__":
    main()
