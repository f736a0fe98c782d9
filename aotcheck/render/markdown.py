"""The pull-request view: a Markdown job summary and GitHub annotations from merged reports.

Example:
    >>> from aotcheck.gate.report import Merged, Report
    >>> print(markdown(Merged(Report(), problems=[])).splitlines()[0])
    ## aotcheck: ✅ passed
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from aotcheck.figures.attribution import CLASSES, PEAK_FIGURE, Attribution
from aotcheck.figures.table import FIGURES, Figure, Unit, Worse
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Merged
from aotcheck.gate.verdict import Verdict
from aotcheck.render.chart import text_bars
from aotcheck.gate.upgrade import Upgrade
from aotcheck.render.summary import SUMMARY_HEADERS, summary_row
from aotcheck.render.serving import HEADERS, bill_line, boot_line, bucket_rows
from aotcheck.render.tables import source_line
from aotcheck.render.text import UNSHARDED_CAUSES, outcome_message
from aotcheck.render.upgrade import upgrade_advice, upgrade_heading, upgrade_rows, upgrade_summary
from aotcheck.units import fmt_bytes, fmt_pct


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table."""

    def esc(cell: object) -> str:
        return str(cell).replace("|", "\\|")

    lines = ["| " + " | ".join(map(esc, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in rows]
    return "\n".join(lines)


def figures_table() -> str:
    """docs/figures.md's table of the figures, from :mod:`aotcheck.figures.table` (tools/gendocs.py writes it; tests/test_docs.py keeps it in step)."""

    def amount(figure: Figure) -> str:
        if not figure.abs:
            return f"{figure.rel:.0%}" if figure.rel else "exact"
        size = fmt_bytes(figure.abs) if figure.unit is Unit.BYTES else f"{figure.abs:g} s"
        return f"{figure.rel:.0%} + {size}" if figure.rel else size

    return markdown_table(["figure", "unit", "worse when", "default tolerance", "what it is"], [
        [f"`{f.glob}`", f.unit, "it drops" if f.worse is Worse.LESS else "it grows", amount(f), f.meaning] for f in FIGURES])


def _changes(outcome: Outcome, limit: int = 3) -> str:
    moved = outcome.moved()
    out = [f"{r.metric} {fmt_pct(r.ratio)}" for r in moved[:limit]]
    if len(moved) > limit:
        out.append(f"+{len(moved) - limit} more")
    return ", ".join(out)


def _peak_block(outcome: Outcome) -> list[str]:
    """The peak by class (against the golden when there is one) and the largest buffers, as Markdown."""
    figures, golden = outcome.figures or {}, outcome.golden_figures or {}
    lines = []
    found = Attribution.from_parts(figures, [])  # A class added later reads as 0.
    if found is not None:
        rows = []
        for kind in CLASSES:
            now, before = found.classes[kind], golden.get(PEAK_FIGURE[kind])
            rows.append([kind, fmt_bytes(now), fmt_bytes(before) if before is not None else "-",
                         fmt_pct(now / before - 1) if before else "-"])
        lines += [markdown_table(["class", "now", "golden", "change"], rows), ""]
    buffers = outcome.details.peak_buffers if outcome.details is not None else []
    if buffers:
        lines += [markdown_table(["bytes/device", "class", "buffer", "shape", "source"],
                                 [[fmt_bytes(b.bytes), b.kind, f"`{b.name}`", b.shape, source_line(b) or "-"]
                                  for b in buffers]), ""]
    return lines


def markdown(merged: Merged, *, title: str = "aotcheck") -> str:
    """The job summary: counts, problems, the case table (failures first), details, HBM bars."""
    report = merged.report
    outcomes = report.outcomes
    verdicts = [o.verdict.value for o in outcomes]
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts), key=verdicts.index))
    cached = sum(1 for o in outcomes if o.measured is not None and o.measured.cached)
    unlowered = sum(1 for o in outcomes if o.measured is not None and not o.measured.lowered)
    status = "❌ failed" if merged.failed else "✅ passed"
    lines = [f"## {title}: {status}", "", f"{len(outcomes)} cases: {counts or 'none'}; {cached} from the figures cache"
             + (f" ({unlowered} of them not even lowered: their inputs unchanged)." if unlowered else "."), ""]
    for problem in merged.problems:
        lines.append(f"> **Report problem:** {problem}")
    for name, error in sorted(report.broken.items()):
        lines.append(f"> **Config `{name}` could not be built:** {error}")
    if merged.problems or report.broken:
        lines.append("")
    if outcomes:
        rows = [summary_row(o) + [_changes(o)] for o in outcomes]
        lines.append(markdown_table(SUMMARY_HEADERS + ["change vs golden"], rows))
    served = report.served()
    if served:
        lines += ["", "### Servers: buckets, largest first, and the start-up bill", ""]
        for bill, buckets in served:
            boot = boot_line(bill)
            lines += [bill_line(bill).removeprefix("aotcheck: "), *(["", boot.strip()] if boot else []), "",
                      markdown_table(HEADERS, bucket_rows(buckets)), ""]
    if report.failed:
        lines += ["", "### What failed", ""]
        for o in report.failed:
            lines += [f"<details><summary><code>{o.case.id}</code>: {o.verdict.value}</summary>", "",
                      "```", outcome_message(o), "```", "</details>", ""]
    explained = [o for o in outcomes if (o.failed or o.verdict is Verdict.REGRESSION) and _peak_block(o)]
    if explained:
        lines += ["", "### What holds the HBM at the peak", ""]
        for o in explained:
            lines += [f"<details><summary><code>{o.case.id}</code>: peak {fmt_bytes((o.figures or {}).get('peak_bytes', 0))}"
                      "</summary>", "", *_peak_block(o), "</details>", ""]
    flagged = [o for o in outcomes if o.details is not None and o.details.unsharded]
    if flagged:
        lines += ["", "### Activations left unsharded", "", UNSHARDED_CAUSES, ""]
        for o in flagged:
            found = o.details.unsharded
            lines += [f"<details><summary><code>{o.case.id}</code>: {len(found)} buffer(s) keep "
                      f"<code>{found[0].input}</code> whole ({found[0].batch} rows, split {found[0].ways} ways)</summary>", "",
                      markdown_table(["bytes/device", "shape", "split", "buffer", "source"],
                                     [[fmt_bytes(u.bytes), u.shape, u.split, f"`{u.name}`", source_line(u) or "-"]
                                      for u in found]), "", "</details>", ""]
    doubtful = [o for o in outcomes if o.details is not None and o.details.doubts()]
    if doubtful:
        lines += ["", "### What the figures may miss or overstate", ""]
        for o in doubtful:
            lines += [f"- `{o.case.id}`: {line}" for line in o.details.doubts()]
        lines.append("")
    if report.upgrade is not None:
        lines += ["", *upgrade_section(report.upgrade, golden_dir=report.golden_dir)]
    if report.stale:
        lines += ["", f"**Stale golden files** (no registered case): {', '.join(report.stale)}"]
    bars = text_bars(outcomes)
    if bars:
        lines += ["", "### Peak HBM per device (full bar = the chip's HBM)", "", "```", bars, "```"]
    return "\n".join(lines) + "\n"


