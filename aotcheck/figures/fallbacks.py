"""Where XLA's SPMD partitioner fell back: the compiler's own warnings as a figure.

When the partitioner cannot move an array from one sharding to the next by a collective, it
replicates the whole array on every device and slices it again ("Involuntary full
rematerialization"): memory and bandwidth the model's author did not ask for, and a sign that a
sharding annotation is missing. libtpu logs each as a warning (read per compile by
``aotcheck._runtime.compiler_warnings``); here each becomes a :class:`Fallback` named with its op and
source line, and ``sharding_fallbacks`` counts them (gated exactly: a new one is a regression).

Example:
    >>> line = ("W1205 10:34:37.534455 8158 spmd_partitioner.cc:666] [SPMD] Involuntary full rematerialization. "
    ...         "The compiler cannot go from sharding {devices=[1,2,4]<=[8]} to {devices=[8,1,1]<=[8]} efficiently "
    ...         "for HLO operation %copy.3 = f32[8,32,16]{2,1,0} copy(%sin.0), metadata={op_name=\\"jit(f)/sharding_"
    ...         "constraint\\" source_file=\\"model.py\\" source_line=90}. As the last resort, SPMD will replicate ...")
    >>> scratch = line.replace("%copy.3 = f32[8,32,16]{2,1,0} copy(%sin.0)", "%fake_parameter.2 = f32[8,32,16]{2,1,0} parameter(2)")
    >>> [f] = read_fallbacks([line, scratch, "W1205 10:34:37 1 other.cc:1] unrelated"], frames={})
    >>> f.kind, f.name, f.source, f.count, f.moved
    ('remat', 'jit(f)/sharding_constraint', 'model.py:90', 1, '{devices=[1,2,4]<=[8]} -> {devices=[8,1,1]<=[8]}')
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from aotcheck.records import Record
from aotcheck.figures.frames import instruction_source, metadata
from aotcheck.figures.hlo import parse_instruction

FIGURE = "sharding_fallbacks"

# The warning's words in libtpu 0.0.50.1 ("cannot go from ... efficiently") and in older XLAs ("was not
# able to go from ... without doing a full rematerialization").
_REMAT = re.compile(r"\[SPMD\] Involuntary full rematerialization\. The compiler (?:cannot|was not able to) go from "
                    r"sharding (?P<src>.*?) to (?P<dst>.*?) (?:efficiently|without doing a full rematerialization of "
                    r"the tensor) for HLO operation:? (?P<inst>%.*?)(?:\. As the last resort|\. You probably|$)")
# The partitioner also partitions scratch modules of its own, to weigh one way of splitting a dot against
# another (their inputs are parameters named fake_parameter, with no metadata): a fallback there is in no
# program (every 2-D-mesh train step of this repository's references logs one, on fake_parameter.2).
_SCRATCH = "fake_parameter"
# Any other fallback the partitioner announces ("[SPMD] Falling back to replicated execution for ...").
_OTHER = re.compile(r"\[SPMD\] (?P<what>Falling back to [^.%]*?)(?: for)?(?: HLO)?(?: operation)?:? (?P<inst>%.*)?$")


@dataclasses.dataclass(frozen=True)
class Fallback(Record):
    """One op the partitioner fell back on, and how often per compile: ``kind`` ``remat`` (replicated and
    sliced again) or ``replicated`` (run replicated); ``moved``: the shardings it could not move between.

    Example:
        >>> Fallback("remat", "jit(f)/mul", "model.py:9", 2, "{a} -> {b}").describe()
        'XLA replicated jit(f)/mul (model.py:9) in full to reshard it ({a} -> {b}), 2 times: a sharding annotation is missing'
    """

    kind: str
    name: str
    source: str | None
    count: int
    moved: str = ""

    def describe(self) -> str:
        where = f" ({self.source})" if self.source else ""
        times = f", {self.count} times" if self.count > 1 else ""
        if self.kind == "remat":
            return (f"XLA replicated {self.name}{where} in full to reshard it ({self.moved}){times}: a sharding "
                    "annotation is missing")
        return f"XLA's partitioner fell back on {self.name}{where}: {self.moved}{times}"


def read_fallbacks(lines: Iterable[str], *, frames: Mapping[int, Any]) -> list[Fallback]:
    """The partitioner's fallbacks among a compile's warning lines, one record per op and kind
    (counted), their source lines from ``frames`` (the stack frames of the module the partitioner
    read: XLA's dump after sharding propagation, :func:`aotcheck.figures.splits.sharding_dump`)."""
    found: dict[tuple[str, str, str | None, str], int] = {}
    for line in lines:
        if "[SPMD]" not in line:
            continue
        remat, other = _REMAT.search(line), _OTHER.search(line)
        if remat is None and other is None:
            continue
        text = (remat or other)["inst"] or ""
        inst = parse_instruction(text) if text else None
        if inst is not None and inst.name.startswith(_SCRATCH) and inst.opcode == "parameter":
            continue
        name = (metadata(inst, "op_name") or inst.name) if inst is not None else "(an op XLA does not name)"
        source = instruction_source(inst, frames) if inst is not None else None
        if remat is not None:
            key = ("remat", name, source, f"{remat['src']} -> {remat['dst']}")
        else:
            key = ("replicated", name, source, other["what"].strip())
        found[key] = found.get(key, 0) + 1
    return [Fallback(kind, name, source, count, moved) for (kind, name, source, moved), count in found.items()]
