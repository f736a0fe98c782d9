"""Checking one case: measure it, check it fits, compare it with its golden, (maybe) accept it.

:func:`check_case` is the decision for one case, as a table of plain cases:

=====================================  =====================================
what happened                          verdict
=====================================  =====================================
the compile process died               CRASHED
XLA ran out of memory (HBM, VMEM...)   OUT_OF_MEMORY
XLA refused the program otherwise      COMPILE_ERROR
the config, mesh or rules are wrong,   ERROR
user code raised, a file is unwritable

the peak exceeds the allowed HBM       OVER_HBM (no golden is written)
``update``                             ACCEPTED (golden created/changed/unchanged)
the golden cannot be read              CORRUPT_GOLDEN
there is no golden                     MISSING_GOLDEN
figures against the golden             REGRESSION, IMPROVEMENT or PASS
figures new or gone against it         METRICS_CHANGED (PASS with a warning
                                       when ``metric_drift="warn"``)
=====================================  =====================================

The outcome carries data, not prose: the verdict, and for a failure its :class:`~aotcheck.gate.outcome.Reason`
and the error's record (a :class:`~aotcheck.gate.outcome.Failure`); :mod:`aotcheck.render.text` words it.

Example (FAKE: a ``measure`` that fails as XLA would, so nothing compiles):
    >>> import tempfile
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.gate.golden import GoldenStore
    >>> def measure(case):
    ...     raise OutOfMemory("RESOURCE_EXHAUSTED: Ran out of memory. Used 20.00G of 15.75G hbm.")
    >>> outcome = check_case(Case.of("lm", "train_step", "v5e-16"), measure=measure,
    ...                      store=GoldenStore(tempfile.mkdtemp()))
    >>> outcome.verdict, outcome.failed, outcome.error.reason, outcome.error.type
    (<Verdict.OUT_OF_MEMORY: 'out-of-memory'>, True, <Reason.OUT_OF_MEMORY: 'out-of-memory'>, 'aotcheck.errors.OutOfMemory')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aotcheck.figures.attribution import LATER_PEAK_FIGURES, PEAK_FIGURES
from aotcheck.errors import AotcheckError, CompileError, OutOfMemory, UserCodeError, WorkerCrashed
from aotcheck.figures.hbm import hbm_verdict
from aotcheck.figures.program import RAW_COST_FIGURES
from aotcheck.pipeline.case import Case
from aotcheck.gate.compare import DEFAULT_TOLERANCES, Change, Tolerance, compare, settle_noisy, verdict
from aotcheck.gate.golden import Golden, GoldenError, GoldenStore, toolchain_note
from aotcheck.pipeline.measurement import Measurement
from aotcheck.gate.outcome import Failure, Outcome, Reason
from aotcheck.gate.verdict import Verdict

Measure = Callable[[Case], Measurement]

# aotcheck's own errors explain themselves (a wrong config, mesh, partitioning, topology or registry name,
# the host, a dump it could not read: all AotcheckErrors); anything else user code raised, a ValueError of
# its own included, is named by its class (UserCodeError: a class that could not cross from the worker).


def check_case(
    case: Case,
    *,
    measure: Measure,
    store: GoldenStore,
    tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES,
    update: bool = False,
    strict: bool = False,
    hbm_headroom: float = 1.0,
    metric_drift: str = "fail",
    usable: dict[str, Any] | None = None,
) -> Outcome:
    """Measures ``case`` with ``measure`` and decides its verdict (see the module's table).

    Under ``update`` the golden is written (atomically) unless the case fails
    to compile or to fit, with ``usable`` (a server's bucket's: what a device may hold, as
    :class:`aotcheck.targets.usable.Usable`'s JSON). ``failed`` is set as ``strict`` judges the verdict.
    ``metric_drift``: ``"fail"`` (figures new or gone against the golden fail the
    case) or ``"warn"`` (they pass, with a warning in the message).
    """
    outcome = _decide(case, measure=measure, store=store, tolerances=tolerances, update=update,
                      hbm_headroom=hbm_headroom, usable=usable)
    if outcome.verdict is Verdict.METRICS_CHANGED and metric_drift == "warn":
        outcome = dataclasses.replace(outcome, verdict=Verdict.PASS)  # Its changes say what drifted.
    return dataclasses.replace(outcome, failed=outcome.verdict.fails(strict=strict))


def failure_of(error: Exception) -> tuple[Verdict, Failure]:
    """The verdict and the record of an error that measuring a case raised: the one classification, the
    gate's and ``aotcheck compile``'s (the first rows of the module's table).

    Example:
        >>> failure_of(OutOfMemory("RESOURCE_EXHAUSTED: Ran out of memory"))[1].reason
        <Reason.OUT_OF_MEMORY: 'out-of-memory'>
        >>> verdict, failure = failure_of(KeyError("vocab"))
        >>> verdict, failure.reason, failure.type_name
        (<Verdict.ERROR: 'error'>, <Reason.USER_CODE: 'user-code'>, 'KeyError')
    """
    if isinstance(error, WorkerCrashed):
        return Verdict.CRASHED, Failure.of(Reason.CRASHED, error)
    if isinstance(error, OutOfMemory):  # Any space: its Overflow says which (HBM, a kernel's VMEM, ...).
        return Verdict.OUT_OF_MEMORY, Failure.of(Reason.OUT_OF_MEMORY, error)
    if isinstance(error, CompileError):
        return Verdict.COMPILE_ERROR, Failure.of(Reason.COMPILE_ERROR, error)
    if isinstance(error, AotcheckError) and not isinstance(error, UserCodeError):
        return Verdict.ERROR, Failure.of(Reason.INPUT, error)  # aotcheck's own error, which explains itself.
    return Verdict.ERROR, Failure.of(Reason.USER_CODE, error)


def with_later_classes(golden: Mapping[str, float]) -> dict[str, float]:
    """A golden's figures with the peak's classes added after it was written read as 0, where it holds the
    rest of the split (a golden of figures version 17 or older has no ``peak_kv_cache_bytes``: its KV pool,
    if any, is in ``peak_batch_bytes``), so it is judged as what it says, not failed for a new name.

    Example:
        >>> with_later_classes({"peak_bytes": 8, **dict.fromkeys(PEAK_FIGURES[:3], 2), "peak_outputs_bytes": 0,
        ...                     "peak_temp_bytes": 2, "peak_other_bytes": 0})["peak_kv_cache_bytes"]
        0
        >>> "peak_kv_cache_bytes" in with_later_classes({"peak_bytes": 8})  # No split: nothing to complete.
        False
    """
    out = dict(golden)
    if all(name in out for name in PEAK_FIGURES if name not in LATER_PEAK_FIGURES):
        for name in LATER_PEAK_FIGURES:
            out.setdefault(name, 0)
    return out


def _decide(
    case: Case, *, measure: Measure, store: GoldenStore, tolerances: Sequence[tuple[str, Tolerance]],
    update: bool, hbm_headroom: float, usable: dict[str, Any] | None = None,
) -> Outcome:
    try:
        result = measure(case)
    except Exception as e:  # User code (tracing, building, make_args) too: named by its class, never a traceback.
        found, failure = failure_of(e)
        return Outcome(case, found, error=failure)
    figures = result.figures
    # What the figures may miss is said on the case every run (its golden records it too).
    doubts = [f"{case.id}: {line}" for line in result.details.doubts()]
    measured = dict(measured=result, notes=[*([result.attribution_problem] if result.attribution_problem else []),
                                            *doubts])
    over = hbm_verdict(int(figures["peak_bytes"]), case.topology, headroom=hbm_headroom)
    if over is not None:
        return Outcome(case, Verdict.OVER_HBM, error=Failure(Reason.OVER_HBM, hbm=over), **measured)
    if update:
        try:
            previous = store.read(case)
        except GoldenError:  # A corrupt golden is simply replaced.
            previous = None
        same_toolchain = previous is not None and toolchain_note(previous.toolchain, platform=case.topology.platform) is None
        written = settle_noisy(previous.figures if same_toolchain else None, figures, tolerances)
        try:
            # The golden keeps a view of the measurement (its figures settled against the last golden's).
            action = store.write(case, written, toolchain=case.topology.platform.toolchain(),
                                 usable=usable, settings=result.settings, program=result.program,
                                 **result.view("compiler_options", "details"))
        except OSError as e:  # Its strerror is the words to keep (its str repeats the path).
            return Outcome(case, Verdict.ERROR, error=Failure.of(Reason.GOLDEN_UNWRITABLE, e, text=e.strerror or str(e),
                                                                 path=str(store.path(case))), **measured)
        return Outcome(case, Verdict.ACCEPTED, golden_action=action, **measured)
    try:
        golden = store.read(case)
    except GoldenError as e:
        return Outcome(case, Verdict.CORRUPT_GOLDEN, error=Failure.of(Reason.CORRUPT_GOLDEN, e), **measured)
    if golden is None:
        return Outcome(case, Verdict.MISSING_GOLDEN, **measured)
    rows = compare(with_later_classes(golden.figures), figures, tolerances)
    if result.attribution_problem:  # The peak's split is missing this time (said in a note): judge the rest.
        rows = [r for r in rows if not (r.metric in PEAK_FIGURES and r.change is Change.GONE)]
    if any(u.kind == "xla_cost" for u in result.details.uncounted):  # XLA's raw cost failed (a note says so).
        rows = [r for r in rows if not (r.metric in RAW_COST_FIGURES and r.change is Change.GONE)]
    found = verdict(rows)
    if found is Verdict.PASS and any(r.change in (Change.NEW, Change.GONE) for r in rows):
        found = Verdict.METRICS_CHANGED
    unread = unread_settings(golden, result)
    if unread:
        measured["notes"] = [*measured["notes"], f"{case.id}: {unread}"]
    return Outcome(case, found, golden=golden, changes=[r for r in rows if r.change is not Change.OK], **measured)


def unread_settings(golden: Golden, result: Measurement) -> str | None:
    """Where settings differ from the golden's and the lowered module is the golden's, those settings and
    what they were (Hunyuan3's MaxText notes: two remat knobs and 18 tiles tuned for a day changed nothing:
    the code never read them); None where none differs, the program changed, or either digest is unknown.

    Example:
        >>> from pathlib import Path
        >>> from aotcheck.pipeline.case import Case
        >>> golden = Golden({}, {}, {}, Path("g.json"), settings={"batch": 8, "mlpwi": "remat"}, program="ab12")
        >>> now = Measurement(Case.of("m", "train_step", "v5e-1"), {}, {}, 1.0,
        ...                   settings={"batch": 8, "mlpwi": "device"}, program="ab12")
        >>> unread_settings(golden, now)
        "mlpwi ('remat' -> 'device') changed, and the program did not: the lowered module is the golden's, so the code never read it"
        >>> unread_settings(golden, dataclasses.replace(now, program="cd34")) is None  # It did change the program.
        True
    """
    if golden.program is None or result.program is None or golden.program != result.program:
        return None
    names = sorted(set(golden.settings) | set(result.settings))
    moved = [n for n in names if golden.settings.get(n, _UNSET) != result.settings.get(n, _UNSET)]
    if not moved:
        return None
    said = ", ".join(f"{n} ({_said(golden.settings.get(n, _UNSET))} -> {_said(result.settings.get(n, _UNSET))})"
                     for n in moved)
    which = "it" if len(moved) == 1 else "them"
    return (f"{said} changed, and the program did not: the lowered module is the golden's, so the code never "
            f"read {which}")


_UNSET = object()


def _said(value: Any) -> str:
    return "unset" if value is _UNSET else repr(value)
