"""Terminal text: a case's message, the session summary, the compile table and ``--explain``.

Everything a user reads in a terminal is worded here, from typed data
(:class:`~aotcheck.gate.outcome.Outcome`, :class:`~aotcheck.gate.report.Report`,
measurements), so the pytest plugin and the CLI print the same lines.

Example:
    >>> print(table(["metric", "now"], [["peak_bytes", "1.50 KiB"]]))
    metric      now
    ----------  --------
    peak_bytes  1.50 KiB
"""

from __future__ import annotations

from collections.abc import Sequence

from aotcheck.figures.hbm import explain_oom, explain_overflow, overflow_phrase
from aotcheck.figures.table import describe
from aotcheck.figures.loops import analyze_hlo, iter_loops
from aotcheck.figures.attribution import CLASSES, PEAK_FIGURE, PeakBuffer
from aotcheck.figures.fit import Fit
from aotcheck.figures.loops import CollectiveOp
from aotcheck.figures.program import Details
from aotcheck.figures.sharding import Unsharded
from aotcheck.gate.why import class_growth, grown
from aotcheck.figures.program import Figures, comm_bytes, roofline
from aotcheck.gate.compare import Change, Row
from aotcheck.pipeline.measurement import Measurement
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.gate.golden import NEWER_GOLDEN
from aotcheck.gate.upgrade import Upgrade, accept_all_command, find_upgrade
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.targets.topology import Topology
from aotcheck.units import fmt_bytes, fmt_count, fmt_pct, fmt_seconds, fmt_share


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned text columns, a rule under the header."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_value(metric: str, value: float | None) -> str:
    """A figure's value in its unit (:mod:`aotcheck.figures.table`): bytes, seconds, or a count."""
    if value is None:
        return "-"
    unit = describe(metric).unit
    if unit == "seconds":
        return f"{value:.2f}s"
    return fmt_bytes(value) if unit == "bytes" else fmt_count(value)


def change_table(rows: Sequence[Row]) -> str:
    """metric / golden / now / change / % / tolerance / status, one line per metric."""
    return table(
        ["metric", "golden", "now", "change", "%", "tolerance", "status"],
        [
            [r.metric, fmt_value(r.metric, r.golden), fmt_value(r.metric, r.now),
             ("+" if (r.delta or 0) > 0 else "") + fmt_value(r.metric, r.delta) if r.delta is not None else "-",
             fmt_pct(r.ratio), str(r.tolerance), r.change.value]
            for r in rows
        ],
    )


def comm_summary(rows: Sequence[Row]) -> list[str]:
    """One line per collective kind that moved, e.g. ``all-gather bytes +300.0%: 3 new all-gathers``."""
    by_metric = {r.metric: r for r in rows}
    lines = []
    for metric, row in by_metric.items():
        if not (metric.startswith("comm_") and metric.endswith("_bytes")) or row.change is Change.OK:
            continue
        kind = metric.removeprefix("comm_").removesuffix("_bytes").replace("_", "-")
        count = by_metric.get(metric.replace("_bytes", "_count"))
        text = f"{kind} bytes {fmt_pct(row.ratio) if row.ratio is not None else row.change.value}"
        if count is not None and count.delta:
            text += f": {abs(int(count.delta))} {'new' if count.delta > 0 else 'fewer'} {kind}s"
        lines.append(text)
    return lines


