"""What holds the HBM at the peak, and which line of code put it there.

XLA's TPU compiler, asked to dump (``xla_dump_to``), writes for every compile
(deviceless ones too) its buffer assignment (which allocation holds which value,
entry parameters by number) and its live ranges (the values live at the peak).
This module reads the two, with the optimized HLO and the lowered program's
argument paths, and splits the compiled peak by class:

- ``params`` / ``opt_state`` / ``batch``: the entry arguments' own buffers, in
  full: XLA never frees or reuses an argument's buffer during the program, so
  they are resident at any peak. ``batch`` is every input that is neither
  parameters nor optimizer state (the batch, a KV cache, a function's arguments
  its ``arg_kinds`` call ``batch`` or ``other``).
- ``outputs``: values live at the peak in buffers that leave the program and
  are not an argument's (an update donated in place counts as its argument).
- ``temp``: every other value live at the peak (activations, gradients,
  gathered copies of parameters), named by the HLO instruction that defined it:
  JAX's name stack (``op_name``) and the Python ``source_file:line`` (the user's;
  for a model installed as a package, its own line too: ``library``); a buffer
  that only moves an argument (a copy, an all-gather) is named by the argument.
- ``other``: what XLA's peak counts beyond these: tile padding (the classes
  count each array's logical bytes), fragmentation, reservations such as program
  code. Never dropped, so the classes sum to ``peak_bytes`` exactly.

Values XLA placed in SMEM or on the host are left out. Those its memory report
calls VMEM stay in: XLA's peak counts them (measured on v5e: without them a tiny
train step's classes cover 15% of its peak, with them 90%).

Example (the dump of a two-argument program, shortened by hand):
    >>> assignment = '''BufferAssignment:
    ... allocation 0: size 4096, parameter 0, shape |f32[32,32]| at ShapeIndex {}:
    ...  value: <1 p0 @0> (size=4096,offset=0): f32[32,32]{1,0}
    ... allocation 1: size 8192, maybe-live-out:
    ...  value: <5 dot.1 @0> (size=8192,offset=0): f32[64,32]{1,0}
    ... allocation 2: size 16384, preallocated-temp:
    ...  value: <3 fusion.2 @0> (size=16384,offset=0): f32[64,64]{1,0}
    ... '''
    >>> live_range = '''  BufferLiveRange:
    ...     p0{}:0-3
    ...     fusion.2{}:1-3
    ...     dot.1{}:3-4
    ... '''
    >>> hlo = '''%f (x: f32[32,32]) -> f32[64,64] {
    ...   %x = f32[32,32]{1,0} parameter(0)
    ...   ROOT %b = f32[64,64]{1,0} broadcast(%x), dimensions={}
    ... }
    ...
    ... ENTRY %main (p0: f32[32,32]) -> f32[64,32] {
    ...   %p0 = f32[32,32]{1,0} parameter(0)
    ...   %fusion.2 = f32[64,64]{1,0} fusion(%p0), kind=kLoop, calls=%f, metadata={op_name="jit(f)/exp" source_file="/x/model.py" source_line=88}
    ...   ROOT %dot.1 = f32[64,32]{1,0} dot(%fusion.2, %p0), metadata={op_name="jit(f)/dot_general" source_file="/x/model.py" source_line=89}
    ... }'''
    >>> found = attribute(assignment, live_range, parse_module(hlo), arguments=[Argument("params/w", "params")],
    ...                   peak_bytes=40000)
    >>> found.classes
    {'params': 4096, 'opt_state': 0, 'batch': 0, 'kv_cache': 0, 'outputs': 8192, 'temp': 16384, 'other': 11328}
    >>> found.buffers[0]
    PeakBuffer(bytes=16384, kind='temp', name='jit(f)/exp', shape='f32[64,64]', source='model.py:88', count=1, library=None)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aotcheck.records import Record, field, same_line
from aotcheck.figures.dump import AttributionError, dump_file, off_chip_colors, parse_assignment, peak_live
from aotcheck.figures.frames import Lines, instruction_library, instruction_source, metadata, stack_frames
from aotcheck.figures.hlo import Computation, Instruction, parse_arrays, parse_module
from aotcheck.figures.table import peak
from aotcheck.programs.lowering import Argument

CLASSES = ("params", "opt_state", "batch", "kv_cache", "outputs", "temp", "other")
PEAK_FIGURE = {kind: peak(kind) for kind in CLASSES}
"""Each class's figure, ``peak_<class>_bytes`` (:func:`aotcheck.figures.table.peak`)."""
PEAK_FIGURES = tuple(PEAK_FIGURE.values())
"""Figures the attribution adds to every case; they sum to ``peak_bytes``."""
LATER_PEAK_FIGURES = (PEAK_FIGURE["kv_cache"],)
"""Classes added after the split was first written (figures version 18): a golden or report made before
holds none, read as 0 (its KV pool, if any, was counted in ``batch``)."""

