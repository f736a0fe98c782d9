"""Every figure aotcheck gates, described once: its unit, which way is worse, its default tolerance;
and the names of the figures that come in families, built and read back here only.

Comparison (:mod:`aotcheck.gate.compare`), the figures' wording (:mod:`aotcheck.render.text`) and
docs/figures.md's figure table (tools/gendocs.py) reads this table; a new figure is one row. Rows are matched in order, the
first whose glob matches a figure's name describing it.

A family's names are made by :func:`peak`, :func:`comm` and :func:`fit_max`, and read back by
:func:`parse`; no other module spells them.

Example:
    >>> describe("peak_temp_bytes").unit, describe("fit_max_batch").worse, describe("compile_cpu_seconds").noisy
    (<Unit.BYTES: 'bytes'>, <Worse.LESS: 'less'>, True)
    >>> describe("comm_all_gather_count").tolerance
    (0.0, 0)
    >>> comm("all-gather", "bytes"), parse("comm_all_gather_bytes")
    ('comm_all_gather_bytes', FigureName(family='comm', kind='all-gather', what='bytes'))
"""

from __future__ import annotations

import enum
import fnmatch
from typing import Literal, NamedTuple


class Unit(enum.StrEnum):
    """How a figure is shown (and which units a tolerance's floor may be given in)."""

    BYTES = "bytes"
    FLOPS = "flops"
    COUNT = "count"
    SECONDS = "seconds"


class Worse(enum.StrEnum):
    """Which way a figure gets worse."""

    MORE = "more"  # A cost: growth is a regression.
    LESS = "less"  # Headroom: a drop is.


class Figure(NamedTuple):
    """One row: a figure's name, or a glob naming a family of figures (``comm_*_count``)."""

    glob: str
    unit: Unit  # How it is shown.
    worse: Worse  # A cost (growth is a regression), or headroom (a drop is).
    rel: float  # The default tolerance: max(rel * |golden|, abs)...
    abs: float  # ...in the figure's unit.
    noisy: bool  # Differs from run to run (a timing): compared as a factor both ways; see ``near``.
    meaning: str  # docs/figures.md's words for it.
    # Noisy figures: how near (rel of the smaller value, abs floor) a golden and a new value must be, both
    # ways, for --update-golden to keep the golden's value (so unchanged programs leave their goldens as
    # they were). Tighter than the tolerance: a golden kept far above its value would loosen the gate.
    near: tuple[float, float] = (0.0, 0.0)

    @property
    def tolerance(self) -> tuple[float, float]:
        return (self.rel, self.abs)


# --- The families' names -----------------------------------------------------------------

Family = Literal["peak", "comm", "fit_max"]
CommWhat = Literal["count", "bytes"]

_PEAK = ("peak_", "_bytes")
_COMM = "comm_"
_FIT_MAX = "fit_max_"


class FigureName(NamedTuple):
    """A family's figure name, read back: its family and what it is of.

    ``kind``: the peak's class (``temp``), XLA's collective (``all-gather``) or the knob (``batch``);
    ``what``: a collective's ``count`` or ``bytes`` (None for the other families).
    """

    family: Family
    kind: str
    what: CommWhat | None = None

    @property
    def name(self) -> str:
        """The figure's name again: ``parse(name).name == name``.

        Example:
            >>> parse("peak_opt_state_bytes").name, parse("fit_max_per_device_batch_size").name
            ('peak_opt_state_bytes', 'fit_max_per_device_batch_size')
        """
        if self.family == "peak":
            return peak(self.kind)
        if self.family == "comm":
            return comm(self.kind, self.what)  # type: ignore[arg-type]
        return fit_max(self.kind)


def peak(kind: str) -> str:
    """The figure of one class of the peak (:mod:`aotcheck.figures.attribution`): its bytes per device.

    Example:
        >>> peak("params"), peak("opt_state")
        ('peak_params_bytes', 'peak_opt_state_bytes')
    """
    return f"{_PEAK[0]}{kind}{_PEAK[1]}"


