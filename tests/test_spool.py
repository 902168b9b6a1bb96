"""The spool between the ring reader and the lines thread (ebpf_cuda/spool.py): order, the
file emptied when the reader of it catches up, drops counted past the limit or on a write
error, abandon."""
import errno
import os
import resource
import signal
import threading

import pytest

from ebpf_cuda.spec import record
from ebpf_cuda.output.spool import READ_BYTES, Spool

FRAME = record.FRAME_SIZE


def frames(first: int, count: int) -> bytes:
    """`count` frames, each filled with its own number (mod 256) so order can be checked."""
    return b"".join(bytes([k % 256]) * FRAME for k in range(first, first + count))


def numbers(data: bytes) -> list:
    return [data[k * FRAME] for k in range(len(data) // FRAME)]


@pytest.mark.parametrize("memory", [0, 30 * FRAME])  # (30 frames held: memory, then file)
def test_frames_come_out_in_order_across_threads(tmp_path, memory):
    spool = Spool(str(tmp_path), memory=memory)
    taken = []
    consumer = threading.Thread(target=lambda: taken.extend(
        n for chunk in spool for n in numbers(chunk)))
    consumer.start()
    for start in range(0, 6000, 11):
        spool.put(frames(start, 11))
    spool.close()
    consumer.join(10)
    assert not consumer.is_alive()
    assert taken == [k % 256 for k in range(0, 6006)]
    assert spool.dropped == 0 and spool.abandoned == 0 and spool.backlog == 0
    spool.discard()


def test_take_hands_at_most_read_bytes(tmp_path):
    spool = Spool(str(tmp_path))
    count = READ_BYTES // FRAME * 2 + 3
    spool.put(frames(0, count))
    spool.close()
    sizes = [len(chunk) for chunk in spool]
    assert sizes == [READ_BYTES, READ_BYTES, 3 * FRAME]


def test_file_is_emptied_when_the_taker_catches_up(tmp_path):
    spool = Spool(str(tmp_path))
    spool.put(frames(0, 10))
    spool.put(frames(10, 5))
    assert os.fstat(spool._fd).st_size == 15 * FRAME
    assert spool.backlog == 15
    assert numbers(spool.take()) == list(range(15))
    assert os.fstat(spool._fd).st_size == 0 and spool.backlog == 0
    spool.put(frames(15, 2))  # written from the start of the file again
    assert os.fstat(spool._fd).st_size == 2 * FRAME
    assert numbers(spool.take()) == [15, 16]


def test_put_past_the_limit_drops_and_counts(tmp_path):
    spool = Spool(str(tmp_path), limit=10 * FRAME)
    spool.put(frames(0, 6))
    spool.put(frames(6, 6))  # 12 > 10: dropped whole
    spool.put(frames(12, 4))  # 10: fits
    assert spool.dropped == 6 and spool.backlog == 10
    spool.take()
    spool.put(frames(16, 10))  # the backlog was taken: room again
    spool.close()
    assert numbers(b"".join(spool)) == list(range(16, 26))
    assert spool.dropped == 6


def test_abandon_ends_iteration_and_counts_the_backlog(tmp_path):
    spool = Spool(str(tmp_path))
    spool.put(frames(0, 8))
    spool.abandon()
    assert spool.closed and spool.abandoned == 8
    assert spool.take() is None
    spool.put(frames(8, 2))  # too late: dropped, counted
    assert spool.dropped == 2


def test_a_write_error_drops_and_counts_with_its_reason(tmp_path):
    """The file size limit (EFBIG) stands in for a full disk (ENOSPC): both are write
    errors that must cost the batch, counted, and not the run."""
    spool = Spool(str(tmp_path))
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 * FRAME, old_limit[1]))
        spool.put(frames(0, 3))
        spool.put(frames(3, 3))  # would end past 4 frames
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert spool.dropped == 3 and spool.error == os.strerror(27)  # EFBIG
    assert numbers(spool.take()) == [0, 1, 2]


def test_close_wakes_a_waiting_taker(tmp_path):
    spool = Spool(str(tmp_path))
    result = []
    taker = threading.Thread(target=lambda: result.append(spool.take()))
    taker.start()
    taker.join(0.2)
    assert taker.is_alive(), "take() should wait for frames"
    spool.close()
    taker.join(5)
    assert result == [None]


