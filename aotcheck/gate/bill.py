"""A server's start-up bill: the compile CPU seconds of its whole bucket matrix on a target, gated.

A server compiles every bucket before it takes traffic (3-6 minutes for 30B-235B models), so the
sum is what a deploy waits for. Each bucket's ``compile_cpu_seconds`` is gated as a case's; the
bill sums them per (config, target) over the buckets that ran and compares the sum with the sum of
their goldens' under the same tolerance (a factor either way, :func:`aotcheck.gate.compare.compare_metric`).
A bill is judged only when every bucket of the group compiled and had a golden (one that did not
fails, or is new, on its own) and ran in this session: a shard whose run holds part of a server's
buckets on a target sums them without judging, and ``aotcheck report`` (:func:`aotcheck.gate.report.merge_reports`) judges the whole under the
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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from aotcheck.records import Record, field
from aotcheck.gate.boot import Boot, Start, boot_budget
from aotcheck.targets.usable import Usable, usable_memory
from aotcheck.gate.compare import DEFAULT_TOLERANCES, Change, Row, Tolerance, compare_metric, tolerance_for
from aotcheck.gate.golden import GoldenError, GoldenStore
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.programs.serving import Server

FIGURE = "compile_cpu_seconds"


@dataclasses.dataclass(frozen=True)
class Bill(Record):
    """The compile CPU seconds of one server's buckets on one target.

    Attributes:
        config: The served config.
        target: The target (``v5e-8x1``).
        buckets: How many of its buckets ran.
        seconds: Their compile CPU seconds, summed (those that compiled).
        complete: Whether every bucket that ran compiled and had a golden (only then is it judged).
        row: The sum against the goldens' sum, under the figure's tolerance (None: not judged).
        tolerance: The tolerance the run judges bills by (None: it does not, as ``--update-golden``).
        accepted: An ``--update-golden`` run found the bill beyond its tolerance against the goldens it
            kept (each bucket's noisy seconds near its last) and wrote the measured seconds (:func:`accept_bills`).
        boot: Whether the server starts there, from its buckets' figures (:mod:`aotcheck.gate.boot`; None
            where a bucket lacks a figure it needs).
        booted: How it started by its goldens' figures (None: not judged, or not known).
        usable: What a device may hold there and where that comes from, as this run found it (a GPU's
            memory fraction is its process's): a merge of shards judges their boot by it.
        load_order: Its server's programs in the order it loads them, and ``pages``, its KV pool's configured
            pages (None: none configured), as the plan's :class:`~aotcheck.programs.serving.Server` has them:
            what a report read back knows of its servers (:attr:`aotcheck.gate.report.Report.servers`).
    """

    config: str
    target: str
    buckets: int
    seconds: float
    complete: bool
    row: Row | None = None
    tolerance: Tolerance | None = None
    accepted: bool = False
    boot: Boot | None = None
    booted: Start | None = field(default=None, decode=lambda value, _: _start(value))
    usable: Usable | None = None
    # Its server's, as the plan knew it: a merge of shards judges the bill by them (gate.report).
    load_order: tuple[str, ...] = ()
    pages: int | None = None

    @property
    def boot_lost(self) -> bool:
        """It starts worse than by its goldens' figures (no longer at all, or now only by reloading
        programs on every switch): the run fails."""
        return self.booted is not None and self.boot is not None and self.boot.start.rank > self.booted.rank

    @property
    def grew(self) -> bool:
        """Its seconds grew beyond the tolerance (and no update accepted them)."""
        return self.row is not None and self.row.change is Change.REGRESSION and not self.accepted

    @property
    def failed(self) -> bool:
        return self.grew or self.boot_lost


def _start(value: Any) -> Start | None:
    """A bill's ``booted`` read back (reports before the chip's rules said only whether it started)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return Start.STARTS if value else Start.FAILS
    return Start(value)


def served(outcome: Outcome) -> bool:
    """Whether the case is a bucket of a server (it carries its bucket)."""
    return bool(outcome.case.bucket)


