"""The pull-request view: a Markdown job summary and GitHub annotations from merged reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aotcheck.chart import text_bars
from aotcheck.format import fmt_pct, markdown_table
from aotcheck.report import Merged, SUMMARY_HEADERS, summary_rows

_MOVED = ("regression", "improvement")


def _changes(outcome: dict[str, Any], limit: int = 3) -> str:
    changes = [c for c in outcome.get("changes") or [] if c["status"] in _MOVED]
    out = []
    for c in changes[:limit]:
        ratio = (c["now"] - c["golden"]) / abs(c["golden"]) if c.get("golden") else None
        out.append(f"{c['metric']} {fmt_pct(ratio)}")
    if len(changes) > limit:
        out.append(f"+{len(changes) - limit} more")
    return ", ".join(out)


def markdown(merged: Merged, *, title: str = "aotcheck") -> str:
    """The job summary: counts, problems, the case table (failures first), details, HBM bars."""
    outcomes = merged.outcomes
    verdicts = [o["verdict"] for o in outcomes]
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts), key=verdicts.index))
    cached = sum(1 for o in outcomes if o.get("cached"))
    status = "❌ failed" if merged.failed or merged.problems else "✅ passed"
    lines = [f"## {title}: {status}", "", f"{len(outcomes)} cases: {counts}; {cached} from the figures cache.", ""]
    for problem in merged.problems:
        lines.append(f"> **Missing or unreadable:** {problem}")
    if merged.problems:
        lines.append("")
    rows = [row + [_changes(o)] for row, o in zip(summary_rows(outcomes), outcomes)]
    lines.append(markdown_table(SUMMARY_HEADERS + ["change vs golden"], rows))
    failed = merged.failed
    if failed:
        lines += ["", "### What failed", ""]
        for o in failed:
            lines += [f"<details><summary><code>{o['case']}</code>: {o['verdict']}</summary>", "",
                      "```", o.get("message") or "", "```", "</details>", ""]
    if merged.stale:
        lines += ["", f"**Stale golden files** (no registered case): {', '.join(merged.stale)}"]
    bars = text_bars(outcomes)
    if bars:
        lines += ["", "### Peak HBM per device (full bar = the chip's HBM)", "", "```", bars, "```"]
    return "\n".join(lines) + "\n"


def annotations(merged: Merged, *, limit: int = 5) -> list[str]:
    """At most ``limit`` ``::error`` workflow commands, pointing at the golden files that moved."""
    out = []
    for o in merged.failed[:limit]:
        message = (o.get("message") or o["verdict"]).replace("%", "%25").replace("\r", "").replace("\n", "%0A")
        path = o.get("golden_path") or ""
        where = f" file={_relative(path)}," if path else " "
        out.append(f"::error{where}title=aotcheck {o['case']} {o['verdict']}::{message}")
    for problem in [p for p in merged.problems][: max(0, limit - len(out))]:
        out.append(f"::error title=aotcheck report::{problem}")
    return out


def _relative(path: str) -> str:
    # Runners check out into the workspace; golden paths in reports are absolute.
    marker = "/golden/"
    return "golden/" + path.split(marker, 1)[1] if marker in path else path


def render(merged: Merged, fmt: str) -> str:
    if fmt == "markdown":
        return markdown(merged)
    from aotcheck.report import terminal_summary

    lines = [terminal_summary(merged.outcomes)]
    lines += [f"missing or unreadable: {p}" for p in merged.problems]
    return "\n".join(lines) + "\n"


__all__ = ["annotations", "markdown", "render"]
