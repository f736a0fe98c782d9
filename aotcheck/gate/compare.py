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
import difflib
import enum
import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping, Sequence

from aotcheck.records import Record
from aotcheck.errors import AotcheckError
from aotcheck.figures.scoped import FIGURES as SCOPED_FIGURES
from aotcheck.figures.table import ANY_KNOB, FIGURES, Unit, Worse, describe, fit_max, parse
from aotcheck.gate.verdict import Verdict


class ToleranceError(AotcheckError, ValueError):
    """A tolerance line that does not parse."""


@dataclasses.dataclass(frozen=True)
class Tolerance(Record):
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


# Defaults, first match wins (aotcheck.figures.table). Figures are bit-identical across runs on one
# toolchain, so these only absorb deliberate small changes.
DEFAULT_TOLERANCES: tuple[tuple[str, Tolerance], ...] = tuple((f.glob, Tolerance(*f.tolerance)) for f in FIGURES)

# Units of a tolerance's absolute floor, by what they measure: bytes (B and the binary units), plain
# multipliers (powers of 1000: counts, FLOPs, bytes in decimal units), time (for seconds figures).
_BYTE_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SI_UNITS = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_TIME_UNITS = {"s": 1, "ms": 1e-3, "us": 1e-6, "min": 60}
_UNITS = {"": 1, **_BYTE_UNITS, **_SI_UNITS, **_TIME_UNITS}
# Each kind of unit: its units, how a message says it, the figure units (aotcheck.figures.table) it may floor.
_UNIT_KINDS = ((_BYTE_UNITS, "a unit of bytes", (Unit.BYTES,)), (_TIME_UNITS, "a unit of time", (Unit.SECONDS,)),
               (_SI_UNITS, "a multiplier (a power of 1000), not a unit of time", (Unit.BYTES, Unit.COUNT, Unit.FLOPS)))
# How to write a floor for a figure of each unit.
_FLOOR_HINTS = {
    Unit.SECONDS: "give a seconds figure's floor in s, ms or min (or no unit: seconds), e.g. '*_cpu_seconds = 400% + 10s'",
    Unit.BYTES: "give a bytes figure's floor in B, KiB, MiB, GiB, TiB (or K, M, G, T: powers of 1000), "
             "e.g. 'peak_bytes = 1% + 64KiB'",
    Unit.COUNT: "give a count's floor as a number, or with K, M, G, T (powers of 1000), e.g. 'comm_*_count = 0% + 2'",
    Unit.FLOPS: "give a FLOP count's floor as a number, or with K, M, G, T (powers of 1000), e.g. 'flops = 1% + 1G'",
}
_NUMBER = r"[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?"
_LINE = re.compile(
    rf"^\s*(?P<glob>[^=\s]+)\s*=\s*(?:(?P<rel>{_NUMBER})\s*%)?\s*(?:\+?\s*(?P<abs>{_NUMBER})\s*(?P<unit>[a-z]*))?\s*$",
    re.IGNORECASE,
)


def _parse_line(line: str) -> tuple[str, Tolerance, str]:
    """A line's glob, tolerance, and its floor's unit as written ("" for none)."""
    match = _LINE.match(line)
    if not match or (match["rel"] is None and match["abs"] is None):
        raise ToleranceError(
            f"Cannot parse tolerance {line!r}; write METRIC_GLOB = REL% [+ ABS[unit]], "
            "e.g. 'peak_bytes = 1% + 64KiB' or 'flops* = 0.5%'."
        )
    unit = match["unit"] or ""
    if unit.lower() not in _UNITS:
        raise ToleranceError(f"Unknown unit {unit!r} in tolerance {line!r}; use B, KiB, MiB, GiB, TiB or K, M, G, T "
                             "for bytes and counts, s, ms or min for seconds.")
    rel = float(match["rel"]) / 100 if match["rel"] is not None else 0.0
    absolute = float(match["abs"]) * _UNITS[unit.lower()] if match["abs"] is not None else 0.0
    return match["glob"], Tolerance(rel, absolute), unit


def parse_tolerance_line(line: str) -> tuple[str, Tolerance]:
    """``"peak_bytes = 0.5% + 1MiB"`` -> ``("peak_bytes", Tolerance(0.005, 1048576))``; a seconds figure's
    floor may be given in time units: ``"*_cpu_seconds = 400% + 2min"`` -> ``Tolerance(4.0, 120.0)``."""
    glob, tolerance, _ = _parse_line(line)
    return glob, tolerance


def _names(known: Sequence[str], knobs: Collection[str] | None) -> list[str]:
    """The figure names a glob may match: ``known``, with its ``fit_max_KNOB`` as each knob's figure
    (``knobs`` None: not known yet; ``fit_max_batch`` and the pattern stand for them)."""
    names = [n for n in known if n != ANY_KNOB]
    if ANY_KNOB in known:
        names += [fit_max(k) for k in sorted(knobs)] if knobs is not None else [fit_max("batch"), ANY_KNOB]
    return list(dict.fromkeys(names))


