"""Comparing figures with their golden: per-metric tolerances with a direction.

Every figure is a cost: growth beyond tolerance is a regression, a drop beyond
tolerance an improvement (reported; a failure only in strict mode, so that
baselines stay tight). A tolerance is relative with an absolute floor.

Example:
    >>> from aotcheck.gate.compare import compare, parse_tolerances
    >>> tol = parse_tolerances(["peak_bytes = 1% + 1KiB"])
    >>> rows = compare({"peak_bytes": 100_000}, {"peak_bytes": 102_000}, tol)
    >>> [(r.metric, r.change.value, r.ratio) for r in rows]
    [('peak_bytes', 'regression', 0.02)]
    >>> verdict(rows)
    <Verdict.REGRESSION: 'regression'>
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aotcheck.figures.table import FIGURES
from aotcheck.gate.verdict import Verdict


class ToleranceError(ValueError):
    """A tolerance line that does not parse."""


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Allowed change: ``max(rel * |golden|, abs)``."""

    rel: float = 0.0
    abs: float = 0.0

    def allowed(self, golden: float) -> float:
        return max(self.rel * abs(golden), self.abs)

    def __str__(self) -> str:
        parts = [f"{self.rel * 100:g}%"] if self.rel else []
        if self.abs:
            parts.append(f"{self.abs:g}")
        return " + ".join(parts) or "exact"

    def to_json(self) -> dict[str, float]:
        return {"rel": float(self.rel), "abs": float(self.abs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Tolerance":
        return cls(float(data["rel"]), float(data["abs"]))


# Defaults, first match wins (aotcheck.figures.table). Figures are bit-identical across runs on one
# toolchain, so these only absorb deliberate small changes.
DEFAULT_TOLERANCES: tuple[tuple[str, Tolerance], ...] = tuple((f.glob, Tolerance(*f.tolerance)) for f in FIGURES)

_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_NUMBER = r"[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?"
_LINE = re.compile(
    rf"^\s*(?P<glob>[^=\s]+)\s*=\s*(?:(?P<rel>{_NUMBER})\s*%)?\s*(?:\+?\s*(?P<abs>{_NUMBER})\s*(?P<unit>[a-z]*))?\s*$",
    re.IGNORECASE,
)


def parse_tolerance_line(line: str) -> tuple[str, Tolerance]:
    """``"peak_bytes = 0.5% + 1MiB"`` -> ``("peak_bytes", Tolerance(0.005, 1048576))``."""
    match = _LINE.match(line)
    if not match or (match["rel"] is None and match["abs"] is None):
        raise ToleranceError(
            f"Cannot parse tolerance {line!r}; write METRIC_GLOB = REL% [+ ABS[unit]], "
            "e.g. 'peak_bytes = 1% + 64KiB' or 'flops* = 0.5%'."
        )
    unit = (match["unit"] or "").lower()
    if unit not in _UNITS:
        raise ToleranceError(f"Unknown unit {match['unit']!r} in tolerance {line!r}; use one of KiB, MiB, GiB, K, M, G, T.")
    rel = float(match["rel"]) / 100 if match["rel"] is not None else 0.0
    absolute = float(match["abs"]) * _UNITS[unit] if match["abs"] is not None else 0.0
    return match["glob"], Tolerance(rel, absolute)


def parse_tolerances(lines: Iterable[str], *, known: Sequence[str] = ()) -> tuple[tuple[str, Tolerance], ...]:
    """User lines first, then the defaults. With ``known`` (every figure name; ``fit_max_KNOB`` for
    any knob's), a glob that matches none of them is an error: the growth it meant to catch would pass.

    Example:
        >>> parse_tolerances(["peak_byte = 0%"], known=["peak_bytes", "flops"])
        Traceback (most recent call last):
        ...
        aotcheck.gate.compare.ToleranceError: 'peak_byte' in 'peak_byte = 0%' matches no figure, so it would tolerate nothing; figures are: flops, peak_bytes
    """
    given = [line.strip() for line in lines if line.strip()]
    user = tuple(parse_tolerance_line(line) for line in given)
    for (glob, _), line in zip(user, given):
        if known and not glob.startswith("fit_max_") and not any(fnmatch.fnmatchcase(n, glob) for n in known):
            raise ToleranceError(f"{glob!r} in {line!r} matches no figure, so it would tolerate nothing; "
                                 f"figures are: {', '.join(sorted(known))}")
    return user + DEFAULT_TOLERANCES


def tolerance_for(metric: str, tolerances: Sequence[tuple[str, Tolerance]]) -> Tolerance:
    for glob, tol in tolerances:
        if fnmatch.fnmatchcase(metric, glob):
            return tol
    return Tolerance()


class Change(enum.Enum):
    """How one metric compares with its golden."""

    OK = "ok"  # Within tolerance.
    REGRESSION = "regression"  # Grew beyond tolerance.
    IMPROVEMENT = "improvement"  # Dropped beyond tolerance.
    NEW = "new"  # Produced now, not in the golden.
    GONE = "gone"  # In the golden, not produced now.


@dataclasses.dataclass(frozen=True)
class Row:
    """One metric's comparison."""

    metric: str
    golden: float | None
    now: float | None
    tolerance: Tolerance
    change: Change

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "golden": self.golden, "now": self.now, "change": self.change.value,
                "tolerance": self.tolerance.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Row":
        return cls(data["metric"], data["golden"], data["now"], Tolerance.from_json(data["tolerance"]),
                   Change(data["change"]))

    @property
    def delta(self) -> float | None:
        if self.golden is None or self.now is None:
            return None
        return self.now - self.golden

    @property
    def ratio(self) -> float | None:
        if self.delta is None or not self.golden:
            return None
        return self.delta / abs(self.golden)


# Figures where more is better (headroom): a drop beyond tolerance is the regression.
HIGHER_IS_BETTER = tuple(f.glob for f in FIGURES if f.worse == "less")
# Figures that differ from run to run (timings): --update-golden keeps a golden's value while the
# new one is within tolerance of it, so accepting unchanged programs leaves their goldens as they were.
NOISY = tuple(f.glob for f in FIGURES if f.noisy)


def settle_noisy(golden: Mapping[str, float] | None, now: Mapping[str, float],
                 tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES) -> dict[str, float]:
    """``now`` with each noisy figure that is within tolerance of ``golden`` put back to the golden's value.

    Example:
        >>> settle_noisy({"compile_cpu_seconds": 3.0, "peak_bytes": 10}, {"compile_cpu_seconds": 3.4, "peak_bytes": 11})
        {'compile_cpu_seconds': 3.0, 'peak_bytes': 11}
    """
    out = dict(now)
    for metric, value in now.items():
        before = (golden or {}).get(metric)
        if before is None or not any(fnmatch.fnmatchcase(metric, glob) for glob in NOISY):
            continue
        if compare_metric(metric, before, value, tolerance_for(metric, tolerances)).change is Change.OK:
            out[metric] = before
    return out


def compare_metric(metric: str, golden: float | None, now: float | None, tol: Tolerance) -> Row:
    if golden is None:
        return Row(metric, None, now, tol, Change.NEW)
    if now is None:
        return Row(metric, golden, None, tol, Change.GONE)
    delta = now - golden
    if any(fnmatch.fnmatchcase(metric, glob) for glob in HIGHER_IS_BETTER):
        delta = -delta
    allowed = tol.allowed(golden)
    change = Change.REGRESSION if delta > allowed else Change.IMPROVEMENT if -delta > allowed else Change.OK
    return Row(metric, golden, now, tol, change)


def compare(
    golden: Mapping[str, float], now: Mapping[str, float], tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES
) -> list[Row]:
    """Compares every metric present on either side, sorted by name."""
    return [
        compare_metric(m, golden.get(m), now.get(m), tolerance_for(m, tolerances))
        for m in sorted(set(golden) | set(now))
    ]


def verdict(rows: Sequence[Row]) -> Verdict:
    """REGRESSION if any metric grew beyond tolerance, else IMPROVEMENT if any dropped, else PASS."""
    changes = {r.change for r in rows}
    if Change.REGRESSION in changes:
        return Verdict.REGRESSION
    if Change.IMPROVEMENT in changes:
        return Verdict.IMPROVEMENT
    return Verdict.PASS
