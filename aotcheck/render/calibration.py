"""The calibration table: each committed chip record's figures beside what aotcheck compiled, and
whether the model's verdicts agree with the chip (:mod:`aotcheck.gate.calibration`).

One row per figure the chip read: case, target, figure, compiled (aotcheck's deviceless figure or
prediction), chip, ratio (chip over compiled). ``docs/calibration.md`` holds the table for the
committed records, kept equal to :func:`calibration_markdown` by a test.

Example (FAKE figures):
    >>> from aotcheck.gate.calibration import Calibration
    >>> record = Calibration("lm/prefill@v5e-1x1", {"libtpu": "0.0.42.1"}, "a doctest", 16909336064,
    ...                      {"prefill[batch=4]": {"peak_bytes": 2**30, "generated_code_bytes": 0, "flops": 1e12,
    ...                       "argument_bytes": 2**29, "output_bytes": 2**29, "alias_bytes": 0, "temp_bytes": 0}},
    ...                      step={"at": "prefill[batch=4]", "code_bytes": None, "reserved_bytes": None,
    ...                            "footprint_bytes": 2**29, "seconds": 0.01})
    >>> for row in calibration_rows([record]): print(row)
    ['lm/prefill', 'v5e-1x1', 'I/O + temporaries + code at prefill[batch=4]', '1.00 GiB', '512.00 MiB held', '0.500']
    ['lm/prefill', 'v5e-1x1', 'FLOP/s at prefill[batch=4]', '1e+12 FLOPs', '100.0 TFLOP/s (0.51 of peak)', '-']
"""

from __future__ import annotations

from collections.abc import Sequence

from aotcheck.gate.calibration import Calibration, agreements, boot_of, held_bound
from aotcheck.units import fmt_bytes

HEADERS = ["case", "target", "figure", "compiled", "chip", "ratio"]


def _ratio(chip: float, compiled: float) -> str:
    return f"{chip / compiled:.3f}" if compiled else "-"


def calibration_rows(records: Sequence[Calibration]) -> list[list[str]]:
    """The table's rows, records in the order given, each section's figures in a fixed order."""
    rows = []
    for r in records:
        case, target = f"{r.config}/{r.program}", r.target
        if r.step is not None:
            at, figures = r.step["at"], r.figures[r.step["at"]]
            if r.step.get("code_bytes") is not None:
                rows.append([case, target, f"code at {at}", f"{int(figures['generated_code_bytes']):,} B",
                             f"{int(r.step['code_bytes']):,} B", _ratio(r.step["code_bytes"], figures["generated_code_bytes"])])
            if r.step.get("reserved_bytes") is not None:
                rows.append([case, target, f"temporaries at {at}", f"{int(figures['temp_bytes']):,} B",
                             f"{int(r.step['reserved_bytes']):,} B reserved", _ratio(r.step["reserved_bytes"], figures["temp_bytes"])])
            if "refused" in r.step:
                rows.append([case, target, f"run at {at}", fmt_bytes(figures["peak_bytes"]) + " peak",
                             f"refused at {r.step['refused']}", "-"])
            if r.step.get("footprint_bytes") is not None:
                bound = held_bound(figures)
                rows.append([case, target, f"I/O + temporaries + code at {at}", fmt_bytes(bound),
                             f"{fmt_bytes(r.step['footprint_bytes'])} held", _ratio(r.step["footprint_bytes"], bound)])
            if r.step.get("seconds") and figures.get("flops"):
                rate = figures["flops"] / float(r.step["seconds"])
                peak = r.topology.device.peak_flops or 0.0
                rows.append([case, target, f"FLOP/s at {at}", f"{figures['flops']:.4g} FLOPs",
                             f"{rate / 1e12:.1f} TFLOP/s ({rate / peak:.2f} of peak)", "-"])
        if r.fit is not None:
            fit, figures = r.fit, r.figures[r.fit["at"]]
            rows.append([case, target, f"fit_max_{fit['knob']}", str(fit["answer"]),
                         f"{fit['answer']} ran, {fit['answer'] + fit['step']} refused at {fit['above']['refused']}", "1.000"])
            if fit.get("footprint_bytes") is not None:
                bound = figures["peak_bytes"] + figures["generated_code_bytes"]
                rows.append([case, target, f"peak + code at {fit['at']}", f"{int(bound):,} B",
                             f"{int(fit['footprint_bytes']):,} B held", _ratio(fit["footprint_bytes"], bound)])
        if r.boot is not None:
            for trial in r.boot["trials"]:
                boot = boot_of(r, int(trial["pages"]))
                seen = "started" if trial["started"] else f"failed: E0101 at {trial['error']['program']}"
                rows.append([case, target, f"start-up at {int(trial['pages']):,} pages", boot.start.value, seen,
                             "agrees" if boot.boots == bool(trial["started"]) else "DISAGREES"])
            largest = int(r.boot["largest_started"])
            predicted = boot_of(r, largest).kv_evict_max_pages or 0
            rows.append([case, target, "largest pool that starts", f"{predicted:,} pages", f"{largest:,} pages",
                         _ratio(largest, predicted)])
    return rows


def calibration_markdown(records: Sequence[Calibration]) -> str:
    """The table in Markdown, then each record's verdicts that disagree with its chip (none: said)."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in calibration_rows(records)]
    wrong = [(r, a) for r in records for a in agreements(r) if not a.agrees]
    lines.append("")
    lines.append("Every verdict re-derived from the records' figures agrees with its chip." if not wrong else
                 "\n".join(f"- DISAGREES: {r.case} {a.what}: aotcheck {a.predicted}, the chip {a.seen}" for r, a in wrong))
    return "\n".join(lines) + "\n"