def over_knobs(glob: str) -> bool:
    """Whether a tolerance's glob is over ``fit_max_<knob>`` figures (whose knobs come with the configs)."""
    name = parse(glob)
    return name is not None and name.family == "fit_max"


def _no_figure(glob: str, line: str, names: Sequence[str]) -> ToleranceError:
    """A glob that matches no figure: the line, every figure, and the closest with the line it would make."""
    close = difflib.get_close_matches(glob, [n for n in names if n != ANY_KNOB], n=1, cutoff=0.6)
    fix = f"; the closest is {close[0]}: did you mean {line.replace(glob, close[0], 1)!r}?" if close else ""
    return ToleranceError(f"{glob!r} in {line!r} matches no figure, so it would tolerate nothing; "
                          f"figures are: {', '.join(sorted(names))}{fix}")


def _check_unit(glob: str, line: str, unit: str, matched: Sequence[str]) -> None:
    """ToleranceError for a floor whose unit measures something else than the figures the glob matches
    (a unit of bytes on a seconds figure, a unit of time on a bytes figure)."""
    if not unit:
        return
    kinds = {describe(name).unit: name for name in sorted(matched, reverse=True)}
    units, words, floors = next(k for k in _UNIT_KINDS if unit.lower() in k[0])
    if any(kind in floors for kind in kinds):
        return
    kind, example = sorted(kinds.items())[0]
    raise ToleranceError(f"{unit!r} in {line!r} is {words}, but {glob!r} matches {kind} figures "
                         f"({', '.join(sorted(matched)[:4])}): {_FLOOR_HINTS.get(kind, 'give the floor in its unit')}.")


def parse_tolerances(
    lines: Iterable[str], *, known: Sequence[str] = (), knobs: Collection[str] | None = None,
) -> tuple[tuple[str, Tolerance], ...]:
    """User lines first, then the defaults. With ``known`` (every figure name; ``fit_max_KNOB`` for
    any knob's), a glob that matches none of them is an error: the growth it meant to catch would pass;
    so is a floor in a unit of another kind than the figures it matches. ``knobs``: the knob names of the
    configs (None: not known yet, so a glob over ``fit_max_`` figures is checked later, by
    :func:`check_knob_tolerances`).

    Example:
        >>> parse_tolerances(["peak_byte = 0%"], known=["peak_bytes", "flops"])
        Traceback (most recent call last):
        ...
        aotcheck.gate.compare.ToleranceError: 'peak_byte' in 'peak_byte = 0%' matches no figure, so it would tolerate nothing; figures are: flops, peak_bytes; the closest is peak_bytes: did you mean 'peak_bytes = 0%'?
        >>> parse_tolerances(["peak_bytes = 1% + 10s"], known=["peak_bytes"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        aotcheck.gate.compare.ToleranceError: 's' in 'peak_bytes = 1% + 10s' is a unit of time, but 'peak_bytes' matches bytes figures (peak_bytes): ...
    """
    given = [line.strip() for line in lines if line.strip()]
    parsed = [_parse_line(line) for line in given]
    if known:
        names = _names(known, knobs)
        for (glob, _, unit), line in zip(parsed, given):
            matched = [n for n in names if fnmatch.fnmatchcase(n, glob)]
            if not matched and (knobs is not None or not over_knobs(glob)):
                raise _no_figure(glob, line, names)
            _check_unit(glob, line, unit, matched or [ANY_KNOB])
    return tuple((glob, tolerance) for glob, tolerance, _ in parsed) + DEFAULT_TOLERANCES


def check_knob_tolerances(tolerances: Sequence[tuple[str, Tolerance]], *, known: Sequence[str],
                          knobs: Collection[str]) -> None:
    """ToleranceError for a parsed line over ``fit_max_`` figures that matches none of ``knobs``' (a typo,
    ``fit_max_batchh``, or a knob no config offers): checked once the configs are known.

    Example:
        >>> check_knob_tolerances(parse_tolerances(["fit_max_batchh = 5%"]), known=["fit_max_KNOB"], knobs=["batch"])
        Traceback (most recent call last):
        ...
        aotcheck.gate.compare.ToleranceError: 'fit_max_batchh' in 'fit_max_batchh = 5%' matches no figure, so it would tolerate nothing; figures are: fit_max_batch; the closest is fit_max_batch: did you mean 'fit_max_batch = 5%'?
    """
    names = _names(known, knobs)
    for glob, tolerance in tolerances:
        if over_knobs(glob) and not any(fnmatch.fnmatchcase(n, glob) for n in names):
            parts = [f"{tolerance.rel * 100:g}%"] if tolerance.rel or not tolerance.abs else []
            parts += [f"{tolerance.abs:g}"] if tolerance.abs else []
            raise _no_figure(glob, f"{glob} = {' + '.join(parts)}", names)


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
class Row(Record):
    """One metric's comparison."""

    metric: str
    golden: int | float | None  # Bytes stay integers, FLOPs floats, as the figures hold them.
    now: int | float | None
    tolerance: Tolerance
    change: Change

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
# A memory space's limit -> its use: the pair judged as headroom (see compare).
HEADROOM = {limit: use for use, limit in SCOPED_FIGURES.values()}
HIGHER_IS_BETTER = tuple(f.glob for f in FIGURES if f.worse is Worse.LESS)
# Figures that differ from run to run (timings). Their tolerance is a factor either way (see compare_metric),
# and --update-golden keeps a golden's value only while it is near the new one (the figure's ``near``).
NOISY = tuple(f.glob for f in FIGURES if f.noisy)