def comm(kind: str, what: CommWhat) -> str:
    """The figure of one kind of collective, by XLA's name for it (``all-gather``): how many run per
    step (``count``) or the bytes they move per device (``bytes``). A glob's ``*`` stays as it is.

    Example:
        >>> comm("all-gather", "count"), comm("collective-permute", "bytes"), comm("*", "bytes")
        ('comm_all_gather_count', 'comm_collective_permute_bytes', 'comm_*_bytes')
    """
    return f"{_COMM}{kind.replace('-', '_')}_{what}"


def fit_max(knob: str) -> str:
    """The figure of a fit search (:mod:`aotcheck.figures.fit`): the largest size of ``knob`` that fits.

    Example:
        >>> fit_max("batch"), fit_max("*")
        ('fit_max_batch', 'fit_max_*')
    """
    return f"{_FIT_MAX}{knob}"


ANY_KNOB = fit_max("KNOB")
"""The name that stands for every knob's ``fit_max_<knob>`` where the knobs are not known (a list of
every figure a case can have, :func:`aotcheck.pipeline.measurement.figure_names`)."""


def parse(name: str) -> FigureName | None:
    """What a family's figure name (or a glob over one, ``fit_max_*``) says; None for a plain figure
    (``peak_bytes``, ``flops``). Read by its spelling only: a collective's ``_`` are read back as XLA's
    ``-``, and any knob or class is taken as given.

    Example:
        >>> parse("comm_collective_permute_count")
        FigureName(family='comm', kind='collective-permute', what='count')
        >>> parse("peak_temp_bytes"), parse("fit_max_batch")
        (FigureName(family='peak', kind='temp', what=None), FigureName(family='fit_max', kind='batch', what=None))
        >>> parse("peak_bytes"), parse("flops"), parse("comm_all_gather")
        (None, None, None)
    """
    if name.startswith(_FIT_MAX):
        return FigureName("fit_max", name[len(_FIT_MAX):])
    if name.startswith(_COMM):
        for what in ("count", "bytes"):
            suffix = f"_{what}"
            if name.endswith(suffix) and len(name) >= len(_COMM) + len(suffix):
                return FigureName("comm", name[len(_COMM):-len(suffix)].replace("_", "-"), what)
        return None
    prefix, suffix = _PEAK
    if name.startswith(prefix) and name.endswith(suffix) and len(name) >= len(prefix) + len(suffix):
        return FigureName("peak", name[len(prefix):-len(suffix)])
    return None


