"""The HLO text reader: a compiled program's optimized module (``compiled.as_text()``) or a lowered
one (``lowered.as_text(dialect="hlo")``) as computations of instructions.

Example:
    >>> module = parse_module('''HloModule m
    ... ENTRY %main (p: f32[4]) -> f32[4] {
    ...   %p = f32[4]{0} parameter(0)
    ...   ROOT %e = f32[4]{0} exponential(%p)
    ... }''')
    >>> [(i.name, i.opcode, i.operands) for i in module["main"].instructions.values()]
    [('p', 'parameter', []), ('e', 'exponential', ['p'])]
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

from aotcheck.figures.frames import instruction_source, metadata, short_source, stack_frames  # noqa: F401  (moved)

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
    "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "token": 0,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%(\S+)\s+\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%(\S+)\s*=\s*")


@dataclasses.dataclass(frozen=True)
class Array:
    dtype: str
    dims: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def bytes(self) -> float:
        return self.elements * _DTYPE_BYTES.get(self.dtype, 1 if self.dtype.startswith("f8") else 4)


def parse_arrays(type_text: str) -> list[Array]:
    """All array types in a (possibly tuple) HLO type string, in order."""
    out = []
    for dtype, dims in _ARRAY.findall(type_text):
        if dtype in _DTYPE_BYTES or dtype.startswith("f8"):
            out.append(Array(dtype, tuple(int(d) for d in dims.split(",") if d)))
    return out


@dataclasses.dataclass
class Instruction:
    name: str
    type_text: str
    opcode: str
    operands: list[str]
    args: str  # Raw text inside the parentheses: a parameter's index, a constant's value.
    attrs: str
    is_root: bool

    @property
    def int_arg(self) -> int | None:
        match = re.fullmatch(r"\s*(-?\d+)\s*", self.args)
        return int(match[1]) if match else None

    @property
    def arrays(self) -> list[Array]:
        return parse_arrays(self.type_text)

    def attr(self, key: str) -> str | None:
        match = re.search(rf"\b{re.escape(key)}=(\{{[^}}]*\}}|[^,\s]+)", self.attrs)
        return match[1] if match else None

    def called(self, key: str) -> list[str]:
        value = self.attr(key)
        if not value:
            return []
        return [v.strip().lstrip("%") for v in value.strip("{}").split(",") if v.strip()]


@dataclasses.dataclass
class Computation:
    name: str
    instructions: dict[str, Instruction]
    root: Instruction | None
    is_entry: bool


def _matching(text: str, start: int, open_char: str, close_char: str) -> int:
    """Index just past the bracket that closes the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def parse_instruction(line: str) -> Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    pos = match.end()
    if line.startswith("(", pos):
        end = _matching(line, pos, "(", ")")
    else:
        end = line.find(" ", pos)
    type_text = line[pos:end]
    rest = line[end:].lstrip()
    op = re.match(r"([\w\-\.]+)\(", rest)
    if not op:
        return None
    close = _matching(rest, op.end() - 1, "(", ")")
    args = rest[op.end():close - 1]
    operands = re.findall(r"%([\w\.\-]+)", args)
    return Instruction(match[2], type_text, op[1], operands, args, rest[close:], bool(match[1]))


_UNPREFIXED = re.compile(r"^(\s*(?:ROOT\s+)?)(?!%)([\w.\-]+\s*=)")


def lowered_instructions(text: str) -> Iterator[Instruction]:
    r"""Every instruction of a module's text in order, names printed with ``%`` (a compiled
    program's) or without (``lowered.as_text(dialect="hlo")``).

    Example:
        >>> [i.opcode for i in lowered_instructions("ENTRY m {\n  p.1 = f32[4]{0} parameter(0)\n}")]
        ['parameter']
    """
    for line in text.splitlines():
        inst = parse_instruction(_UNPREFIXED.sub(r"\1%\2", line, count=1))
        if inst is not None:
            yield inst


def parse_module(text: str) -> dict[str, Computation]:
    """Computations of an HLO module's text, by name."""
    computations: dict[str, Computation] = {}
    current: Computation | None = None
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header:
                current = Computation(header[2], {}, None, bool(header[1]))
            continue
        if line.startswith("}"):
            computations[current.name] = current
            current = None
            continue
        inst = parse_instruction(line)
        if inst:
            current.instructions[inst.name] = inst
            if inst.is_root:
                current.root = inst
    return computations
