"""Saved traces: the file format (header checks, truncation, trailer) on hand-made records, and
a real trace of the stand-in saved live then replayed by `ebpf-cuda report` with outputs equal
to the live ones."""
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ebpf_cuda.spec import apis, record
from ebpf_cuda.output import savefile
from ebpf_cuda.errors import DecodeError
from ebpf_cuda.decode.events import Decoder
from records import frame_of, pack_frame

REPO = Path(__file__).resolve().parent.parent
OFFSET = 1_700_000_000 * 10 ** 9


FRAMES = [pack_frame("cudaMalloc", 1000, (0x10, 4000), outs=(0x7F0000000000,)),
          pack_frame("cudaLaunchKernel", 2000,
                     (0x4010, 2 | 1 << 32, 1, 64 | 1 << 32, 1, 0, 0, 0)),
          pack_frame("cudaFree", 3000, (0x7F0000000000,))]


def write(path, frames, close=True, namer=None, events=()):
    writer = savefile.open_save(str(path), apis.TABLE, OFFSET, namer)
    for batch in frames:
        writer.write_frames(batch)
    writer.write(events)
    if close:
        writer.close()
    else:
        writer.stream.flush()
    return writer


def live_events(frames):
    return [ev.to_json() for ev in Decoder(apis.TABLE, OFFSET).decode_frames(b"".join(frames))]


def test_round_trip_gives_the_same_events(tmp_path):
    path = tmp_path / "t.ebpfcuda"
    write(path, [FRAMES[0], b"".join(FRAMES[1:])])
    saved = savefile.load(str(path))
    assert saved.clock_offset_ns == OFFSET and saved.function_names[:2] == ["cudaMalloc",
                                                                             "cudaFree"]
    assert [ev.to_json() for ev in saved] == live_events(FRAMES)
    assert [len(batch) for batch in saved.batches()] == [6]
    assert not saved.truncated


def test_header_layout(tmp_path):
    path = tmp_path / "t.ebpfcuda"
    write(path, [FRAMES[0]])
    head = path.read_bytes()[:32]
    magic, version, size, offset, frame_bytes, names = struct.unpack("<8sHHqQI", head)
    assert (magic, version, size, offset) == (b"EBPFCUDA", savefile.FORMAT_VERSION,
                                              record.SIZE, OFFSET)
    assert frame_bytes == len(FRAMES[0]) and names > 0


def test_kernel_names_travel_in_the_trailer(tmp_path):
    path = tmp_path / "t.ebpfcuda"
    events = list(Decoder(apis.TABLE, OFFSET).decode_frames(FRAMES[1]))
    write(path, [FRAMES[1]], namer=lambda ev, addr: "vec_add", events=events)
    saved = savefile.load(str(path))
    launch = list(saved)[1]
    assert saved.kernels == {(42, 0x4010): "vec_add"}
    assert saved.namer(launch, 0x4010) == "vec_add" and saved.namer(launch, 0x99) is None


def test_a_file_whose_writer_died_is_read_to_its_last_whole_frame(tmp_path):
    path = tmp_path / "t.ebpfcuda"
    writer = write(path, [b"".join(FRAMES)], close=False)
    with open(path, "ab") as f:
        f.write(FRAMES[0][:50])  # killed in the middle of a frame
    saved = savefile.load(str(path))
    assert [ev.to_json() for ev in saved] == live_events(FRAMES)
    assert saved.truncated and saved.kernels == {}
    writer.stream.close()


def test_empty_trace(tmp_path):
    path = tmp_path / "t.ebpfcuda"
    write(path, [])
    saved = savefile.load(str(path))
    assert list(saved) == [] and not saved.truncated


@pytest.mark.parametrize("damage, message", [
    (lambda b: b"NOTATRACE" + b[9:], "bad magic"),
    (lambda b: b[:8] + struct.pack("<H", 99) + b[10:], "format version 99"),
    (lambda b: b[:10] + struct.pack("<H", 64) + b[12:], "64-byte records"),
    (lambda b: b[:40], "truncated inside its header"),
    (lambda b: b[:32] + b"cudaNoSuchThing" + b[47:], "does not know"),
])
def test_damaged_headers_raise_decode_errors(tmp_path, damage, message):
    path = tmp_path / "t.ebpfcuda"
    write(path, FRAMES)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DecodeError, match=message):
        savefile.load(str(path))