def trim_error(text: str, *, max_lines: int = 12) -> str:
    """The lines of an XLA error that matter: the status line(s), not the C++ trace."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    keep = [line for line in lines if not line.lstrip().startswith(("File ", "@", "*** Begin", "---"))]
    if len(keep) > max_lines:
        keep = keep[:max_lines] + [f"... ({len(lines) - max_lines} more lines in the report)"]
    return "\n".join(keep)


def outcome_message(outcome: Outcome, *, golden_file: str, accept: str) -> str:
    """What a case's verdict means for the user, with the fix.

    ``golden_file`` is the golden's path as the user should see it; ``accept``
    the command that accepts the case's current figures.
    """
    case, verdict, detail = outcome.case, outcome.verdict, outcome.error.text if outcome.error else ""
    if verdict is Verdict.CRASHED:
        return (f"{case.id} crashed: {detail}\nA crash of the compiler (or the host's out-of-memory killer), "
                "not a figure of your program: the other cases were checked. Try this case alone "
                f"(-k) to see whether it repeats; a newer {CRASHED_COMPILER.get(case.topology.platform, 'jax')} may fix it.")
    if verdict is Verdict.COMPILE_ERROR:
        return f"{case.id} does not compile:\n{trim_error(detail)}"
    if verdict is Verdict.OUT_OF_MEMORY:
        overflow = outcome.error.overflow if outcome.error else None
        if overflow is not None:  # An op's VMEM or SMEM, not HBM: its own words, never an HBM table.
            fit = outcome.details.fit if outcome.details is not None else None
            message = f"{case.id} {explain_overflow(overflow, case.topology, fit=fit)}"
            found = fit_lines(case.id, fit, case.topology) if fit is not None and fit.max_size else []
            return "\n\n".join([message, *(["\n".join(found)] if found else [])])
        message = f"{case.id} {explain_oom(detail, case.topology)}"
        if outcome.details is not None and outcome.details.peak_buffers:
            message += "\nThe largest buffers at XLA's peak (from its dump):\n" + buffers_table(outcome.details.peak_buffers)
        return "\n\n".join([message, *unsharded_lines(outcome)])
    if verdict is Verdict.OVER_HBM:
        # It compiled (a GPU compile never refuses for size; a TPU's may leave less headroom than the
        # project allows): its own peak says what fills the memory, and a fit search how far down it fits.
        message = f"{case.id} does not fit: it {detail}."
        details = outcome.details
        if details is not None and details.peak_buffers:
            message += "\nThe largest buffers at its peak:\n" + buffers_table(details.peak_buffers)
        fit = ["\n".join(fit_lines(case.id, details.fit, case.topology))] if details is not None and details.fit else []
        return "\n\n".join([message, *fit, *unsharded_lines(outcome)])
    if verdict is Verdict.ERROR:
        return f"{case.id}: {detail}"
    if verdict is Verdict.CORRUPT_GOLDEN:
        return f"{detail}\nTo replace it: {accept}"
    if verdict is Verdict.MISSING_GOLDEN:
        return f"{case.id} has no golden file ({golden_file}).\nTo create it: {accept}"
    if verdict is Verdict.ACCEPTED:
        return f"golden {outcome.golden_action.value if outcome.golden_action else 'written'}: {golden_file}"
    drift = [r for r in outcome.changes if r.change in (Change.NEW, Change.GONE)]
    if verdict is Verdict.METRICS_CHANGED or (verdict is Verdict.PASS and outcome.drift_warning):
        lines = [f"{case.id}: its figures and its golden's ({golden_file}) differ in names:"]
        lines += [f"  {r.metric}: {'new, not in the golden' if r.change is Change.NEW else 'in the golden, no longer produced'}"
                  for r in drift]
        if verdict is Verdict.PASS:
            return "\n".join(["warning: " + lines[0], *lines[1:], "These figures are not checked (aot_metric_drift = warn)."])
        lines += ["A figure that is not in both is not checked. If aotcheck or your toolchain changed what it "
                  f"measures, accept the new set: {accept}", "(Or let it pass with a warning: aot_metric_drift = warn.)"]
        return "\n".join(lines)
    if verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT):
        what = "regressed" if verdict is Verdict.REGRESSION else "improved beyond tolerance"
        lines = [f"{case.id} {what} against {golden_file}:", "", change_table(outcome.changes), ""]
        moved = comm_summary(outcome.changes)
        if moved:
            lines += ["Collectives that moved: " + "; ".join(moved), ""]
        why = why_lines(outcome)
        if why:
            lines += [*why, ""]
        lines += [line for found in unsharded_lines(outcome) for line in (found, "")]
        if outcome.toolchain_note:
            lines.append(f"Note: {outcome.toolchain_note}.")
        if not (outcome.toolchain_note or "").startswith(NEWER_GOLDEN):  # A downgrade is never accepted.
            lines.append(f"To accept the new figures: {accept}")
        return "\n".join(lines)
    return outcome.message


# Whose crash a dead compile worker's usually is, by platform.
CRASHED_COMPILER = {"tpu": "libtpu", "gpu": "jax and its CUDA plugin"}

UNSHARDED_CAUSES = (
    "Likely causes: the model skips its sharding constraints on a CPU host (a helper that checks "
    "jax.devices() or jax.default_backend(); decide by the mesh in context instead: "
    "jax.sharding.get_abstract_mesh().empty), or the partitioner dropped a constraint (constrain this "
    "activation's batch dimension). The figures are those of this program, which is not the one the accelerator "
    "would run. See README, \"How a model finds its mesh\".")


def unsharded_lines(outcome: Outcome, *, limit: int = 5) -> list[str]:
    """The lint's finding on a case (:mod:`aotcheck.figures.sharding`) as one paragraph; none if clean.

    Example:
        >>> from aotcheck.figures.sharding import Unsharded
        >>> from aotcheck.pipeline.case import Case
        >>> found = Unsharded(2**25, "jit(step)/dot_general", "f32[16,256,256,4]", "model.py:88", "batch/tokens", 16, 8, 2)
        >>> from aotcheck.pipeline.measurement import Measurement
        >>> case = Case.of("llama", "train_step", "v5e-16")
        >>> o = Outcome(case, Verdict.PASS, measured=Measurement(case, {}, {}, 1.0, details=Details(unsharded=[found])))
        >>> print(unsharded_lines(o)[0])  # doctest: +NORMALIZE_WHITESPACE
        llama/train_step@v5e-16x1: 1 activation at the peak keeps the whole batch on every device
        (batch/tokens: 16 rows, split 8 ways):
          bytes/device  shape              split  buffer                 source
          ------------  -----------------  -----  ---------------------  -----------
          32.00 MiB     f32[16,256,256,4]  2      jit(step)/dot_general  model.py:88
        Likely causes: ...
    """
    found = outcome.details.unsharded if outcome.details is not None else []
    return [unsharded_paragraph(found, what=outcome.case.id, limit=limit)] if found else []


def unsharded_paragraph(found: Sequence[Unsharded], *, what: str, limit: int = 5) -> str:
    """The buffers that keep a sharded batch whole, a table and their likely causes (``found`` non-empty)."""
    first = found[0]
    rows = [[fmt_bytes(u.bytes), u.shape, u.split, _clip(u.name, 60), source_line(u) or "-"] for u in found[:limit]]
    more = [f"  ... and {len(found) - limit} more (the JSON report has them all)"] if len(found) > limit else []
    head = (f"{what}: {len(found)} activation{'s' if len(found) > 1 else ''} at the peak "
            f"keep{'' if len(found) > 1 else 's'} the whole batch on every device "
            f"({first.input}: {first.batch} rows, split {first.ways} ways):")
    body = "\n".join("  " + line for line in table(["bytes/device", "shape", "split", "buffer", "source"], rows).splitlines())
    return "\n".join([head, body, *more, UNSHARDED_CAUSES])


def hbm_fraction(outcome: Outcome) -> float | None:
    """Peak bytes per device over the chip's HBM capacity (None without figures or a chip)."""
    figures = outcome.figures or {}
    hbm = outcome.case.topology.hbm_bytes
    if "peak_bytes" not in figures or hbm is None:
        return None
    return figures["peak_bytes"] / hbm


