"""Figures of a compiled program: plain dicts of integers (bytes) and floats (FLOPs).

All figures are per device, as XLA reports them. Names are stable: golden files
and reports key on them.
"""

from __future__ import annotations

from typing import Any


# (figure name, attribute of jax's CompiledMemoryStats)
_MEMORY = (
    ("argument_bytes", "argument_size_in_bytes"),
    ("output_bytes", "output_size_in_bytes"),
    ("alias_bytes", "alias_size_in_bytes"),
    ("temp_bytes", "temp_size_in_bytes"),
    ("generated_code_bytes", "generated_code_size_in_bytes"),
    ("peak_bytes", "peak_memory_in_bytes"),
)
# (figure name, key of cost_analysis()); XLA omits zero-valued keys.
_COST = (
    ("flops_xla", "flops"),
    ("transcendentals_xla", "transcendentals"),
    ("bytes_accessed_xla", "bytes accessed"),
)


def memory_figures(compiled: Any) -> dict[str, int]:
    """Per-device memory: arguments, outputs, aliases, temporaries, code, peak and total.

    ``total_bytes`` is axlearn's HBM sum (argument + output - alias + temp + code);
    ``peak_bytes`` is XLA's liveness-aware peak, usually lower, and what we gate on.
    """
    stats = compiled.memory_analysis()
    out = {name: int(getattr(stats, attr, 0) or 0) for name, attr in _MEMORY}
    out["total_bytes"] = (
        out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
        + out["generated_code_bytes"]
    )
    if not out["peak_bytes"]:  # Backends without a liveness peak.
        out["peak_bytes"] = out["total_bytes"]
    return out


def cost_figures(compiled: Any) -> dict[str, float]:
    """XLA's own per-device cost figures (a while loop's body counted once)."""
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # Older jax returned one dict per program.
        cost = cost[0] if cost else {}
    return {name: float(cost.get(key, 0.0)) for name, key in _COST}


def program_figures(compiled: Any) -> dict[str, int | float]:
    """All figures of one compiled program, as a flat dict.

    Example:
        >>> figures = program_figures(compiled)  # doctest: +SKIP
        >>> figures["peak_bytes"], figures["flops_xla"]  # doctest: +SKIP
    """
    figures: dict[str, int | float] = {}
    figures.update(memory_figures(compiled))
    figures.update(cost_figures(compiled))
    return figures
