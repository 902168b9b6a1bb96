"""Classes of named values for the modules a trace's start imports, without `dataclasses`.

`dataclasses` costs a start ~7 ms to import (it brings `inspect`, `ast`, `dis`, `tokenize`)
and ~0.6 ms a class to decorate (each class's methods are generated and compiled). A
`ValueClass` gets its equality and repr from the names its class body annotates, in order;
its `__init__` takes them by position or keyword, the class attributes being the defaults:

    class Request(ValueClass):
        output: Optional[str] = None
        as_json: bool = False

`frozen=True` in the class statement refuses assignments and makes instances hashable. A
class whose instances are made per event writes its own `__init__`. Modules off a start's
path (the analyses, the GPU's records) keep `dataclasses`.
"""
from typing import Any, Dict, Tuple

_MISSING = object()


class ValueClass:
    _fields = ()  # type: Tuple[str, ...]  # (not annotated: it is no field)

    def __init_subclass__(cls, frozen: bool = False, **keywords: Any) -> None:
        super().__init_subclass__(**keywords)  # type: ignore[call-arg]
        own = cls.__dict__.get("__annotations__")
        if own is None:  # (3.14 evaluates a class's annotations when they are asked for;
            own = getattr(cls, "__annotations__", {})  # before 3.10 this may be a base's)
        inherited = cls._fields  # (a base's fields first, as a dataclass's)
        cls._fields = inherited + tuple(name for name in own if name not in inherited)
        if frozen:
            cls.__setattr__ = ValueClass._refuse  # type: ignore[assignment]
            cls.__hash__ = ValueClass._hash  # type: ignore[assignment]

    def __init__(self, *values: Any, **keywords: Any) -> None:
        name = type(self).__name__
        if len(values) > len(self._fields):
            raise TypeError("%s() takes at most %d values, not %d"
                            % (name, len(self._fields), len(values)))
        given: Dict[str, Any] = dict(zip(self._fields, values))
        for key, value in keywords.items():
            if key not in self._fields:
                raise TypeError("%s() got an unexpected keyword argument %r" % (name, key))
            if key in given:
                raise TypeError("%s() got multiple values for argument %r" % (name, key))
            given[key] = value
        for field in self._fields:
            value = given.get(field, getattr(type(self), field, _MISSING))
            if value is _MISSING:
                raise TypeError("%s() missing required argument %r" % (name, field))
            object.__setattr__(self, field, value)

    def _refuse(self, key: str, value: Any) -> None:
        raise AttributeError("cannot assign to field %r: %s is frozen"
                             % (key, type(self).__name__))

    def _values(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, field) for field in self._fields)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # (mutable: unhashable, as a dataclass)

    def _hash(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % (field, getattr(self, field)) for field in self._fields))
