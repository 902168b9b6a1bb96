"""The decoder (events.py): record bytes → events, and nothing else. It keeps no state
between batches: names, graphs and NCCL communicators are added by whoever decodes for the
outputs (stream.py, savefile.py), so decoding the same bytes twice gives the same events."""
import functools

import pytest

from ebpf_cuda.spec import apis, record
from ebpf_cuda.errors import DecodeError
from ebpf_cuda.decode.events import ENTER, EXIT, Decoder
from ebpf_cuda.decode.nccl import Communicators
from records import pack_frame

OFFSET = 1_700_000_000 * 10 ** 9
COMM = 0x55AA00


# (a thread other than the process's main one)
frame = functools.partial(pack_frame, tid=43)


def decoder() -> Decoder:
    return Decoder(apis.TABLE, OFFSET)


def test_a_complete_call_is_an_entry_and_an_exit_sharing_their_arguments():
    enter, done = decoder().decode_batch(frame("cudaMalloc", 1000, (0x10, 4000),
                                               outs=(0x7F0000000000,)))
    assert (enter.api, enter.phase, enter.ts_ns, enter.pid, enter.tid, enter.comm) == (
        "cudaMalloc", ENTER, 1000, 42, 43, "app")
    assert enter.args == {"size": 4000}  # (devPtr, where the result goes, is not shown)
    assert enter.args is done.args  # (one record: how the NCCL annotation pairs them)
    assert (done.phase, done.ts_ns, done.duration_ns, done.ret, done.ret_name) == (
        EXIT, 1700, 700, 0, "cudaSuccess")
    assert done.outs == {"ptr": 0x7F0000000000}
    assert done.ts == pytest.approx((1700 + OFFSET) / 1e9)


def test_failed_calls_have_no_out_parameters_and_name_their_error():
    _, done = decoder().decode_batch(frame("cudaMalloc", 1000, (0x10, 4000), ret=2,
                                           outs=(0x7F0000000000,)))
    assert (done.ret, done.ret_name, done.outs) == (2, "cudaErrorMemoryAllocation", {})


def test_entry_records_and_exits_whose_entry_was_sent_are_one_event_each():
    d = decoder()
    only_entry = d.decode_batch(frame("cudaFree", 1000, (0x10,), phase=record.PHASE_ENTER))
    assert [(e.api, e.phase) for e in only_entry] == [("cudaFree", ENTER)]
    exit_only = d.decode_batch(frame("cudaFree", 1000, (0x10,),
                                     flags=record.FLAG_ENTRY_SENT))
    assert [(e.api, e.phase, e.ret) for e in exit_only] == [("cudaFree", EXIT, 0)]


def test_hello_records_make_no_event():
    assert decoder().decode_batch(frame(record.HELLO_FN, 1000, phase=record.PHASE_HELLO)) == []


def test_damaged_records_are_decode_errors():
    with pytest.raises(DecodeError, match="unknown function id"):
        decoder().decode_batch(frame(len(apis.TABLE) + 5, 1000))
    with pytest.raises(DecodeError, match="unknown phase"):
        decoder().decode_batch(frame("cudaFree", 1000, phase=9))
    with pytest.raises(DecodeError, match="expected %d" % record.SIZE):
        decoder().decode_record(b"\0" * 10)


def _nccl_frames() -> bytes:
    """Two collectives on a communicator made before the trace began."""
    reduce_ = frame("ncclAllReduce", 2000, (0xA0, 0xB0, 256, 7, 0, COMM, 0x5000))
    return reduce_ + reduce_


def test_the_decoder_keeps_no_state_between_batches():
    """NCCL sequence numbers are not the decoder's: the same bytes decode the same way
    every time, and the numbers come from the Communicators the reader keeps."""
    d = decoder()
    first, second = d.decode_batch(_nccl_frames()), d.decode_batch(_nccl_frames())
    assert [e.to_json() for e in first] == [e.to_json() for e in second]
    assert all("seq" not in e.args for e in first)
    comms = Communicators()
    comms.annotate_batch(first)
    comms.annotate_batch(second)
    seqs = [e.args["seq"] for e in first + second if e.api == "ncclAllReduce"]
    assert seqs == [1, 1, 2, 2, 3, 3, 4, 4]  # (entry and exit of one call share a number)


def test_a_batch_tells_an_entry_record_from_the_entry_of_a_complete_call():
    """An entry record followed by an exit record (--entries) is one call, numbered once;
    an entry record followed by another call's complete record is two calls."""
    d = decoder()
    args = (0xA0, 0xB0, 256, 7, 0, COMM, 0x5000)
    split = (frame("ncclAllReduce", 2000, args, phase=record.PHASE_ENTER)
             + frame("ncclAllReduce", 2000, args, flags=record.FLAG_ENTRY_SENT)
             + frame("ncclAllReduce", 3000, args, phase=record.PHASE_ENTER)
             + frame("ncclAllReduce", 4000, args))
    events = d.decode_batch(split)
    Communicators().annotate_batch(events)
    assert [(e.phase, e.args["seq"]) for e in events] == [
        (ENTER, 1), (EXIT, 1), (ENTER, 2), (ENTER, 3), (EXIT, 3)]


def test_the_wall_clock_offset_comes_from_the_tightest_bracket(monkeypatch):
    """A pair of clock reads preempted in between is off by the preemption: the offset is
    taken from the bracket whose two monotonic reads are closest."""
    from ebpf_cuda.decode import events
    # (monotonic before, wall, monotonic after) of each sample: the second was preempted
    # 10 ms before its wall read, the third is the tightest.
    samples = [(1_000, 5_000_100, 1_200), (2_000, 5_011_000, 12_100), (20_000, 5_019_050, 20_100)]
    mono = iter(x for before, _, after in samples for x in (before, after))
    wall = iter(w for _, w, _ in samples)
    monkeypatch.setattr(events.time, "monotonic_ns", lambda: next(mono))
    monkeypatch.setattr(events.time, "time_ns", lambda: next(wall))
    assert events.wall_minus_monotonic_ns(samples=3) == 5_019_050 - 20_050
