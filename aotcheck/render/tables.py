"""Text tables and the cells they hold: columns, a figure's value in its unit, a clipped name, the
source line of a buffer or collective, and the tables of buffers and collectives every text renderer
shows (:mod:`aotcheck.render.text`, :mod:`aotcheck.render.summary`, :mod:`aotcheck.render.explain`).

Example:
    >>> print(table(["metric", "now"], [["peak_bytes", fmt_value("peak_bytes", 1536)], ["flops", fmt_value("flops", 4.3e13)]]))
    metric      now
    ----------  --------
    peak_bytes  1.50 KiB
    flops       43.00 T
"""

from __future__ import annotations

from collections.abc import Sequence

from aotcheck.figures.attribution import PeakBuffer
from aotcheck.figures.loops import CollectiveOp
from aotcheck.figures.table import describe
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.units import fmt_bytes, fmt_count


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned text columns, a rule under the header."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_value(metric: str, value: float | None) -> str:
    """A figure's value in its unit (:mod:`aotcheck.figures.table`): bytes, seconds, or a count."""
    if value is None:
        return "-"
    unit = describe(metric).unit
    if unit == "seconds":
        return f"{value:.2f}s"
    return fmt_bytes(value) if unit == "bytes" else fmt_count(value)


def clip(text: str, width: int) -> str:
    """The end of a long name (a name stack's last ops say the most), marked as clipped.

    Example:
        >>> clip("jit(train_step)/while/body/dot_general", 20)
        '...body/dot_general'
    """
    return text if len(text) <= width else "..." + text[-(width - 3):]


def source_line(item) -> str | None:
    """Where a buffer, collective or finding was made: a model library's line via the user's call
    (``esm2quinox/_esm2.py:123 via train.py:250``), else the one line (None: none).

    Example:
        >>> source_line(PeakBuffer(8, "temp", "jit(f)/exp", "f32[2]", "train.py:250", library="esm2quinox/_esm2.py:123"))
        'esm2quinox/_esm2.py:123 via train.py:250'
        >>> source_line(PeakBuffer(8, "temp", "jit(f)/exp", "f32[2]", "model.py:9"))
        'model.py:9'
    """
    library = getattr(item, "library", None)
    return f"{library} via {item.source}" if library and item.source else library or item.source


def buffers_table(buffers: Sequence[PeakBuffer], *, limit: int = 10, width: int = 90) -> str:
    """The largest buffers at the peak: bytes, class, name (argument path or JAX op), shape, source line."""
    return table(["bytes/device", "class", "buffer", "shape", "source"],
                 [[fmt_bytes(b.bytes) + (f" ({b.count})" if b.count > 1 else ""), b.kind, clip(b.name, width),
                   b.shape, source_line(b) or "-"] for b in buffers[:limit]])


def collectives_table(ops: Sequence[CollectiveOp], *, limit: int = 10, width: int = 90) -> str:
    """The collectives that move the most bytes per step, by the JAX op that made them."""
    return table(["collective", "count", "bytes/device", "op", "source"],
                 [[op.kind, op.count, fmt_bytes(op.bytes), clip(op.name, width), source_line(op) or "-"]
                  for op in ops[:limit]])


def hbm_fraction(outcome: Outcome) -> float | None:
    """Peak bytes per device over the chip's HBM capacity (None without figures or a chip)."""
    figures = outcome.figures or {}
    hbm = outcome.case.topology.device.memory_bytes
    if "peak_bytes" not in figures or hbm is None:
        return None
    return figures["peak_bytes"] / hbm


def verdict_label(outcome: Outcome) -> str:
    """The verdict column: the golden action for accepted cases, FAILED where only strictness failed it."""
    if outcome.verdict is Verdict.ACCEPTED and outcome.golden_action:
        return outcome.golden_action.value
    label = outcome.verdict.value
    return label + " (FAILED)" if outcome.failed and not outcome.verdict.fails() else label


_TOPOLOGY_KEYS = ["chips_per_host", "wraparound", "chips", "devices", "hbm_per_device", "peak_bf16_flops_per_device",
                  "hbm_bandwidth_per_device", "platform"]


def topologies_table(records: list[dict], *, sources: tuple[str, str]) -> str:
    """``aotcheck topologies``: the table of every topology's listing, and where its figures come from
    (``sources``: the TPU table's, the GPU table's)."""
    rows = [[r["name"], r["libtpu_name"] or r["cuda_topology"], r["chip_config"] or r["device_kind"],
             *(r.get(k, "-") for k in _TOPOLOGY_KEYS)] for r in records]
    return "\n".join([
        table(["name", "compiler's topology", "chip config / GPU", "chips/host", "torus", "chips", "devices",
               "HBM/device", "bf16 FLOP/s/device", "HBM BW/device", "platform"], rows),
        "\nAliases: v5litepod-N = v5e-N, tpu7x-N = 7x-N. GPU hosts: h100-8x2 (also h100-16) is two hosts of "
        "8, joined by the network as slices are. cpu-N: N host CPU devices (no libtpu).",
        f"Per-device figures: TPU: {sources[0]}. GPU: {sources[1]}."])
