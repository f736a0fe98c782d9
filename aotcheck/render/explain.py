"""``aotcheck compile``'s output: its table of figures per program, and ``--explain``, where the FLOPs
and bytes come from (loops, matmuls, collectives, what holds the HBM at the peak).

Example:
    >>> split = {"peak_params_bytes": 2**30, "peak_opt_state_bytes": 2 * 2**30, "peak_batch_bytes": 0,
    ...          "peak_outputs_bytes": 0, "peak_temp_bytes": 2**30, "peak_other_bytes": 0}
    >>> print(peak_table({"peak_bytes": 4 * 2**30, **split}))
    at the peak  bytes/device  share
    -----------  ------------  -----
    params       1.00 GiB      25.0%
    opt_state    2.00 GiB      50.0%
    batch        0 B           0%
    kv_cache     0 B           0%
    outputs      0 B           0%
    temp         1.00 GiB      25.0%
    other        0 B           0%
    peak         4.00 GiB      100%
"""

from __future__ import annotations

from collections.abc import Sequence

from aotcheck.figures.attribution import CLASSES, Attribution
from aotcheck.figures.loops import analyze_hlo, iter_loops
from aotcheck.figures.program import Details, Figures, comm_bytes, roofline
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.tables import buffers_table, collectives_table, table
from aotcheck.render.text import unsharded_paragraph
from aotcheck.targets.topology import Topology
from aotcheck.units import fmt_bytes, fmt_count, fmt_seconds, fmt_share

COMPILE_HEADERS = ["case", "compile", "argument", "output", "alias", "temp", "code", "peak", "peak/HBM",
                   "FLOPs", "FLOPs (XLA raw)", "collectives", "step >="]


def compile_table(results: Sequence[Measurement], topology: Topology) -> str:
    """``aotcheck compile``'s table: XLA's memory analysis, the peak's share of HBM, FLOPs, collectives."""
    hbm = topology.device.memory_bytes
    rows = []
    for r in results:
        f = r.figures
        bound = roofline(f, topology)
        short = r.details.incomplete()  # Figures that what is uncounted may leave short: lower bounds.
        flops = ("> " if "flops" in short else "") + fmt_count(f["flops"])
        comm = (">= " if "comm_*" in short else "") + fmt_bytes(comm_bytes(f))
        rows.append([r.case.id, f"{r.compile_seconds:.1f}s", fmt_bytes(f["argument_bytes"]),
                     fmt_bytes(f["output_bytes"]), fmt_bytes(f["alias_bytes"]), fmt_bytes(f["temp_bytes"]),
                     fmt_bytes(f["generated_code_bytes"]), fmt_bytes(f["peak_bytes"]),
                     fmt_share(f["peak_bytes"] / hbm) if hbm else "-", flops,
                     fmt_count(f.get("flops_xla")), comm,
                     fmt_seconds(bound["bound_seconds"]) if bound else "-"])
    doubts = [f"{r.case.id}: {line}" for r in results for line in r.details.doubts()]
    return (table(COMPILE_HEADERS, rows)
            + "\n\nPer device. FLOPs count each loop body times its trip count (matmuls, convolutions,"
              "\nragged dots, dots XLA rewrote, and each kernel's registered or declared cost); XLA's raw"
              "\nfigure counts a loop body once. '>' marks a figure that misses what a note names."
              "\n'step >=' is a roofline lower bound."
            + "".join(f"\nnote: {d}" for d in doubts))


def peak_table(figures: Figures) -> str | None:
    """The peak split by class (``peak_*_bytes``), with each class's share; None without the split."""
    peak = figures.get("peak_bytes")
    found = Attribution.from_parts(figures, []) if peak else None  # A class added later reads as 0.
    if not peak or found is None:
        return None
    rows = [[kind, fmt_bytes(found.classes[kind]), fmt_share(found.classes[kind] / peak)] for kind in CLASSES]
    return table(["at the peak", "bytes/device", "share"], rows + [["peak", fmt_bytes(peak), "100%"]])


def explain(hlo_text: str, figures: Figures, *, details: Details | None = None, limit: int = 12) -> str:
    """Where the FLOPs and bytes come from (from a program's optimized HLO text): loops with their
    trip counts, top matmuls, collectives by op; with the figures' peak split and ``details``,
    what holds the HBM at the peak and which line made it."""
    analysis = analyze_hlo(hlo_text)
    # The measured figure, not this text's count: a kernel's cost may read constants the text elides.
    lines = [f"FLOPs per device: {fmt_count(figures.get('flops', analysis.flops))} loop-aware vs "
             f"{fmt_count(figures.get('flops_xla'))} XLA raw"]
    loops = list(iter_loops(analysis))
    if loops:
        lines.append(table(
            ["loop", "trips", "runs", "FLOPs/trip", "FLOPs in all", "op"],
            [[loop.name, loop.trip_count if loop.trip_count is not None else "unknown (counted once)",
              loop.multiplier, fmt_count(loop.flops_per_trip),
              fmt_count(loop.flops_per_trip * (loop.trip_count or 1) * loop.multiplier), loop.op_name[-60:]]
             for loop in loops[:12]],
        ))
    lines.append(table(["top matmuls", "FLOPs in all", "times run"],
                       [[name[-80:], fmt_count(f), m] for f, name, m in analysis.top_ops]))
    if details is not None and details.kernels:
        lines.append(table(["kernel", "runs", "FLOPs in all", "counted by", "source"],
                           [[k.name[-60:], k.count, ("<= " if k.bound else "") + fmt_count(k.flops),
                             k.basis + (" (its buffer)" if k.bound else ""), k.source or "-"]
                            for k in details.kernels[:limit]]))
    if details is not None and details.collectives:
        lines.append("The largest collectives, per step:\n" + collectives_table(details.collectives, limit=limit))
    split = peak_table(figures)
    if split:
        excess = details.peak_excess_bytes if details is not None else 0
        note = (f"\n(XLA's live ranges list {fmt_bytes(excess)} more at the peak than its peak figure; "
                "temp is shown net of that.)") if excess else ""
        lines.append("What holds the HBM at the peak (per device):\n" + split + note)
    if details is not None and details.peak_buffers:
        lines.append("The largest buffers at the peak:\n" + buffers_table(details.peak_buffers, limit=limit))
    if details is not None and details.unsharded:
        lines.append(unsharded_paragraph(details.unsharded, what="this program"))
    return "\n\n".join(lines)
