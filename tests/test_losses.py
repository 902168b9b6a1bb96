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
