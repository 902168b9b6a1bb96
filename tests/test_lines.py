"""The fast path (output/lines.py: lines straight from frames) writes exactly what the
writers write from decoded events, for every row of the table and every record shape."""
import io
import random

import pytest

from ebpf_cuda.spec import record
from ebpf_cuda.spec.apis import TABLE
from ebpf_cuda.decode.events import Decoder
from ebpf_cuda.output.jsonl import JsonWriter
from ebpf_cuda.output.lines import JsonLines, TextLines
from ebpf_cuda.output.text import TextWriter
from records import pack_frame

COMMS = [b"basic02", b'we"ird\\name\xc3\xa9', b"x" * 16, b"python3\0garbage"]
RETS = [0, 0, 0, 1, 35, 500, 999, -1]


class FakeNamer:
    """Names every third address."""

    def name_for(self, pid, api, address, when=None):
        return "kernel<%s,%x>" % (api, address) if address % 3 == 0 else None

    def __call__(self, event, address):
        return self.name_for(event.pid, event.api, address)


def _frame(rng: random.Random, fn_id: int) -> bytes:
    phase = rng.choice([record.PHASE_CALL, record.PHASE_CALL, record.PHASE_ENTER])
    flags = 0
    if phase == record.PHASE_CALL:
        flags = rng.choice([0, 0, 0, record.FLAG_ENTRY_SENT, record.FLAG_OUT0_FAULT,
                            record.FLAG_OUT1_FAULT | record.FLAG_OUT0_FAULT])
    pid = rng.randrange(1, 1 << 22)
    tid = pid if rng.random() < 0.6 else rng.randrange(1, 1 << 22)
    ts = rng.randrange(10**9, 10**15)

    def cell():
        return rng.choice([0, 1, 3, 2**31, 2**32 - 1, 2**63 + 5, rng.randrange(1 << 64),
                           rng.randrange(1 << 32), 0x7F0012345678])

    exit_ts = ts + rng.randrange(0, 10**7)
    comm = rng.choice(COMMS)
    args = [cell() for _ in range(record.ARG_CELLS)]
    ret = rng.choice(RETS)
    outs = [cell() for _ in range(record.OUT_CELLS)]
    return pack_frame(fn_id, ts, args, ret, outs, exit_ts=exit_ts, phase=phase, flags=flags,
                      pid=pid, tid=tid, comm=comm)


def _frames(seed: int, per_row: int = 25) -> bytes:
    rng = random.Random(seed)
    frames = [_frame(rng, fn_id) for fn_id in range(len(TABLE)) for _ in range(per_row)]
    rng.shuffle(frames)
    return b"".join(frames)


def _writers(as_json: bool, timestamps: bool, namer):
    def make():
        stream = io.StringIO()
        if as_json:
            return JsonWriter(stream, namer=namer), stream
        return TextWriter(stream, timestamps=timestamps, namer=namer), stream
    return make(), make()


def _decoded_and_fast(frames: bytes, as_json: bool, from_start: bool):
    """(the decoded path's lines, the fast path's, its writer) of the same frames, each with
    its own device tracker."""
    from ebpf_cuda.decode.devices import DeviceTracker
    from ebpf_cuda.output import DecodeContext

    offset = 1_700_000_000 * 10**9
    (slow, slow_out), (fast, fast_out) = _writers(as_json, True, None)
    reference = Decoder(TABLE, clock_offset_ns=offset).decode_batch(frames)
    DeviceTracker(from_start).annotate(reference)
    slow.write(reference)
    tracker = DeviceTracker(from_start)
    fast.bind(DecodeContext(annotate=tracker.annotate, devices=tracker))
    fast.write_frames(frames, Decoder(TABLE, clock_offset_ns=offset))
    return slow_out.getvalue().splitlines(), fast_out.getvalue().splitlines(), fast


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("timestamps", [True, False])
@pytest.mark.parametrize("with_namer", [True, False])
def test_fast_lines_equal_decoded_lines(as_json, timestamps, with_namer):
    frames = _frames(seed=7)
    namer = FakeNamer() if with_namer else None
    (slow, slow_out), (fast, fast_out) = _writers(as_json, timestamps, namer)
    offset = 1_700_000_000 * 10**9
    slow.write(Decoder(TABLE, clock_offset_ns=offset).decode_batch(frames))
    fast.write_frames(frames, Decoder(TABLE, clock_offset_ns=offset))
    expected, got = slow_out.getvalue().splitlines(), fast_out.getvalue().splitlines()
    assert len(got) == len(expected) > len(TABLE) * 25
    for want, have in zip(expected, got):
        assert have == want


def test_most_rows_take_the_fast_path():
    """The compiled rows cover the table but for the name-teaching calls and rare kinds."""
    lines = TextLines(TABLE, Decoder(TABLE), lambda events: [], None)
    slow = [api.name for api, row in zip(TABLE, lines.rows) if row is None]
    fast = [api.name for api, row in zip(TABLE, lines.rows) if row is not None]
    assert "cudaLaunchKernel" in fast and "cuLaunchKernel" in fast and "cudaMemcpy" in fast
    assert "cuModuleGetFunction" in slow and "cudaEventElapsedTime" in slow
    assert len(fast) > 3 * len(slow)
    assert [r is None for r in JsonLines(TABLE, Decoder(TABLE), list, None).rows] == \
        [r is None for r in lines.rows]



