r"""XLA's dumps of one compile, read: the options that make it write them, the files, the buffer
assignment (which allocation holds which value, entry parameters by number) and the values live at
the program's HBM peak, found by a sweep over their live ranges. What they mean (classes, names,
source lines) is :mod:`aotcheck.figures.attribution`'s.

Example:
    >>> text = "allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:\n value: <1 p0 @0> (size=64,offset=0): f32[16]{0}"
    >>> allocations, values = parse_assignment(text)
    >>> allocations[0].kind, allocations[0].parameter, values["p0"]
    ('parameter', 0, (0, 0, 'f32[16]'))
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotcheck.errors import AotcheckError
from aotcheck.figures.hlo import parse_arrays

_ON_CHIP_OR_HOST = frozenset({"smem", "host", "sflag"})

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+), (.*)$")
_VALUE = re.compile(r"^ value: <\d+ (\S+?)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (\S+)")
_SPACE = re.compile(r"^Memory Space: (\S+) \(color=(\d+)\)")
_SHAPE = re.compile(r"^(\w+\[[\d,]*\])")


class AttributionError(AotcheckError, ValueError):
    """The dump to attribute the peak from is missing or in a form this version does not read."""


@dataclasses.dataclass
class Allocation:
    size: int
    kind: str  # "parameter", "output", "temp"
    color: int
    parameter: int | None = None
    shape: str = "?"


def dump_options(directory: str) -> dict[str, Any]:
    """Compiler options that make XLA write its dumps (text) into ``directory``, constants whole (a
    Pallas kernel's mask is one: aotcheck.figures.kernels reads what it visits)."""
    # Bools: "true" is refused.
    return {"xla_dump_to": directory, "xla_dump_hlo_as_text": True, "xla_dump_large_constants": True}


def parse_assignment(text: str) -> tuple[dict[int, Allocation], dict[str, tuple[int, int, str]]]:
    """Allocations by number, and value name -> (allocation, offset in it, shape)."""
    allocations: dict[int, Allocation] = {}
    values: dict[str, tuple[int, int, str]] = {}
    current = None
    for line in text.splitlines():
        match = _ALLOCATION.match(line)
        if match:
            # libtpu 0.0.50.1 writes "size N, page P, ..." where 0.0.42.1 wrote "size N, ...".
            current, rest = int(match[1]), re.sub(r"^page \d+, ", "", match[3])
            param = re.match(r"parameter (\d+), shape \|(.*?)\| at ShapeIndex \{([\d,]*)\}", rest)
            color = re.search(r"\bcolor (\d+)", rest)
            if param:
                index = [int(i) for i in param[3].split(",") if i]
                # A tuple-shaped entry parameter (rare) holds the arguments by index.
                number, kind = (index[0] if index else int(param[1])), "parameter"
            else:
                number, kind = None, ("output" if "maybe-live-out" in rest or "output shape" in rest else "temp")
            allocations[current] = Allocation(int(match[2]), kind, int(color[1]) if color else 0, number,
                                               param[2] if param else "?")
            continue
        match = _VALUE.match(line)
        if match and current is not None:
            shape = _SHAPE.match(match[4])
            values.setdefault(match[1], (current, int(match[3]), shape[1] if shape else match[4]))
        elif not line.startswith(" "):
            current = None
    return allocations, values


_RANGE = re.compile(r"^\s+(\S+):(\d+)-(\d+)$")


def peak_live(
    text: str, allocations: Mapping[int, Allocation], values: Mapping[str, tuple[int, int, str]], off_chip: set[int]
) -> list[tuple[str, int, int, int]]:
    """The values live at the peak of the HBM they occupy: (value, logical bytes, allocation, offset).

    The peak is found here, by a sweep over every value's live range (XLA's own "Live ranges at N
    (peak)" line is not used: measured, it points at a 10 MiB moment of a program whose two 16 GiB
    temporaries live together earlier, its sums seemingly overflowing past 2 GiB values). Values
    in one buffer (a loop's input, its body's parameter, its result) count once, over the union
    of their ranges. Arguments' buffers are counted in full elsewhere; other memories are not HBM.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "BufferLiveRange:"), None)
    if start is None:
        raise AttributionError("the live-range dump has no 'BufferLiveRange:' section")
    spans: dict[tuple[int, int], list] = {}  # (allocation, offset) -> [(start, end, bytes, value)]
    for line in lines[start + 1:]:
        match = _RANGE.match(line)
        if not match:
            if line.strip():
                break
            continue
        value = match[1].removesuffix("{}")
        if value not in values:
            continue  # Tuple index tables and the like: not in the buffer assignment, a few bytes.
        number, offset, shape = values[value]
        allocation = allocations[number]
        if allocation.kind == "parameter" or allocation.color in off_chip:
            continue
        # A tuple-shaped value is its index table; its elements are values of their own.
        size = 0 if shape.startswith("(") else int(sum(a.bytes for a in parse_arrays(shape)))
        spans.setdefault((number, offset), []).append((int(match[2]), int(match[3]), size, value))
    # Values at one place whose ranges overlap are one buffer (a loop's values); at other times,
    # the place holds other buffers.
    buffers: list[tuple[int, int, int, str, int, int]] = []  # (start, end, bytes, value, allocation, offset)
    for (number, offset), found in spans.items():
        found.sort()
        current = list(found[0])
        for first, last, size, value in found[1:]:
            if first <= current[1]:
                current[1] = max(current[1], last)
                if size > current[2]:
                    current[2], current[3] = size, value
            else:
                buffers.append((*current, number, offset))
                current = [first, last, size, value]
        buffers.append((*current, number, offset))
    if not buffers:
        return []
    events: dict[int, int] = {}
    for first, last, size, *_ in buffers:
        events[first] = events.get(first, 0) + size
        events[last + 1] = events.get(last + 1, 0) - size
    total, best, when = 0, -1, 0
    for time in sorted(events):
        total += events[time]
        if total > best:
            best, when = total, time
    return [(value, size, number, offset) for first, last, size, value, number, offset in buffers
            if first <= when <= last]


def off_chip_colors(usage_report: str | None) -> set[int]:
    """Colors (memory spaces) that are not HBM, from XLA's memory-usage report."""
    if not usage_report:
        return set()
    return {int(m[2]) for line in usage_report.splitlines() if (m := _SPACE.match(line)) and m[1] in _ON_CHIP_OR_HOST}


def dump_file(directory: str | Path, suffix: str = "", *, required: bool = True) -> str | None:
    """The text of one file XLA dumped for the optimized program into ``directory``: ``suffix`` ""
    is the module itself, else ``buffer-assignment``, ``live-range``, ``memory-usage-report``.

    Raises AttributionError, naming the file, when a required one is missing or unreadable.
    """
    pattern = f"*after_optimizations{'-' + suffix if suffix else ''}.txt"
    files = sorted(Path(directory).glob(pattern))
    if not files:
        if required:
            raise AttributionError(f"XLA wrote no {pattern} into its dump directory")
        return None
    try:
        return files[-1].read_text(errors="replace")
    except OSError as e:
        raise AttributionError(f"cannot read XLA's dump {files[-1].name}: {e.strerror or e}") from None
