"""Source lines that follow the code: mapping a cached answer's lines onto the program as it is now.

The figures cache keys on the lowered program without its locations, so an edit that only moves
lines (a comment at the top of the model's file) reuses the compiled figures. The details stored
with them name source lines (``model.py:128``) as they were; served as they are, every "why" would
point one line off. So an entry also keeps, for each line its details name, where that line's
instructions stand in the lowered program (``anchors``: their positions in its instruction order,
which the unchanged program keeps), and a hit reads the lines at those positions in the fresh
lowering (``remap``). A line whose positions now disagree, or that names no instruction, cannot be
mapped: the case is compiled afresh. A model library's lines (:func:`aotcheck.figures.frames.instruction_library`)
are anchored the same way, in a second run of positions after the user's lines: a line is one
line of code whichever it names, so both are mapped by one table.

Example (line 7 became line 8; line 9 still names what it did):
    >>> before = ["m.py:7", "m.py:7", None, "m.py:9"]
    >>> found = anchors({"m.py:7", "m.py:9"}, before)
    >>> found
    {'m.py:7': [0, 1], 'm.py:9': [3]}
    >>> remap(found, ["m.py:8", "m.py:8", None, "m.py:9"])
    {'m.py:7': 'm.py:8', 'm.py:9': 'm.py:9'}
    >>> remap(found, ["m.py:8", "m.py:20", None, "m.py:9"]) is None  # One line became two: not mappable.
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from aotcheck.figures.frames import instruction_library, instruction_source, stack_frames
from aotcheck.figures.hlo import lowered_instructions

Anchors = dict[str, list[int]]
"""A source line -> the positions of the instructions it made, in the lowered program's order."""


def source_sequence(lowered_hlo: str) -> list[str | None]:
    """The source line of every instruction of a lowered program, in order, then the model library's
    line of every instruction, in the same order (``lowered.as_text(dialect="hlo", debug_info=True)``;
    None where an instruction names none).

    Example (one line each: no library's):
        >>> source_sequence('''ENTRY main.3 {
        ...   p.1 = f32[4]{0} parameter(0)
        ...   e.2 = f32[4]{0} exponential(p.1), metadata={op_name="jit(f)/exp" source_file="/m.py" source_line=9}
        ... }''')
        [None, 'm.py:9', None, None]
    """
    frames = stack_frames(lowered_hlo)
    instructions = list(lowered_instructions(lowered_hlo))
    return ([instruction_source(inst, frames) for inst in instructions]
            + [instruction_library(inst, frames) for inst in instructions])


def anchors(sources: Iterable[str], sequence: Sequence[str | None]) -> Anchors:
    """Where each of ``sources`` stands in ``sequence`` (a line that names no instruction: no entry)."""
    wanted = set(sources)
    found: Anchors = {}
    for position, source in enumerate(sequence):
        if source in wanted:
            found.setdefault(source, []).append(position)
    return {source: found[source] for source in sorted(found)}


def remap(stored: Mapping[str, Sequence[int]], sequence: Sequence[str | None], *,
          needed: Iterable[str] = ()) -> dict[str, str] | None:
    """Each stored line -> the line at its positions in ``sequence``; None when one cannot be mapped
    (its positions now disagree or fall outside the program) or a ``needed`` line has no anchors."""
    mapping: dict[str, str] = {}
    for source, positions in stored.items():
        if not positions or max(positions) >= len(sequence):
            return None
        now = {sequence[p] for p in positions}
        if len(now) != 1 or None in now:
            return None
        mapping[source] = now.pop()  # type: ignore[assignment]
    if any(source not in mapping for source in needed):
        return None
    return mapping


def anchors_problem(data: object) -> str | None:
    """Why stored anchors cannot be used (not a mapping of line -> positions), or None.

    Example:
        >>> anchors_problem({"m.py:7": [0, 1]}), anchors_problem({"m.py:7": "0"})
        (None, "anchors of 'm.py:7' are not a list of positions")
    """
    if not isinstance(data, dict):
        return f"anchors are a {type(data).__name__}, not a mapping"
    for source, positions in data.items():
        if not isinstance(source, str) or not isinstance(positions, list) \
                or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in positions):
            return f"anchors of {source!r} are not a list of positions"
    return None
