"""The result of checking one case, as plain typed data that round-trips through JSON.

An :class:`Outcome` crosses every boundary with its type: from the check to the
pytest item, through pytest-xdist (as JSON in the report's ``user_properties``),
into the JSON report, and back out of it for the Markdown summary and the chart.
It holds the records it was judged from (the :class:`Measurement`, the
:class:`~aotcheck.gate.golden.Golden`, or the :class:`Failure` that left no figures: a
:class:`Reason` and the error's record, never prose), where its golden is and the command that
accepts it (:class:`Accept`, a record): :mod:`aotcheck.render.text` words its message from them.

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
import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotcheck.records import Record, field
from aotcheck.errors import Overflow, error_to_json
from aotcheck.figures.hbm import HbmVerdict
from aotcheck.figures.program import Details, Figures
from aotcheck.gate.compare import Change, Row
from aotcheck.gate.golden import Golden, toolchain_note
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement


class Reason(enum.Enum):
    """Why a case failed: a code, worded by :mod:`aotcheck.render.text` (the verdict says less: an
    ``error`` may be the config's, user code's, an unwritable golden's or a failure outside the check)."""

    CRASHED = "crashed"  # The compile process died: a WorkerCrashed.
    OUT_OF_MEMORY = "out-of-memory"  # XLA refused it for HBM (OutOfMemory) or another memory space (OutOfMemorySpace).
    COMPILE_ERROR = "compile-error"  # XLA refused it otherwise.
    INPUT = "input"  # aotcheck's own error, which explains itself: the config, mesh, rules, a name, the host, HLO.
    USER_CODE = "user-code"  # Code of the user's raised while building or lowering it.
    OVER_HBM = "over-hbm"  # It compiled, to a peak over the HBM the project allows (``hbm``).
    CORRUPT_GOLDEN = "corrupt-golden"  # Its golden file cannot be read.
    GOLDEN_UNWRITABLE = "golden-unwritable"  # Its golden file (``path``) cannot be written.
    INTERNAL = "internal"  # It failed outside the check (``text``: pytest's report of it).


# What a report written before reasons were recorded meant by each verdict's error.
_REASON_OF_VERDICT = {Verdict.CRASHED: Reason.CRASHED, Verdict.OUT_OF_MEMORY: Reason.OUT_OF_MEMORY,
                      Verdict.COMPILE_ERROR: Reason.COMPILE_ERROR, Verdict.OVER_HBM: Reason.OVER_HBM,
                      Verdict.CORRUPT_GOLDEN: Reason.CORRUPT_GOLDEN}


@dataclasses.dataclass(frozen=True)
class Failure(Record):
    """What went wrong with a case, as a record: why (``reason``), and the error that said so in its
    one JSON form (:func:`aotcheck.errors.error_to_json`: ``type``, its message as ``text``, its
    ``fields``, those a reader needs typed: ``details``, ``log``, ``overflow``); or, for figures
    that exist but fail, the peak against the HBM allowed (``hbm``) or the golden file (``path``).
    No prose of aotcheck's: :mod:`aotcheck.render.text` words it.

    Attributes:
        reason: Why the case failed.
        text: The error's own message, verbatim (XLA's, a config error's, pytest's report); "" when none.
        type: The error's class as its JSON record names it (``builtins.KeyError``); None when none.
        fields: The error's other fields (a crash's signal and last lines, a user error's class name).
        details: What filled the memory of a compile that ran out of it (and a fit search after it).
        log: What a compile process that died printed, whole.
        overflow: What XLA said of the memory it ran out of, in any space (HBM's too: needed, available, its
            breakdown and largest allocations), read once where the compile raised it.
        hbm: The peak over the HBM the project allows (``OVER_HBM``).
        path: The golden file it concerns (``GOLDEN_UNWRITABLE``).

    Example:
        >>> from aotcheck.errors import error_from_json, error_type
        >>> failure = Failure.of(Reason.USER_CODE, KeyError("vocab_size"))
        >>> failure.text, failure.type, failure.type_name
        ('vocab_size', 'builtins.KeyError', 'KeyError')
        >>> error_from_json(failure.record)
        KeyError('vocab_size')
        >>> Failure.from_json(failure.to_json()) == failure
        True
    """

    reason: Reason
    text: str = ""
    type: str | None = field(default=None, omit="none")
    fields: dict[str, Any] = field(default_factory=dict, omit="empty")
    details: Details | None = None
    log: tuple[str, ...] = ()
    overflow: Overflow | None = field(default=None, omit="none")
    hbm: HbmVerdict | None = field(default=None, omit="none")
    path: str | None = field(default=None, omit="none")

    @classmethod
    def of(cls, reason: Reason, error: BaseException, **more: Any) -> "Failure":
        """The record of ``error`` (its JSON form, its details, log and overflow typed); ``more`` sets other
        attributes (``path``; ``text`` where the error's message is not the words to keep)."""
        record = error_to_json(error)
        fields = dict(record.get("fields") or {})
        details, log, overflow = fields.pop("details", None), fields.pop("log", ()), fields.pop("overflow", None)
        return cls(reason, **{"text": record["message"], **more}, type=record["type"], fields=fields,
                   details=Details.from_json(details) if details is not None else None,
                   log=tuple(str(line) for line in log), overflow=Overflow.from_json(overflow) if overflow else None)

    @property
    def record(self) -> dict[str, Any]:
        """The error's JSON form (:func:`aotcheck.errors.error_from_json` makes it again); {} when no error said it."""
        if self.type is None:
            return {}
        fields = {**self.fields, **({"details": self.details.to_json()} if self.details is not None else {}),
                  **({"log": list(self.log)} if self.log else {}),
                  **({"overflow": self.overflow.to_json()} if self.overflow is not None else {})}
        return {"type": self.type, "message": self.text, **({"fields": fields} if fields else {})}

    @property
    def type_name(self) -> str | None:
        """The error's class as user code raised it, even across a worker (:func:`aotcheck.errors.error_type`)."""
        if self.type is None:
            return None
        return str(self.fields.get("type_name") or self.type.rpartition(".")[2])


@dataclasses.dataclass(frozen=True)
class Accept(Record):
    """The command that accepts a case's current figures as its golden, as a record: the case, and the
    options of its run that decide the figures or where goldens are (:mod:`aotcheck.render.accept` words it).

    Example:
        >>> accept = Accept(Case.parse("lm/step[tokens=16]@v5e-16x1"), ("--aot-golden-dir=ci/golden",))
        >>> Accept.from_json(accept.to_json()) == accept
        True
    """

    case: Case
    args: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Shipped(Record):
    """Where a passing case's executable went (``--aot-export``) and its size: a figure of the report,
    not gated.

    Example:
        >>> Shipped.from_json(Shipped("out/m/step@cpu-1x1.manifest.json", 4096).to_json()).payload_bytes
        4096
    """

    manifest: str
    payload_bytes: int


@dataclasses.dataclass(frozen=True)
class Outcome(Record):
    """What checking one case found.

    Attributes:
        case: The case.
        verdict: What was found.
        failed: Whether the case failed, as judged by its session (strict or not).
        measured: What measuring it produced (None if it did not compile).
        golden: The golden it was compared with (None: none was, or none could be read).
        changes: The metrics that are not within tolerance.
        error: What went wrong, when something did: its record (:class:`Failure`).
        golden_action: What ``--update-golden`` did, when it ran.
        notes: What the session had to say once while checking it (e.g. a cache that stopped working).
        reason: Why a skipped case did not run (the plan's reason, or pytest's).
        golden_file: Its golden file, as the user sees the path.
        accept: The command that accepts its figures, as a record.
        shipped: Where its executable was exported, when it passed and the run exports.
    """

    case: Case
    verdict: Verdict
    failed: bool = False
    # The program's text is --explain's, never the report's; a golden is read where its case says.
    measured: Measurement | None = field(default=None, encode=lambda m: _without("hlo_text", m),
                                         decode=lambda data, read: Measurement.from_json(data, case=read["case"]))
    golden: Golden | None = field(default=None, decode=lambda data, read: Golden.from_json(
        data, path=Path(read["case"].golden_relpath)))
    changes: list[Row] = field(default_factory=list)
    error: Failure | None = None
    golden_action: GoldenAction | None = None
    notes: list[str] = field(default_factory=list)
    reason: str = ""
    golden_file: str = ""
    accept: Accept | None = None
    shipped: Shipped | None = field(default=None, omit="none")

    # Written for a reader of the report file, who should not have to parse the case's id; never read back.
    __json_extra__ = {"config": lambda o: o.case.config, "program": lambda o: o.case.program,
                      "bucket": lambda o: dict(o.case.bucket), "topology": lambda o: o.case.topology.name,
                      "num_slices": lambda o: o.case.num_slices, "golden_path": lambda o: o.golden_path}

    @classmethod
    def __json_read__(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        error = data.get("error") if isinstance(data, Mapping) else None
        if not isinstance(error, Mapping) or error.get("reason"):
            return data
        # A report written before reasons were recorded: what its verdict meant.
        reason = _REASON_OF_VERDICT.get(Verdict(data["verdict"]), Reason.INPUT)
        return {**data, "error": {**error, "reason": reason.value}}

    @classmethod
    def skip(cls, case: Case, reason: str) -> "Outcome":
        """A case not run, with the reason (the plan's, or pytest's)."""
        return cls(case, Verdict.SKIPPED, reason=reason)

    @classmethod
    def internal_error(cls, case: Case, report: str) -> "Outcome":
        """A case that failed outside the check, so that it is not lost from the report: ``report`` is
        pytest's, kept verbatim as the error's text."""
        return cls(case, Verdict.ERROR, failed=True, error=Failure(Reason.INTERNAL, report))

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
    def options_changed(self) -> list[tuple[str, str | None, str | None]]:
        """The compiler options the golden's compile and this one's differ in: ``(name, the golden's, this
        run's)``, None where one was not sent (a golden made with aotcheck's presets off, judged with them on)."""
        if self.golden is None or self.measured is None:
            return []
        before, now = self.golden.compiler_options, self.measured.compiler_options
        return [(k, before.get(k), now.get(k)) for k in sorted({*before, *now}) if before.get(k) != now.get(k)]

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


def _without(key: str, record: Any) -> dict[str, Any]:
    return {k: v for k, v in record.to_json().items() if k != key}


def sort_outcomes(outcomes: list[Outcome]) -> list[Outcome]:
    """Failures first, then by verdict rank, then by case: config, program, its bucket by its sizes as values
    (``step[tokens=128]`` before ``step[tokens=1024]``, which its id's text would put first), target: the
    order every report shows."""
    return sorted(outcomes, key=lambda o: (not o.failed, o.verdict.rank(), o.case.config, o.case.program,
                                           tuple(o.case.bucket.items()), o.case.target.name))
