"""Checking one case against its golden: compile, compare, decide, (maybe) accept.

:func:`check_case` is the whole gate for one case, without pytest; the plugin
turns its :class:`Outcome` into a test item's result.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from aotcheck import _runtime
from aotcheck.cache import FiguresCache
from aotcheck.case import Case
from aotcheck.compare import DEFAULT_TOLERANCES, Row, Tolerance, compare, verdict
from aotcheck.compile import CompileError
from aotcheck.format import fmt_bytes, fmt_count, fmt_pct, table
from aotcheck.golden import GoldenError, GoldenStore
from aotcheck.memory import explain_oom, hbm_verdict
from aotcheck.registry import REGISTRY, Registry
from aotcheck.runner import CaseResult, run_case

# Verdicts that fail the item (improvement only under strict).
FAILING = {"regression", "missing-golden", "corrupt-golden", "compile-error", "out-of-memory", "over-hbm", "error"}


@dataclasses.dataclass
class Outcome:
    """The result of checking one case: plain data, JSON-ready via :meth:`to_json`."""

    case: Case
    verdict: str
    message: str = ""
    figures: dict[str, int | float] | None = None
    golden: dict[str, int | float] | None = None
    rows: list[Row] = dataclasses.field(default_factory=list)
    compile_seconds: float | None = None
    golden_path: str = ""
    golden_action: str | None = None  # created | changed | unchanged, under --update-golden
    toolchain_note: str | None = None
    detail: str | None = None  # Full error text, for the report.
    cached: bool = False  # Figures from the figures cache, no compile.

    def failed(self, *, strict: bool = False) -> bool:
        return self.verdict in FAILING or (strict and self.verdict == "improvement")

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case.id,
            "config": self.case.config,
            "program": self.case.program,
            "topology": self.case.topology,
            "num_slices": self.case.num_slices,
            "verdict": self.verdict,
            "message": self.message,
            "figures": self.figures,
            "golden": self.golden,
            "changes": [
                {"metric": r.metric, "golden": r.golden, "now": r.now, "status": r.status, "tolerance": str(r.tolerance)}
                for r in self.rows
                if r.status != "ok"
            ],
            "compile_seconds": self.compile_seconds,
            "cached": self.cached,
            "golden_path": self.golden_path,
            "golden_action": self.golden_action,
            "toolchain_note": self.toolchain_note,
            "detail": self.detail,
        }


def accept_command(case: Case) -> str:
    """The command that accepts this case's current figures as its golden."""
    return shlex.join(
        ["pytest", "--update-golden", f"--aot-configs={case.config}",
         f"--aot-topologies={case.topology}x{case.num_slices}", "-k", case.program]
    )


def toolchain_note(golden_toolchain: dict[str, Any]) -> str | None:
    """Says how the golden's toolchain differs from this one, or None."""
    now = _runtime.toolchain()
    diffs = [f"{k} {golden_toolchain.get(k)} -> {now[k]}" for k in now if golden_toolchain.get(k) != now[k]]
    if not diffs:
        return None
    return "golden made with another toolchain (" + ", ".join(diffs) + "); figures may differ for that reason alone"


def _fmt_value(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    return fmt_bytes(value) if metric.endswith("_bytes") else fmt_count(value)


def change_table(rows: Sequence[Row], *, only_changed: bool = True) -> str:
    """metric / golden / now / change / % / tolerance / status."""
    shown = [r for r in rows if r.status not in ("ok",)] if only_changed else list(rows)
    return table(
        ["metric", "golden", "now", "change", "%", "tolerance", "status"],
        [
            [r.metric, _fmt_value(r.metric, r.golden), _fmt_value(r.metric, r.now),
             ("+" if (r.delta or 0) > 0 else "") + _fmt_value(r.metric, r.delta) if r.delta is not None else "-",
             fmt_pct(r.ratio), str(r.tolerance), r.status]
            for r in shown
        ],
    )


def comm_summary(rows: Sequence[Row]) -> list[str]:
    """One line per collective kind that moved, e.g. ``all-gather bytes +300.0%: 3 new all-gathers``."""
    by_metric = {r.metric: r for r in rows}
    lines = []
    for metric, row in by_metric.items():
        if not (metric.startswith("comm_") and metric.endswith("_bytes")) or row.status == "ok":
            continue
        kind = metric.removeprefix("comm_").removesuffix("_bytes").replace("_", "-")
        count = by_metric.get(metric.replace("_bytes", "_count"))
        text = f"{kind} bytes {fmt_pct(row.ratio) if row.ratio is not None else row.status}"
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


def check_case(
    case: Case,
    *,
    store: GoldenStore,
    tolerances: Sequence[tuple[str, Tolerance]] = DEFAULT_TOLERANCES,
    update: bool = False,
    hbm_headroom: float = 1.0,
    registry: Registry = REGISTRY,
    cache: FiguresCache | None = None,
    runner: Callable[[Case], CaseResult] | None = None,
) -> Outcome:
    """Compiles ``case``, checks it fits, compares it with its golden, writes the golden if ``update``.

    ``runner`` compiles the case (default: :func:`aotcheck.runner.run_case` here,
    with ``registry`` and ``cache``); the plugin passes one that isolates chip families.
    """
    golden_path = str(store.path(case))
    try:
        result = runner(case) if runner else run_case(case, registry=registry, cache=cache)
    except CompileError as e:
        oom = explain_oom(str(e), case.topology)
        if oom:
            return Outcome(case, "out-of-memory", f"{case.id} {oom}", golden_path=golden_path, detail=str(e))
        return Outcome(case, "compile-error", f"{case.id} does not compile:\n{trim_error(str(e))}",
                       golden_path=golden_path, detail=str(e))
    except (ValueError, KeyError) as e:  # Config, mesh or partition errors: they explain themselves.
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        return Outcome(case, "error", f"{case.id}: {message}", golden_path=golden_path, detail=str(message))
    figures = result.figures
    base = dict(figures=figures, compile_seconds=result.compile_seconds, golden_path=golden_path,
                cached=result.cached)
    over = hbm_verdict(int(figures["peak_bytes"]), case.topology, headroom=hbm_headroom)
    if over:
        return Outcome(case, "over-hbm", f"{case.id} does not fit: it {over}.", **base)
    if update:
        action = store.write(case, figures, toolchain=_runtime.toolchain(), compiler_options=result.compiler_options)
        return Outcome(case, action, f"golden {action}: {golden_path}", golden_action=action, **base)
    try:
        golden = store.read(case)
    except GoldenError as e:
        return Outcome(case, "corrupt-golden", f"{e}\nTo replace it: {accept_command(case)}", **base)
    if golden is None:
        return Outcome(
            case, "missing-golden",
            f"{case.id} has no golden file ({golden_path}).\nTo create it: {accept_command(case)}", **base,
        )
    rows = compare(golden.figures, figures, tolerances)
    outcome = Outcome(case, verdict(rows), golden=golden.figures, rows=rows,
                      toolchain_note=toolchain_note(golden.toolchain), **base)
    if outcome.verdict != "pass":
        what = {"regression": "regressed", "improvement": "improved beyond tolerance"}[outcome.verdict]
        lines = [f"{case.id} {what} against {golden_path}:", "", change_table(rows), ""]
        moved = comm_summary(rows)
        if moved:
            lines += ["Collectives that moved: " + "; ".join(moved), ""]
        if outcome.toolchain_note:
            lines.append(f"Note: {outcome.toolchain_note}.")
        lines.append(f"To accept the new figures: {accept_command(case)}")
        outcome.message = "\n".join(lines)
    return outcome