FIGURES: tuple[Figure, ...] = (
    Figure(comm("*", "count"), Unit.COUNT, Worse.MORE, 0.0, 0, False,
           "collectives of each kind, loop-aware, async start/done counted once: all-reduce, all-gather, "
           "reduce-scatter, all-to-all, collective-permute always; ragged-all-to-all, collective-broadcast, "
           "send and recv (the cross-slice DCN legs XLA's megascale runtime runs; a host callback's are not "
           "counted) where a program has them; 7x's SparseCore-offloaded ones as the collective they run "
           "(named `sparsecore` in the details): a new collective is news"),
    Figure(comm("*", "bytes"), Unit.BYTES, Worse.MORE, 0.01, 4 * 1024, False,
           "the bytes they move, per device, the larger side of each; a ragged-all-to-all's output buffer "
           "(the most it can receive: the sizes it sends are known only at run time)"),
    Figure(fit_max("*"), Unit.COUNT, Worse.LESS, 0.02, 0, False,
           "the largest size of a knob (`fit_max_batch`) that compiles and fits the chip's HBM: fewer is worse"),
    # Compile cost is CPU time: the same compile varied up to 2.2x across runs in one session on a
    # 2-core machine, and 3.4x against its golden on another day (docs/toolchains.md). Only more than 5x, and
    # over 10 s more, is news: the hazard it catches (a toolchain's compile-time blowup) is larger.
    # Kept by --update-golden while within 2x or 1 s of the new value, both ways: one kind of run's spread
    # (docs/toolchains.md: up to 1.97x) stays put; a golden from a machine 2.5x slower, or 50 s for a 0.5 s compile, goes.
    Figure("*_cpu_seconds", Unit.SECONDS, Worse.MORE, 4.0, 10.0, True,
           "`compile_cpu_seconds`, `lower_cpu_seconds`: the compile's and the lowering's CPU seconds (user + sys of "
           "the compiling process, every thread; not wall time)", near=(1.0, 1.0)),
    Figure("*_headroom_bytes", Unit.BYTES, Worse.LESS, 0.01, 64 * 1024, False,
           "`vmem_headroom_bytes`, `smem_headroom_bytes`: a Pallas kernel's limit less its use, judged in place of "
           "the limit where the golden and the run both hold the pair (derived as they are compared, not stored): "
           "a raised limit is room gained, a halved one room lost; less is worse"),
    Figure("*_bytes", Unit.BYTES, Worse.MORE, 0.01, 64 * 1024, False,
           "memory per device: XLA's memory analysis (`argument_bytes`, `output_bytes`, `alias_bytes`, `temp_bytes`, "
           "`generated_code_bytes`), its liveness-aware `peak_bytes` (checked against the chip's HBM; on a TPU it "
           "also counts what memory-space assignment puts in the core's VMEM, never resident in HBM: lm-tiny's "
           "train step on one v5e chip peaks at 37.6 MB with 35.3 MiB of VMEM allocations, where the chip's "
           "footprint was 16.6 MB; near the HBM limit the share is nil: lm-1b's prefill at its fit answer, "
           "peak + code = 0.99996 of the chip's footprint), `total_bytes` "
           "(axlearn's sum), the peak split by what holds it (`peak_params_bytes`, ...: they sum to `peak_bytes` "
           "exactly); Pallas TPU kernels': `vmem_scoped_bytes` and `vmem_limit_bytes`, the "
           "scoped VMEM of the kernel nearest its limit (the compiler's record) and that limit, `smem_bytes` and "
           "`smem_limit_bytes` its SMEM (as its Mosaic body declares it) and the core's"),
    Figure("*flops*", Unit.FLOPS, Worse.MORE, 0.01, 0, False,
           "`flops`: loop-aware FLOPs per device (each loop body times its trip count) of every `dot`, "
           "`convolution`, `ragged-dot`, cuBLAS gemm, Cholesky, triangular solve and FFT, each dot XLA rewrote "
           "as multiply + reduce (decode attention's), and each custom kernel by the cost registered for its "
           "name (`aotcheck.kernel_cost`; jax's splash attention over its mask's blocks, ragged paged "
           "attention's bound) or else the one it declares (`pl.CostEstimate`); not elementwise work. A kernel "
           "with neither, an op the ledger has no rule for, a loop of unknown trip count: each named in a "
           "note; the program's work as compiled, what XLA recomputes included (near the HBM limit it recomputes "
           "a projection per layer: lm-1b's prefill at batch 224 on v5e-1 counts 8.2% over the model's analytic "
           "FLOPs, as XLA's own count does per loop trip); `flops_program`: times the devices; `flops_xla`: "
           "XLA's raw count (a loop body once)"),
    Figure("sharding_fallbacks", Unit.COUNT, Worse.MORE, 0.0, 0, False,
           "TPU: the ops XLA's SPMD partitioner could not reshard by a collective and replicated in full instead "
           "(its \"Involuntary full rematerialization\" warning, and any other fallback it announces), each named "
           "with its source line: exact, so a new one fails"),
    Figure("*", Unit.COUNT, Worse.MORE, 0.02, 0, False,
           "any other figure: XLA's raw `bytes_accessed_xla` and `transcendentals_xla` (a loop body counted once)"),
)


def describe(name: str) -> Figure:
    """The row that describes figure ``name`` (the catch-all ``*`` at worst)."""
    return next(f for f in FIGURES if fnmatch.fnmatchcase(name, f.glob))
