"""Checking one case: measure it, check it fits, compare it with its golden, (maybe) accept it.

:func:`check_case` is the decision for one case, as a table of plain cases:

=====================================  =====================================
what happened                          verdict
=====================================  =====================================
XLA ran out of memory                  OUT_OF_MEMORY
XLA refused the program otherwise      COMPILE_ERROR
the config, mesh or rules are wrong    ERROR
the peak exceeds the allowed HBM       OVER_HBM (no golden is written)
``update``                             ACCEPTED (golden created/changed/unchanged)
the golden cannot be read              CORRUPT_GOLDEN
there is no golden                     MISSING_GOLDEN
figures against the golden             REGRESSION, IMPROVEMENT or PASS
=====================================  =====================================

The outcome carries data, not prose: :mod:`aotcheck.render.text` words it.

Example (FAKE: a ``measure`` that fails as XLA would, so nothing compiles):
    >>> import tempfile
    >>> from aotcheck.gate.case import Case
    >>> from aotcheck.gate.golden import GoldenStore
    >>> def measure(case):
    ...     raise CompileError("RESOURCE_EXHAUSTED: Ran out of memory. Used 20.00G of 15.75G hbm.")
    >>> outcome = check_case(Case.of("lm", "train_step", "v5e-16"), measure=measure,
    ...                      store=GoldenStore(tempfile.mkdtemp()))
    >>> outcome.verdict, outcome.failed
    (<Verdict.OUT_OF_MEMORY: 'out-of-memory'>, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aotcheck import _runtime
from aotcheck.figures.hbm import explain_oom, hbm_verdict
from aotcheck.gate.case import Case
from aotcheck.gate.compare import DEFAULT_TOLERANCES, Change, Tolerance, compare, verdict
from aotcheck.gate.golden import GoldenError, GoldenStore, toolchain_note
from aotcheck.gate.measure import Measurement
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.programs.compile import CompileError

Measure = Callable[[Case], Measurement]

# Errors that explain themselves: a wrong config, mesh, partitioning, topology or
# registry name (all ValueErrors), or a missing program (KeyError-like lookups).
CONFIG_ERRORS: tuple[type[Exception], ...] = (ValueError, KeyError)


def check_case(
    case: Case,
    *,
    measure: Measure,
    store: GoldenStore,
    tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES,
    update: bool = False,
    strict: bool = False,
    hbm_headroom: float = 1.0,
) -> Outcome:
    """Measures ``case`` with ``measure`` and decides its verdict (see the module's table).

    Under ``update`` the golden is written (atomically) unless the case fails
    to compile or to fit. ``failed`` is set as ``strict`` judges the verdict.
    """
    outcome = _decide(case, measure=measure, store=store, tolerances=tolerances, update=update,
                      hbm_headroom=hbm_headroom)
    outcome.failed = outcome.verdict.fails(strict=strict)
    return outcome


def _decide(
    case: Case, *, measure: Measure, store: GoldenStore, tolerances: Sequence[tuple[str, Tolerance]],
    update: bool, hbm_headroom: float,
) -> Outcome:
    try:
        result = measure(case)
    except CompileError as e:
        oom = explain_oom(str(e), case.topology)
        return Outcome(case, Verdict.OUT_OF_MEMORY if oom else Verdict.COMPILE_ERROR, detail=str(e))
    except CONFIG_ERRORS as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        return Outcome(case, Verdict.ERROR, detail=str(message))
    figures = result.figures
    measured = dict(figures=figures, compile_seconds=result.compile_seconds, cached=result.cached)
    over = hbm_verdict(int(figures["peak_bytes"]), case.topology, headroom=hbm_headroom)
    if over:
        return Outcome(case, Verdict.OVER_HBM, detail=over, **measured)
    if update:
        action = store.write(case, figures, toolchain=_runtime.toolchain(), compiler_options=result.compiler_options)
        return Outcome(case, Verdict.ACCEPTED, golden_action=action, **measured)
    try:
        golden = store.read(case)
    except GoldenError as e:
        return Outcome(case, Verdict.CORRUPT_GOLDEN, detail=str(e), **measured)
    if golden is None:
        return Outcome(case, Verdict.MISSING_GOLDEN, **measured)
    rows = compare(golden.figures, figures, tolerances)
    return Outcome(case, verdict(rows), golden=golden.figures, changes=[r for r in rows if r.change is not Change.OK],
                   toolchain_note=toolchain_note(golden.toolchain), **measured)
