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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from aotcheck.errors import AotcheckError

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
    "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "token": 0,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*(?:\(.*\)\s*->\s*.*)?\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%(\S+)\s*=\s*")
# A computation's closing brace may carry attributes: 7x's `}, execution_thread="sparsecore"`.
_CLOSE_WITH_ATTRIBUTES = re.compile(r'^\}\s*,\s*[\w.]+=')
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations|true_computation|false_computation)="
                    r"(\{[^}]*\}|[^,\s]+)")


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

    def called_computations(self) -> list[str]:
        """Every computation this instruction names (``calls=``, ``to_apply=``, ``body=``, ...), in one scan."""
        return [v.strip().lstrip("%") for match in _CALLS.finditer(self.attrs)
                for v in match[1].strip("{}").split(",") if v.strip()]

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


class HloParseError(AotcheckError, RuntimeError):
    """aotcheck could not read XLA's program text whole: no figure is made from part of a program.
    The message names the computation and the line."""


# A quoted string (which may hold braces, parentheses and raw newlines: a Pallas kernel's
# backend_config does), or a character that opens, closes or ends something.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}()\n]')


def _matching(text: str, start: int, open_char: str, close_char: str) -> int:
    """Index just past the bracket that closes the one at ``start`` (brackets in quoted strings do not count)."""
    depth = 0
    for match in _TOKEN.finditer(text, start):
        token = match.group()
        if token == open_char:
            depth += 1
        elif token == close_char:
            depth -= 1
            if depth == 0:
                return match.end()
    return len(text)


def logical_lines(text: str) -> Iterator[tuple[int, int, str]]:
    r"""(bracket depth at its start, line number, text) of each statement of a module's text: a
    line, joined with the lines after it while a string, parenthesis or brace it opened is still
    open. A computation's header (a line that ends by opening a brace at depth 0) is one statement.

    Example (a backend config holding a raw newline stays in its instruction):
        >>> for depth, number, line in logical_lines('ENTRY %m () -> f32[] {\n  ROOT %c = f32[] custom-call(), '
        ...                                          'backend_config={"a":1,\n"b":"}"}\n}'):
        ...     print(depth, number, repr(line))
        0 1 'ENTRY %m () -> f32[] {'
        1 2 '  ROOT %c = f32[] custom-call(), backend_config={"a":1,\n"b":"}"}'
        1 4 '}'
    """
    depth = start = start_depth = 0
    number = start_number = 1
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token == "\n":
            piece = text[start:match.start()]
            if depth <= start_depth or (start_depth == 0 and depth == 1 and piece.rstrip().endswith("{")):
                yield start_depth, start_number, piece
                start, start_depth, start_number = match.end(), depth, number + 1
            number += 1
        elif token in "{(":
            depth += 1
        elif token in "})":
            depth -= 1
        else:
            number += token.count("\n")
    if start < len(text):
        yield start_depth, start_number, text[start:]


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
    for _, _, line in logical_lines(text):
        inst = parse_instruction(_UNPREFIXED.sub(r"\1%\2", line, count=1))
        if inst is not None:
            yield inst


def parse_module(text: str) -> dict[str, Computation]:
    r"""Computations of an HLO module's text, by name, each checked whole as it is read: every
    statement inside a computation is an instruction, names are unique, a ROOT ends it, every
    operand is defined in it and every computation called exists. :class:`HloParseError` names
    the computation and line otherwise: a figure is never made from part of a program.

    Example:
        >>> parse_module("ENTRY %main () -> f32[] {\n  %c = f32[] constant(1)\n}")
        Traceback (most recent call last):
        ...
        aotcheck.figures.hlo.HloParseError: XLA's program text could not be read whole: computation 'main' (line 1) has no ROOT instruction...
    """
    computations: dict[str, Computation] = {}
    current: Computation | None = None
    first = 0
    for depth, number, line in logical_lines(text):
        if current is None:
            header = _HEADER.match(line) if depth == 0 else None
            if header:
                current, first = Computation(header[2], {}, None, bool(header[1])), number
            elif depth != 0 or line.rstrip().endswith("{"):  # A computation this reader does not know.
                raise _unreadable(f"line {number}: not a computation header this reader knows: {_clip(line.strip())}")
            continue
        stripped = line.strip()
        if stripped == "}" or _CLOSE_WITH_ATTRIBUTES.match(stripped):
            _check_computation(current, first)
            computations[current.name] = current
            current = None
        elif stripped:
            inst = parse_instruction(line)
            if inst is None:
                raise _unreadable(f"computation {current.name!r}, line {number}: not an instruction: {_clip(stripped)}")
            if inst.name in current.instructions:
                raise _unreadable(f"computation {current.name!r}, line {number}: {inst.name!r} defined twice")
            current.instructions[inst.name] = inst
            if inst.is_root:
                if current.root is not None:
                    raise _unreadable(f"computation {current.name!r}, line {number}: a second ROOT ({inst.name!r})")
                current.root = inst
    if current is not None:
        raise _unreadable(f"computation {current.name!r} (line {first}) never ends")
    entries = [c.name for c in computations.values() if c.is_entry]
    if (computations or text.strip()) and len(entries) != 1:
        raise _unreadable(f"the module has {len(entries)} ENTRY computations ({', '.join(entries) or 'none'}), not one")
    for comp in computations.values():
        for inst in comp.instructions.values():
            missing = [name for name in inst.called_computations() if name not in computations]
            if missing:
                raise _unreadable(f"computation {comp.name!r}: {inst.name!r} calls {missing[0]!r}, which the "
                                  f"module does not define")
    return computations