def startup_bills(outcomes: Sequence[Outcome], tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES,
                  *, judge: bool = True, partial: Collection[tuple[str, str]] = (),
                  usable: Mapping[tuple[str, str], Usable] | None = None,
                  servers: Mapping[str, Server] | None = None) -> list[Bill]:
    """One bill per (served config, target) among ``outcomes`` (skipped buckets left out), in the
    order they first appear; ``judge=False`` (an ``--update-golden`` run, which accepts the figures)
    sums without comparing, and so does a ``(config, target)`` in ``partial`` (some of its buckets
    run in another shard). ``usable``: what a device may hold per ``(config, target)`` as the runs that
    measured them found it (a merge of shards) or as the configs and the ini give it (a run); else this process's
    (:func:`aotcheck.targets.usable.usable_memory`). ``servers``: each served config's
    :class:`~aotcheck.programs.serving.Server`: its programs in the order it loads them
    (:func:`aotcheck.gate.boot.load_order`; by name where not given) and its KV pool's configured pages (else a
    fit search's, where one ran). A run's bills come from :func:`aotcheck.gate.analysis.analyse`."""
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
        judged = tolerance is not None and (config, target) not in partial
        row = compare_metric(FIGURE, float(sum(b for b in before if b is not None)), seconds, tolerance) \
            if judged and complete else None
        whole = (config, target) not in partial  # A shard that holds part of a server knows part of its budget.
        room = (usable or {}).get((config, target)) or usable_memory(group[0].case.topology)
        server = (servers or {}).get(config)
        programs, configured = (server.programs, server.pages) if server is not None else ((), None)
        boot = _boot(group, lambda o: o.figures, room, programs, configured) if whole else None
        # The goldens' start as they were made: with what a device could hold then, where they say it.
        made = next((o.golden.usable for o in group if o.golden is not None and o.golden.usable), None)
        then = Usable.from_json(made) if made is not None else room
        was = _boot(group, lambda o: o.golden_figures, then, programs, configured) if judged else None
        bills.append(Bill(config, target, len(group), seconds, complete, row, tolerance, boot=boot,
                          booted=was.start if was is not None else None, usable=room, load_order=tuple(programs),
                          pages=configured))
    return bills


def _boot(group: Sequence[Outcome], figures: Callable[[Outcome], Mapping[str, float] | None],
          usable: Usable | None, programs: Sequence[str], pages: int | None = None) -> Boot | None:
    """The boot budget of one server's buckets on one target, by ``figures``."""
    found = [((o.case.program, o.case.bucket), figures(o)) for o in group]
    if any(f is None for _, f in found):
        return None
    fits = [o.details.fit for o in group if o.details is not None and o.details.fit is not None]
    pages = pages or next((f.configured for f in fits if f.knob == "pages"), None)
    return (boot_budget(found, group[0].case.topology, pages=pages, usable=usable, programs=programs)
            if usable is not None else None)


def accept_bills(outcomes: Sequence[Outcome], store: GoldenStore,
                 tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES, *,
                 partial: Collection[tuple[str, str]] = (),
                 usable: Mapping[tuple[str, str], Usable] | None = None,
                 servers: Mapping[str, Server] | None = None) -> list[Bill]:
    """After an ``--update-golden`` run has written its buckets' goldens: each server's bill judged
    against them. A golden keeps a noisy figure that is near its last value
    (:func:`aotcheck.gate.compare.settle_noisy`), so buckets each near their last can still sum beyond
    the bill's tolerance, and the next check would fail as this one would have. Where it does, each
    bucket's ``compile_cpu_seconds`` is written as measured: the update accepts the bill as it accepts a
    case. Returns every bill, those so written marked ``accepted`` (their row: the kept sum against the
    measured). A server split across shards (``partial``) is summed only: no shard sees its whole bill."""
    tolerance = tolerance_for(FIGURE, tolerances)
    bills = startup_bills(outcomes, judge=False, partial=partial, usable=usable, servers=servers)
    out = []
    for bill in bills:
        group = [o for o in outcomes if served(o) and o.verdict is Verdict.ACCEPTED
                 and (o.case.config, o.case.target.name) == (bill.config, bill.target)]
        try:
            goldens = [store.read(o.case) for o in group]
        except GoldenError:  # One was removed or spoiled since the update wrote it: this bill is not accepted.
            out.append(bill)
            continue
        now = [(o.figures or {}).get(FIGURE) for o in group]
        kept = [(g.figures.get(FIGURE) if g is not None else None) for g in goldens]
        if ((bill.config, bill.target) in partial or not group or len(group) != bill.buckets
                or any(v is None for v in now + kept)):
            out.append(bill)
            continue
        row = compare_metric(FIGURE, float(sum(kept)), float(sum(now)), tolerance)
        if row.change is Change.OK:
            out.append(bill)
            continue
        try:
            for o, golden, seconds in zip(group, goldens, now):
                assert golden is not None
                store.write(o.case, {**golden.figures, FIGURE: seconds}, toolchain=golden.toolchain,
                            compiler_options=golden.compiler_options, details=golden.details, usable=golden.usable,
                            settings=golden.settings, program=golden.program)
        except OSError:  # The cases' own writes succeeded a moment ago; a bill not accepted fails the next check.
            out.append(bill)
            continue
        out.append(dataclasses.replace(bill, row=row, tolerance=tolerance, accepted=True))
    return out


def split_groups(matrix: Iterable[Case], ran: Iterable[Case]) -> set[tuple[str, str]]:
    """The ``(config, target)`` of servers some of whose buckets in ``matrix`` are not among ``ran``
    (run by another shard): their bills cannot be judged here.

    Example:
        >>> cases = [Case.of("llm", f"step[tokens={t}]", "v5e-8") for t in (16, 32)]
        >>> split_groups(cases, cases[:1]), split_groups(cases, cases)
        ({('llm', 'v5e-8x1')}, set())
    """
    ran = set(ran)
    return {(c.config, c.target.name) for c in matrix if c.bucket and c not in ran}
