"""The one record of a measured case (:class:`Measurement`), with one JSON form, and the figures a case can have.

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> m = Measurement(Case.of("lm", "prefill", "v4-8"), {"peak_bytes": 1024.0}, {"xla_opt": "1"}, 2.5)
    >>> Measurement.from_json(m.to_json()) == m
    True
    >>> m.view("figures", "compile_seconds")
    {'figures': {'peak_bytes': 1024.0}, 'compile_seconds': 2.5}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aotcheck.records import Record, field
from aotcheck.figures.attribution import PEAK_FIGURES
from aotcheck.figures.fallbacks import FIGURE as FALLBACKS
from aotcheck.figures.fit import Fit
from aotcheck.figures.loops import COLLECTIVES
from aotcheck.figures.program import REQUIRED_FIGURES, Details, Figures
from aotcheck.figures.table import ANY_KNOB, comm, fit_max
from aotcheck.figures.scoped import FIGURES as SPACE_FIGURES
from aotcheck.pipeline.case import Case

# What measuring costs, in the process's CPU seconds: figures like the others, but noisy (not bit-identical
# across runs, unlike every figure of the program itself).
COST_FIGURES = ("compile_cpu_seconds", "lower_cpu_seconds")

# What a figures cache entry keeps of a measurement: what a fresh compile would answer (the rest is
# the run's: the options it resolved, the process's memory, whether it came from the cache).
CACHED_FIELDS = ("figures", "compile_seconds", "details", "program")


def figure_names() -> tuple[str, ...]:
    """Every figure a case can have; ``fit_max_<knob>`` stands for any knob's (``fit_max_KNOB``).

    Example:
        >>> names = figure_names()
        >>> "peak_bytes" in names and "comm_all_gather_bytes" in names and "compile_cpu_seconds" in names
        True
    """
    collectives = tuple(comm(kind, what) for kind in COLLECTIVES for what in ("count", "bytes"))
    return (*REQUIRED_FIGURES, *PEAK_FIGURES, *collectives, FALLBACKS,
            *(name for names in SPACE_FIGURES.values() for name in names), *COST_FIGURES, ANY_KNOB)


@dataclasses.dataclass(frozen=True)
class Measurement(Record):
    """What measuring a case produced: one record, with one JSON form (:meth:`to_json`). The compile
    worker's reply is that form; the figures cache, the golden file and ``aotcheck compile --json``
    keep views of it (:meth:`view`)."""

    case: Case
    figures: Figures
    compiler_options: dict[str, str]
    compile_seconds: float
    # The executable, in the process that compiled it (None from the cache, and across a pipe): not data.
    compiled: Any = field(default=None, repr=False, compare=False, skip=True)
    cached: bool = False
    lowered: bool = True  # False: answered by its unchanged inputs, without tracing (pipeline.inputs).
    host_peak_bytes: int | None = None  # Peak RSS of the process that measured it (not gated).
    details: Details = field(default_factory=Details)  # The peak's largest buffers, collectives.
    attribution_problem: str | None = None  # Why the peak could not be split by class (then no peak_* figures).
    # The optimized HLO, when asked for (--explain): an artifact of the run, like the executable.
    hlo_text: str | None = field(default=None, repr=False, compare=False)
    # Where a cached answer came from when another runner wrote it: the shared store's entry (its URL).
    cached_from: str | None = field(default=None, omit="empty")
    # What the config was built with (its knobs' sizes, its declared settings: MaxText's overrides) and a
    # digest of the lowered module (a cache entry keeps it; None from an entry older than it): a golden
    # records both, so a setting that changed while the program did not is said (gate.check.unread_settings).
    settings: dict[str, Any] = field(default_factory=dict, omit="empty")
    program: str | None = field(default=None, omit="none")

    def view(self, *fields: str) -> dict[str, Any]:
        """Some fields of :meth:`to_json`, in the order asked: what a cache entry or a golden keeps (a field
        its JSON leaves out, such as an unknown program digest, left out here too)."""
        whole = self.to_json()
        return {name: whole[name] for name in fields if name in whole}

    def with_fit(self, fit: Fit) -> "Measurement":
        """This measurement with a fit search's result: the figure ``fit_max_<knob>`` and the search in its details."""
        return dataclasses.replace(self, figures={**self.figures, fit_max(fit.knob): fit.max_size},
                                   details=dataclasses.replace(self.details, fit=fit))