def _noisy(metric: str) -> bool:
    return any(fnmatch.fnmatchcase(metric, glob) for glob in NOISY)


def settle_noisy(golden: Mapping[str, float] | None, now: Mapping[str, float],
                 tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES) -> dict[str, float]:
    """``now`` with each noisy figure put back to the golden's value while the two are near each other.

    Near is both ways: within the figure's ``near`` band (:mod:`aotcheck.figures.table`; compile seconds:
    within 2x or 1 s of each other, measured from the smaller) and within its tolerance, so the gate
    would pass either value against the other. A golden kept is therefore never more than 2x (or 1 s)
    above what this machine measures: one recorded on a slow machine, or an outlier, is replaced by the
    new value, and the gate stays as tight as the figures now allow.

    Example:
        >>> settle_noisy({"compile_cpu_seconds": 3.0, "peak_bytes": 10}, {"compile_cpu_seconds": 3.4, "peak_bytes": 11})
        {'compile_cpu_seconds': 3.0, 'peak_bytes': 11}
        >>> settle_noisy({"compile_cpu_seconds": 50.0}, {"compile_cpu_seconds": 0.5})  # Far: the new value.
        {'compile_cpu_seconds': 0.5}
    """
    out = dict(now)
    for metric, value in now.items():
        before = (golden or {}).get(metric)
        if before is None or not _noisy(metric):
            continue
        near = Tolerance(*describe(metric).near)
        if abs(value - before) <= near.allowed(min(abs(before), abs(value))) \
                and compare_metric(metric, before, value, tolerance_for(metric, tolerances)).change is Change.OK:
            out[metric] = before
    return out


def compare_metric(metric: str, golden: float | None, now: float | None, tol: Tolerance) -> Row:
    """One metric against its golden. A noisy figure's tolerance is a factor either way, measured from the
    smaller of the two values: a drop to a fifth (and by over 10 s) is as far beyond ``400% + 10`` as a
    growth to five times is; measured from the golden, a relative tolerance of 100% or more would never
    see a drop, and a golden far above the figures would hide for good that the gate had gone slack.

    Example:
        >>> compare_metric("compile_cpu_seconds", 50.0, 0.5, Tolerance(4.0, 10.0)).change
        <Change.IMPROVEMENT: 'improvement'>
    """
    if golden is None:
        return Row(metric, None, now, tol, Change.NEW)
    if now is None:
        return Row(metric, golden, None, tol, Change.GONE)
    delta = now - golden
    if any(fnmatch.fnmatchcase(metric, glob) for glob in HIGHER_IS_BETTER):
        delta = -delta
    allowed = tol.allowed(min(golden, now, key=abs) if _noisy(metric) else golden)
    change = Change.REGRESSION if delta > allowed else Change.IMPROVEMENT if -delta > allowed else Change.OK
    return Row(metric, golden, now, tol, change)


def compare(
    golden: Mapping[str, float], now: Mapping[str, float], tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES
) -> list[Row]:
    """Compares every metric present on either side, sorted by name. A memory space's limit is no cost
    (raising it is no regression): where both sides hold it and its use, their difference is judged
    instead, as ``*_headroom_bytes`` (less is worse).

    Example:
        >>> rows = compare({"vmem_scoped_bytes": 8, "vmem_limit_bytes": 16 << 20}, {"vmem_scoped_bytes": 8,
        ...                "vmem_limit_bytes": 32 << 20}, parse_tolerances([]))
        >>> [(r.metric, r.change.value) for r in rows]
        [('vmem_headroom_bytes', 'improvement'), ('vmem_scoped_bytes', 'ok')]
    """
    rows = []
    for m in sorted(set(golden) | set(now)):
        use = HEADROOM.get(m)
        if use is not None and all(k in side for side in (golden, now) for k in (m, use)):
            name = m.replace("_limit_bytes", "_headroom_bytes")
            rows.append(compare_metric(name, golden[m] - golden[use], now[m] - now[use], tolerance_for(name, tolerances)))
            continue
        rows.append(compare_metric(m, golden.get(m), now.get(m), tolerance_for(m, tolerances)))
    return sorted(rows, key=lambda r: r.metric)


def verdict(rows: Sequence[Row]) -> Verdict:
    """REGRESSION if any metric grew beyond tolerance, else IMPROVEMENT if any dropped, else PASS."""
    changes = {r.change for r in rows}
    if Change.REGRESSION in changes:
        return Verdict.REGRESSION
    if Change.IMPROVEMENT in changes:
        return Verdict.IMPROVEMENT
    return Verdict.PASS
