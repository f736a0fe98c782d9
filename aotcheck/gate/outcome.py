"""The result of checking one case, as plain typed data that round-trips through JSON.

An :class:`Outcome` crosses every boundary with its type: from the check to the
pytest item, through pytest-xdist (as JSON in the report's ``user_properties``),
into the JSON report, and back out of it for the Markdown summary and the chart.
It holds the records it was judged from (the :class:`Measurement`, the
:class:`~aotcheck.gate.golden.Golden`, or the :class:`Failure` that left no figures)
and the one worded field, ``message``, that the session words with :mod:`aotcheck.render.text`.

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.pipeline.measurement import Measurement
    >>> from aotcheck.gate.outcome import Outcome
    >>> from aotcheck.gate.verdict import Verdict
    >>> case = Case.of("lm-tiny", "prefill", "v4-8")
    >>> outcome = Outcome(case, Verdict.PASS, measured=Measurement(case, {"peak_bytes": 1024}, {}, 2.0))
    >>> Outcome.from_json(outcome.to_json()) == outcome
    True
    >>> outcome.to_json()["verdict"], outcome.golden_path, outcome.figures
    ('pass', 'lm-tiny/prefill@v4-8x1.json', {'peak_bytes': 1024})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotcheck.errors import Overflow
from aotcheck.figures.program import Details, Figures
from aotcheck.gate.compare import Change, Row
from aotcheck.gate.golden import Golden, toolchain_note
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement


@dataclasses.dataclass(frozen=True)
class Failure:
    """What went wrong with a case, as text: an error that left no figures (then ``details`` may say
    what filled the memory, ``overflow`` which memory space other than HBM an op overflowed, and
    ``log`` is what a compile process that died printed, whole), or why figures that exist fail
    (over HBM, a golden that cannot be read or written)."""

    text: str
    details: Details | None = None
    log: tuple[str, ...] = ()
    overflow: Overflow | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"text": self.text, "details": self.details.to_json() if self.details is not None else None,
               "log": list(self.log)}
        return {**out, "overflow": self.overflow.to_json()} if self.overflow is not None else out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Failure":
        details, overflow = data.get("details"), data.get("overflow")
        return cls(str(data["text"]), Details.from_json(details) if details is not None else None,
                   tuple(str(line) for line in data.get("log") or ()),
                   Overflow.from_json(overflow) if overflow else None)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What checking one case found.

    Attributes:
        case: The case.
        verdict: What was found.
        failed: Whether the case failed, as judged by its session (strict or not).
        measured: What measuring it produced (None if it did not compile).
        golden: The golden it was compared with (None: none was, or none could be read).
        changes: The metrics that are not within tolerance.
        error: What went wrong, when something did.
        golden_action: What ``--update-golden`` did, when it ran.
        notes: What the session had to say once while checking it (e.g. a cache that stopped working).
        message: One paragraph for the user (a table for regressions), with the fix: worded by the session.
    """

    case: Case
    verdict: Verdict
    failed: bool = False
    measured: Measurement | None = None
    golden: Golden | None = None
    changes: list[Row] = dataclasses.field(default_factory=list)
    error: Failure | None = None
    golden_action: GoldenAction | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    message: str = ""

    @classmethod
    def skip(cls, case: Case, reason: str) -> "Outcome":
        """A case not run, with the reason."""
        return cls(case, Verdict.SKIPPED, message=reason)

    @classmethod
    def internal_error(cls, case: Case, message: str) -> "Outcome":
        """A case that failed outside the check, so that it is not lost from the report."""
        return cls(case, Verdict.ERROR, failed=True, error=Failure(message), message=message)

    # Views of the records, as the readers of an outcome ask for them.

    @property
    def figures(self) -> Figures | None:
        return self.measured.figures if self.measured is not None else None

    @property
    def details(self) -> Details | None:
        """What explains the figures, or what filled the memory of a compile that ran out of it."""
        if self.measured is not None:
            return self.measured.details
        return self.error.details if self.error is not None else None

    @property
    def golden_figures(self) -> Figures | None:
        return self.golden.figures if self.golden is not None else None

    @property
    def golden_details(self) -> Details | None:
        return Details.from_json(self.golden.details) if self.golden is not None else None

    @property
    def toolchain_note(self) -> str | None:
        """How the golden's toolchain differs from this process's."""
        return toolchain_note(self.golden.toolchain, platform=self.case.topology.platform) if self.golden is not None else None

    @property
    def drift_warning(self) -> bool:
        """Figures were new or gone against the golden and the session let that pass."""
        return self.verdict is Verdict.PASS and any(r.change in (Change.NEW, Change.GONE) for r in self.changes)

    @property
    def golden_path(self) -> str:
        """The golden file, relative to the golden directory."""
        return self.case.golden_relpath

    def moved(self) -> list[Row]:
        """Metrics that grew or dropped beyond tolerance."""
        return [r for r in self.changes if r.change in (Change.REGRESSION, Change.IMPROVEMENT)]

    def to_json(self) -> dict[str, Any]:
        measured = self.measured.to_json() if self.measured is not None else None
        if measured is not None:
            measured.pop("hlo_text")  # The program's text is --explain's, never the report's.
        return {
            "case": self.case.id,
            "config": self.case.config,
            "program": self.case.program,
            "topology": self.case.topology.name,
            "num_slices": self.case.num_slices,
            "verdict": self.verdict.value,
            "failed": self.failed,
            "measured": measured,
            "golden": self.golden.to_json() if self.golden is not None else None,
            "golden_path": self.golden_path,
            "changes": [r.to_json() for r in self.changes],
            "error": self.error.to_json() if self.error is not None else None,
            "golden_action": self.golden_action.value if self.golden_action else None,
            "notes": list(self.notes),
            "message": self.message,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Outcome":
        """The inverse of :meth:`to_json`; KeyError/ValueError on a document that is not one."""
        case = Case.parse(data["case"])
        measured, golden, error = data.get("measured"), data.get("golden"), data.get("error")
        return cls(
            case=case,
            verdict=Verdict(data["verdict"]),
            failed=bool(data.get("failed")),
            measured=Measurement.from_json(measured, case=case) if measured is not None else None,
            golden=Golden.from_json(golden, path=Path(case.golden_relpath)) if golden is not None else None,
            changes=[Row.from_json(r) for r in data.get("changes") or []],
            error=Failure.from_json(error) if error is not None else None,
            golden_action=GoldenAction(data["golden_action"]) if data.get("golden_action") else None,
            notes=list(data.get("notes") or []),
            message=data.get("message") or "",
        )


def sort_outcomes(outcomes: list[Outcome]) -> list[Outcome]:
    """Failures first, then by verdict rank, then by id: the order every report shows."""
    return sorted(outcomes, key=lambda o: (not o.failed, o.verdict.rank(), o.case.id))
