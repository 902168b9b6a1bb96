"""The account of what a trace lost (losses.py): its words and its saved form."""
from ebpf_cuda.losses import Losses


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