def verdict_label(outcome: Outcome) -> str:
    """The verdict column: the golden action for accepted cases, FAILED where only strictness failed it."""
    if outcome.verdict is Verdict.ACCEPTED and outcome.golden_action:
        return outcome.golden_action.value
    label = outcome.verdict.value
    return label + " (FAILED)" if outcome.failed and not outcome.verdict.fails() else label


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


def toolchain_text(toolchain: dict[str, str | None]) -> str:
    """``jax 0.12.0.1, jaxlib 0.12.0.1, libtpu 0.0.50.1``."""
    return ", ".join(f"{k} {v}" for k, v in toolchain.items())


def upgrade_rows(upgrade: Upgrade) -> list[list[str]]:
    """case / figure / golden / now / change, one row per figure that moved (tables of both renderers)."""
    rows = []
    for case_id, changes in upgrade.moved:
        for r in changes or []:
            rows.append([case_id, r.metric, fmt_value(r.metric, r.golden), fmt_value(r.metric, r.now),
                         fmt_pct(r.ratio) if r.ratio is not None else r.change.value])
    return rows


def upgrade_heading(upgrade: Upgrade) -> str:
    """What the goldens' toolchain is to this run's, in a few words (both renderers' headings).

    Example:
        >>> from aotcheck.gate.upgrade import Upgrade
        >>> upgrade_heading(Upgrade({}, {}, [], [], [], "downgrade"))
        "older toolchain than the goldens'"
    """
    return {"upgrade": "toolchain upgrade", "downgrade": "older toolchain than the goldens'"}.get(
        upgrade.direction, "toolchain change")


