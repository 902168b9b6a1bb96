"""The text and JSON writers' CPU per traced call beside CPython's floor for the same work,
in one interleaved run (issue 36): what is left between ours and the floor is what the
writer could still cut.

The input is N records of cudaGetDevice calls as the ring hands them over (synthesized: one
process, one thread of it, 1-3 µs calls, two lines each, as bench/hotpath.py's workload
writes them), formatted by:
- `ours`: the writer's fast path (output/lines.py through LineWriter.write_frames, bound as
  a live trace binds it: devices, containers, graphs), written to /dev/null;
- `base`: the same with the lines.py of another checkout (--baseline DIR), loaded into this
  package (only lines.py differs);
- `floor same bytes`: a loop written by hand for this one row and thread, producing exactly
  our bytes (checked): iter_unpack of the frame layout, the clock text kept per second, one
  `%` format of both lines, the durations' text kept per value, join, one write;
- `floor bare`: iter_unpack, one `%` format of a line of the same length and conversions
  with values taken straight from the record (no time arithmetic), join, one write.
- `json floor float repr`: the floor for the JSON bytes before issue 36's third round,
  whose times were the floats' shortest repr (now: "S.NNNNNNNNN" from the ns, exact).
`floor parts` prints what each step of the floor costs alone (the unpack, the two times'
arithmetic, the format). Each case runs once per round, the order rotated; median (min-max)
over the rounds of the thread's CPU per call. No root needed.

    python3 bench/writer_floor.py [--calls 200000] [--rounds 7] [--baseline DIR]
"""
import argparse
import importlib.util
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ebpf_cuda.decode.devices import DeviceTracker  # noqa: E402
from ebpf_cuda.decode.events import Decoder  # noqa: E402
from ebpf_cuda.decode.graphs import GraphTracker  # noqa: E402
from ebpf_cuda.decode.values import RET_AT  # noqa: E402
from ebpf_cuda.output import DecodeContext  # noqa: E402
from ebpf_cuda.output.jsonl import JsonWriter  # noqa: E402
from ebpf_cuda.output.text import TextWriter  # noqa: E402
from ebpf_cuda.spec import record  # noqa: E402
from ebpf_cuda.spec.apis import BY_NAME, TABLE  # noqa: E402
from ebpf_cuda.targets.containers import Containers  # noqa: E402

FUNCTION = "cudaGetDevice"
PID, TID, COMM = 16604, 16605, b"callloop-fakecu"
FRAME = record.FRAME_SIZE
_UNPACK = record.LAYOUT.format.lstrip("<=@!>")


def frames(calls: int, seed: int = 1) -> bytes:
    """`calls` complete calls of FUNCTION, back to back, as ring frames."""
    rng = random.Random(seed)
    fn_id = TABLE.index(BY_NAME[FUNCTION])
    pack = record.LAYOUT.pack
    header = (record.SIZE).to_bytes(4, "little") + bytes(4)
    out, ts = [], 37_000_000_000_000
    for _ in range(calls):
        took = rng.randrange(1000, 3000)
        out.append(header + pack(ts, ts + took, TID, PID, fn_id, record.PHASE_CALL, 0, 0, COMM,
                                 *([0] * record.ARG_CELLS), 0, *([0] * record.OUT_CELLS), 0))
        ts += took + rng.randrange(200, 600)
    return b"".join(out)


def _context() -> DecodeContext:
    """What a live trace binds a lone text or JSON writer to (Stream._bind)."""
    return DecodeContext(lambda events: None, GraphTracker(None), Containers(),
                         DeviceTracker(from_start=True), None)