TOP_BUFFERS = 10
# Instructions that only move or re-lay data: the buffer they define holds what their operand held.
_MOVES = frozenset({"copy", "copy-start", "copy-done", "bitcast", "reshape", "optimization-barrier"})
# Instructions that make another copy of (part of) their operand: named "<op> of <operand>".
_COPIES = frozenset({
    "convert", "all-gather", "all-gather-start", "all-gather-done", "all-to-all", "collective-permute",
    "collective-permute-start", "collective-permute-done", "dynamic-slice", "slice", "transpose", "broadcast",
})


@dataclasses.dataclass(frozen=True)
class PeakBuffer(Record):
    """Buffers of one name live at the peak: their bytes per device (all ``count`` of them)."""

    bytes: int
    kind: str
    name: str  # An argument's path, or the defining op's JAX name stack.
    shape: str  # dtype[dims] of the largest of them.
    source: str | None = None  # "file.py:88": the Python line that made it (the user's).
    count: int = 1
    library: str | None = field(default=None, omit=same_line)  # "esm2quinox/_esm2.py:123": the model library's line, where it is another.

    @property
    def key(self) -> tuple[str, str]:
        """What identifies a buffer across two compiles of one case."""
        return self.kind, self.name


@dataclasses.dataclass(frozen=True)
class Attribution:
    """The peak by class (summing to the peak) and the largest buffers in it."""

    classes: dict[str, int]
    buffers: list[PeakBuffer]
    excess: int = 0  # How much more XLA lists live at its live-range peak than its peak figure (temp is net of it).

    def figures(self) -> dict[str, int]:
        """The gated figures: ``peak_<class>_bytes``."""
        return {PEAK_FIGURE[kind]: self.classes[kind] for kind in CLASSES}

    @classmethod
    def from_parts(cls, figures: Mapping[str, Any], buffers: Sequence[Mapping[str, Any]]) -> "Attribution | None":
        """Rebuilt from a case's figures and its stored buffer list; None without the figures."""
        if not all(name in figures for name in PEAK_FIGURES if name not in LATER_PEAK_FIGURES):
            return None
        return cls({kind: int(figures.get(PEAK_FIGURE[kind], 0)) for kind in CLASSES},
                   [PeakBuffer.from_json(b) for b in buffers])


