"""Whether a program fits its chip's HBM, said in plain words and numbers.

Two ways to not fit: the compiled peak exceeds the device's HBM (or the
headroom a project allows), or XLA itself refuses with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import re

from aotcheck.units import fmt_bytes
from aotcheck.targets.topology import Topology, parse_topology

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def hbm_verdict(peak_bytes: int, topology: str | Topology, *, headroom: float = 1.0) -> str | None:
    """None if ``peak_bytes`` fits ``headroom`` x the device's HBM, else the reason.

    Example:
        >>> print(hbm_verdict(int(17.3 * 2**30), "v5e-16"))
        needs 17.30 GiB of 16.00 GiB HBM per device on v5e-16: 108%
    """
    topo = parse_topology(topology)
    if topo.hbm_bytes is None:
        return None
    limit = topo.hbm_bytes * headroom
    if peak_bytes <= limit:
        return None
    allowed = f" (headroom {headroom:.0%} allows {fmt_bytes(limit)})" if headroom != 1.0 else ""
    return (
        f"needs {fmt_bytes(peak_bytes)} of {fmt_bytes(topo.hbm_bytes)} HBM per device on "
        f"{topo.name}: {peak_bytes / topo.hbm_bytes:.0%}{allowed}"
    )


def _size(number: str, unit: str) -> float:
    return float(number) * _UNITS.get(unit.upper().rstrip("IB") if unit else "", 1)


def explain_oom(error: str, topology: str | Topology) -> str:
    """A plain summary of XLA's out-of-memory error (an :class:`aotcheck.errors.OutOfMemory`'s message)."""
    name = parse_topology(topology).name
    lines = []
    need = re.search(r"required for (.+?) \(([\d.]+)([KMGT]?)i?B?\) exceeds available HBM \(([\d.]+)([KMGT]?)i?B?\)", error)
    used = re.search(r"Used ([\d.]+)([KMGT]?)i?B? of ([\d.]+)([KMGT]?)i?B? hbm", error)
    if need:
        required, available = _size(need[2], need[3]), _size(need[4], need[5])
        lines.append(
            f"does not fit: XLA needs {fmt_bytes(required)} for {need[1]} of the {fmt_bytes(available)} HBM "
            f"a device can use on {name}: {required / available:.0%}"
        )
    elif used:
        required, available = _size(used[1], used[2]), _size(used[3], used[4])
        lines.append(
            f"does not fit: XLA needs {fmt_bytes(required)} of the {fmt_bytes(available)} HBM a device can "
            f"use on {name}: {required / available:.0%}"
        )
    else:
        lines.append(f"does not fit in HBM on {name}")
    parts = re.findall(r"^\s+(reserved|program|arguments|HLO temp)\s+([\d.]+[KMGT]?)", error, re.M)
    if parts:
        lines.append("XLA's figures per device: " + ", ".join(f"{k} {v}" for k, v in parts))
    allocations = re.findall(r"Size: ([\d.]+[KMGT]?i?B?)\s*\n\s*(?:Operator: ([^\n]*)\n\s*)?(?:Shape: ([^\n]*))?", error)
    if allocations:
        lines.append("Largest allocations XLA names:")
        for size, operator, shape in allocations[:5]:
            lines.append(f"  {size}  {shape.strip()}  {operator.strip()[:120]}".rstrip())
    return "\n".join(lines)