def upgrade_summary(upgrade: Upgrade) -> str:
    """The cases, both toolchains and which way this run's stands to the goldens' (both renderers)."""
    now = toolchain_text(upgrade.now)
    if upgrade.direction == "downgrade":
        now += ", which is older (a downgrade: the CI lock or this machine is behind the goldens)"
    elif upgrade.direction != "upgrade":
        now += (", neither newer nor older throughout ("
                + ", ".join(f"{k} {step}" for k, step in upgrade.steps.items()) + ")")
    return (f"{len(upgrade.cases)} case(s) judged against goldens made with {toolchain_text(upgrade.before)}; "
            f"now {now}")


def upgrade_advice(upgrade: Upgrade, *, golden_dir: str, extra: Sequence[str] = ()) -> tuple[str, str | None]:
    """What to do, and the command (None: none to run). A downgrade is never accepted over the goldens."""
    if upgrade.direction == "downgrade":
        return ("Do not accept these figures: they would take the goldens back to an older toolchain. Install the "
                f"goldens' toolchain ({toolchain_text(upgrade.before)}) to check against them.", None)
    command = accept_all_command(upgrade.cases, golden_dir=golden_dir, extra=extra)
    if upgrade.direction == "upgrade":
        return "To accept the new toolchain's figures for all of them:", command
    return "If this run's toolchain is the one the goldens should follow, to accept its figures for all of them:", command


def upgrade_lines(upgrade: Upgrade, *, golden_dir: str, extra: Sequence[str] = ()) -> list[str]:
    """The toolchain upgrade (or downgrade): what moved, by how much, what did not move, and what to do: the
    command accepting it all for an upgrade, the goldens' toolchain to install for a downgrade."""
    lines = [f"aotcheck: {upgrade_heading(upgrade)}: {upgrade_summary(upgrade)}. "
             f"{len(upgrade.moved)} moved, {len(upgrade.unmoved)} did not."]
    if upgrade.moved:
        lines += ["", table(["case", "figure", "golden", "now", "change"], upgrade_rows(upgrade))]
    if upgrade.unmoved:
        lines += ["", "Did not move (every figure within tolerance): " + ", ".join(upgrade.unmoved)]
    advice, command = upgrade_advice(upgrade, golden_dir=golden_dir, extra=extra)
    lines += ["", advice + (f" {command}" if command else "")]
    return lines