class _Module:
    """The optimized HLO, indexed for tracing a value back to where its data came from."""

    def __init__(self, module: Mapping[str, Computation], frames: Mapping[int, Lines | str] | None = None) -> None:
        self.frames = frames or {}
        self.where: dict[str, tuple[Computation, Instruction]] = {}
        self.loop_of: dict[str, Instruction] = {}  # A while body's or condition's name -> the while.
        self.feeds: dict[str, tuple[Instruction, int]] = {}  # A loop's initial value -> (the while, its index).
        self.computations = module
        for comp in module.values():
            for inst in comp.instructions.values():
                self.where[inst.name] = (comp, inst)
                if inst.opcode == "while":
                    for key in ("body", "condition"):
                        for name in inst.called(key):
                            self.loop_of[name] = inst
                    init = comp.instructions.get(inst.operands[0]) if inst.operands else None
                    if init is not None and init.opcode == "tuple":
                        for i, operand in enumerate(init.operands):
                            self.feeds.setdefault(operand, (inst, i))

    def origin(self, name: str, index: tuple[int, ...], depth: int = 0) -> tuple[int | None, str | None, Instruction | None]:
        """(entry parameter the data came from, the copying op on the way, the instruction to name it by)."""
        found = self.where.get(name)
        if found is None or depth > 64:
            return None, None, None
        comp, inst = found
        op = inst.opcode
        if op == "parameter":
            if comp.is_entry:
                return (inst.int_arg if not index else index[0]) if inst.int_arg is not None else None, None, inst
            loop = self.loop_of.get(comp.name)
            if loop is not None and loop.operands:
                return self._carried(loop, index, depth)
            return None, None, inst
        if op == "get-tuple-element":
            position = int(inst.attr("index") or 0)
            return self.origin(inst.operands[0], (position, *index), depth + 1) if inst.operands else (None, None, inst)
        if op == "tuple" and index and index[0] < len(inst.operands):
            return self.origin(inst.operands[index[0]], index[1:], depth + 1)
        if op == "while":
            return self._carried(inst, index, depth)
        if op in _MOVES and inst.operands:
            return self.origin(inst.operands[0], () if op.startswith("copy-") else index, depth + 1)
        if op in _COPIES and inst.operands:
            number, _, _ = self.origin(inst.operands[0], (), depth + 1)
            if number is not None:
                return number, op.removesuffix("-start").removesuffix("-done"), inst
        return None, None, inst

    def _written(self, inst: Instruction) -> Instruction:
        """For a loop's stacked output (a dynamic-update-slice, or a fusion rooted at one: a scan's
        saved residuals), the instruction that made the slice it writes; else ``inst``."""
        update: Instruction | None = None
        if inst.opcode == "dynamic-update-slice" and len(inst.operands) > 1:
            update = self.where.get(inst.operands[1], (None, None))[1]
        elif inst.opcode == "fusion":
            fused = self.computations.get((inst.called("calls") or [""])[0])
            if fused is not None and fused.root is not None and fused.root.opcode == "dynamic-update-slice":
                update = fused.instructions.get(fused.root.operands[1]) if len(fused.root.operands) > 1 else None
                while update is not None and update.opcode in _MOVES | {"convert"} and update.operands:
                    update = fused.instructions.get(update.operands[0])
                if update is not None and update.opcode == "parameter" and update.int_arg is not None \
                        and update.int_arg < len(inst.operands):
                    update = self.where.get(inst.operands[update.int_arg], (None, None))[1]
        return update if _named(update) else inst

    def _carried(self, loop: Instruction, index: tuple[int, ...], depth: int):
        """A loop-carried value: the loop's input if the body passes it through, else what the body makes."""
        body = self.computations.get((loop.called("body") or [""])[0])
        if body is None or body.root is None or not index or body.root.opcode != "tuple":
            return None, None, loop
        made = body.root.operands[index[0]] if index[0] < len(body.root.operands) else None
        source = self.where.get(made or "")
        if source is not None:
            _, inst = source
            passes = (inst.opcode == "get-tuple-element" and int(inst.attr("index") or 0) == index[0]
                      and self.where.get(inst.operands[0], (None, None))[1] is not None
                      and self.where[inst.operands[0]][1].opcode == "parameter")
            if not passes:
                return None, None, self._written(inst)
        return self.origin(loop.operands[0], index, depth + 1)


def _named(inst: Instruction | None) -> bool:
    return inst is not None and "/" in (metadata(inst, "op_name") or "")


def _split(value: str) -> tuple[str, tuple[int, ...]]:
    match = re.fullmatch(r"(.*?)\{([\d,]*)\}", value)
    if not match:
        return value, ()
    return match[1], tuple(int(i) for i in match[2].split(",") if i)


