"""value_class.ValueClass: what the start-path classes kept from `dataclasses` (their
constructors, equality, repr, frozen configs), checked on the real classes and on small ones."""
from typing import Optional

import pytest

from ebpf_cuda.decode.events import Event
from ebpf_cuda.kernel_abi import LinkInfo
from ebpf_cuda.output.plan import Request
from ebpf_cuda.spec.config import TraceConfig
from ebpf_cuda.value_class import ValueClass


class Point(ValueClass):
    x: int
    y: int = 0
    label: Optional[str] = None


class Frozen(ValueClass, frozen=True):
    a: int
    b: str = "b"


def test_fields_by_position_keyword_and_default():
    assert Point._fields == ("x", "y", "label")
    p = Point(1, label="here")
    assert (p.x, p.y, p.label) == (1, 0, "here")
    assert repr(p) == "Point(x=1, y=0, label='here')"
    assert Point(1, 0, "here") == p and Point(1, 1, "here") != p


def test_bad_arguments_are_type_errors():
    with pytest.raises(TypeError, match="missing required argument 'x'"):
        Point(y=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(1, z=2)
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)
    with pytest.raises(TypeError, match="at most 3 values, not 4"):
        Point(1, 2, "a", "b")


def test_equality_needs_the_same_class():
    class Other(ValueClass):
        x: int
        y: int = 0
        label: Optional[str] = None

    assert Point(1) != Other(1)
    assert Point(1) != (1, 0, None)


def test_a_subclass_keeps_its_bases_fields_first():
    class Labelled(Point):
        colour: str = "red"

    assert Labelled._fields == ("x", "y", "label", "colour")
    assert Labelled(1, colour="blue") == Labelled(1, 0, None, "blue")
    assert repr(Labelled(2)) == "Labelled(x=2, y=0, label=None, colour='red')"


def test_a_mutable_class_is_unhashable_and_assignable():
    p = Point(1)
    p.y = 5
    assert p == Point(1, 5)
    with pytest.raises(TypeError):
        hash(p)


def test_a_frozen_class_refuses_assignments_and_hashes_by_value():
    f = Frozen(1)
    with pytest.raises(AttributeError, match="Frozen is frozen"):
        f.a = 2
    assert hash(f) == hash(Frozen(1)) and {f: 1}[Frozen(1, "b")] == 1


def test_trace_config_keeps_tuples_and_is_frozen():
    config = TraceConfig(command=["./app", "x"], functions=["cudaMalloc"], library=["a.so"])
    assert (config.command, config.functions, config.library) == (
        ("./app", "x"), ("cudaMalloc",), ("a.so",))
    assert config == TraceConfig(command=("./app", "x"), functions=("cudaMalloc",),
                                 library=("a.so",))
    assert hash(config) == hash(TraceConfig(command=["./app", "x"], functions=["cudaMalloc"],
                                            library=["a.so"]))
    assert config.functions is not None and TraceConfig().functions is None
    with pytest.raises(AttributeError):
        config.pid = 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        TraceConfig(bogus=1)


def test_events_and_link_infos_get_their_own_containers():
    a = Event(1.0, 1, 2, 3, "c", "cudaMalloc", "EXIT", {})
    b = Event(1.0, 1, 2, 3, "c", "cudaMalloc", "EXIT", {})
    a.outs["devPtr"] = 16
    assert b.outs == {} and a != b
    assert a.faults == () and a.py_stack is None and a.wall_ns is None
    first, second = LinkInfo(1, 2, 3), LinkInfo(1, 2, 3)
    first.offsets.append(64)
    assert second.offsets == [] and first != second


def test_request_defaults():
    request = Request(summary=True)
    assert request.output is None and request.timestamps and request.summary_only()
    assert Request("x.txt").output == "x.txt"