def test_missing_file_is_a_usage_error(tmp_path):
    from ebpf_cuda.errors import UsageError

    with pytest.raises(UsageError):
        savefile.load(str(tmp_path / "nothing"))


# -- real trace, live then replayed ---------------------------------------------------------

OPS = ["malloc:4000", "malloc:100", "memcpy:4000:1", "launch:2,1,1:64", "free:@0", "free:@0",
       "setdevice:5", "sleep:300"]  # the sleep keeps the process alive to name its kernel
OUTPUTS = ["--json", "-o", "{d}/events.jsonl", "--summary", "--leaks",
           "--trace-out", "{d}/trace.json", "--report", "{d}/report.html"]


def _cli(*args, python=sys.executable, flags=(), cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([python, *flags, *args], capture_output=True, text=True, timeout=120,
                          env=env, check=True, cwd=cwd)


@pytest.fixture(scope="module")
def live(cc, tmp_path_factory):
    """A live trace with every output, saved with --save; (folder, stdout, stderr)."""
    from fakecuda import build_fake_cuda

    _, prog = build_fake_cuda(cc)
    folder = tmp_path_factory.mktemp("live")
    outputs = [arg.format(d=folder) for arg in OUTPUTS]
    done = _cli("-m", "ebpf_cuda", "--save", str(folder / "run.ebpfcuda"), *outputs, "--",
                str(prog), *OPS)
    return folder, done.stdout, done.stderr


def _same_outputs(live_dir: Path, replay_dir: Path) -> None:
    for name in ("events.jsonl", "trace.json", "report.html"):
        assert (replay_dir / name).read_text() == (live_dir / name).read_text(), name


@pytest.mark.kernel
def test_replay_in_process_equals_the_live_outputs(live, tmp_path, capsys):
    from ebpf_cuda.cli import main as cli

    folder, live_out, live_err = live
    outputs = [arg.format(d=tmp_path) for arg in OUTPUTS]
    cli.main(["report", str(folder / "run.ebpfcuda"), *outputs])
    _same_outputs(folder, tmp_path)
    replay = capsys.readouterr()
    summary = live_out[live_out.index(" ** CUDA API Summary"):]
    assert replay.out == summary
    assert "double free" in replay.err and "double free" in live_err
    assert "vec_add_kernel" in (tmp_path / "events.jsonl").read_text()
    assert json.loads((tmp_path / "trace.json").read_text())


@pytest.mark.kernel
def test_replay_as_nobody_with_the_bundle_and_system_python(live, tmp_path):
    """An unprivileged user with a bare python3 (no click, no pyelftools) replays the file."""
    folder, _, _ = live
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK) or subprocess.run(["id", "nobody"]).returncode:
        pytest.skip("needs /usr/bin/python3 and the user nobody")
    share = Path(os.environ.get("TMPDIR", "/tmp")) / ("ebpf-cuda-replay-%d" % os.getpid())
    share.mkdir(mode=0o777)
    try:
        os.chmod(share, 0o777)
        _cli("-m", "ebpf_cuda.bundle", "-o", str(share / "ebpf-cuda.pyz"))
        saved = share / "run.ebpfcuda"
        saved.write_bytes((folder / "run.ebpfcuda").read_bytes())
        os.chmod(saved, 0o644)
        outputs = [arg.format(d=share) for arg in OUTPUTS]
        subprocess.run(["runuser", "-u", "nobody", "--", python, "-I", "-S",
                        str(share / "ebpf-cuda.pyz"), "report", str(saved), *outputs],
                       check=True, capture_output=True, timeout=120, cwd=str(share))
        _same_outputs(folder, share)
    finally:
        subprocess.run(["rm", "-rf", str(share)])


