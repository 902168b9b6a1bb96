"""gpu/feed.GpuFeed: the GPU's records put among the calls a text or JSON writer writes, in
time order, each before the first call after it; a record waits while an older one may still
come (an event whose launches are not filled yet, a sampling round under way)."""
import struct
from types import SimpleNamespace as R

from ebpf_cuda.gpu.feed import GpuFeed
from ebpf_cuda.spec import record


def frames(*times):
    """Ring frames whose calls ended at `times` (ns); a pair (enter, 0): an enter record."""
    out = b""
    for t in times:
        enter, end = t if isinstance(t, tuple) else (t - 1, t)
        body = bytearray(record.SIZE)
        struct.pack_into("=QQ", body, record.TS_ENTER, enter, end)
        out += bytes(record.FRAME_HEADER) + bytes(body)
    return out


def ends(piece):
    return [max(s, e) for s, e in zip(record.frame_column(piece, record.TS_ENTER, "Q"),
                                      record.frame_column(piece, record.TS_EXIT, "Q"))]


def test_records_go_before_the_first_call_after_them_and_the_rest_waits():
    samples = [R(ts_ns=150, n="s150"), R(ts_ns=150, n="t150"), R(ts_ns=420, n="s420")]
    feed = GpuFeed(samples, [])
    pieces = feed.split_frames(frames(100, 200, 300, (350, 0), 400))
    assert [(ends(piece), [r.n for r in due]) for piece, due in pieces] == [
        ([100], ["s150", "t150"]), ([200, 300, 350, 400], [])]
    samples.append(R(ts_ns=500, n="s500"))  # (the sampler's list grows)
    pieces = feed.split_frames(frames(450, 600))
    assert [(ends(piece), [r.n for r in due]) for piece, due in pieces] == [
        ([], ["s420"]), ([450], ["s500"]), ([600], [])]
    assert feed.rest() == [] and feed.split_frames(b"") == [(b"", [])]


def test_decoded_events_are_cut_the_same_way_by_their_times():
    feed = GpuFeed([R(ts_ns=15), R(ts_ns=35)], [R(ts_ns=25, n="xid")])
    events = [R(ts_ns=t) for t in (10, 20, 30, 40)]
    pieces = feed.split_events(events)
    assert [([e.ts_ns for e in piece], [r.ts_ns for r in due]) for piece, due in pieces] == [
        ([10], [15]), ([20], [25]), ([30], [35]), ([40], [])]


def test_an_event_not_ready_holds_the_records_after_it():
    events = [R(ts_ns=150, n="xid")]
    ready = [0]
    feed = GpuFeed([R(ts_ns=120, n="a"), R(ts_ns=180, n="b")], events, lambda: ready[0])
    pieces = feed.split_frames(frames(100, 200))
    assert [(ends(p), [r.n for r in due]) for p, due in pieces] == [([100], ["a"]), ([200], [])]
    ready[0] = 1  # (its launches filled: it comes, and what it held)
    pieces = feed.split_frames(frames(300))
    assert [(ends(p), [r.n for r in due]) for p, due in pieces] == [([], ["xid", "b"]),
                                                                    ([300], [])]


def test_a_round_under_way_holds_the_records_from_its_start_and_rest_gives_all():
    since = [140]
    samples = [R(ts_ns=120, n="a")]
    events = [R(ts_ns=160, n="xid")]
    feed = GpuFeed(samples, events, round_since=lambda: since[0])
    pieces = feed.split_frames(frames(100, 200))
    assert [(ends(p), [r.n for r in due]) for p, due in pieces] == [([100], ["a"]), ([200], [])]
    samples.append(R(ts_ns=145, n="round"))  # (the round ends: its sample is older than the Xid)
    since[0] = None
    assert [r.n for r in feed.rest()] == ["round", "xid"]


def test_a_writer_alone_takes_the_samples_out_of_the_sampler_s_list():
    """The only output's feed: the samples it took leave the list (a long JSON trace's
    samples are not kept to its end); what the sampler appends later is taken next."""
    samples = [R(ts_ns=150, n="a"), R(ts_ns=250, n="b")]
    feed = GpuFeed(samples, [], drop=True)
    pieces = feed.split_frames(frames(100, 200))
    assert [(ends(p), [r.n for r in due]) for p, due in pieces] == [([100], ["a"]), ([200], [])]
    assert samples == []  # (taken: "b" waits in the feed for a call after it)
    samples.append(R(ts_ns=350, n="c"))
    assert [r.n for r in feed.rest()] == ["b", "c"] and samples == []