def upgrade_section(upgrade: Upgrade, *, golden_dir: str) -> list[str]:
    """The toolchain upgrade (or downgrade) in Markdown: what moved, what did not, and what to do (a
    downgrade gives no command: its figures are not to be accepted over the newer goldens')."""
    heading = upgrade_heading(upgrade)
    lines = [f"### {heading[0].upper()}{heading[1:]}", "",
             f"{upgrade_summary(upgrade)}: {len(upgrade.moved)} moved, {len(upgrade.unmoved)} did not.", ""]
    if upgrade.moved:
        lines += [markdown_table(["case", "figure", "golden", "now", "change"], upgrade_rows(upgrade)), ""]
    if upgrade.unmoved:
        lines += ["Did not move: " + ", ".join(f"`{c}`" for c in upgrade.unmoved), ""]
    advice, command = upgrade_advice(upgrade, golden_dir=golden_dir)
    return lines + ([advice, "", "```", command, "```"] if command else [f"**{advice}**"])


def annotations(merged: Merged, *, limit: int = 5) -> list[str]:
    """At most ``limit`` ``::error`` workflow commands, pointing at the golden files that moved."""
    out = []
    for o in merged.report.failed[:limit]:
        message = (outcome_message(o) or o.verdict.value).replace("%", "%25").replace("\r", "").replace("\n", "%0A")
        path = posixpath.join(merged.report.golden_dir, o.golden_path)
        out.append(f"::error file={path},title=aotcheck {o.case.id} {o.verdict.value}::{message}")
    for problem in merged.problems[: max(0, limit - len(out))]:
        out.append(f"::error title=aotcheck report::{problem}")
    return out
