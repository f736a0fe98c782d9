"""Peak HBM per device against the chip's capacity, as a picture (SVG) and as text bars.

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.gate.outcome import Outcome
    >>> from aotcheck.gate.verdict import Verdict
    >>> from aotcheck.pipeline.measurement import Measurement
    >>> def measured(case, figures):
    ...     return Outcome(case, Verdict.PASS, measured=Measurement(case, figures, {}, 1.0))
    >>> o = measured(Case.of("lm", "prefill", "v5e-16"), {"peak_bytes": 4 * 2**30})
    >>> print(text_bars([o], width=8))
    lm/prefill@v5e-16x1  ██░░░░░░    25.0%  4.00 GiB

With the peak split by class, each bar is stacked by class (a letter each):

    >>> split = {"peak_params_bytes": 2**30, "peak_opt_state_bytes": 2 * 2**30, "peak_batch_bytes": 0,
    ...          "peak_outputs_bytes": 0, "peak_temp_bytes": 2**30, "peak_other_bytes": 0}
    >>> o = measured(Case.of("lm", "train_step", "v5e-16"), {"peak_bytes": 4 * 2**30, **split})
    >>> print(text_bars([o], width=16))
    lm/train_step@v5e-16x1  POOT░░░░░░░░░░░░    25.0%  4.00 GiB
    P params  O opt_state  B batch  K kv_cache  U outputs  T temp  x other  ░ free
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

from aotcheck.figures.attribution import CLASSES, Attribution
from aotcheck.gate.outcome import Outcome
from aotcheck.render.tables import hbm_fraction
from aotcheck.units import fmt_bytes, fmt_share


GLYPHS = {"params": "P", "opt_state": "O", "batch": "B", "kv_cache": "K", "outputs": "U", "temp": "T", "other": "x"}
COLORS = {"params": "#2f81f7", "opt_state": "#8250df", "batch": "#1a7f37", "kv_cache": "#0a7ea4", "outputs": "#bf8700",
          "temp": "#e36209", "other": "#8c959f"}


def _bars(outcomes: Sequence[Outcome]) -> list[tuple[str, float, int, dict[str, float]]]:
    """(case, peak / HBM, peak bytes, each class's share of HBM, empty without the split)."""
    rows = []
    for o in outcomes:
        frac = hbm_fraction(o)
        if frac is not None:
            figures = o.figures or {}
            peak = int(figures.get("peak_bytes", 0))
            found = Attribution.from_parts(figures, []) if peak else None  # A class added later reads as 0.
            split = {k: frac * found.classes[k] / peak for k in CLASSES} if found is not None else {}
            rows.append((o.case.id, frac, peak, split))
    return rows


def _stacked(frac: float, split: dict[str, float], width: int) -> str:
    filled = min(width, round(frac * width))
    if not split:
        return "█" * filled
    cells, edge = [], 0.0
    for kind in CLASSES:  # Round the running total so the segments add up to the bar.
        start, edge = edge, edge + split[kind]
        cells.append(GLYPHS[kind] * (min(filled, round(edge * width)) - min(filled, round(start * width))))
    return "".join(cells)


def text_bars(outcomes: Sequence[Outcome], *, width: int = 30) -> str:
    """``case  ██████░░░░  43.1%  6.9 GiB`` lines, full bar = the chip's HBM."""
    rows = _bars(outcomes)
    if not rows:
        return ""
    name_width = max(len(r[0]) for r in rows)
    lines = []
    for case, frac, peak, split in rows:
        filled = min(width, round(frac * width))
        bar = _stacked(frac, split, width) + "░" * (width - filled) + ("▶" if frac > 1 else "")
        lines.append(f"{case.ljust(name_width)}  {bar}  {fmt_share(frac):>7}  {fmt_bytes(peak)}")
    if any(r[3] for r in rows):
        lines.append("  ".join(f"{GLYPHS[k]} {k}" for k in CLASSES) + "  ░ free")
    return "\n".join(lines)


def svg_chart(outcomes: Sequence[Outcome]) -> str:
    """A horizontal bar chart: one bar per case (stacked by class when the peak is split), the
    dashed line at 100% of HBM."""
    rows = _bars(outcomes)
    bar_h, gap, label_w, plot_w = 18, 6, 330, 420
    scale_max = max([1.0] + [r[1] for r in rows])
    height = 40 + len(rows) * (bar_h + gap) + 50
    width = label_w + plot_w + 150

    def x_of(frac: float) -> float:
        return label_w + plot_w * frac / scale_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        '<text x="10" y="20" font-size="14" font-weight="bold">Peak HBM per device, share of the chip\'s capacity</text>',
    ]
    for i, (case, frac, peak, split) in enumerate(rows):
        y = 35 + i * (bar_h + gap)
        parts.append(f'<text x="{label_w - 8}" y="{y + 13}" text-anchor="end">{escape(case)}</text>')
        if split:
            start = 0.0
            for kind in CLASSES:
                if split[kind] > 0:
                    parts.append(f'<rect x="{x_of(start):.1f}" y="{y}" width="{x_of(start + split[kind]) - x_of(start):.1f}" '
                                 f'height="{bar_h}" fill="{COLORS[kind]}"><title>{kind}</title></rect>')
                start += split[kind]
            if frac > 1:
                parts.append(f'<rect x="{label_w}" y="{y}" width="{x_of(frac) - label_w:.1f}" height="{bar_h}" '
                             'fill="none" stroke="#d73a49" stroke-width="2"/>')
        else:
            color = "#d73a49" if frac > 1 else "#e36209" if frac > 0.9 else "#2f81f7"
            parts.append(f'<rect x="{label_w}" y="{y}" width="{max(1.0, x_of(frac) - label_w):.1f}" height="{bar_h}" fill="{color}"/>')
        parts.append(f'<text x="{x_of(frac) + 6:.1f}" y="{y + 13}">{fmt_share(frac)} ({escape(fmt_bytes(peak))})</text>')
    line_x = x_of(1.0)
    bottom = 35 + len(rows) * (bar_h + gap)
    parts.append(f'<line x1="{line_x:.1f}" y1="30" x2="{line_x:.1f}" y2="{bottom}" stroke="#000" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{line_x:.1f}" y="{bottom + 16}" text-anchor="middle">100% of HBM</text>')
    if any(r[3] for r in rows):
        for j, kind in enumerate(CLASSES):
            x = label_w + j * 75
            parts.append(f'<rect x="{x}" y="{bottom + 26}" width="10" height="10" fill="{COLORS[kind]}"/>')
            parts.append(f'<text x="{x + 14}" y="{bottom + 35}">{kind}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
