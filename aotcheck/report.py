"""Reports over case outcomes: the terminal summary and the JSON report file.

Outcomes are the plain dicts of :meth:`aotcheck.check.Outcome.to_json` (plus
``failed``), as they arrive from pytest-xdist workers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aotcheck import _runtime
from aotcheck.figures import comm_bytes, roofline
from aotcheck.format import fmt_bytes, fmt_count, fmt_seconds, fmt_share, table
from aotcheck.golden import atomic_write_text
from aotcheck.topology import parse_topology

REPORT_FORMAT = 1
# Failures first, then what moved, then the rest.
_ORDER = {"compile-error": 0, "error": 0, "out-of-memory": 0, "over-hbm": 0, "corrupt-golden": 0, "regression": 1, "missing-golden": 2,
          "improvement": 3, "changed": 4, "created": 4, "pass": 5, "unchanged": 5, "skipped": 6}


def hbm_fraction(outcome: dict[str, Any]) -> float | None:
    """Peak bytes per device over the chip's HBM capacity."""
    figures = outcome.get("figures") or {}
    if "peak_bytes" not in figures:  # Failed before figures (and maybe before a topology).
        return None
    chip = parse_topology(outcome["topology"]).chip
    return figures["peak_bytes"] / chip.hbm_bytes if chip else None


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
            "cached" if o.get("cached") else f"{seconds:.1f}s" if seconds is not None else "-",
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
    figures = outcome.get("figures")
    return roofline(figures, outcome["topology"]) if figures else None


def terminal_summary(outcomes: Sequence[dict[str, Any]]) -> str:
    return table(SUMMARY_HEADERS, summary_rows(outcomes))


def report_document(
    outcomes: Sequence[dict[str, Any]], *, stale: Sequence[str] = (), shard: tuple[int, int] | None = None
) -> dict[str, Any]:
    return {
        "aotcheck_report": REPORT_FORMAT,
        "toolchain": _runtime.toolchain(),
        "shard": list(shard) if shard else None,
        "cases": sort_outcomes(outcomes),
        "stale_goldens": list(stale),
    }


def write_report(
    path: Path, outcomes: Sequence[dict[str, Any]], *, stale: Sequence[str] = (), shard: tuple[int, int] | None = None
) -> None:
    document = report_document(outcomes, stale=stale, shard=shard)
    atomic_write_text(Path(path), json.dumps(document, indent=2, sort_keys=True) + "\n")


class ReportError(ValueError):
    """A report file that cannot be read or comes from another report format."""


def load_report(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: not a readable JSON report ({e})") from e
    if not isinstance(doc, dict) or doc.get("aotcheck_report") != REPORT_FORMAT or not isinstance(doc.get("cases"), list):
        found = doc.get("aotcheck_report") if isinstance(doc, dict) else None
        raise ReportError(f"{path}: not an aotcheck report of format {REPORT_FORMAT} (found {found!r})")
    return doc


@dataclasses.dataclass
class Merged:
    """Reports of several shards, merged."""

    outcomes: list[dict[str, Any]]
    stale: list[str]
    problems: list[str]  # Unreadable reports, missing shards.

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [o for o in self.outcomes if o.get("failed")]


def merge_reports(paths: Sequence[Path], *, expect_shards: int | None = None) -> Merged:
    """Merges shard reports; names unreadable ones and shards with no report, and goes on."""
    outcomes: dict[str, dict[str, Any]] = {}
    stale: set[str] = set()
    problems: list[str] = []
    seen_shards: set[int] = set()
    for path in paths:
        try:
            doc = load_report(path)
        except ReportError as e:
            problems.append(str(e))
            continue
        for outcome in doc["cases"]:
            outcomes[outcome["case"]] = outcome
        stale.update(doc.get("stale_goldens") or [])
        if doc.get("shard"):
            seen_shards.add(int(doc["shard"][0]))
    if expect_shards:
        missing = sorted(set(range(1, expect_shards + 1)) - seen_shards)
        problems += [f"shard {k}/{expect_shards} has no report: its runner crashed or was cancelled" for k in missing]
    # A stale golden is one no shard's registry knows; every shard sees the same registry.
    return Merged(sort_outcomes(list(outcomes.values())), sorted(stale), problems)
