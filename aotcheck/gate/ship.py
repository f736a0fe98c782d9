"""Ship what you gated: the executable of each case that passed its gate goes to the export destination,
naming the golden it passed against; a case that failed ships nothing (its staged export is removed).

Example:
    >>> from aotcheck.gate.outcome import Outcome
    >>> from aotcheck.gate.verdict import Verdict
    >>> from aotcheck.pipeline.case import Case
    >>> ship("/nonexistent", "out", Outcome(Case.of("m", "step", "cpu-1"), Verdict.REGRESSION), Path("g.json"))
    (None, None)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from aotcheck.gate.outcome import Outcome, Shipped
from aotcheck.pipeline.export import ExportError, discard, publish


def ship(staging: str, dest: str, outcome: Outcome, golden: Path, *,
         strict: bool = False) -> tuple[Shipped | None, str | None]:
    """Publishes ``outcome``'s staged export to ``dest`` when the case passed (its golden's sha256 in the
    manifest): where it went, or a note on what went wrong; discards it when the case failed."""
    case = outcome.case.id
    if outcome.verdict.fails(strict=strict) or outcome.measured is None:
        discard(staging, case)
        return None, None
    try:
        digest = hashlib.sha256(golden.read_bytes()).hexdigest() if golden.is_file() else None
        where, size = publish(staging, dest, case, golden_digest=digest)
    except (OSError, ExportError) as e:
        return None, f"aotcheck: {case} passed its gate but its executable could not be exported to {dest}: {e}"
    return Shipped(where, size), None
