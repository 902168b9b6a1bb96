"""Lost events under load: the ebpf-cuda CLI tracing a program that calls as fast as it can.

bench/native/callloop calls cudaGetDevice (stand-in runtime) flat out or paced to a rate for
SECONDS, in 1, 4 or 16 threads, and prints how many calls it made. The CLI traces it with
default settings (4 MiB ring; text and JSON through the spool) in each output mode; the accounting is

    made (the target's count) = seen (records in the output) + lost (the CLI's "N events lost")

and any run where that does not hold is flagged. Modes: text to a file, JSON Lines to a file,
--summary, --save (the last two only when the CLI has them). Rate-limited runs find the
highest tested rate at which text and JSON lose nothing. Needs root and gcc.

    sudo python3 bench/loss.py [--seconds 10] [--rate-seconds 5] [--rates 100k,250k,500k,1M]
"""
import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Built  # noqa: E402

import io  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402

from ebpf_cuda.spec import record
from ebpf_cuda.output import savefile  # noqa: E402
from ebpf_cuda.spec.apis import FN_ID, TABLE  # noqa: E402
from ebpf_cuda.decode.events import Decoder  # noqa: E402
from ebpf_cuda.output.jsonl import JsonWriter  # noqa: E402
from ebpf_cuda.output.text import TextWriter  # noqa: E402

FUNCTION = "cudaGetDevice"


@dataclass
class Outcome:
    mode: str
    threads: int
    rate: float  # asked for; 0 = flat out
    made: int
    seen: int
    lost: int
    achieved: float  # calls/s the target managed
    wall_s: float  # the CLI's run time, start to exit

    @property
    def balanced(self) -> bool:
        return self.seen + self.lost == self.made

    def line(self) -> str:
        asked = "full" if not self.rate else _rate_text(self.rate)
        loss = 100.0 * self.lost / self.made if self.made else 0.0
        flag = "" if self.balanced else "  !! seen+lost=%d != made (%+d)" % (
            self.seen + self.lost, self.seen + self.lost - self.made)
        return "%-8s %3d thr  %-6s %10d made %10d seen %10d lost (%5.1f%%)  %9.0f calls/s  " \
               "%5.1f s%s" % (self.mode, self.threads, asked, self.made, self.seen, self.lost,
                              loss, self.achieved, self.wall_s, flag)


def _rate_text(rate: float) -> str:
    return "%gM" % (rate / 1e6) if rate >= 1e6 else "%gk" % (rate / 1e3)


def parse_rate(text: str) -> float:
    text = text.strip().lower()
    scale = {"k": 1e3, "m": 1e6}.get(text[-1:], 1)
    return float(text[:-1] if scale != 1 else text) * scale


# How each mode is run (extra CLI options given an output path) and its records counted.
def _count_lines(marker: str) -> Callable[[str, str], int]:
    def count(path: str, stdout: str) -> int:
        with open(path, errors="replace") as f:
            return sum(1 for line in f if marker in line)
    return count


def _count_summary(path: str, stdout: str) -> int:
    """Num Calls of FUNCTION in the cuda_api_sum table."""
    table = stdout.split("cuda_api_sum", 1)[-1]
    for line in table.splitlines():
        cols = line.split()
        if cols and cols[-1] == FUNCTION and len(cols) >= 3:
            return int(cols[2].replace(",", ""))
    return 0


def _count_saved(path: str, stdout: str) -> int:
    return sum(record.call_count(frames) for frames in savefile.load(path).frames())


MODES: Dict[str, tuple] = {
    "text": (lambda out: ["-o", out], _count_lines("[EXIT]")),
    "json": (lambda out: ["--json", "-o", out], _count_lines('"phase":"exit"')),
    "summary": (lambda out: ["--summary"], _count_summary),
    "save": (lambda out: ["--save", out], _count_saved),
}


def run_mode(built: Built, mode: str, seconds: float, rate: float, threads: int,
             options: List[str]) -> Outcome:
    make_options, count = MODES[mode]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "trace.out")
        command = common.loop_args(built, seconds=seconds, rate=rate, threads=threads)
        run = common.run_cli(["-p", str(built.lib), "--functions", FUNCTION, *options,
                              *make_options(out)], command)
        loop = common.parse_loop(run.stdout)
        seen = count(out, run.stdout)
    return Outcome(mode, threads, rate, loop.made, seen, run.lost,
                   loop.total.get("rate", 0.0), run.wall_s)


# -- the consumer alone: how many records/s each way of handling them sustains --------------


