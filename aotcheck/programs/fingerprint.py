"""What a build of a config looks like, leaf by leaf: two builds of one config (in one process or two)
agree, and where they do not, the first leaf that differs says why.

A registry's entry fingerprints each build (:meth:`~aotcheck.programs.registry.Entry.fingerprint`),
a second build is compared with the first (:meth:`~aotcheck.programs.registry.Entry.unstable`), and
a compile worker compares its build with the session's (:mod:`aotcheck.gate.worker`).

Example:
    >>> fingerprint([1, {"a": (2.0, "x")}]).leaves
    {'[0]': '1', "[1]['a'][0]": '2.0', "[1]['a'][1]": "'x'"}
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import logging
import re
import types
from collections.abc import Mapping
from typing import Any, NamedTuple

_ADDRESS = re.compile(r"\s*at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")
_MAX_LEAVES, _MAX_DEPTH, _MAX_ARRAY_BYTES = 20_000, 12, 16 << 20


class Fingerprint(NamedTuple):
    """What a build of a config looks like, leaf by leaf (``path -> value``, in the order a walk of it
    meets them: fields, closure cells, defaults, code), and one digest of it all. Equal builds (the
    same builder called twice, in one process or two) give equal fingerprints."""

    digest: str
    leaves: dict[str, str]

    def difference(self, other: "Fingerprint") -> str | None:
        """The first leaf where ``other`` differs from this one, in words; None when they are alike.

        Example:
            >>> def build(width):
            ...     return {"make_args": functools.partial(max, width)}
            >>> fingerprint(build(128)).difference(fingerprint(build(256)))
            "['make_args'].args[0]: 128 vs 256"
            >>> fingerprint(build(128)).difference(fingerprint(build(128))) is None
            True
        """
        if self.digest == other.digest:
            return None
        for path in dict.fromkeys([*self.leaves, *other.leaves]):
            mine, theirs = self.leaves.get(path, "(absent)"), other.leaves.get(path, "(absent)")
            if mine != theirs:
                return f"{path or '(the config)'}: {mine} vs {theirs}"
        return "(the walk was cut short the same way, but not at the same things)"


def fingerprint(obj: Any) -> Fingerprint:
    """A :class:`Fingerprint` of a built config (or anything): dataclass fields, containers, functions
    by their code, defaults and closure cells, arrays by dtype, shape and bytes, other objects by their
    type and attributes; memory addresses left out, so two processes' equal builds agree."""
    walk = _Walk()
    walk(obj, "", 0)
    text = "\n".join(f"{path}={value}" for path, value in walk.leaves.items())
    return Fingerprint(hashlib.sha256(text.encode()).hexdigest(), walk.leaves)


def _short(text: str) -> str:
    text = _ADDRESS.sub("", text)
    return text if len(text) <= 120 else f"{text[:60]}...(sha {hashlib.sha256(text.encode()).hexdigest()[:12]})"


def _code_digest(code: types.CodeType) -> str:
    parts: list[bytes] = [code.co_code, repr(code.co_names).encode()]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            parts.append(_code_digest(const).encode())
        elif isinstance(const, frozenset):  # `x in {"a", "b"}`: its order is the process's string hashing.
            parts.append(repr(sorted(map(repr, const))).encode())
        else:
            parts.append(_short(repr(const)).encode())
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _module(thing: Any) -> str:
    """The module that defines ``thing``, named alike in the session and a worker: a script runs as
    ``__main__`` in one and is imported as ``__aotcheck_main__`` in the other (programs.loader)."""
    module = getattr(thing, "__module__", None) or ""
    return "__main__" if module == "__aotcheck_main__" else module


def _atom(value: Any) -> str | None:
    """A value that is its own leaf, in words (a number, a string, a class, a module, ...); None otherwise."""
    if value is None or isinstance(value, (bool, int, float, complex)):
        return repr(value)
    if isinstance(value, (str, bytes)):
        return _short(repr(value))
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, type):
        return f"<class {_module(value)}.{value.__qualname__}>"
    if isinstance(value, types.ModuleType):
        return f"<module {value.__name__}>"
    if isinstance(value, re.Pattern):
        return f"re.compile({value.pattern!r}, {value.flags})"
    if isinstance(value, logging.Logger):
        return f"<logger {value.name}>"
    return None