def attribute(
    assignment: str,
    live_range: str,
    module: Mapping[str, Computation],
    *,
    arguments: Sequence[Argument],
    peak_bytes: int | None,
    frames: Mapping[int, Lines | str] | None = None,
    usage_report: str | None = None,
    top: int = TOP_BUFFERS,
) -> Attribution:
    """The peak split by class, and its ``top`` largest buffers (see the module's docstring).

    ``peak_bytes`` None (a program XLA refused for want of memory has no peak
    figure): ``other`` is 0 and the classes sum to what the dump names.
    """
    allocations, values = parse_assignment(assignment)
    if not allocations:
        raise AttributionError("the buffer-assignment dump lists no allocations")
    off_chip = off_chip_colors(usage_report)
    hlo = _Module(module, frames)
    classes = dict.fromkeys(CLASSES, 0)
    # (kind, name) -> [bytes, count, (largest bytes, shape), (source, library)]: the lines of the first.
    named: dict[tuple[str, str], list] = {}

    def lines(inst: Instruction | None) -> tuple[str | None, str | None]:
        return (instruction_source(inst, hlo.frames), instruction_library(inst, hlo.frames)) if inst else (None, None)

    def add(kind: str, name: str, size: int, shape: str, source: tuple[str | None, str | None]) -> None:
        classes[kind] += size
        entry = named.setdefault((kind, name), [0, 0, (0, shape), source])
        entry[0] += size
        entry[1] += 1
        entry[2] = max(entry[2], (size, shape))

    for allocation in allocations.values():
        if allocation.kind == "parameter" and allocation.color not in off_chip:
            argument = arguments[allocation.parameter] if allocation.parameter < len(arguments) else None
            path = argument.path if argument else f"argument {allocation.parameter}"
            # The logical size: tile padding is XLA's, not the argument's; it stays in "other".
            size = int(sum(a.bytes for a in parse_arrays(allocation.shape))) or allocation.size
            add(argument.peak_class if argument else "batch", path, size, allocation.shape, (None, None))
    for value, size, number, _ in peak_live(live_range, allocations, values, off_chip):
        allocation = allocations[number]
        kind = "outputs" if allocation.kind == "output" else "temp"
        name, index = _split(value)
        origin, via, inst = hlo.origin(name, index)
        if origin is not None and origin < len(arguments):
            label = f"{via} of {arguments[origin].path}" if via else f"copy of {arguments[origin].path}"
            source = lines(inst if via else None)  # The line that copied it.
        else:
            inst = inst or hlo.where.get(name, (None, None))[1]
            if inst is not None and "/" not in (metadata(inst, "op_name") or "") and inst.name in hlo.feeds:
                # A buffer made for a loop (a scan's stacked residuals, allocated or zeroed before it),
                # with no JAX name of its own: named by what the loop writes into it.
                loop, index = hlo.feeds[inst.name]
                inst = hlo._carried(loop, (index,), 0)[2] or inst
            label = (metadata(inst, "op_name") if inst else None) or (inst.opcode if inst else name)
            source = lines(inst)
        add(kind, label, size, values[value][2], source)
    counted = sum(classes.values())
    excess = max(0, counted - peak_bytes) if peak_bytes is not None else 0
    if excess:
        # XLA's live-range peak and its memory analysis's peak are two accounts (measured: lm-1b's
        # prefill on v4-8 lists 4% more live at its peak than the analysis's peak). Temporaries are
        # shown net of the difference, and the difference is kept to be said.
        if excess > classes["temp"]:
            raise AttributionError(
                f"the buffers live at XLA's peak add up to {counted} bytes, more than its peak of {peak_bytes} "
                "beyond its temporaries; this libtpu's dump does not mean what aotcheck reads it as")
        classes["temp"] -= excess
    classes["other"] = peak_bytes - (counted - excess) if peak_bytes is not None else 0
    buffers = [PeakBuffer(total, kind, name, shape, source, count, library)
               for (kind, name), (total, count, (_, shape), (source, library)) in named.items()]
    buffers.sort(key=lambda b: (-b.bytes, b.kind, b.name))
    return Attribution(classes, buffers[:top], excess)


def read_dump(directory: str | Path, *, hlo_text: str | None, arguments: Sequence[Argument], peak_bytes: int | None,
              module: Mapping[str, Computation] | None = None, top: int = TOP_BUFFERS) -> Attribution:
    """:func:`attribute` on the one program XLA dumped into ``directory``.

    ``hlo_text`` is the optimized module (``compiled.as_text()``; None: the dump's
    own, for a program that did not compile), ``module`` its parse when the caller
    has one already.

    Raises AttributionError, naming the file, when a dump is missing or unreadable.
    """
    if hlo_text is None:
        hlo_text = dump_file(directory)
    return attribute(dump_file(directory, "buffer-assignment"), dump_file(directory, "live-range"),
                     module or parse_module(hlo_text), arguments=arguments, peak_bytes=peak_bytes,
                     frames=stack_frames(hlo_text), usage_report=dump_file(directory, "memory-usage-report", required=False),
                     top=top)
