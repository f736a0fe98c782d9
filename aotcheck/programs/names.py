"""Names of configs and programs, and a serving bucket as a value: the one place ids are read back, a
program's (``step[tokens=64]``, made from its bucket) and a case's (``llm/step[tokens=64]@v5e-16x1``;
its target's text is :class:`aotcheck.targets.topology.Target`'s).

Example:
    >>> bucket = Bucket({"tokens": 64, "seqs": 8})
    >>> program_id("sample", bucket), parse_program_id("sample[tokens=64,seqs=8]") == ("sample", bucket)
    ('sample[tokens=64,seqs=8]', True)
    >>> parse_program_id("train_step"), dict(bucket), bucket == Bucket(tokens=64, seqs=8)
    (('train_step', Bucket()), {'tokens': 64, 'seqs': 8}, True)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from aotcheck import records
from aotcheck.errors import ConfigError


class Bucket(Mapping[str, int]):
    """A serving bucket: a size per axis, in the axes' declared order; immutable and hashable, so a
    case that carries one is a value. Empty for a program that is not a bucket."""

    __slots__ = ("_items",)

    def __init__(self, point: Mapping[str, int] | None = None, /, **sizes: int) -> None:
        items = tuple({**(point or {}), **sizes}.items())
        for axis, size in items:
            if not (isinstance(axis, str) and axis.isidentifier()):
                raise ConfigError(f"bucket axis {axis!r} is not a name (letters, digits and _, not starting with a "
                                  f"digit); rename it, e.g. {re.sub(r'[^0-9A-Za-z_]', '_', str(axis))!r}")
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ConfigError(f"bucket size {axis}={size!r} is not a size; give an int >= 1")
        object.__setattr__(self, "_items", items)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Bucket is immutable")

    def __getitem__(self, axis: str) -> int:
        for name, size in self._items:
            if name == axis:
                return size
        raise KeyError(axis)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and list(self.items()) == list(other.items())

    def __repr__(self) -> str:
        return f"Bucket({', '.join(f'{a}={s}' for a, s in self._items)})"


def program_id(program: str, bucket: Mapping[str, int]) -> str:
    """The program's name at a bucket, as case ids and golden files say it: ``step[tokens=64]`` (axes
    in their declared order); the program's name alone for no bucket."""
    return f"{program}[{','.join(f'{axis}={size}' for axis, size in bucket.items())}]" if bucket else program


_BUCKET = re.compile(r"^(?P<program>[^\[\]]+)\[(?P<point>[^\[\]]+)\]$")


def parse_program_id(text: str) -> tuple[str, Bucket]:
    """``(program, bucket)`` of a program id; a name that is no bucket's is a program's whole name."""
    match = _BUCKET.match(text)
    if not match:
        return text, Bucket()
    point = {}
    for part in match["point"].split(","):
        axis, _, size = part.partition("=")
        if not (size.isascii() and size.isdigit()) or not axis.isidentifier():
            return text, Bucket()
        point[axis] = int(size)
    return match["program"], Bucket(point)


_CASE_ID = re.compile(r"^(?P<config>[^/@\s]+)/(?P<program>[^/@\s]+)@(?P<target>[^/@\s]+)$")


def split_case_id(text: str) -> tuple[str, str, str]:
    """``(config, program id, target text)`` of a case's id, ``CONFIG/PROGRAM@TOPOLOGYxSLICES`` (a calibration
    record's ``*`` for a server's every program too); ValueError if it is not one.

    Example:
        >>> split_case_id("llm/step[tokens=16]@v5e-16x1"), split_case_id("llm/*@v5e-1x1")[1]
        (('llm', 'step[tokens=16]', 'v5e-16x1'), '*')
    """
    match = _CASE_ID.match(text)
    if not match:
        raise ValueError(f"Not a case id: {text!r} (expected CONFIG/PROGRAM@TOPOLOGYxSLICES).")
    return match["config"], match["program"], match["target"]


def name_problem(name: object, what: str) -> str | None:
    """Why ``name`` cannot name a config or program (it becomes part of a case id and a golden
    file's path), None if it can.

    Example:
        >>> name_problem("train_step", "Program"), name_problem("my step", "Program")
        (None, "Program name 'my step' must be non-empty, without '/', '@', '[', ']' or spaces.")
    """
    # '/' and '@' separate a case id's parts; ',' and spaces separate the names of --aot-configs; a
    # program's brackets are its bucket's (step[tokens=16]), which a config carries as a value.
    banned = "/@," if what == "Config" else "/@[]"
    if not isinstance(name, str) or not name or any(c in banned or c.isspace() for c in name):
        return f"{what} name {name!r} must be non-empty, without {', '.join(map(repr, banned))} or spaces."
    if name in (".", ".."):  # Hardening round 5, V84: refused, but for the characters it does not have.
        return (f"{what} name {name!r} would name {'the golden directory itself' if name == '.' else 'its parent'} "
                "in a golden file's path; pick another name.")
    if len(name.encode()) > MAX_NAME_BYTES:  # V83: compiled, then failed "File name too long".
        return (f"{what} name of {len(name.encode())} bytes ({name[:40]!r}...) is too long: it names a golden "
                f"{'directory' if what == 'Config' else 'file'}, and file systems take at most 255 bytes a name; "
                f"give it at most {MAX_NAME_BYTES}.")
    return None


# A config names a golden directory, a program a golden file beside its target (``@v5e-16x2.json``).
MAX_NAME_BYTES = 200


records.leaf(Bucket, dict, Bucket)  # A bucket's JSON is its sizes by axis, in their order.