@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("from_start", [True, False])
def test_calls_telling_the_device_take_the_fast_path_with_the_same_lines(as_json, from_start):
    """cudaGetDevice (which tells its thread's device, the JSON `device` key of its exit
    being its out-parameter) is formatted from frames too, and teaches the device tracker
    what the decoded path would: the lines of the calls after it carry the same device."""
    rng = random.Random(11)
    frames = []
    for i in range(400):
        fn = rng.choice(["cudaGetDevice", "cudaGetDevice", "cudaSetDevice", "cudaGetLastError",
                         "cudaLaunchKernel"])
        tid = rng.choice([100, 101, 102])
        phase = rng.choice([record.PHASE_CALL, record.PHASE_CALL, record.PHASE_ENTER])
        flags = rng.choice([0, 0, record.FLAG_ENTRY_SENT]) if phase == record.PHASE_CALL else 0
        device = rng.randrange(4)
        frames.append(pack_frame(fn, 10**12 + i * 1000, [device, 1, 2, 3],
                                 rng.choice([0, 0, 0, 101]), [device], exit_ts=10**12 + i * 1000
                                 + 500, phase=phase, flags=flags, pid=100, tid=tid,
                                 comm=b"app"))
    expected, got, fast = _decoded_and_fast(b"".join(frames), as_json, from_start)
    assert len(got) == len(expected) > 400
    assert got == expected
    if as_json:
        assert any('"api":"cudaGetDevice","phase":"exit"' in line and '"device":' in line
                   for line in got)
    lines = fast._from_frames
    assert lines.row(TABLE.index(next(a for a in TABLE if a.name == "cudaGetDevice"))) \
        is not None  # (the fast path, not the decoder)
    assert lines.row(TABLE.index(next(a for a in TABLE if a.name == "cudaSetDevice"))) is None


@pytest.mark.parametrize("as_json", [False, True])
def test_a_thread_renamed_and_a_device_told_again_keep_their_lines(as_json):
    """The thread columns are kept by tid with its comm: a thread that renames itself (and
    back) shows each name; a device told again, the same or another, teaches the tracker
    what the decoded path would (the columns keep the cell last told, see lines._told)."""
    frames = []
    for i, (comm, device) in enumerate([(b"app", 0), (b"app", 0), (b"worker", 0), (b"app", 2),
                                        (b"app", 2), (b"worker", 1), (b"app", 1)]):
        for fn in ("cudaGetDevice", "cudaGetLastError"):
            frames.append(pack_frame(fn, 10**12 + i * 1000, [], 0, [device],
                                     exit_ts=10**12 + i * 1000 + 500, pid=100, tid=101,
                                     comm=comm))
    expected, got, _ = _decoded_and_fast(b"".join(frames), as_json, True)
    assert got == expected
    assert sum("worker" in line for line in got) == 8  # (2 lines a call, 2 calls, 2 times)
    if as_json:
        assert [line.count('"device":1') for line in got[-4:]] == [1, 1, 1, 1]


def _written(writer_class, spans, offset: int, fast: bool):
    """The lines a writer gives for cudaGetDevice calls of these (enter, exit) times, from
    the frames (the fast path) or from decoded events."""
    frames = b"".join(pack_frame("cudaGetDevice", enter, exit_ts=exit_, outs=[0])
                      for enter, exit_ in spans)
    out = io.StringIO()
    writer = writer_class(out)
    if fast:
        writer.write_frames(frames, Decoder(TABLE, clock_offset_ns=offset))
    else:
        writer.write(Decoder(TABLE, clock_offset_ns=offset).decode_batch(frames))
    return out.getvalue().splitlines()


@pytest.mark.parametrize("fast", [True, False])
def test_json_times_are_the_wall_clock_ns_exactly(fast):
    """JSON `ts` is the wall-clock time to the ns, "S.NNNNNNNNN" (not a float's shortest
    repr, which rounds to ~0.2 µs): a call across a second's end, leading zeros, a time on
    the second; json.loads reads each as the float nearest the exact time."""
    import json

    offset = 1_796_646_153 * 10**9
    spans = [(999_999_990, 1_000_000_007), (5, 1_234), (2 * 10**9, 2 * 10**9 + 1)]
    lines = _written(JsonWriter, spans, offset, fast)
    want = ["1796646153.999999990", "1796646154.000000007", "1796646153.000000005",
            "1796646153.000001234", "1796646155.000000000", "1796646155.000000001"]
    assert [line.split(",", 1)[0] for line in lines] == ['{"ts":' + ts for ts in want]
    exact = [offset + t for span in spans for t in span]
    assert [json.loads(line)["ts"] for line in lines] == [ns / 10**9 for ns in exact]


@pytest.mark.parametrize("fast", [True, False])
def test_text_times_are_the_wall_clock_ns_truncated(fast):
    """Text times are the wall-clock ns truncated to the microsecond, the second exact too
    (a float of the seconds rounds to ~0.2 µs: .123456999 would show .123457, and a time
    just before a second's end the next second)."""
    import time

    spans = [(123_456_999, 999_999_990), (999_999_999, 1_000_000_000)]
    lines = _written(TextWriter, spans, 1_796_646_153 * 10**9, fast)

    def shown(second: int, micro: str) -> str:
        return time.strftime("%H:%M:%S", time.localtime(1_796_646_153 + second)) + micro

    assert [line.split(" ", 1)[0] for line in lines] == [
        shown(0, ".123456"), shown(0, ".999999"), shown(0, ".999999"), shown(1, ".000000")]
