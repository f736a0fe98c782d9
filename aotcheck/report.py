"""Reports over case outcomes: the terminal summary and the JSON report file.

Outcomes are the plain dicts of :meth:`aotcheck.check.Outcome.to_json` (plus
``failed``), as they arrive from pytest-xdist workers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aotcheck import _runtime
from aotcheck.figures import comm_bytes, roofline
from aotcheck.format import fmt_bytes, fmt_count, fmt_seconds, fmt_share, table
from aotcheck.golden import atomic_write_text
from aotcheck.topology import TopologyError, parse_topology

REPORT_FORMAT = 1
# Failures first, then what moved, then the rest.
_ORDER = {"compile-error": 0, "error": 0, "out-of-memory": 0, "over-hbm": 0, "corrupt-golden": 0, "regression": 1, "missing-golden": 2,
          "improvement": 3, "changed": 4, "created": 4, "pass": 5, "unchanged": 5, "skipped": 6}


def hbm_fraction(outcome: dict[str, Any]) -> float | None:
    """Peak bytes per device over the chip's HBM capacity."""
    figures = outcome.get("figures") or {}
    try:
        chip = parse_topology(outcome.get("topology") or outcome["case"].split("@")[1].rsplit("x", 1)[0]).chip
    except (TopologyError, IndexError, KeyError):
        return None
    if chip is None or "peak_bytes" not in figures:
        return None
    return figures["peak_bytes"] / chip.hbm_bytes


def sort_outcomes(outcomes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(outcomes, key=lambda o: (not o.get("failed"), _ORDER.get(o["verdict"], 9), o["case"]))


def summary_rows(outcomes: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for o in sort_outcomes(outcomes):
        figures = o.get("figures") or {}
        frac = hbm_fraction(o)
        seconds = o.get("compile_seconds")
        rows.append([
            o["case"],
            f"{seconds:.1f}s" if seconds is not None else "-",
            fmt_bytes(figures.get("peak_bytes")) if figures else "-",
            fmt_share(frac),
            fmt_count(figures.get("flops", figures.get("flops_xla"))) if figures else "-",
            fmt_bytes(comm_bytes(figures)) if figures else "-",
            fmt_seconds(bound["bound_seconds"]) if (bound := _roofline(o)) else "-",
            o["verdict"] + (" (FAILED)" if o.get("failed") and o["verdict"] in ("improvement", "skipped") else ""),
        ])
    return rows


SUMMARY_HEADERS = ["case", "compile", "peak/device", "of HBM", "FLOPs/device", "comm/device", "step >=", "verdict"]



def _roofline(outcome: dict[str, Any]) -> dict[str, float] | None:
    try:
        return roofline(outcome.get("figures") or {}, outcome["topology"])
    except (TopologyError, KeyError):
        return None


def terminal_summary(outcomes: Sequence[dict[str, Any]]) -> str:
    return table(SUMMARY_HEADERS, summary_rows(outcomes))


def report_document(outcomes: Sequence[dict[str, Any]], *, stale: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "aotcheck_report": REPORT_FORMAT,
        "toolchain": _runtime.toolchain(),
        "cases": sort_outcomes(outcomes),
        "stale_goldens": list(stale),
    }


def write_report(path: Path, outcomes: Sequence[dict[str, Any]], *, stale: Sequence[str] = ()) -> None:
    atomic_write_text(Path(path), json.dumps(report_document(outcomes, stale=stale), indent=2, sort_keys=True) + "\n")
