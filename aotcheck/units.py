"""How numbers read: binary bytes, SI counts, seconds, shares and changes.

A leaf every layer may use (an HBM verdict needs bytes in words as much as a report does).

Example:
    >>> fmt_bytes(1536), fmt_bytes(17.3 * 2**30), fmt_count(4.3e13), fmt_seconds(0.0123)
    ('1.50 KiB', '17.30 GiB', '43.00 T', '12.3 ms')
    >>> fmt_share(0.4312), fmt_share(0.00012), fmt_pct(0.25), fmt_pct(None)
    ('43.1%', '0.012%', '+25.0%', '-')
"""

from __future__ import annotations

import re


def fmt_bytes(n: float | int | None) -> str:
    """Bytes in binary units, as HBM is sold and XLA reports."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_count(n: float | int | None) -> str:
    """A count with decimal SI prefixes, for FLOPs."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(value) < 1000 or unit == "E":
            return f"{value:.0f}" if unit == "" else f"{value:.2f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def fmt_seconds(x: float | None) -> str:
    """Seconds, in s, ms or us."""
    if x is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if x >= scale or unit == "us":
            return f"{x / scale:.3g} {unit}"
    raise AssertionError("unreachable")


def fmt_share(x: float | None) -> str:
    """A share of a capacity; small ones stay visible."""
    if x is None:
        return "-"
    return f"{x * 100:.1f}%" if x >= 0.001 else f"{x * 100:.2g}%"


def fmt_pct(x: float | None) -> str:
    """A signed relative change."""
    return "-" if x is None else f"{x * 100:+.1f}%"


# A run of characters no reader takes in at once: a value a user gave (a flag of 100,000 digits) is shown
# by its ends and its length, so an error or a header stays a line, not 200 KB.
LONG_RUN = 400


def clip_runs(text: str, limit: int = LONG_RUN) -> str:
    """``text`` with every run of more than ``limit`` non-space characters cut to its ends and its length.

    Example:
        >>> clip_runs("--xla_a=" + "9" * 1000 + " is not a size")  # Past LONG_RUN (400) characters.
        '--xla_a=99999999999999999999999999999999999999999999999999999999999999…9999999999 (1,008 characters) is not a size'
        >>> clip_runs("short words stay")
        'short words stay'
    """
    def cut(match: "re.Match[str]") -> str:
        run = match.group(0)
        return f"{run[:70]}…{run[-10:]} ({len(run):,} characters)"

    return re.sub(rf"\S{{{limit + 1},}}", cut, text)


def read_count(digits: str) -> int:
    """A count a user wrote, in decimal digits. Python refuses to read one of over 4,300 digits (a
    ValueError no check expects), so past 4,000 it reads as 10**4000, which every limit refuses.

    Example:
        >>> read_count("16"), read_count("9" * 100_000) == 10**4000
        (16, True)
    """
    return int(digits) if len(digits) <= 4000 else 10**4000
