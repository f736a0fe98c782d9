"""One JSON form per record, derived from its dataclass's fields: declared once, never written by hand.

A record is a dataclass that subclasses :class:`Record`. Its JSON is an object with one key per field,
each value converted by the field's type: nested records, enums (by value), paths, tuples (as lists),
mappings, and value types registered with :func:`leaf` (a case as its id). What a field's JSON needs
beyond that is declared on the field (:func:`field`): another key, when it is left out (``omit``),
or a converter of its own. A class may add keys that are computed, written and never read
(``__json_extra__``), and upgrade an older document's form before its fields are read
(``__json_read__``). Reading ignores keys it does not know and gives a missing field its default;
a missing field without one is a KeyError naming it.

Example:
    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Buffer(Record):
    ...     bytes: int
    ...     kind: str
    ...     source: str | None = field(default=None, omit="none")
    ...     shape: tuple[int, ...] = ()
    >>> Buffer(8, "temp", shape=(2,)).to_json()
    {'bytes': 8, 'kind': 'temp', 'shape': [2]}
    >>> Buffer.from_json({"bytes": 8, "kind": "temp", "shape": [2], "later": 1})
    Buffer(bytes=8, kind='temp', source=None, shape=(2,))
    >>> Buffer.from_json({"kind": "temp"})
    Traceback (most recent call last):
    KeyError: 'bytes'
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

Omit = Literal["none", "empty"] | Callable[[Any, Any], bool]
"""When a field is left out of the JSON: ``"none"`` when it is None, ``"empty"`` when it is falsy (None,
0, "", an empty list or mapping), or a predicate of ``(record, value)``; by default it is always written."""

_LEAVES: dict[type, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {}


def leaf(cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any]) -> None:
    """Declares ``cls`` a value that is one JSON scalar: ``encode`` makes it, ``decode`` reads it
    (a :class:`~aotcheck.pipeline.case.Case` is its id). Declared by the module that defines ``cls``."""
    _LEAVES[cls] = (encode, decode)


@dataclasses.dataclass(frozen=True)
class Spec:
    """What one field's JSON needs beyond its type (:func:`field` makes it)."""

    key: str | None = None  # The JSON key, when it is not the field's name.
    omit: Omit | None = None
    skip: bool = False  # Not in the JSON at all (what a process holds: a compiled executable, a path read).
    encode: Callable[[Any], Any] | None = None
    # Converters of a value that is not None: decode's second argument holds the fields read before it.
    decode: Callable[[Any, Mapping[str, Any]], Any] | None = None

    def omits(self, record: Any, value: Any) -> bool:
        if self.omit is None:
            return False
        if self.omit == "none":
            return value is None
        if self.omit == "empty":
            return not value
        return bool(self.omit(record, value))  # type: ignore[operator]


_PLAIN = Spec()


def field(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, key: str | None = None,
          omit: Omit | None = None, skip: bool = False, encode: Callable[[Any], Any] | None = None,
          decode: Callable[[Any, Mapping[str, Any]], Any] | None = None, compare: bool = True,
          repr: bool = True) -> Any:  # noqa: A002 (dataclasses.field's own name)
    """A dataclass field with its JSON declared (see :class:`Spec`)."""
    return dataclasses.field(default=default, default_factory=default_factory, compare=compare, repr=repr,
                             metadata={"json": Spec(key, omit, skip, encode, decode)})


def same_line(record: Any, value: Any) -> bool:
    """``omit`` for a model library's line: left out where there is none or it is the user's own (``source``)."""
    return not value or value == record.source


class Record:
    """A dataclass whose JSON is derived from its fields (see the module's docstring)."""

    __json_extra__: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}
    """Keys written beside the fields, each computed from the record; never read back."""

    @classmethod
    def __json_read__(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """The document as this version reads it: an older form upgraded, a schema checked (by default, as is)."""
        return data

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], **given: Any) -> Any:
        """The record ``data`` holds; ``given`` sets fields the document does not carry (or replaces them)."""
        return from_json(cls, data, **given)


def to_json(record: Any) -> dict[str, Any]:
    """``record``'s JSON object."""
    hints = _hints(type(record))
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        spec = f.metadata.get("json", _PLAIN)
        value = getattr(record, f.name)
        if spec.skip or spec.omits(record, value):
            continue
        out[spec.key or f.name] = None if value is None else spec.encode(value) if spec.encode else \
            _encode(value, hints[f.name])
    for key, compute in getattr(type(record), "__json_extra__", {}).items():
        out[key] = _encode(compute(record), Any)
    return out


def from_json(cls: type, data: Mapping[str, Any], **given: Any) -> Any:
    """The record of class ``cls`` that ``data`` holds (KeyError, TypeError or ValueError where it holds none)."""
    read = getattr(cls, "__json_read__", None)
    data = read(data) if read is not None else data
    if not isinstance(data, Mapping):
        raise TypeError(f"a {cls.__name__} is a JSON object, not {type(data).__name__}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
            continue
        spec = f.metadata.get("json", _PLAIN)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        value = None if spec.skip else data.get(spec.key or f.name, dataclasses.MISSING)
        if value is dataclasses.MISSING or value is None and not _optional(hints[f.name]):
            if has_default or spec.skip:
                continue
            raise KeyError(spec.key or f.name)
        values[f.name] = None if value is None else spec.decode(value, values) if spec.decode else \
            _decode(hints[f.name], value)
    return cls(**{k: v for k, v in values.items() if _init(cls, k)})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # Each class's annotations read in its own module.


def _init(cls: type, name: str) -> bool:
    return next(f.init for f in dataclasses.fields(cls) if f.name == name)


def _optional(hint: Any) -> bool:
    return hint is Any or typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _encode(value: Any, hint: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and hint is float:
        return float(value)  # A float field stays a float in the file, whatever number it was given.
    if isinstance(value, (int, float)):
        return value
    if type(value) in _LEAVES:
        return _LEAVES[type(value)][0](value)
    if dataclasses.is_dataclass(value):
        return to_json(value)
    if isinstance(value, Path):
        return str(value)
    args = typing.get_args(hint)
    if isinstance(value, Mapping):
        inner = args[1] if len(args) == 2 else Any
        return {k: _encode(v, inner) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        inner = (lambda i: args[0]) if len(args) == 2 and args[1] is Ellipsis or len(args) == 1 else \
                (lambda i: args[i] if i < len(args) else Any)
        return [_encode(v, inner(i)) for i, v in enumerate(value)]
    raise TypeError(f"no JSON form for a {type(value).__name__}")


_SCALARS = (bool, int, float, str)


def _decode(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _decode(rest[0], value)
        if all(a in _SCALARS for a in rest):
            return value  # A number that is an int or a float stays what the file says (validated elsewhere).
        for a in rest:
            try:
                return _decode(a, value)
            except (KeyError, TypeError, ValueError):
                continue
        raise TypeError(f"{value!r} is none of {hint}")
    if hint in _LEAVES:
        return _LEAVES[hint][1](value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if hint in _SCALARS or hint is Path:
        return hint(value)
    if origin is tuple or hint is tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"expected a list, not {type(value).__name__}")
        if not args or len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0] if args else Any, v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value, strict=True))
    if origin in (list, Sequence) or hint is list:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"expected a list, not {type(value).__name__}")
        return [_decode(args[0] if args else Any, v) for v in value]
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise TypeError(f"expected an object, not {type(value).__name__}")
        key, inner = args if len(args) == 2 else (Any, Any)
        return {_decode(key, k): _decode(inner, v) for k, v in value.items()}
    raise TypeError(f"no JSON form for {hint!r}")
