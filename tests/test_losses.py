"""The account of what a trace lost (losses.py): its words and its saved form."""
import json

import pytest

from ebpf_cuda.decode.losses import Losses


def test_names_lost_are_said_apart_from_events_and_saved():
    only_names = Losses(names_lost=7)
    assert only_names.total == 0  # (no event is missing: only the names of 7)
    assert only_names.sentence().startswith("7 kernel names lost: ")
    both = Losses(ring_full=3, names_lost=2)
    assert both.sentence().startswith("3 events lost: 3 with the ring buffer full")
    assert "; 2 kernel names lost" in both.sentence()
    again = Losses.from_json(both.to_json())
    assert (again.ring_full, again.names_lost, again.read().names_lost) == (3, 2, 2)
    assert Losses.from_json({"ring_full": 1}).names_lost == 0  # (a trace saved before)
    assert Losses().sentence() == ""


def test_names_lost_say_their_causes_and_are_saved_with_them():
    lost = Losses(names_lost=5, names_unread=2)
    assert lost.sentence() == (
        "5 kernel names lost: 3 let go by the probes' names map before the reader came to "
        "their calls (try --ring-size: the map grows with the ring), 2 unreadable when their "
        "calls returned, in no file mapped read-only")
    again = Losses.from_json(json.loads(json.dumps(lost.to_json())))
    assert (again.names_lost, again.names_unread, again.read().names_unread) == (5, 2, 2)
    assert Losses.from_json({"names_lost": 4}).name_causes() == [
        "4 let go by the probes' names map before the reader came to their calls (try "
        "--ring-size: the map grows with the ring)"]  # (a trace saved before: one cause)


def test_records_a_stage_dropped_before_every_output_are_said_saved_and_read():
    """(a flight recorder's dump: what its ring overwrote or its disk refused)"""
    lost = Losses(ring_full=2, dropped={"the flight recorder": (5, "5 refused by the disk")},
                  unwritten={"out.txt": (1, "EIO")})
    assert lost.total == 2 + 5 + 1
    assert lost.sentence() == ("8 events lost: 2 with the ring buffer full (try --ring-size), "
                               "5 dropped by the flight recorder (5 refused by the disk), "
                               "1 not written to out.txt (EIO)")
    assert lost.read().total == 7  # (what every output misses: the stage's drops too)
    again = Losses.from_json(json.loads(json.dumps(lost.to_json())))
    assert (again.ring_full, again.dropped) == (2, lost.dropped)
    with pytest.raises(ValueError):
        Losses.from_json({"dropped": {"x": [-1, "why"]}})


def test_a_trace_saved_before_losses_were_counted_in_calls_keeps_its_wording():
    """Before 2026-12-07 a --entries trace counted entry and call records alike (its trailer
    says "entries": true); its loss line still says records, as it did then."""
    old = Losses.from_json({"ring_full": 7, "spool_past": 0, "spool_refused": 0,
                            "interrupted": 0, "too_deep": 0, "entries": True,
                            "names_lost": 0, "dropped": {}})
    assert old.sentence().startswith("7 records (entries and calls) lost: 7 with the ring")
    new = Losses.from_json(Losses(ring_full=7, entries_lost=3).to_json())
    assert new.sentence() == ("7 events lost: 7 with the ring buffer full (try --ring-size); "
                              "3 entry records lost with the ring buffer full (try "
                              "--ring-size; their calls are counted apart)")


def test_losses_count_calls_not_the_entry_records_of_entries():
    """record.call_count, the unit of every loss (spool drops, outputs that fail, the flight
    recorder): a complete call is one, -r's enter record is one, --entries' enter record
    (flagged: its complete record follows) and a thread's hello are none."""
    from ebpf_cuda.spec import record
    from records import pack_frame

    frames = b"".join([
        pack_frame("cudaMalloc"), pack_frame("cudaFree"),
        pack_frame("cudaMalloc", phase=record.PHASE_ENTER, flags=record.FLAG_RETURN_FOLLOWS),
        pack_frame("cudaMalloc", phase=record.PHASE_ENTER),
        pack_frame(record.HELLO_FN, phase=record.PHASE_HELLO),
    ])
    assert record.call_count(frames) == 3