def _base_lines(directory: Path):
    """Another checkout's output/lines.py, as a module of this package."""
    spec = importlib.util.spec_from_file_location(
        "ebpf_cuda.output._base_lines", str(directory / "ebpf_cuda" / "output" / "lines.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def writer(as_json: bool, offset: int, lines_module=None):
    """A writer to /dev/null (its fast path from `lines_module`, else this tree's)."""
    stream = open(os.devnull, "w")
    w = JsonWriter(stream) if as_json else TextWriter(stream)
    w.bind(_context())
    decoder = Decoder(TABLE, offset)
    if lines_module is not None:
        made = (lines_module.JsonLines(TABLE, decoder, w.slow_lines, None, w.context)
                if as_json else
                lines_module.TextLines(TABLE, decoder, w.slow_lines, None, True, w.context))
        w._from_frames = made
    w.prepare(decoder)
    return w, decoder


def run_writer(data: bytes, as_json: bool, offset: int, lines_module=None) -> None:
    w, decoder = writer(as_json, offset, lines_module)
    batch = 2048 * FRAME  # as the spool hands them over
    for start in range(0, len(data), batch):
        w.write_frames(data[start:start + batch], decoder)


def our_bytes(data: bytes, as_json: bool, offset: int) -> bytes:
    import io

    w, decoder = writer(as_json, offset)
    w.stream = io.StringIO()
    w._fd = -1
    w.write_frames(data, decoder)
    return w.stream.getvalue().encode()


# -- the floors ----------------------------------------------------------------------------

def _text_template() -> str:
    who = "%-16s %-7d " % (COMM.decode(), PID)
    return ("%s.%06d " + who + "%-20s %8s " % (FUNCTION, "[ENTER]") + " tid=%d\n" % TID
            + "%s.%06d " + who + "%-20s %8s returned=cudaSuccess" % (FUNCTION, "[EXIT]")
            + " device=%d (%s us)" + " tid=%d" % TID)


def _json_template(ts: str = "%s%09d") -> str:
    """(ts: the time's conversions; "%r": the float the JSON wrote before issue 36's third
    round, for the `floor float repr` row)"""
    who = ',"pid":%d,"tid":%d,"comm":"%s"' % (PID, TID, COMM.decode())
    return ('{"ts":' + ts + who + ',"device":0,"api":"' + FUNCTION + '","phase":"enter",'
            '"args":{}}\n{"ts":' + ts + who + ',"api":"' + FUNCTION + '","phase":"exit",'
            '"args":{},"ret":0,"ret_name":"cudaSuccess","duration_ns":%d,"device":%d}')


def _emit(out: List[str], fd: int) -> None:
    text = "\n".join(out) + "\n"
    os.write(fd, text.encode())


def floor_text(data: bytes, offset: int, fd: int, chunk: int = 1024) -> None:
    """Our text bytes for this row and thread, by the least CPython can do."""
    import struct

    unpack = struct.Struct("=8x" + _UNPACK).iter_unpack
    template, durations = _text_template(), {}
    low, high, clock = 0, 0, ""
    dev = RET_AT + 1  # (the tuple's index of the first out-parameter cell)
    for start in range(0, len(data), chunk * FRAME):
        out: List[str] = []
        add = out.append
        for f in unpack(data[start:start + chunk * FRAME]):
            w0, w1 = f[0] + offset, f[1] + offset
            if not low <= w1 < high:
                second = w1 // 1_000_000_000
                low, high = second * 1_000_000_000, (second + 1) * 1_000_000_000
                clock = time.strftime("%H:%M:%S", time.localtime(second))
            took = f[1] - f[0]
            d = durations.get(took)
            if d is None:
                d = durations[took] = "%.1f" % (took / 1000.0)
            add(template % (clock if low <= w0 else time.strftime(
                "%H:%M:%S", time.localtime(w0 // 1_000_000_000)), w0 % 1_000_000_000 // 1000,
                            clock, (w1 - low) // 1000, f[dev] & 0xFFFFFFFF, d))
        _emit(out, fd)


def floor_json(data: bytes, offset: int, fd: int, chunk: int = 1024) -> None:
    """Our JSON bytes for this row and thread, by the least CPython can do."""
    import struct

    unpack = struct.Struct("=8x" + _UNPACK).iter_unpack
    template = _json_template()
    dev = RET_AT + 1
    low, high, text = 0, 0, ""
    for start in range(0, len(data), chunk * FRAME):
        out: List[str] = []
        add = out.append
        for f in unpack(data[start:start + chunk * FRAME]):
            w0, w1 = f[0] + offset, f[1] + offset
            if not low <= w1 < high:
                second = w1 // 1_000_000_000
                low, high, text = second * 1_000_000_000, (second + 1) * 1_000_000_000, (
                    "%d." % second)
            add(template % (text if low <= w0 else "%d." % (w0 // 1_000_000_000),
                            w0 % 1_000_000_000, text, w1 - low, f[1] - f[0],
                            f[dev] & 0xFFFFFFFF))
        _emit(out, fd)


def floor_json_repr(data: bytes, offset: int, fd: int, chunk: int = 1024) -> None:
    """The JSON bytes before the third round (times as float reprs), by the least CPython
    can do."""
    import struct

    unpack = struct.Struct("=8x" + _UNPACK).iter_unpack
    template = _json_template("%r")
    dev = RET_AT + 1
    for start in range(0, len(data), chunk * FRAME):
        out: List[str] = []
        add = out.append
        for f in unpack(data[start:start + chunk * FRAME]):
            add(template % ((f[0] + offset) / 1e9, (f[1] + offset) / 1e9, f[1] - f[0],
                            f[dev] & 0xFFFFFFFF))
        _emit(out, fd)


def floor_bare(data: bytes, as_json: bool, fd: int, chunk: int = 1024) -> None:
    """One `%` of a line as long, with as many conversions, values straight from the
    record: unpacking, formatting and writing alone."""
    import struct

    unpack = struct.Struct("=8x" + _UNPACK).iter_unpack
    if as_json:
        template = _json_template("%d.%09d")
    else:
        template = _text_template().replace("%s.%06d", "%08d.%06d").replace("(%s us)",
                                                                             "(%03d us)")
    for start in range(0, len(data), chunk * FRAME):
        out: List[str] = []
        add = out.append
        if as_json:
            for f in unpack(data[start:start + chunk * FRAME]):
                add(template % (f[0], f[2], f[1], f[2], f[3], f[9]))
        else:
            for f in unpack(data[start:start + chunk * FRAME]):
                add(template % (f[0], f[2], f[1], f[3], f[9], f[4]))
        _emit(out, fd)


def parts(data: bytes, offset: int) -> Dict[str, Callable[[], None]]:
    """The floor's steps alone (no write): unpacking, the times' arithmetic, the float
    repr of JSON's times."""
    import struct

    unpack = struct.Struct("=8x" + _UNPACK).iter_unpack

    def unpack_only() -> None:
        for f in unpack(data):
            pass

    def times() -> None:
        for f in unpack(data):
            t0, t1 = (f[0] + offset) / 1e9, (f[1] + offset) / 1e9
            (t0 * 1e6 % 1e6, t1 * 1e6 % 1e6)

    def ns_times() -> None:
        low = high = 0
        for f in unpack(data):
            w0, w1 = f[0] + offset, f[1] + offset
            if not low <= w1 < high:
                low = w1 - w1 % 1_000_000_000
                high = low + 1_000_000_000
            ((w0 - low) // 1000, (w1 - low) // 1000)

    def reprs() -> None:
        for f in unpack(data):
            "%r%r" % ((f[0] + offset) / 1e9, (f[1] + offset) / 1e9)

    def exact() -> None:
        low, high, text = 0, 0, ""
        for f in unpack(data):
            w0, w1 = f[0] + offset, f[1] + offset
            if not low <= w1 < high:
                second = w1 // 1_000_000_000
                low, high, text = second * 1_000_000_000, (second + 1) * 1_000_000_000, (
                    "%d." % second)
            "%s%09d%s%09d" % (text, w0 - low, text, w1 - low)

    return {"part: iter_unpack": unpack_only, "part: + text float times": times,
            "part: + text ns times": ns_times,
            "part: + JSON %r times": reprs, "part: + JSON ns times": exact}


# -- running -------------------------------------------------------------------------------

def cpu_us(fn: Callable[[], None], calls: int) -> float:
    start = time.thread_time()
    fn()
    return (time.thread_time() - start) * 1e6 / calls


def cases(data: bytes, offset: int, base) -> Dict[str, Callable[[], None]]:
    fd = os.open(os.devnull, os.O_WRONLY)
    rows: Dict[str, Callable[[], None]] = {}
    for name, as_json in (("text", False), ("json", True)):
        rows[name + " ours"] = lambda j=as_json: run_writer(data, j, offset)
        if base is not None:
            rows[name + " base"] = lambda j=as_json: run_writer(data, j, offset, base)
        rows[name + " floor same bytes"] = ((lambda: floor_json(data, offset, fd)) if as_json
                                            else (lambda: floor_text(data, offset, fd)))
        rows[name + " floor bare"] = lambda j=as_json: floor_bare(data, j, fd)
    rows["json floor float repr"] = lambda: floor_json_repr(data, offset, fd)
    rows.update(parts(data, offset))
    return rows


def check_floors(offset: int) -> None:
    """The same-bytes floors write exactly our bytes (else they measure something else)."""
    import tempfile

    sample = frames(3000, seed=2)
    for as_json, floor in ((False, floor_text), (True, floor_json)):
        with tempfile.TemporaryFile() as file:
            floor(sample, offset, file.fileno(), chunk=64)
            file.seek(0)
            got = file.read()
        want = our_bytes(sample, as_json, offset)
        if got != want:
            raise SystemExit("the %s floor's bytes differ from ours:\n%r\n%r" % (
                "JSON" if as_json else "text", got[:400], want[:400]))


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.machine()


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", metavar="DIR", help="another checkout: its lines.py")
    parser.add_argument("--only", help="comma-separated case names")
    args = parser.parse_args(argv)
    offset = 1_796_646_153_000_000_000 - 37_000_000_000_000  # (a wall clock of 2026)
    check_floors(offset)
    base: Optional[object] = _base_lines(Path(args.baseline)) if args.baseline else None
    data = frames(args.calls)
    rows = cases(data, offset, base)
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        rows = {k: v for k, v in rows.items() if k in wanted}
    import platform

    print("writer_floor: %s, %d cores, Python %s, %s; %d %s calls, %d rounds" % (
        _cpu(), os.cpu_count(),
        platform.python_version(), time.strftime("%Y-%m-%d %H:%M"), args.calls, FUNCTION,
        args.rounds))
    results: Dict[str, List[float]] = {name: [] for name in rows}
    names = list(rows)
    for round_no in range(args.rounds):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(cpu_us(rows[name], args.calls))
    print("%-24s %s" % ("case", "CPU us/call: median (min-max)"))
    for name, values in results.items():
        print("%-24s %.2f (%.2f-%.2f)" % (name, statistics.median(values), min(values),
                                          max(values)))


if __name__ == "__main__":
    main(sys.argv[1:])