def test_version_1_files_still_load(tmp_path):
    """Version 2 only adds hello records to the frames; files of version 1 read the same."""
    path = tmp_path / "v1.ebpfcuda"
    write(path, FRAMES)
    data = bytearray(path.read_bytes())
    data[8:10] = struct.pack("<H", 1)
    path.write_bytes(bytes(data))
    assert [ev.to_json() for ev in savefile.load(str(path))] == live_events(FRAMES)


def test_files_saved_before_the_py_stack_field_read_the_same(tmp_path):
    """Records were 8 bytes shorter before --py-stacks (no PY_STACK field): such a file's
    frames are widened as they are read."""
    path = tmp_path / "new.ebpfcuda"
    write(path, [b"".join(FRAMES)])
    data = path.read_bytes()
    magic, version, rsize, offset, fbytes, nlen = savefile._HEADER.unpack_from(data)
    start = savefile._HEADER.size + nlen
    step, old_size = record.FRAME_SIZE, record.SIZE - 8
    head = record.FRAME_HEADER
    old = b"".join(frame_of(data[start + at + head:start + at + head + old_size])
                   for at in range(0, fbytes, step))
    old_path = tmp_path / "old.ebpfcuda"
    old_path.write_bytes(savefile._HEADER.pack(magic, version, old_size, offset, len(old), nlen)
                         + data[savefile._HEADER.size:start] + old + data[start + fbytes:])
    assert [ev.to_json() for ev in savefile.load(str(old_path))] == live_events(FRAMES)


def test_the_trailer_keeps_python_stacks(tmp_path):
    from ebpf_cuda.decode.events import PyFrame

    path = tmp_path / "t.ebpfcuda"
    key = 0xABCDEF01
    stacked = pack_frame("cudaFree", 5000, py_stack=key)
    writer = write(path, [stacked], close=False)
    writer.note_py_stacks({key: [["/app/train.py", 12, "step"], ["/app/train.py", 40, "<module>"]]})
    writer.close()
    events = list(savefile.load(str(path)))
    assert [ev.py_stack for ev in events] == [(PyFrame("/app/train.py", 12, "step"),
                                               PyFrame("/app/train.py", 40, "<module>"))] * 2
    assert events[1].to_json()["py_stack"][0] == {"file": "/app/train.py", "line": 12,
                                                  "function": "step"}


def test_the_trailer_keeps_user_stacks_symbolised_when_first_seen(tmp_path):
    from ebpf_cuda.targets.symbols import Frame

    path = tmp_path / "t.ebpfcuda"
    frames = {(42, 3): [Frame("cudaStreamSynchronize", 0x12, "/lib/libcudart.so.12"), None,
                        Frame("step", 0x2c, "/app/train")],
              (43, 3): [Frame(None, 0x1f40, "/app/other")]}
    asked = []

    def stacks(pid, stack_id):
        asked.append((pid, stack_id))
        return frames[(pid, stack_id)]

    writer = savefile.open_save(str(path), apis.TABLE, OFFSET)
    writer.stacks = stacks
    writer.write_frames(pack_frame("cudaStreamSynchronize", 1000, (0,), stack_id=3)
                        + pack_frame("cudaStreamSynchronize", 2000, (0,), stack_id=3)
                        + pack_frame("cudaStreamSynchronize", 3000, (0,), pid=43, stack_id=3)
                        + pack_frame("cudaLaunchKernel", 4000))  # (no stack: not asked)
    writer.close()
    assert sorted(asked) == [(42, 3), (43, 3)]  # once each
    saved = savefile.load(str(path))
    assert saved.stack_frames(42, 3) == tuple(frames[(42, 3)])
    assert saved.stack_frames(43, 3) == tuple(frames[(43, 3)])
    assert saved.stack_frames(42, 4) == ()
    assert [ev.stack_id for ev in saved if ev.phase == "exit"] == [3, 3, 3, 0]


def test_a_damaged_stack_in_the_trailer_is_a_decode_error(tmp_path):
    path = tmp_path / "t.ebpfcuda"
    writer = write(path, [FRAMES[0]], close=False)
    writer.stack_frames = {(42, 3): [["step", "0x2c", "/app/train"]]}  # (an offset as text)
    writer.close()
    with pytest.raises(DecodeError, match="a stack frame is not"):
        savefile.load(str(path))