def case_line(outcome: Outcome) -> str:
    """One line as a case finishes (the CLI's progress)."""
    return f"{outcome.case.id}: {verdict_label(outcome)}" + (" FAILED" if outcome.failed else "")


COMPILE_HEADERS = ["case", "compile", "argument", "output", "alias", "temp", "code", "peak", "peak/HBM",
                   "FLOPs", "FLOPs (XLA raw)", "collectives", "step >="]


def compile_table(results: Sequence[Measurement], topology: Topology) -> str:
    """``aotcheck compile``'s table: XLA's memory analysis, the peak's share of HBM, FLOPs, collectives."""
    hbm = topology.hbm_bytes
    rows = []
    for r in results:
        f = r.figures
        bound = roofline(f, topology)
        rows.append([r.case.id, f"{r.compile_seconds:.1f}s", fmt_bytes(f["argument_bytes"]),
                     fmt_bytes(f["output_bytes"]), fmt_bytes(f["alias_bytes"]), fmt_bytes(f["temp_bytes"]),
                     fmt_bytes(f["generated_code_bytes"]), fmt_bytes(f["peak_bytes"]),
                     fmt_share(f["peak_bytes"] / hbm) if hbm else "-", fmt_count(f["flops"]),
                     fmt_count(f["flops_xla"]), fmt_bytes(comm_bytes(f)),
                     fmt_seconds(bound["bound_seconds"]) if bound else "-"])
    doubts = [f"{r.case.id}: {u.describe()}" for r in results for u in r.details.uncounted]
    return (table(COMPILE_HEADERS, rows)
            + "\n\nPer device. FLOPs count each loop body times its trip count (matmuls, convolutions,"
              "\nragged dots, and the cost a kernel declares); XLA's raw figure counts a loop body once."
              "\n'step >=' is a roofline lower bound."
            + "".join(f"\nnote: {d}" for d in doubts))


def _clip(text: str, width: int) -> str:
    """The end of a long name (a name stack's last ops say the most), marked as clipped."""
    return text if len(text) <= width else "..." + text[-(width - 3):]


def source_line(item) -> str | None:
    """Where a buffer, collective or finding was made: a model library's line via the user's call
    (``esm2quinox/_esm2.py:123 via train.py:250``), else the one line (None: none).

    Example:
        >>> source_line(PeakBuffer(8, "temp", "jit(f)/exp", "f32[2]", "train.py:250", library="esm2quinox/_esm2.py:123"))
        'esm2quinox/_esm2.py:123 via train.py:250'
        >>> source_line(PeakBuffer(8, "temp", "jit(f)/exp", "f32[2]", "model.py:9"))
        'model.py:9'
    """
    library = getattr(item, "library", None)
    return f"{library} via {item.source}" if library and item.source else library or item.source


def peak_table(figures: Figures) -> str | None:
    """The peak split by class (``peak_*_bytes``), with each class's share; None without the split."""
    peak = figures.get("peak_bytes")
    if not peak or any(PEAK_FIGURE[kind] not in figures for kind in CLASSES):
        return None
    rows = [[kind, fmt_bytes(figures[PEAK_FIGURE[kind]]), fmt_share(figures[PEAK_FIGURE[kind]] / peak)]
            for kind in CLASSES]
    return table(["at the peak", "bytes/device", "share"], rows + [["peak", fmt_bytes(peak), "100%"]])


def buffers_table(buffers: Sequence[PeakBuffer], *, limit: int = 10, width: int = 90) -> str:
    """The largest buffers at the peak: bytes, class, name (argument path or JAX op), shape, source line."""
    return table(["bytes/device", "class", "buffer", "shape", "source"],
                 [[fmt_bytes(b.bytes) + (f" ({b.count})" if b.count > 1 else ""), b.kind, _clip(b.name, width),
                   b.shape, source_line(b) or "-"] for b in buffers[:limit]])


