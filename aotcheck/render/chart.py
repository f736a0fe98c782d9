"""Peak HBM per device against the chip's capacity, as a picture (SVG) and as text bars.

Example:
    >>> from aotcheck.gate.case import Case
    >>> from aotcheck.gate.outcome import Outcome
    >>> from aotcheck.gate.verdict import Verdict
    >>> o = Outcome(Case.of("lm", "prefill", "v5e-16"), Verdict.PASS, figures={"peak_bytes": 4 * 2**30})
    >>> print(text_bars([o], width=8))
    lm/prefill@v5e-16x1  ██░░░░░░    25.0%  4.00 GiB
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

from aotcheck.gate.outcome import Outcome
from aotcheck.render.text import hbm_fraction
from aotcheck.units import fmt_bytes, fmt_share


def _bars(outcomes: Sequence[Outcome]) -> list[tuple[str, float, int]]:
    rows = []
    for o in outcomes:
        frac = hbm_fraction(o)
        if frac is not None:
            rows.append((o.case.id, frac, int((o.figures or {}).get("peak_bytes", 0))))
    return rows


def text_bars(outcomes: Sequence[Outcome], *, width: int = 30) -> str:
    """``case  ██████░░░░  43.1%  6.9 GiB`` lines, full bar = the chip's HBM."""
    rows = _bars(outcomes)
    if not rows:
        return ""
    name_width = max(len(r[0]) for r in rows)
    lines = []
    for case, frac, peak in rows:
        filled = min(width, round(frac * width))
        bar = "█" * filled + "░" * (width - filled) + ("▶" if frac > 1 else "")
        lines.append(f"{case.ljust(name_width)}  {bar}  {fmt_share(frac):>7}  {fmt_bytes(peak)}")
    return "\n".join(lines)


def svg_chart(outcomes: Sequence[Outcome]) -> str:
    """A horizontal bar chart: one bar per case, the dashed line at 100% of HBM."""
    rows = _bars(outcomes)
    bar_h, gap, label_w, plot_w = 18, 6, 330, 420
    scale_max = max([1.0] + [r[1] for r in rows])
    height = 40 + len(rows) * (bar_h + gap) + 30
    width = label_w + plot_w + 150

    def x_of(frac: float) -> float:
        return label_w + plot_w * frac / scale_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        '<text x="10" y="20" font-size="14" font-weight="bold">Peak HBM per device, share of the chip\'s capacity</text>',
    ]
    for i, (case, frac, peak) in enumerate(rows):
        y = 35 + i * (bar_h + gap)
        color = "#d73a49" if frac > 1 else "#e36209" if frac > 0.9 else "#2f81f7"
        parts.append(f'<text x="{label_w - 8}" y="{y + 13}" text-anchor="end">{escape(case)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{max(1.0, x_of(frac) - label_w):.1f}" height="{bar_h}" fill="{color}"/>')
        parts.append(f'<text x="{x_of(frac) + 6:.1f}" y="{y + 13}">{fmt_share(frac)} ({escape(fmt_bytes(peak))})</text>')
    line_x = x_of(1.0)
    bottom = 35 + len(rows) * (bar_h + gap)
    parts.append(f'<line x1="{line_x:.1f}" y1="30" x2="{line_x:.1f}" y2="{bottom}" stroke="#000" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{line_x:.1f}" y="{bottom + 16}" text-anchor="middle">100% of HBM</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