@pytest.mark.parametrize("limit", [0, FRAME - 1])
def test_no_frame_fits_a_limit_below_one_frame(tmp_path, limit):
    spool = Spool(str(tmp_path), limit=limit)
    spool.put(frames(0, 1))
    assert spool.dropped == 1 and spool.backlog == 0


def _refuse_o_tmpfile(monkeypatch):
    """os.open as on a file system without O_TMPFILE (9p, overlayfs before 6.6, ...)."""
    real = os.open

    def fake_open(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)


def test_spool_file_is_unnamed_from_the_start(tmp_path):
    spool = Spool(str(tmp_path))
    assert "O_TMPFILE" in spool.where and str(tmp_path) in spool.where
    assert os.listdir(tmp_path) == []
    spool.discard()


def test_without_o_tmpfile_a_named_file_is_unlinked_at_once(tmp_path, monkeypatch):
    _refuse_o_tmpfile(monkeypatch)
    spool = Spool(str(tmp_path))
    try:
        assert os.listdir(tmp_path) == []  # no name left behind
        target = os.readlink("/proc/self/fd/%d" % spool._fd)
        assert target.startswith(str(tmp_path / "ebpf-cuda-spool-")) and "(deleted)" in target
        assert "unlinked at once" in spool.where and "ebpf-cuda-spool-" in spool.where
        assert not os.get_inheritable(spool._fd)
        consumer_got = []
        spool.put(frames(0, 5))
        spool.close()
        consumer_got.extend(n for chunk in spool for n in numbers(chunk))
        assert consumer_got == [0, 1, 2, 3, 4] and spool.dropped == 0
    finally:
        spool.discard()


def test_other_errors_are_not_hidden_by_the_fallback(tmp_path):
    with pytest.raises(OSError) as info:
        Spool(str(tmp_path / "missing"))
    assert info.value.errno == errno.ENOENT


def test_a_formatter_that_never_quite_catches_up_keeps_the_file_within_the_limit(tmp_path):
    """The backlog never empties (the file is never truncated), yet the file stays a ring
    of `limit` bytes, and every frame comes out whole and in order across its wrap."""
    limit = READ_BYTES + 9 * FRAME  # (the batch put and the 7 behind it fit; not a divisor)
    spool = Spool(str(tmp_path), limit=limit)
    spool.put(frames(0, 7))  # (always 7 frames ahead of the formatter)
    taken = []
    for start in range(7, 7 + 40 * 2048, 2048):
        spool.put(frames(start, 2048))
        taken += numbers(spool.take())
    assert os.fstat(spool._fd).st_size <= limit
    assert spool.dropped == 0 and spool.backlog == 7
    spool.close()
    taken += numbers(b"".join(spool))
    assert taken == [k % 256 for k in range(7 + 40 * 2048)]


def test_a_backlog_within_memory_is_handed_over_without_the_file(tmp_path):
    """The first `memory` bytes of backlog are the batches put, as they are; past them the
    file takes the rest, and while it holds some, the batches after them go there too: they
    come out in order, the backlog and the limit counting both."""
    spool = Spool(str(tmp_path), limit=40 * FRAME, memory=10 * FRAME)
    first = frames(0, 6)
    spool.put(first)
    spool.put(frames(6, 4))  # 10 in memory
    assert os.fstat(spool._fd).st_size == 0 and spool.backlog == 10
    spool.put(frames(10, 3))  # past the memory: the file
    spool.put(frames(13, 1))  # the file holds some: after them
    assert os.fstat(spool._fd).st_size == 4 * FRAME and spool.backlog == 14
    dropped = frames(14, 27)
    spool.put(dropped)  # 41 > 40: dropped
    assert spool.dropped == record.call_count(dropped) > 0 and spool.backlog == 14
    assert spool.take() is first  # (no copy)
    spool.put(frames(14, 2))  # memory has room, but the file holds some: the file
    assert [numbers(spool.take()) for _ in range(2)] == [[6, 7, 8, 9], list(range(10, 16))]
    assert os.fstat(spool._fd).st_size == 0 and spool.backlog == 0
    spool.put(frames(40, 2))  # the file is empty: memory again
    assert os.fstat(spool._fd).st_size == 0
    spool.put(frames(42, 1))
    spool.abandon()
    assert spool.abandoned == 3 and spool.take() is None
