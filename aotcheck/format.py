"""Human-readable numbers and plain-text tables, shared by the CLI and the reports."""

from __future__ import annotations

from collections.abc import Sequence


def fmt_bytes(n: float | int | None) -> str:
    """``1536 -> '1.5 KiB'``; binary units, as HBM is sold and XLA reports."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_count(n: float | int | None) -> str:
    """``4.3e13 -> '43.00 T'``; decimal SI prefixes, for FLOPs."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(value) < 1000 or unit == "E":
            return f"{value:.0f}" if unit == "" else f"{value:.2f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def fmt_seconds(x: float | None) -> str:
    """``0.0123 -> '12.3 ms'``."""
    if x is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if x >= scale or unit == "us":
            return f"{x / scale:.3g} {unit}"
    raise AssertionError("unreachable")


def fmt_share(x: float | None) -> str:
    """A share of a capacity: ``0.4312 -> '43.1%'``, small ones still visible (``'0.012%'``)."""
    if x is None:
        return "-"
    return f"{x * 100:.1f}%" if x >= 0.001 else f"{x * 100:.2g}%"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned text columns, a rule under the header."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table."""
    esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in rows]
    return "\n".join(lines)