def collectives_table(ops: Sequence[CollectiveOp], *, limit: int = 10, width: int = 90) -> str:
    """The collectives that move the most bytes per step, by the JAX op that made them."""
    return table(["collective", "count", "bytes/device", "op", "source"],
                 [[op.kind, op.count, fmt_bytes(op.bytes), _clip(op.name, width), source_line(op) or "-"]
                  for op in ops[:limit]])


def _buffer_line(g) -> str:
    b = g.now
    where = f" at {source_line(b)}" if source_line(b) else ""
    status = "new at peak" if g.before is None else f"was {fmt_bytes(g.before)}"
    count = f" x{b.count}" if b.count > 1 else ""
    return f"  {b.kind} +{fmt_bytes(g.added)}: {b.shape}{count} '{_clip(b.name, 100)}'{where} ({status})"


def _collective_line(g) -> str:
    op = g.now
    where = f" at {source_line(op)}" if source_line(op) else ""
    status = "new" if g.before is None else f"was {fmt_bytes(g.before)}"
    return f"  {op.kind} +{fmt_bytes(g.added)} ({op.count} per step): '{_clip(op.name, 100)}'{where} ({status})"


def why_lines(outcome: Outcome) -> list[str]:
    """Why the figures moved: the peak's classes that grew, the buffers and collectives new or grown."""
    moved = {r.metric for r in outcome.changes if r.change is Change.REGRESSION}
    now, before = outcome.details, outcome.golden_details
    lines = []
    if moved & {"peak_bytes", "total_bytes", "temp_bytes", "argument_bytes", "output_bytes"} | {
            m for m in moved if m.startswith("peak_")}:
        growth = class_growth(outcome.golden_figures or {}, outcome.figures or {})
        if growth:
            lines.append("The peak grew in: " + ", ".join(f"{kind} +{fmt_bytes(b)}" for kind, b in growth))
        if now is not None and before is not None:
            # An argument entering the top of the list is not news unless its class grew.
            grew = {kind for kind, _ in growth} | {"outputs", "temp", "other"}
            buffers = grown(before.peak_buffers, [b for b in now.peak_buffers if b.kind in grew])
            if buffers:
                lines += ["Buffers at the peak that are new or grew:", *map(_buffer_line, buffers)]
    for metric in sorted(m for m in moved if m.startswith("fit_max_")):
        fit = now.fit if now is not None else None
        configured = (f"; the configured {fit.knob} ({fit.configured}) still fits, peak "
                      f"{fmt_bytes(fit.peak_at_configured)}" if fit and fit.peak_at_configured else "")
        lines.append(f"Headroom lost: the largest {metric.removeprefix('fit_max_')} that fits fell from "
                     f"{int((outcome.golden_figures or {}).get(metric, 0))} to {int((outcome.figures or {}).get(metric, 0))}"
                     f"{configured}.")
    if any(m.startswith("comm_") for m in moved) and now is not None and before is not None:
        ops = grown(before.collectives, now.collectives)
        if ops:
            lines += ["Collectives that are new or grew:", *map(_collective_line, ops)]
    return lines


