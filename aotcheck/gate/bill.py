"""A server's start-up bill: the compile CPU seconds of its whole bucket matrix on a target, gated.

A server compiles every bucket before it takes traffic (3-6 minutes for 30B-235B models), so the
sum is what a deploy waits for. Each bucket's ``compile_cpu_seconds`` is gated as a case's; the
bill sums them per (config, target) over the buckets that ran and compares the sum with the sum of
their goldens' under the same tolerance (a factor either way, :func:`aotcheck.gate.compare.compare_metric`).
A bill is judged only when every bucket of the group compiled and had a golden (one that did not
fails, or is new, on its own) and ran in this session: a shard whose run holds part of a server's
buckets on a target sums them without judging, and ``merge-reports`` judges the whole under the
tolerance the shards recorded.

Example:
    >>> from pathlib import Path
    >>> from aotcheck.gate.outcome import Outcome
    >>> from aotcheck.gate.golden import Golden
    >>> from aotcheck.gate.verdict import Verdict
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.pipeline.measurement import Measurement
    >>> def bucket(tokens, now, before):
    ...     case = Case.of("llm", f"step[tokens={tokens}]", "v5e-8")
    ...     return Outcome(case, Verdict.PASS, measured=Measurement(case, {"compile_cpu_seconds": now}, {}, now),
    ...                    golden=Golden({"compile_cpu_seconds": before}, {}, {}, Path("g")))
    >>> bill, = startup_bills([bucket(16, 2.0, 2.0), bucket(32, 30.0, 3.0), Outcome.skip(Case.of("lm", "prefill", "v5e-8"), "")])
    >>> bill.config, bill.target, bill.buckets, bill.seconds, bill.row.golden, bill.failed
    ('llm', 'v5e-8x1', 2, 32.0, 5.0, True)
    >>> bill.tolerance  # compile_cpu_seconds's, a factor either way: 400% + 10 s.
    Tolerance(rel=4.0, abs=10.0)
    >>> Bill.from_json(bill.to_json()) == bill
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from aotcheck.gate.compare import DEFAULT_TOLERANCES, Change, Row, Tolerance, compare_metric, tolerance_for
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.programs.serving import parse_bucket

FIGURE = "compile_cpu_seconds"


@dataclasses.dataclass(frozen=True)
class Bill:
    """The compile CPU seconds of one server's buckets on one target.

    Attributes:
        config: The served config.
        target: The target (``v5e-8x1``).
        buckets: How many of its buckets ran.
        seconds: Their compile CPU seconds, summed (those that compiled).
        complete: Whether every bucket that ran compiled and had a golden (only then is it judged).
        row: The sum against the goldens' sum, under the figure's tolerance (None: not judged).
        tolerance: The tolerance the run judges bills by (None: it does not, as ``--update-golden``).
    """

    config: str
    target: str
    buckets: int
    seconds: float
    complete: bool
    row: Row | None = None
    tolerance: Tolerance | None = None

    @property
    def failed(self) -> bool:
        return self.row is not None and self.row.change is Change.REGRESSION

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "target": self.target, "buckets": self.buckets, "seconds": self.seconds,
                "complete": self.complete, "row": self.row.to_json() if self.row is not None else None,
                "tolerance": self.tolerance.to_json() if self.tolerance is not None else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Bill":
        row, tolerance = data.get("row"), data.get("tolerance")
        return cls(str(data["config"]), str(data["target"]), int(data["buckets"]), float(data["seconds"]),
                   bool(data["complete"]), Row.from_json(row) if row else None,
                   Tolerance.from_json(tolerance) if tolerance else None)


def served(outcome: Outcome) -> bool:
    """Whether the case is a bucket of a server (its program named ``step[tokens=64]``)."""
    return parse_bucket(outcome.case.program) is not None


def startup_bills(outcomes: Sequence[Outcome], tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES,
                  *, judge: bool = True, partial: Collection[tuple[str, str]] = ()) -> list[Bill]:
    """One bill per (served config, target) among ``outcomes`` (skipped buckets left out), in the
    order they first appear; ``judge=False`` (an ``--update-golden`` run, which accepts the figures)
    sums without comparing, and so does a ``(config, target)`` in ``partial`` (some of its buckets
    run in another shard)."""
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for o in outcomes:
        if served(o) and o.verdict is not Verdict.SKIPPED:
            groups.setdefault((o.case.config, o.case.target.name), []).append(o)
    tolerance = tolerance_for(FIGURE, tolerances) if judge else None
    bills = []
    for (config, target), group in groups.items():
        now = [(o.figures or {}).get(FIGURE) for o in group]
        before = [(o.golden_figures or {}).get(FIGURE) for o in group]
        seconds = float(sum(s for s in now if s is not None))
        complete = all(s is not None for s in now + before)
        row = compare_metric(FIGURE, float(sum(b for b in before if b is not None)), seconds, tolerance) \
            if tolerance is not None and complete and (config, target) not in partial else None
        bills.append(Bill(config, target, len(group), seconds, complete, row, tolerance))
    return bills


def split_groups(matrix: Iterable[Case], ran: Iterable[Case]) -> set[tuple[str, str]]:
    """The ``(config, target)`` of servers some of whose buckets in ``matrix`` are not among ``ran``
    (run by another shard): their bills cannot be judged here.

    Example:
        >>> cases = [Case.of("llm", f"step[tokens={t}]", "v5e-8") for t in (16, 32)]
        >>> split_groups(cases, cases[:1]), split_groups(cases, cases)
        ({('llm', 'v5e-8x1')}, set())
    """
    ran = set(ran)
    return {(c.config, c.target.name) for c in matrix if parse_bucket(c.program) is not None and c not in ran}
