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

from aotcheck.figures.attribution import CLASSES, PEAK_FIGURE, PeakBuffer
from aotcheck.figures.fit import Fit
from aotcheck.figures.loops import CollectiveOp
from aotcheck.figures.table import parse
from aotcheck.gate.compare import Change
from aotcheck.gate.outcome import Outcome

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


@dataclasses.dataclass(frozen=True)
class Headroom:
    """A fit search's answer that fell: the knob's kind, its largest fitting size then and now, and the search."""

    kind: str
    before: int
    now: int
    fit: Fit | None


@dataclasses.dataclass(frozen=True)
class Why:
    """Why a case's figures moved, as its details and its golden's show it (:mod:`aotcheck.render.text` words
    it): the peak's classes that grew, the buffers at the peak and the collectives new or grown, and the
    fit searches whose answer fell."""

    peak_growth: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    buffers: list[Grown[PeakBuffer]] = dataclasses.field(default_factory=list)
    headroom: list[Headroom] = dataclasses.field(default_factory=list)
    collectives: list[Grown[CollectiveOp]] = dataclasses.field(default_factory=list)


_PEAK = {"peak_bytes", "total_bytes", "temp_bytes", "argument_bytes", "output_bytes"}


def _family(metric: str) -> str | None:
    """The family of a figure's name (``peak``, ``comm``, ``fit_max``), or None for a figure of its own."""
    name = parse(metric)
    return name.family if name is not None else None


def why(outcome: Outcome) -> Why:
    """What moved a case's regressed figures (nothing for figures that did not regress)."""
    moved = {r.metric for r in outcome.changes if r.change is Change.REGRESSION}
    now, before = outcome.details, outcome.golden_details
    growth: list[tuple[str, int]] = []
    buffers: list[Grown[PeakBuffer]] = []
    if moved & _PEAK or any(_family(m) == "peak" for m in moved):
        growth = class_growth(outcome.golden_figures or {}, outcome.figures or {})
        if now is not None and before is not None:
            # An argument entering the top of the list is not news unless its class grew.
            grew = {kind for kind, _ in growth} | {"outputs", "temp", "other"}
            buffers = grown(before.peak_buffers, [b for b in now.peak_buffers if b.kind in grew])
    headroom = [Headroom(parse(m).kind, int((outcome.golden_figures or {}).get(m, 0)),
                         int((outcome.figures or {}).get(m, 0)), now.fit if now is not None else None)
                for m in sorted(m for m in moved if _family(m) == "fit_max")]
    collectives = grown(before.collectives, now.collectives) if any(_family(m) == "comm" for m in moved) \
        and now is not None and before is not None else []
    return Why(growth, buffers, headroom, collectives)