def synthetic_frames(count: int) -> bytes:
    """`count` ring frames of complete cudaGetDevice calls, as the probes write them."""
    frames = []
    for k in range(count):
        body = record.LAYOUT.pack(
            10**9 + 1000 * k, 10**9 + 1000 * k + 700, 4321, 1234,
            FN_ID[FUNCTION], record.PHASE_CALL, 0, 0, b"callloop", *([0] * record.ARG_CELLS),
            0, 0, 0)
        frames.append(struct.pack("<II", record.SIZE, 0) + body)
    return b"".join(frames)


def consumer_rates(count: int = 52000, batch: int = 4096) -> Dict[str, float]:
    """Records/s of: decoding; decoding + text; decoding + JSON; raw save; decode + summary
    (in this process, no kernel, writes to memory or /dev/null)."""
    frames = synthetic_frames(batch)
    batches = max(1, count // batch)

    def time_it(handle: Callable[[bytes], None]) -> float:
        start = time.perf_counter()
        for _ in range(batches):
            handle(frames)
        return batches * batch / (time.perf_counter() - start)

    decoder = Decoder(TABLE)
    rates = {"decode only": time_it(lambda f: list(decoder.decode_frames(f)))}
    with open(os.devnull, "w") as null:
        text = TextWriter(null)
        rates["decode + text"] = time_it(lambda f: text.write(list(decoder.decode_frames(f))))
        json = JsonWriter(null)
        rates["decode + json"] = time_it(lambda f: json.write(list(decoder.decode_frames(f))))
        # what the CLI runs when text or JSON is the only output: lines from frames
        fast_text = TextWriter(null)
        rates["text from frames"] = time_it(lambda f: fast_text.write_frames(f, decoder))
        fast_json = JsonWriter(null)
        rates["json from frames"] = time_it(lambda f: fast_json.write_frames(f, decoder))
    raw = io.BytesIO()
    rates["save (raw write)"] = time_it(raw.write)
    try:
        from ebpf_cuda.analysis import Summary
        summary = Summary()
        rates["decode + summary"] = time_it(
            lambda f: summary.write(list(decoder.decode_frames(f))))
    except ImportError:
        pass
    return rates


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10, help="full-speed run length")
    parser.add_argument("--rate-seconds", type=float, default=5,
                        help="length of rate-limited and multi-thread runs")
    parser.add_argument("--rates", default="100k,250k,500k,1M")
    parser.add_argument("--threads", default="4,16")
    parser.add_argument("--modes", default="text,json,summary,save")
    parser.add_argument("--lib", help="libcudart.so.12 to use instead of the stand-in")
    parser.add_argument("--cli-options", default="", help="extra CLI options for every run")
    args = parser.parse_args(argv)
    common.need_root()
    built = common.build(args.lib)
    extra = args.cli_options.split()
    wanted = [m for m in args.modes.split(",") if m]
    available = [m for m in wanted if m in ("text", "json") or common.cli_has("--" + m)]
    for missing in set(wanted) - set(available):
        print("(mode %s skipped: the CLI has no --%s yet)" % (missing, missing))
    print("loss: %s" % common.machine())
    print("target %s, default ring, function %s" % (built.callloop.name, FUNCTION))
    print("\n-- the consumer alone (synthetic records, no kernel): records/s")
    for what, rate in consumer_rates().items():
        print("  %-18s %10.0f" % (what, rate))
    outcomes: List[Outcome] = []

    def go(mode: str, seconds: float, rate: float, threads: int) -> Outcome:
        outcome = run_mode(built, mode, seconds, rate, threads, extra)
        print(outcome.line(), flush=True)
        outcomes.append(outcome)
        return outcome

    print("\n-- one thread, full speed, %g s" % args.seconds)
    for mode in available:
        go(mode, args.seconds, 0, 1)
    rates = [parse_rate(r) for r in args.rates.split(",") if r]
    print("\n-- one thread, rate-limited, %g s" % args.rate_seconds)
    best: Dict[str, Optional[float]] = {}
    for mode in [m for m in ("text", "json") if m in available]:
        best[mode] = None
        for rate in sorted(rates):
            if go(mode, args.rate_seconds, rate, 1).lost == 0:
                best[mode] = rate
    print("\n-- several threads, full speed, %g s" % args.rate_seconds)
    for threads in [int(t) for t in args.threads.split(",") if t]:
        for mode in [m for m in ("save", "text") if m in available]:
            go(mode, args.rate_seconds, 0, threads)
    print("\nhighest tested rate with zero loss:")
    for mode, rate in best.items():
        print("  %-6s %s" % (mode, _rate_text(rate) + " calls/s" if rate else "none"))
    bad = [o for o in outcomes if not o.balanced]
    print("accounting: %s" % ("seen + lost == made in every run" if not bad else
                              "%d run(s) do NOT balance (see !! above)" % len(bad)))


if __name__ == "__main__":
    main(sys.argv[1:])
