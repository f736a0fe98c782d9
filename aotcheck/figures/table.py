"""Every figure aotcheck gates, described once: its unit, which way is worse, its default tolerance.

Comparison (:mod:`aotcheck.gate.compare`), the figures' wording (:mod:`aotcheck.render.text`) and
README's figure table read this table; a new figure is one row. Rows are matched in order, the
first whose glob matches a figure's name describing it.

Example:
    >>> describe("peak_temp_bytes").unit, describe("fit_max_batch").worse, describe("compile_cpu_seconds").noisy
    ('bytes', 'less', True)
    >>> describe("comm_all_gather_count").tolerance
    (0.0, 0)
"""

from __future__ import annotations

import fnmatch
from typing import NamedTuple


class Figure(NamedTuple):
    """One row: a figure's name, or a glob naming a family of figures (``comm_*_count``)."""

    glob: str
    unit: str  # "bytes", "flops", "count" or "seconds": how it is shown.
    worse: str  # "more": a cost (growth is a regression); "less": headroom (a drop is).
    rel: float  # The default tolerance: max(rel * |golden|, abs)...
    abs: float  # ...in the figure's unit.
    noisy: bool  # Differs from run to run (a timing): compared as a factor both ways; see ``near``.
    meaning: str  # README's words for it.
    # Noisy figures: how near (rel of the smaller value, abs floor) a golden and a new value must be, both
    # ways, for --update-golden to keep the golden's value (so unchanged programs leave their goldens as
    # they were). Tighter than the tolerance: a golden kept far above its value would loosen the gate.
    near: tuple[float, float] = (0.0, 0.0)

    @property
    def tolerance(self) -> tuple[float, float]:
        return (self.rel, self.abs)


FIGURES: tuple[Figure, ...] = (
    Figure("comm_*_count", "count", "more", 0.0, 0, False,
           "collectives of each kind (all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute), "
           "loop-aware, async start/done counted once: a new collective is news"),
    Figure("comm_*_bytes", "bytes", "more", 0.01, 4 * 1024, False,
           "the bytes they move, per device, the larger side of each"),
    Figure("fit_max_*", "count", "less", 0.02, 0, False,
           "the largest size of a knob (`fit_max_batch`) that compiles and fits the chip's HBM: fewer is worse"),
    # Compile cost is CPU time: the same compile varied up to 2.2x across runs in one session on a
    # 2-core machine, and 3.4x against its golden on another day (README). Only more than 5x, and
    # over 10 s more, is news: the hazard it catches (a toolchain's compile-time blowup) is larger.
    # Kept by --update-golden while within 2x or 1 s of the new value, both ways: one kind of run's spread
    # (README: up to 1.97x) stays put; a golden from a machine 2.5x slower, or 50 s for a 0.5 s compile, goes.
    Figure("*_cpu_seconds", "seconds", "more", 4.0, 10.0, True,
           "`compile_cpu_seconds`, `lower_cpu_seconds`: the compile's and the lowering's CPU seconds (user + sys of "
           "the compiling process, every thread; not wall time)", near=(1.0, 1.0)),
    Figure("*_bytes", "bytes", "more", 0.01, 64 * 1024, False,
           "memory per device: XLA's memory analysis (`argument_bytes`, `output_bytes`, `alias_bytes`, `temp_bytes`, "
           "`generated_code_bytes`), its liveness-aware `peak_bytes` (checked against the chip's HBM), `total_bytes` "
           "(axlearn's sum), the peak split by what holds it (`peak_params_bytes`, ...: they sum to `peak_bytes` "
           "exactly)"),
    Figure("*flops*", "flops", "more", 0.01, 0, False,
           "`flops`: loop-aware FLOPs per device (each loop body times its trip count) of every `dot`, "
           "`convolution` and `ragged-dot`, cuBLAS gemm, and the cost a Pallas/Mosaic kernel declares "
           "(`pl.CostEstimate`); not elementwise work, nor a kernel that declares no cost (each named in a "
           "note); `flops_program`: times the devices; `flops_xla`: XLA's raw count (a loop body once)"),
    Figure("*", "count", "more", 0.02, 0, False,
           "any other figure: XLA's raw `bytes_accessed_xla` and `transcendentals_xla` (a loop body counted once)"),
)


def describe(name: str) -> Figure:
    """The row that describes figure ``name`` (the catch-all ``*`` at worst)."""
    return next(f for f in FIGURES if fnmatch.fnmatchcase(name, f.glob))
