"""The session in the terminal: its header, a line per case as it finishes, and the end-of-session
summary (the table of cases, notes, what an update did, stale goldens, a toolchain upgrade). The
table's rows are the Markdown summary's too (:mod:`aotcheck.render.markdown`).

Example:
    >>> from aotcheck.gate.report import Report
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.pipeline.measurement import Measurement
    >>> case = Case.of("lm", "prefill", "v5e-16")
    >>> o = Outcome(case, Verdict.PASS, measured=Measurement(case, {"peak_bytes": 4 * 2**30}, {}, 2.0))
    >>> case_line(o), f"{hbm_fraction(o):.0%}"
    ('lm/prefill@v5e-16x1: pass', '25%')
    >>> print("\\n".join(session_summary(Report([o]), update=False)))  # doctest: +NORMALIZE_WHITESPACE
    case                 compile  compile CPU  host RSS  peak/device  of HBM  FLOPs/device  comm/device  step >=  verdict
    -------------------  -------  -----------  --------  -----------  ------  ------------  -----------  -------  -------
    lm/prefill@v5e-16x1  2.0s     -            -         4.00 GiB     25.0%   -             0 B          -        pass
"""

from __future__ import annotations

from collections.abc import Sequence

from aotcheck.figures.program import comm_bytes, roofline
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.gate.upgrade import find_upgrade
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.render.serving import serving_lines
from aotcheck.render.tables import fmt_value, hbm_fraction, table, verdict_label
from aotcheck.render.text import unsharded_lines
from aotcheck.render.upgrade import upgrade_lines
from aotcheck.units import fmt_bytes, fmt_count, fmt_seconds, fmt_share


def header_lines(
    *, targets: Sequence[str], golden_dir: str, update: bool, cache_dir: str | None, shard: tuple[int, int] | None,
    toolchain: dict[str, str | None], foreign: Sequence[str], shard_seconds: tuple[float, float] | None = None,
) -> list[str]:
    """The session's header: what it checks, where goldens are, the cache, the shard (with its expected
    compile seconds of the whole matrix's), the toolchain."""
    cache = (f"figures cache {cache_dir}{' (written, not read: goldens take figures from compiles only)' if update else ''}"
             if cache_dir else "no figures cache")
    expected = (f" (expected {shard_seconds[0]:.1f} s of the matrix's {shard_seconds[1]:.1f} s of compile CPU)"
                if shard and shard_seconds else "")
    lines = [f"aotcheck: {', '.join(targets)}; goldens in {golden_dir}{' (updating)' if update else ''}; {cache}"
             f"{f'; shard {shard[0]}/{shard[1]}{expected}' if shard else ''}; "
             + ", ".join(f"{k} {v}" for k, v in toolchain.items())]
    if foreign:
        lines.append(f"aotcheck: {len(foreign)} golden file(s) were made with another toolchain "
                     f"({foreign[0]}): their figures may differ for that reason alone; the summary's upgrade "
                     "table says which moved")
    return lines


def case_line(outcome: Outcome) -> str:
    """One line as a case finishes (the CLI's progress)."""
    return f"{outcome.case.id}: {verdict_label(outcome)}" + (" FAILED" if outcome.failed else "")


SUMMARY_HEADERS = ["case", "compile", "compile CPU", "host RSS", "peak/device", "of HBM", "FLOPs/device", "comm/device", "step >=",
                   "verdict"]


def summary_row(o: Outcome) -> list[str]:
    """One case's line in the summary table (terminal and Markdown alike)."""
    figures = o.figures or {}
    bound = roofline(figures, o.case.topology) if figures else None
    m = o.measured
    seconds = m.compile_seconds if m is not None else None
    return [
        o.case.id,
        "cached" if m is not None and m.cached else f"{seconds:.1f}s" if seconds is not None else "-",
        fmt_value("compile_cpu_seconds", figures.get("compile_cpu_seconds")),
        fmt_bytes(m.host_peak_bytes if m is not None else None),
        fmt_bytes(figures.get("peak_bytes")) if figures else "-",
        fmt_share(hbm_fraction(o)),
        fmt_count(figures.get("flops", figures.get("flops_xla"))) if figures else "-",
        fmt_bytes(comm_bytes(figures)) if figures else "-",
        fmt_seconds(bound["bound_seconds"]) if bound else "-",
        verdict_label(o),
    ]


def summary_table(outcomes: Sequence[Outcome]) -> str:
    return table(SUMMARY_HEADERS, [summary_row(o) for o in outcomes])


def session_summary(report: Report, *, update: bool, accept_args: Sequence[str] = ()) -> list[str]:
    """The end-of-session lines: the table, notes on improvements, what an update did, stale goldens."""
    lines = [summary_table(report.outcomes)] if report.outcomes else []
    served = serving_lines(report, accept_args=accept_args)
    lines += ["", *served] if served else []
    for o in report.outcomes:
        if (o.verdict is Verdict.IMPROVEMENT and not o.failed) or o.drift_warning:
            lines += ["", o.message if o.drift_warning else f"note: {o.message}"]
    for o in report.outcomes:
        lines += [line for found in unsharded_lines(o) for line in ("", "note: " + found)]
    for name, error in sorted(report.broken.items()):
        lines += ["", f"aotcheck: config {name!r} could not be built: {error}"]
    if update:
        actions = [o.golden_action for o in report.outcomes]
        counts = {a: actions.count(a) for a in GoldenAction}
        lines += ["", f"aotcheck --update-golden: {counts[GoldenAction.CREATED]} created, "
                      f"{counts[GoldenAction.CHANGED]} changed, {counts[GoldenAction.UNCHANGED]} unchanged; "
                      "golden files of cases that did not run were left alone."]
    lines += [f"aotcheck: removed stale golden {rel}" for rel in report.removed]
    upgrade = find_upgrade(report.outcomes, now=report.toolchain)
    if upgrade is not None:
        lines += ["", *upgrade_lines(upgrade, golden_dir=report.golden_dir, extra=accept_args)]
    if report.notes:
        lines += ["", *report.notes]
    if report.stale:
        lines += ["", f"aotcheck: WARNING: {len(report.stale)} stale golden file(s) with no registered case: "
                      + ", ".join(report.stale)
                      + ". Remove them, or run --update-golden over the whole matrix (no -k, no --aot-configs)."]
    return lines