class _Walk:
    """One walk over an object graph, recording its leaves; shared objects and cycles are named where
    they were first met."""

    def __init__(self) -> None:
        self.leaves: dict[str, str] = {}
        self.seen: dict[int, str] = {}
        self.keep: list[Any] = []  # What was walked stays alive, so an id is not reused within the walk.

    def leaf(self, path: str, text: str) -> None:
        self.leaves[path] = text

    def __call__(self, value: Any, path: str, depth: int) -> None:
        if len(self.leaves) >= _MAX_LEAVES:
            return self.leaf(path, "(walk cut short)")
        atom = _atom(value)
        if atom is not None:
            return self.leaf(path, atom)
        if id(value) in self.seen:  # Shared, or a cycle: where it was first met.
            return self.leaf(path, f"(as {self.seen[id(value)] or 'the config'})")
        self.seen[id(value)] = path
        self.keep.append(value)
        name = f"{_module(type(value))}.{type(value).__qualname__}"
        if depth > _MAX_DEPTH:
            return self.leaf(path, f"<{name}>")
        try:
            self._object(value, path, depth + 1, name)
        except Exception as e:  # An attribute that raises when read: its type says what it is.
            self.leaf(path, f"<{name}: unreadable ({type(e).__name__})>")
        return None

    def _object(self, value: Any, path: str, down: int, name: str) -> None:
        if isinstance(value, (types.CodeType, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                              types.BuiltinMethodType, functools.partial)):
            return self._callable(value, path, down)
        if hasattr(value, "shape") and hasattr(value, "dtype") and not callable(value):
            if hasattr(value, "__array__") and not hasattr(value, "sharding") or hasattr(value, "addressable_shards"):
                return self.leaf(path, _array_text(value))
            return self.leaf(path, _short(repr(value)))  # An abstract array (ShapeDtypeStruct): its repr says it all.
        if isinstance(value, (Mapping, list, tuple, set, frozenset)):
            return self._container(value, path, down, name)
        return self._attributes(value, path, down, name)

    def _callable(self, value: Any, path: str, down: int) -> None:
        """A function by its code, defaults and closure cells; a method, a builtin, a partial."""
        if isinstance(value, types.CodeType):
            return self.leaf(path, f"code {_code_digest(value)}")
        if isinstance(value, types.FunctionType):
            self.leaf(path, f"function {_module(value)}.{value.__qualname__} code {_code_digest(value.__code__)}")
            if value.__defaults__:
                self(value.__defaults__, f"{path}.__defaults__", down)
            if value.__kwdefaults__:
                self(value.__kwdefaults__, f"{path}.__kwdefaults__", down)
            for var, cell in zip(value.__code__.co_freevars, value.__closure__ or ()):
                try:
                    contents = cell.cell_contents
                except ValueError:
                    self.leaf(f"{path}.<{var}>", "(empty)")
                    continue
                self(contents, f"{path}.<{var}>", down)
            return None
        if isinstance(value, types.MethodType):
            self(value.__func__, f"{path}.__func__", down)
            return self(value.__self__, f"{path}.__self__", down)
        if isinstance(value, functools.partial):
            self.leaf(path, "partial")
            self(value.func, f"{path}.func", down)
            self(value.args, f"{path}.args", down)
            return self(value.keywords, f"{path}.keywords", down)
        return self.leaf(path, f"builtin {getattr(value, '__module__', '')}.{value.__qualname__}")

    def _container(self, value: Any, path: str, down: int, name: str) -> None:
        """A mapping or sequence item by item (its type where it is not a plain one, or empty); a set sorted."""
        if isinstance(value, (set, frozenset)):
            return self.leaf(path, "{" + ", ".join(sorted(_short(repr(v)) for v in value)) + "}")
        if type(value) not in (dict, list, tuple) or not value:
            self.leaf(path, f"<{name}>")
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, item in items:
            self(item, f"{path}[{_short(repr(key)) if isinstance(value, Mapping) else key}]", down)
        return None

    def _attributes(self, value: Any, path: str, down: int, name: str) -> None:
        """Any other object: a dataclass's fields, what a jitted or decorated function wraps, its
        ``__dict__`` or slots, else its repr (a C type's, addresses left out)."""
        if dataclasses.is_dataclass(value):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        elif getattr(value, "__wrapped__", None) is not None and callable(value):
            fields = {"__wrapped__": value.__wrapped__}
        elif isinstance(getattr(value, "__dict__", None), dict):
            fields = dict(value.__dict__)
        else:
            slots = [s for k in type(value).__mro__
                     for s in ((lambda d: (d,) if isinstance(d, str) else d)(getattr(k, "__slots__", ())))
                     if isinstance(s, str) and s not in ("__weakref__", "__dict__")]
            if not slots:
                return self.leaf(path, _short(repr(value)))
            fields = {slot: getattr(value, slot) for slot in slots if hasattr(value, slot)}
        self.leaf(path, f"<{name}>")
        for key, item in fields.items():
            self(item, f"{path}.{key}", down)
        return None


def _array_text(value: Any) -> str:
    """An array by dtype, shape and (up to 16 MiB) its bytes."""
    head = f"array {value.dtype}{tuple(value.shape)}"
    try:
        import numpy as np  # noqa: PLC0415

        size = int(np.prod(value.shape)) * np.dtype(value.dtype).itemsize
        if size > _MAX_ARRAY_BYTES:  # Never copied to the host only to be skipped.
            return head
        data = np.asarray(value)
        if data.nbytes <= _MAX_ARRAY_BYTES:
            return f"{head} sha {hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()[:16]}"
    except Exception:  # noqa: BLE001  (an array that cannot be read here: its shape still tells)
        pass
    return head
