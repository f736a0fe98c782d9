"""The JSON report: every case's outcome, stale goldens and broken configs, typed both ways.

A session writes one (``--aot-report=PATH``, ``aotcheck check --report PATH``);
CI shards each write theirs and :func:`merge_reports` joins them. Golden paths
are relative to ``golden_dir``, itself relative to the rootdir (the directory
of the pytest configuration) when it lies inside it.

Example:
    >>> import pathlib, tempfile
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.gate.outcome import Outcome
    >>> from aotcheck.gate.verdict import Verdict
    >>> report = Report([Outcome(Case.of("lm", "prefill", "v4-8"), Verdict.PASS)], golden_dir="golden")
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "report.json"
    >>> write_report(path, report)
    >>> load_report(path) == report
    True
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aotcheck.records import Record, field
from aotcheck.errors import AotcheckError
from aotcheck import _runtime
from aotcheck.figures.program import value_problem
from aotcheck.figures.fit import Pools
from aotcheck.gate.analysis import analyse
from aotcheck.gate.bill import FIGURE as BILL_FIGURE, Bill, served
from aotcheck.gate.golden import atomic_write_text, toolchain_problem
from aotcheck.gate.outcome import Outcome, sort_outcomes
from aotcheck.gate.run import Interrupted
from aotcheck.gate.upgrade import Upgrade
from aotcheck.programs.serving import KV_KNOB, Server

# 2: typed outcomes (changes with their tolerance), relative golden paths, broken configs.
# 3: an outcome holds its records: the measurement, the golden, the failure (aotcheck.gate.outcome).
REPORT_FORMAT = 3


class ReportError(AotcheckError, ValueError):
    """A report file that cannot be read or comes from another report format."""


@dataclasses.dataclass
class Report(Record):
    """What one session (or several merged shards) found.

    Attributes:
        outcomes: Every case's outcome, failures first.
        golden_dir: Where the golden files are (golden paths are relative to it).
        stale: Golden files with no registered case (relative paths).
        removed: Stale golden files a full ``--update-golden`` removed.
        broken: Config name -> why building it failed.
        shard: ``(K, N)`` when the session ran shard K of N.
        toolchain: The versions behind the figures: jax, jaxlib and each target platform's compiler (the
            session's; libtpu's when not given).
        notes: What the session had to say once (an unwritable cache, ...).
        bills: Each server's start-up bill per target (:mod:`aotcheck.gate.bill`).
        accept_args: The run's options an accept command must repeat (launch flags, presets off, ...),
            so that one printed from the report (a bill's) accepts the figures judged.
        interrupted: What ended the run early, when something did.
        matrix: A digest of the run's whole matrix (:attr:`aotcheck.plan.Plan.matrix_digest`), the same in
            each of its shards; None in a merged report or one from before it was recorded.
        servers: Config name -> its :class:`~aotcheck.programs.serving.Server`, for each server the run's plan
            selected (:attr:`aotcheck.plan.Plan.servers`): what a merge of shards judges their bills by. Not
            written: a report read back has them from its bills (their ``load_order`` and ``pages``).
        pools: Each program searched on several pools, as one answer over them; and
        upgrade: the toolchain upgrade the goldens show: both derived from the outcomes by
            :func:`aotcheck.gate.analysis.analyse` (a session's, a merge's), not written (a merge derives them
            again), and not compared.
    """

    # A case fails by its verdict whatever its ``failed`` field says (a regression said to pass still fails);
    # the field can only add a failure: an improvement's, which fails under strict (recorded only there).
    # A report read back keeps its cases in the order its writer gave them (an older one's: by their ids' text).
    outcomes: list[Outcome] = field(default_factory=list, key="cases", decode=lambda cases, _: _AsWritten(
        o if o.failed or not o.verdict.fails() else dataclasses.replace(o, failed=True)
        for o in map(Outcome.from_json, cases)))
    golden_dir: str = "golden"
    stale: list[str] = field(default_factory=list, key="stale_goldens")
    removed: list[str] = field(default_factory=list, key="removed_goldens")
    broken: dict[str, str] = field(default_factory=dict, key="broken_configs")
    shard: tuple[int, int] | None = None
    toolchain: dict[str, str | None] = field(default_factory=_runtime.toolchain)
    notes: list[str] = field(default_factory=list)
    bills: list[Bill] = field(default_factory=list, key="startup_bills")
    accept_args: list[str] = field(default_factory=list)
    interrupted: Interrupted | None = None
    matrix: str | None = None
    servers: dict[str, Server] = field(default_factory=dict, skip=True)
    pools: list[tuple[str, Pools]] = field(default_factory=list, compare=False, skip=True)
    upgrade: Upgrade | None = field(default=None, compare=False, skip=True)

    __json_extra__ = {"aotcheck_report": lambda report: REPORT_FORMAT}

    @classmethod
    def __json_read__(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        return {"toolchain": {}, **data}  # A report that recorded none: not this process's toolchain.

    def __post_init__(self) -> None:
        self.outcomes = list(self.outcomes) if isinstance(self.outcomes, _AsWritten) else sort_outcomes(
            list(self.outcomes))
        if not self.servers:  # A report read back: its bills carry what it knew of its servers.
            self.servers = servers_of(self.bills)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failed]

    @property
    def passed(self) -> bool:
        """No case failed, every config built, and no server's start-up bill grew beyond its tolerance."""
        return not self.failed and not self.broken and not any(b.failed for b in self.bills)

    def served(self) -> list[tuple[Bill, list[Outcome]]]:
        """Each bill with its buckets' outcomes, as a server's table lists them: its programs in the order it
        loads them (then any other in the order they came), each's buckets largest first (by their sizes)."""
        out = []
        for bill in self.bills:
            group = [o for o in self.outcomes if served(o) and (o.case.config, o.case.target.name) ==
                     (bill.config, bill.target)]
            order = {p: k for k, p in enumerate(dict.fromkeys([*bill.load_order, *(o.case.program for o in group)]))}
            out.append((bill, sorted(group, key=lambda o: (order[o.case.program],
                                                         tuple(-size for size in o.case.bucket.values())))))
        return out


class _AsWritten(list):
    """A report's cases as its file lists them (not sorted again)."""


def servers_of(bills: Sequence[Bill]) -> dict[str, Server]:
    """The servers a run's bills name, as much as a bill carries of its server (its load order, its KV pool's
    configured pages; what a device may hold is each bill's ``usable``)."""
    out: dict[str, Server] = {}
    for bill in bills:
        out.setdefault(bill.config, Server(bill.config, bill.load_order, KV_KNOB if bill.pages is not None else None,
                                           bill.pages))
    return out


def dumps_report(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n"


def write_report(path: Path, report: Report) -> None:
    """Writes ``report`` atomically (never a half-written file)."""
    atomic_write_text(Path(path), dumps_report(report))


def load_report(path: Path) -> Report:
    """Reads a report; ReportError names the file and what is wrong with it."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: not a readable JSON report ({e})") from e
    if not isinstance(doc, dict) or doc.get("aotcheck_report") != REPORT_FORMAT:
        found = doc.get("aotcheck_report") if isinstance(doc, dict) else None
        raise ReportError(f"{path}: not an aotcheck report of format {REPORT_FORMAT} (found {found!r}); "
                          "write it again with this aotcheck (--aot-report=PATH)")
    for field in ("cases", "startup_bills"):  # Its own format, but a field of the wrong shape: that field named.
        if field in doc and not isinstance(doc[field], list) or field == "cases" and field not in doc:
            raise ReportError(f"{path}: its {field!r} is {type(doc.get(field)).__name__}, not a list; "
                              "write the report again (--aot-report=PATH)")
    problem = toolchain_problem(doc.get("toolchain") or {})
    if problem:  # Versions of another type would break the toolchain tables: the file's error, named.
        raise ReportError(f"{path}: {problem}; write the report again (--aot-report=PATH)")
    for case in doc["cases"]:
        golden = case.get("golden") if isinstance(case, dict) else None
        problem = toolchain_problem(golden.get("toolchain") or {}) if isinstance(golden, dict) else None
        if problem:
            raise ReportError(f"{path}: case {case.get('case')}, in its golden: {problem}; write the report "
                              "again (--aot-report=PATH)")
    try:
        for bill in doc.get("startup_bills") or []:
            Bill.from_json(bill)
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise ReportError(f"{path}: a start-up bill in this report is malformed ({type(e).__name__}: {e}); "
                          "write the report again (--aot-report=PATH)") from e
    try:
        report = Report.from_json(doc)
        for outcome in report.outcomes:
            outcome.golden_details  # noqa: B018  (parsed here, so a malformed one is this error, not a later one)
        for case in doc["cases"]:
            for record in (case.get("measured"), case.get("golden")):
                if record is not None and not isinstance(record.get("figures"), dict):
                    raise TypeError(f"case {case['case']}: its figures are not an object")
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise ReportError(f"{path}: a case in this report is malformed ({type(e).__name__}: {e})") from e
    for outcome in report.outcomes:
        for which, figures in (("figures", outcome.figures), ("golden", outcome.golden_figures)):
            problem = next(filter(None, (value_problem(k, v) for k, v in (figures or {}).items())), None)
            if problem:
                raise ReportError(f"{path}: case {outcome.case.id}: {problem}" + (" (in its golden)" if which == "golden"
                                  else "") + "; write the report again (--aot-report=PATH)")
    return report


@dataclasses.dataclass
class Merged:
    """Reports of several shards, merged, and what was wrong with the set."""

    report: Report
    problems: list[str]  # Unreadable reports, missing shards.

    @property
    def failed(self) -> bool:
        return not self.report.passed or bool(self.problems)


def _toolchain_words(toolchain: Mapping[str, str | None]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(toolchain.items()))


def _analysed(outcomes: list[Outcome], shard_bills: list[Bill], servers: Mapping[str, Server],
              toolchain: Mapping[str, str | None]) -> dict[str, Any]:
    """The run's analyses over the merged cases (:func:`aotcheck.gate.analysis.analyse`), as a Report's fields.
    A shard's bill carries the tolerance its run judges by (none under an update) and what a device may hold,
    as that run found them; the servers are those the shards recorded."""
    judged = [b for b in shard_bills if b.tolerance is not None and not b.accepted]
    found = analyse(outcomes, servers, toolchain=toolchain,
                    tolerances=[(BILL_FIGURE, judged[0].tolerance)] if judged else (), judge=bool(judged),
                    usable={(b.config, b.target): b.usable for b in shard_bills if b.usable})
    return {"outcomes": found.outcomes, "bills": found.bills, "pools": found.pools, "upgrade": found.upgrade}


def merge_reports(paths: Sequence[Path], *, expect_shards: int | None = None) -> Merged:
    """Merges shard reports; names unreadable ones, shards with no report, and cases in two reports (shards
    never share a case: the merge keeps the failing copy, so no report can hide another's failure), and
    goes on."""
    outcomes: dict[str, Outcome] = {}
    source: dict[str, Path] = {}  # Case id -> the report it was read from.
    shared: dict[tuple[Path, Path], list[str]] = {}  # (first report, later report) -> the cases both hold.
    stale, removed = set[str](), set[str]()
    broken: dict[str, str] = {}
    golden_dir = "golden"
    accept_args: list[str] = []
    notes: list[str] = []
    interrupted: Interrupted | None = None  # A shard's interruption (the first that says one).
    toolchain: dict[str, str | None] | None = None
    problems: list[str] = []
    seen_shards: set[int] = set()
    of_shards: dict[int, Path] = {}  # N of each report's recorded shard K/N -> a report that says so.
    matrices: dict[str, Path] = {}  # Each matrix digest recorded -> a report that records it.
    toolchains: dict[Path, dict[str, str | None]] = {}  # Reports whose toolchain is not the first's.
    toolchains_first = Path()
    shard_bills: list[Bill] = []
    servers: dict[str, Server] = {}
    for path in paths:
        try:
            report = load_report(path)
        except ReportError as e:
            problems.append(str(e))
            continue
        for o in report.outcomes:
            first = outcomes.get(o.case.id)
            if first is not None:
                shared.setdefault((source[o.case.id], path), []).append(o.case.id)
                if sort_outcomes([first, o])[0] is first:  # The failing (or more severe) copy counts.
                    continue
            outcomes[o.case.id], source[o.case.id] = o, path
        stale.update(report.stale)  # Every shard sees the same registry, so the same stale files.
        removed.update(report.removed)
        broken.update(report.broken)
        golden_dir = report.golden_dir
        accept_args = accept_args or report.accept_args  # Shards of one run share its options.
        notes += [n for n in report.notes if n not in notes]
        interrupted = interrupted or report.interrupted
        if report.toolchain and toolchain and report.toolchain != toolchain:
            toolchains.setdefault(path, report.toolchain)
        elif report.toolchain and not toolchain:
            toolchain, toolchains_first = report.toolchain, path
        shard_bills += report.bills
        servers = {**report.servers, **servers}  # Every shard's plan has the same servers: the first one's kept.
        if report.shard:
            seen_shards.add(report.shard[0])
            of_shards.setdefault(report.shard[1], path)
        if report.matrix:
            matrices.setdefault(report.matrix, path)
    for (first, later), cases in shared.items():
        held = cases[0] if len(cases) == 1 else f"{len(cases)} cases ({', '.join(sorted(cases))})"
        problems.append(f"{first} and {later} both hold {held}: shards never share a case, so these reports are "
                        "not the shards of one run (or one report was given twice); the merge counts the failing one")
    if toolchains:  # Shards are one run on one toolchain: which one these figures came from is not known.
        first = toolchains_first
        problems.append("these reports were made with different toolchains ("
                        + "; ".join(f"{p}: {_toolchain_words(t)}" for p, t in
                                    [(first, toolchain or {}), *toolchains.items()])
                        + "): merge the shards of one run, each made with the same lock file")
    problems += _split_problems(matrices, of_shards, seen_shards, expect_shards)
    # A server's buckets may run in several shards: its bills are summed again over the merged cases.
    now = toolchain or _runtime.toolchain()
    merged = Report(golden_dir=golden_dir, stale=sorted(stale), removed=sorted(removed), broken=broken, notes=notes,
                    accept_args=accept_args, interrupted=interrupted, toolchain=now, servers=servers,
                    **_analysed(list(outcomes.values()), shard_bills, servers, now))
    return Merged(merged, problems)


def _split_problems(matrices: Mapping[str, Path], of_shards: Mapping[int, Path], seen_shards: set[int],
                    expect_shards: int | None) -> list[str]:
    """What is wrong with how the merged reports split their run: different matrices, different shard
    counts, shards with no report (a report that records its shard is one part of a run)."""
    problems: list[str] = []
    if len(matrices) > 1:
        problems.append("these reports are shards of different matrices (" + ", ".join(
            f"{path}: matrix {digest}" for digest, path in matrices.items()) + "; each shard of one run records the "
            "same digest of the whole case list): merge the shards of one run, made with the same configs, targets "
            "and slices")
    if len(of_shards) > 1:
        problems.append("these reports are shards of runs split differently ("
                        + ", ".join(f"{path}: of {n}" for n, path in sorted(of_shards.items()))
                        + "): merge the shards of one run")
    # A report that records its shard is one part of a run: alone it is incomplete, even unasked.
    expected = expect_shards or (next(iter(of_shards)) if len(of_shards) == 1 else None)
    if expect_shards and of_shards and set(of_shards) != {expect_shards}:
        problems.append(f"--expect-shards {expect_shards}, but the reports say their run was split "
                        f"{' and '.join(str(n) for n in sorted(of_shards))} ways")
    if expected:
        missing = sorted(set(range(1, expected + 1)) - seen_shards)
        problems += [f"shard {k}/{expected} has no report: its runner crashed or was cancelled, or its report was not "
                     "given (a shard alone is part of the run, its start-up bills part of a server's)" for k in missing]
    return problems
