"""What is live at the peak, in XLA's own words: the live-range dump of one compile.

Asked to dump (``xla_dump_to``), XLA's TPU compiler writes, also for deviceless
compiles, ``*after_optimizations-live-range.txt``: the values live at the peak
with their sizes, and a breakdown of the peak by JAX name stack (``jit(train_step)
/transpose(jvp())/while/...``) and by argument path (``state['opt_state'][1][0].mu[...]``).
This module reads that file; it is informational (``aotcheck compile --explain``),
not a gated figure.

Example:
    >>> text = '''HloLiveRange (max 9):
    ...   Live ranges at 5 (peak):
    ...     fusion.7{1}: 2097152 bytes (cumulative: 2097152 bytes)
    ...     param.2{}: 131072 bytes (cumulative: 2228224 bytes)
    ...   Stack trace breakdown for peak usage: 2 228 224 bytes
    ...     main (100.0%, total: 2 228 224 bytes, current: 0 bytes, remaining: 2 228 224 bytes)
    ...       ├── jit(f)/while (94.1%, total: 2 097 152 bytes, current: 0 bytes, remaining: 2 228 224 bytes)
    ...       │   └── jit(f)/while/body/dot_general (94.1%, total: 2 097 152 bytes, current: 2 097 152 bytes, remaining: 131 072 bytes)
    ...       └── state['params']['w'] (5.9%, total: 131 072 bytes, current: 131 072 bytes, remaining: 0 bytes)
    ... '''
    >>> peak = parse_live_range(text)
    >>> peak.values[0], peak.total_bytes
    (PeakValue(name='fusion.7{1}', bytes=2097152), 2228224)
    >>> [(b.depth, b.name, b.bytes) for b in peak.breakdown]
    [(1, 'jit(f)/while', 2097152), (2, 'jit(f)/while/body/dot_general', 2097152), (1, "state['params']['w']", 131072)]
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

_VALUE = re.compile(r"^\s+(\S+): (\d+) bytes \(cumulative")
_BREAKDOWN_HEAD = re.compile(r"Stack trace breakdown for peak usage: ([\d ]+) bytes")
_NODE = re.compile(r"^(\s*(?:[│ ]   )*)[├└]── (.*) \(([\d.]+)%, total: ([\d ]+) bytes")


def dump_options(directory: str) -> dict[str, Any]:
    """Compiler options that make XLA write its dumps (text) into ``directory``."""
    return {"xla_dump_to": directory, "xla_dump_hlo_as_text": True}  # A bool: "true" is refused.


@dataclasses.dataclass(frozen=True)
class PeakValue:
    """One value live at the peak: its HLO name (with tuple index) and size per device."""

    name: str
    bytes: int


@dataclasses.dataclass(frozen=True)
class PeakNode:
    """One line of XLA's peak breakdown: a name-stack entry or an argument path, and its bytes."""

    depth: int
    name: str
    bytes: int


@dataclasses.dataclass(frozen=True)
class Peak:
    """XLA's account of a program's peak."""

    values: list[PeakValue]
    total_bytes: int | None
    breakdown: list[PeakNode]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Peak":
        return cls([PeakValue(**v) for v in data["values"]], data["total_bytes"],
                   [PeakNode(**n) for n in data["breakdown"]])


def parse_live_range(text: str) -> Peak | None:
    """The peak section of a live-range dump; None if the text has none (another format)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "Live ranges at" in line and "(peak)" in line), None)
    if start is None:
        return None
    values, total, breakdown = [], None, []
    for line in lines[start + 1:]:
        match = _VALUE.match(line)
        if not match:
            break
        values.append(PeakValue(match[1], int(match[2])))
    for i, line in enumerate(lines):
        head = _BREAKDOWN_HEAD.search(line)
        if head:
            total = int(head[1].replace(" ", ""))
            for node_line in lines[i + 2:]:  # i + 1 is the root (the entry computation).
                node = _NODE.match(node_line)
                if not node:
                    break
                column = len(node[1])  # Where the branch mark stands: 4 columns a level.
                breakdown.append(PeakNode(max(1, (column - 6) // 4 + 1), node[2], int(node[4].replace(" ", ""))))
            break
    return Peak(values, total, breakdown)


def read_peak(directory: str | Path) -> Peak | None:
    """The peak of the one program XLA dumped into ``directory``; None if there is no live-range dump."""
    files = sorted(Path(directory).glob("*after_optimizations-live-range.txt"))
    if not files:
        return None
    try:
        return parse_live_range(files[-1].read_text(errors="replace"))
    except OSError:
        return None