def _check_computation(comp: Computation, first: int) -> None:
    if comp.root is None:
        raise _unreadable(f"computation {comp.name!r} (line {first}) has no ROOT instruction")
    for inst in comp.instructions.values():
        undefined = [o for o in inst.operands if o not in comp.instructions]
        if undefined:
            raise _unreadable(f"computation {comp.name!r} (line {first}): {inst.name!r} uses {undefined[0]!r}, "
                              f"which it does not define")


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _unreadable(what: str) -> HloParseError:
    return HloParseError(f"XLA's program text could not be read whole: {what}. No figure is made from part of a "
                         f"program; this is aotcheck's bug: please report it with this message")


_NUMBER = re.compile(r"-?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)|true|false", re.I)


def constant_value(inst: Instruction) -> "np.ndarray | None":
    """The value a ``constant`` holds, shaped as its array; None where the text elides it (``{...}``:
    XLA prints a large constant whole only when asked, ``xla_dump_large_constants``) or it is not one.

    Example:
        >>> constant_value(parse_instruction("%c = s8[2,3]{1,0} constant({ { 1, 0, 0 }, { 2, 1, 0 } })")).tolist()
        [[1, 0, 0], [2, 1, 0]]
        >>> constant_value(parse_instruction("%c = s8[64,64]{1,0} constant({...})")) is None
        True
    """
    import numpy as np  # noqa: PLC0415  (only where a constant is read)

    if inst.opcode != "constant" or "..." in inst.args or len(inst.arrays) != 1:
        return None
    words = _NUMBER.findall(inst.args)
    array = inst.arrays[0]
    if len(words) != array.elements:
        return None
    values = [1.0 if w.lower() == "true" else 0.0 if w.lower() == "false" else float(w) for w in words]
    integral = array.dtype == "pred" or array.dtype[0] in "su"
    return np.array(values, dtype=np.int64 if integral else np.float64).reshape(array.dims)


def constants(text: str) -> dict[str, Instruction]:
    """Every ``constant`` of a module's text, by name (a dump's, where XLA printed them whole)."""
    found = (parse_instruction(line) for _, _, line in logical_lines(text) if " constant(" in line)
    return {inst.name: inst for inst in found if inst is not None and inst.opcode == "constant"}


def check_against(module: dict[str, Computation], xla_module: Any) -> None:
    """Checks a parse against XLA's own parse of the same program (an independent count): the same
    computations, each with the same number of instructions. ``xla_module``: an ``HloModule`` of
    ``compiled.runtime_executable().hlo_modules()``. The computation an async op wraps is printed
    inside its ``*-start`` (``all-reduce-start(...)``) when it is one instruction, not apart: XLA's
    copy of it is then not compared. Raises :class:`HloParseError` naming the first computation that differs.
    """
    try:
        computations = list(xla_module.computations())
        roots = {inst.async_wrapped_root().name for comp in computations for inst in comp.instructions()
                 if str(inst.opcode).endswith("AsyncStart")}
            # Wrapped computations the text prints inside their start op (not apart) are not compared.
        theirs = {comp.name: len(comp.instructions()) for comp in computations
                  if comp.name in module or not any(inst.name in roots for inst in comp.instructions())}
    except (AttributeError, TypeError):  # A toolchain whose bindings lack these: nothing to check against.
        return
    ours = {name: len(c.instructions) for name, c in module.items()}
    for name in sorted(theirs.keys() | ours.keys()):
        if theirs.get(name) != ours.get(name):
            raise _unreadable(f"computation {name!r} has {ours.get(name, 'no')} instructions here and "
                              f"{theirs.get(name, 'no')} in XLA's own parse of the program")
