"""Why a case's figures moved: the peak's classes that grew, and the buffers and collectives
that are new or grew, found by comparing a case's details with its golden's.

The figures say *that* the peak grew; the details (the largest buffers at the
peak and the largest collectives, each with its JAX op name and source line)
say *what* grew. Buffers and collectives are matched by class (or kind) and name.

Example:
    >>> from aotcheck.figures.attribution import PeakBuffer
    >>> before = [PeakBuffer(1 << 20, "params", "params/w", "f32[512,512]")]
    >>> after = before + [PeakBuffer(1 << 30, "temp", "jit(step)/log_softmax", "f32[16,2048,8192]", "model.py:88")]
    >>> [(g.now.name, g.before) for g in grown(before, after)]
    [('jit(step)/log_softmax', None)]
    >>> class_growth({"peak_temp_bytes": 10}, {"peak_temp_bytes": 30, "peak_params_bytes": 5})
    [('temp', 20)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

from aotcheck.figures.attribution import CLASSES, PEAK_FIGURE

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Grown(Generic[T]):
    """A buffer or collective that is new (``before`` None) or larger than in the golden."""

    now: T
    before: int | None  # Its bytes in the golden; None when it was not there.

    @property
    def added(self) -> int:
        return self.now.bytes - (self.before or 0)


def grown(golden: Sequence[T], now: Sequence[T], *, limit: int = 5) -> list[Grown[T]]:
    """Items of ``now`` (``PeakBuffer`` or ``CollectiveOp``) new against ``golden`` or larger, largest growth first."""
    before = {item.key: item.bytes for item in golden}
    out = [Grown(item, before.get(item.key)) for item in now
           if item.key not in before or item.bytes > before[item.key]]
    return sorted(out, key=lambda g: -g.added)[:limit]


def class_growth(golden: Mapping[str, float], now: Mapping[str, float]) -> list[tuple[str, int]]:
    """(class, bytes added) for each peak class that grew; classes either side lacks are left out."""
    out = []
    for kind in CLASSES:
        name = PEAK_FIGURE[kind]
        if name in golden and name in now and now[name] > golden[name]:
            out.append((kind, int(now[name] - golden[name])))
    return sorted(out, key=lambda pair: -pair[1])