def fit_lines(case_id: str, fit: Fit, topology: Topology) -> list[str]:
    """What a fit search found, in words, with what fills the memory at the max."""
    hbm = topology.hbm_bytes
    share = (lambda b: f" ({fmt_share(b / hbm)} of {fmt_bytes(hbm)})") if hbm else (lambda b: "")
    how = ("bisection (the affine prediction was not confirmed: memory is not a straight line in the "
           f"{fit.knob} here)" if fit.bisected else "the affine prediction, confirmed")
    if fit.max_size == 0:
        peak = f"; its peak there: {fmt_bytes(fit.smallest_peak)}{share(fit.smallest_peak)}" if fit.smallest_peak else \
            f" ({overflow_phrase(fit.refused)})" if fit.refused else " (XLA ran out of memory)"
        return [f"{case_id}: does not fit even at the smallest {fit.knob} ({fit.step}){peak}. "
                f"{fit.probes} compiles."]
    lines = [f"{case_id}: the largest {fit.knob} that fits is {fit.max_size}"
             + (" (the search's upper bound: the limit is higher)" if fit.upper_bound else "")
             + (f", peak {fmt_bytes(fit.peak_at_max)}{share(fit.peak_at_max)}" if fit.peak_at_max else ""),
             f"  configured {fit.knob} {fit.configured}"
             + (f": peak {fmt_bytes(fit.peak_at_configured)}{share(fit.peak_at_configured)}"
                if fit.peak_at_configured else " (does not fit)")
             + (f"; {fit.max_size / fit.configured:.1f}x room" if fit.configured else ""),
             f"  {fit.probes} compiles ({fit.knob} in steps of {fit.step}), by {how}"
             + ("" if fit.upper_bound else f"; {fit.max_size + fit.step} does not fit")
             + (f": not for HBM, {overflow_phrase(fit.refused)}" if fit.refused and not fit.upper_bound else "")]
    if fit.split_at_max:
        lines.append("  at the max: " + ", ".join(
            f"{kind} {fmt_bytes(fit.split_at_max[PEAK_FIGURE[kind]])}" for kind in CLASSES
            if PEAK_FIGURE[kind] in fit.split_at_max))
    if fit.buffers_at_max:
        lines.append("What fills the memory at the max:\n" + buffers_table(fit.buffers_at_max, limit=5))
    return lines


def explain(hlo_text: str, figures: Figures, *, details: Details | None = None, limit: int = 12) -> str:
    """Where the FLOPs and bytes come from (from a program's optimized HLO text): loops with their
    trip counts, top matmuls, collectives by op; with the figures' peak split and ``details``,
    what holds the HBM at the peak and which line made it."""
    analysis = analyze_hlo(hlo_text)
    lines = [f"FLOPs per device: {fmt_count(analysis.flops)} loop-aware vs {fmt_count(figures['flops_xla'])} XLA raw"]
    loops = list(iter_loops(analysis))
    if loops:
        lines.append(table(
            ["loop", "trips", "runs", "FLOPs/trip", "FLOPs in all", "op"],
            [[loop.name, loop.trip_count if loop.trip_count is not None else "unknown (counted once)",
              loop.multiplier, fmt_count(loop.flops_per_trip),
              fmt_count(loop.flops_per_trip * (loop.trip_count or 1) * loop.multiplier), loop.op_name[-60:]]
             for loop in loops[:12]],
        ))
    lines.append(table(["top matmuls", "FLOPs in all", "times run"],
                       [[name[-80:], fmt_count(f), m] for f, name, m in analysis.top_ops]))
    if details is not None and details.collectives:
        lines.append("The largest collectives, per step:\n" + collectives_table(details.collectives, limit=limit))
    split = peak_table(figures)
    if split:
        excess = details.peak_excess_bytes if details is not None else 0
        note = (f"\n(XLA's live ranges list {fmt_bytes(excess)} more at the peak than its peak figure; "
                "temp is shown net of that.)") if excess else ""
        lines.append("What holds the HBM at the peak (per device):\n" + split + note)
    if details is not None and details.peak_buffers:
        lines.append("The largest buffers at the peak:\n" + buffers_table(details.peak_buffers, limit=limit))
    if details is not None and details.unsharded:
        lines.append(unsharded_paragraph(details.unsharded, what="this program"))
    return "\n\n".join(lines)


def header_lines(
    *, targets: Sequence[str], golden_dir: str, update: bool, cache_dir: str | None, shard: tuple[int, int] | None,
    toolchain: dict[str, str | None], foreign: Sequence[str], shard_seconds: tuple[float, float] | None = None,
) -> list[str]:
    """The session's header: what it checks, where goldens are, the cache, the shard (with its expected
    compile seconds of the whole matrix's), the toolchain."""
    cache = f"figures cache {cache_dir}" if cache_dir else "no figures cache"
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
