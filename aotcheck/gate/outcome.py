"""The result of checking one case, as plain typed data that round-trips through JSON.

An :class:`Outcome` crosses every boundary with its type: from the check to the
pytest item, through pytest-xdist (as JSON in the report's ``user_properties``),
into the JSON report, and back out of it for the Markdown summary and the chart.

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.gate.outcome import Outcome
    >>> from aotcheck.gate.verdict import Verdict
    >>> outcome = Outcome(Case.of("lm-tiny", "prefill", "v4-8"), Verdict.PASS, figures={"peak_bytes": 1024})
    >>> Outcome.from_json(outcome.to_json()) == outcome
    True
    >>> outcome.to_json()["verdict"], outcome.golden_path
    ('pass', 'lm-tiny/prefill@v4-8x1.json')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from aotcheck.figures.program import Details, Figures
from aotcheck.pipeline.case import Case
from aotcheck.gate.compare import Change, Row
from aotcheck.gate.verdict import GoldenAction, Verdict


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What checking one case found.

    Attributes:
        case: The case.
        verdict: What was found.
        message: One paragraph for the user (a table for regressions), with the fix.
        failed: Whether the case failed, as judged by its session (strict or not).
        figures: The figures measured (None if it did not compile).
        golden: The golden's figures, when one was compared.
        changes: The metrics that are not within tolerance.
        compile_seconds: Compile time (from the cache entry when ``cached``).
        cached: Figures came from the figures cache: nothing was compiled.
        golden_action: What ``--update-golden`` did, when it ran.
        toolchain_note: How the golden's toolchain differs from this one.
        detail: The full error text, for the report.
        host_peak_bytes: Peak resident memory of the process that compiled it (not gated;
            for sizing CI runners).
        drift_warning: Figures were new or gone against the golden and the session lets that pass.
        notes: What the session had to say once while checking it (e.g. a cache that stopped working).
        details: What explains the figures: the peak's largest buffers, the largest collectives.
        golden_details: The golden's details, when one was compared.
        golden_toolchain: The toolchain the golden was made with, when one was compared.
        log: What a compile process that died on the case printed, whole (a crash handler's
            stack among it): for the report; the message quotes its last lines.
    """

    case: Case
    verdict: Verdict
    message: str = ""
    failed: bool = False
    figures: Figures | None = None
    golden: Figures | None = None
    changes: list[Row] = dataclasses.field(default_factory=list)
    compile_seconds: float | None = None
    cached: bool = False
    golden_action: GoldenAction | None = None
    toolchain_note: str | None = None
    detail: str | None = None
    host_peak_bytes: int | None = None
    drift_warning: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)
    details: Details | None = None
    golden_details: Details | None = None
    golden_toolchain: dict[str, str | None] | None = None
    log: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def skip(cls, case: Case, reason: str) -> "Outcome":
        """A case not run, with the reason."""
        return cls(case, Verdict.SKIPPED, message=reason)

    @classmethod
    def internal_error(cls, case: Case, message: str) -> "Outcome":
        """A case that failed outside the check, so that it is not lost from the report."""
        return cls(case, Verdict.ERROR, message=message, failed=True, detail=message)

    @property
    def golden_path(self) -> str:
        """The golden file, relative to the golden directory."""
        return self.case.golden_relpath

    def moved(self) -> list[Row]:
        """Metrics that grew or dropped beyond tolerance."""
        return [r for r in self.changes if r.change in (Change.REGRESSION, Change.IMPROVEMENT)]

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case.id,
            "config": self.case.config,
            "program": self.case.program,
            "topology": self.case.topology.name,
            "num_slices": self.case.num_slices,
            "verdict": self.verdict.value,
            "failed": self.failed,
            "message": self.message,
            "figures": self.figures,
            "golden": self.golden,
            "changes": [r.to_json() for r in self.changes],
            "compile_seconds": self.compile_seconds,
            "cached": self.cached,
            "golden_path": self.golden_path,
            "golden_action": self.golden_action.value if self.golden_action else None,
            "toolchain_note": self.toolchain_note,
            "detail": self.detail,
            "host_peak_bytes": self.host_peak_bytes,
            "drift_warning": self.drift_warning,
            "notes": list(self.notes),
            "details": self.details.to_json() if self.details is not None else None,
            "golden_details": self.golden_details.to_json() if self.golden_details is not None else None,
            "golden_toolchain": self.golden_toolchain,
            "log": list(self.log),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Outcome":
        """The inverse of :meth:`to_json`; KeyError/ValueError on a document that is not one."""
        return cls(
            case=Case.parse(data["case"]),
            verdict=Verdict(data["verdict"]),
            message=data.get("message") or "",
            failed=bool(data.get("failed")),
            figures=data.get("figures"),
            golden=data.get("golden"),
            changes=[Row.from_json(r) for r in data.get("changes") or []],
            compile_seconds=data.get("compile_seconds"),
            cached=bool(data.get("cached")),
            golden_action=GoldenAction(data["golden_action"]) if data.get("golden_action") else None,
            toolchain_note=data.get("toolchain_note"),
            detail=data.get("detail"),
            host_peak_bytes=data.get("host_peak_bytes"),
            drift_warning=bool(data.get("drift_warning")),
            notes=list(data.get("notes") or []),
            details=Details.from_json(data["details"]) if data.get("details") is not None else None,
            golden_details=Details.from_json(data["golden_details"]) if data.get("golden_details") is not None
            else None,
            golden_toolchain=dict(data["golden_toolchain"]) if data.get("golden_toolchain") else None,
            log=[str(line) for line in data.get("log") or []],
        )


def sort_outcomes(outcomes: list[Outcome]) -> list[Outcome]:
    """Failures first, then by verdict rank, then by id: the order every report shows."""
    return sorted(outcomes, key=lambda o: (not o.failed, o.verdict.rank(), o.case.id))
