"""The verdict vocabulary, defined once: what each verdict means, whether it fails, how it sorts.

Example:
    >>> from aotcheck.gate.verdict import Verdict
    >>> Verdict("regression").fails(), Verdict.IMPROVEMENT.fails(), Verdict.IMPROVEMENT.fails(strict=True)
    (True, False, True)
    >>> [v.value for v in sorted([Verdict.PASS, Verdict.REGRESSION, Verdict.COMPILE_ERROR], key=Verdict.rank)]
    ['compile-error', 'regression', 'pass']
"""

from __future__ import annotations

import enum


class Verdict(enum.Enum):
    """What checking one case found. The value is the stable name reports use."""

    # value, fails, sort rank (failures first, then what moved, then the rest)
    CRASHED = ("crashed", True, 0)  # The compile process died (a signal, an abort, the OOM killer).
    COMPILE_ERROR = ("compile-error", True, 0)  # XLA refused the program.
    OUT_OF_MEMORY = ("out-of-memory", True, 0)  # XLA refused it for lack of HBM.
    OVER_HBM = ("over-hbm", True, 0)  # It compiled, but its peak exceeds the allowed share of HBM.
    ERROR = ("error", True, 0)  # The config, mesh or partitioning is wrong; the message says how.
    CORRUPT_GOLDEN = ("corrupt-golden", True, 0)  # The golden file cannot be read.
    REGRESSION = ("regression", True, 1)  # A figure grew beyond its tolerance.
    METRICS_CHANGED = ("metrics-changed", True, 1)  # The case produces figures its golden lacks, or lacks some.
    MISSING_GOLDEN = ("missing-golden", True, 2)  # No golden file yet.
    IMPROVEMENT = ("improvement", False, 3)  # A figure dropped beyond tolerance (fails under strict).
    ACCEPTED = ("accepted", False, 4)  # --update-golden wrote (or confirmed) the golden.
    PASS = ("pass", False, 5)  # Every figure within tolerance.
    SKIPPED = ("skipped", False, 6)  # Not run (e.g. too few devices for the config).

    def __new__(cls, value: str, fails: bool, rank: int) -> "Verdict":
        member = object.__new__(cls)
        member._value_ = value
        member._fails = fails
        member._rank = rank
        return member

    def fails(self, *, strict: bool = False) -> bool:
        """Whether this verdict fails its case (improvements too, under ``strict``)."""
        return self._fails or (strict and self is Verdict.IMPROVEMENT)

    def rank(self) -> int:
        """Sort key: failures first, then what moved, then the rest."""
        return self._rank

    @classmethod
    def _missing_(cls, value: object) -> "Verdict | None":
        for member in cls:  # Verdict("pass") finds PASS by its name alone.
            if member._value_ == value:
                return member
        return None

    def __str__(self) -> str:
        return self.value


class GoldenAction(enum.Enum):
    """What ``--update-golden`` did to a case's golden file."""

    CREATED = "created"
    CHANGED = "changed"
    UNCHANGED = "unchanged"
