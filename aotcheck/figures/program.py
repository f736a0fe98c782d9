"""Figures of a compiled program: plain dicts of integers (bytes) and floats (FLOPs).

All figures are per device, as XLA reports them. Names are stable: golden files
and reports key on them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax

from aotcheck.records import Record, field
from aotcheck.figures.attribution import LATER_PEAK_FIGURES, PEAK_FIGURES, PeakBuffer
from aotcheck.figures.fallbacks import Fallback
from aotcheck.figures.fit import Fit
from aotcheck.figures.loops import CollectiveOp, HloAnalysis, KernelRun, Uncounted, analyze_hlo
from aotcheck.figures.sharding import Unsharded
from aotcheck.figures.scoped import ScopedUse
from aotcheck.figures.table import comm, parse
from aotcheck.targets.devices import host_device
from aotcheck.targets.topology import Topology, parse_topology

Figures = dict[str, int | float]
"""Figure name -> value: integer bytes, float FLOPs; names are stable (goldens key on them)."""

# Figures every program has (``comm_<kind>_*`` come with the collectives a program has).
REQUIRED_FIGURES = (
    "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes", "peak_bytes",
    "total_bytes", "flops_xla", "transcendentals_xla", "bytes_accessed_xla", "flops", "flops_program",
)


@dataclasses.dataclass(frozen=True)
class Details(Record):
    """What explains a program's figures, not gated one by one: the largest buffers at its peak
    (:mod:`aotcheck.figures.attribution`) and its largest collectives, with their source lines;
    the buffers at the peak that keep a sharded batch whole (:mod:`aotcheck.figures.sharding`).

    Example:
        >>> details = Details([PeakBuffer(1024, "temp", "jit(f)/exp", "f32[256]", "model.py:3")], [])
        >>> Details.from_json(details.to_json()) == details
        True
    """

    peak_buffers: list[PeakBuffer] = field(default_factory=list)
    collectives: list[CollectiveOp] = field(default_factory=list)
    # The rest is written only where there is some: details without it read as they did before it was.
    fit: Fit | None = field(default=None, omit="none")  # The fit search, for configs that ask for one.
    # How much more XLA lists live at the peak than its peak figure (temp is net).
    peak_excess_bytes: int = field(default=0, omit="empty")
    unsharded: list[Unsharded] = field(default_factory=list, omit="empty")  # The lint's findings.
    uncounted: list[Uncounted] = field(default_factory=list, omit="empty")  # What ``flops`` may miss.
    kernels: list[KernelRun] = field(default_factory=list, omit="empty")  # Custom kernels: how each was counted.
    fallbacks: list[Fallback] = field(default_factory=list, omit="empty")  # Where XLA's partitioner fell back.
    scoped: list[ScopedUse] = field(default_factory=list, omit="empty")  # Each Pallas TPU kernel's VMEM and SMEM.

    @classmethod
    def __json_read__(cls, data: Mapping[str, Any] | None) -> Mapping[str, Any]:
        return {} if data is None else data  # None: no details.

    def incomplete(self) -> set[str]:
        """The figures (and globs of them: ``comm_*``) that what is uncounted may leave short.

        Example:
            >>> sorted(Details(uncounted=[Uncounted("op", "shiny-op", None, 1)]).incomplete())
            ['comm_*', 'flops']
        """
        return {name for u in self.uncounted for name in u.incomplete}

    def doubts(self) -> list[str]:
        """What the figures may miss or overstate, one line each (as data: render words the rest):
        what is uncounted, the compiler's sharding fallbacks, kernels counted over their buffer, kernels
        within 5% of their scoped VMEM or SMEM limit.

        Example:
            >>> Details(uncounted=[Uncounted("op", "shiny-op", None, 1)]).doubts()
            ["shiny-op (1 per step) has no rule in aotcheck's ledger: its FLOPs and communication are not in flops and comm_*"]
        """
        bounds = [line for k in self.kernels if (line := k.describe()) is not None]
        near = [line for u in self.scoped if (line := u.describe()) is not None]
        return [*(u.describe() for u in self.uncounted), *(f.describe() for f in self.fallbacks), *bounds, *near]

    def sources(self) -> set[str]:
        """Every source line these details name, the user's and a model library's (what a cached copy
        must map onto the code as it is now)."""
        found = [*self.peak_buffers, *self.collectives, *self.unsharded, *self.uncounted, *self.kernels, *self.fallbacks,
                 *(self.fit.buffers_at_max if self.fit is not None else [])]
        return {line for item in found for line in (item.source, getattr(item, "library", None)) if line}

    def with_sources(self, lines: Mapping[str, str]) -> "Details":
        """These details with every source line (the user's and a model library's) replaced by
        ``lines[line]`` (see :mod:`aotcheck.figures.sources`); a line not in ``lines`` stays.

        Example:
            >>> d = Details([PeakBuffer(8, "temp", "jit(f)/exp", "f32[2]", "m.py:7", library="lib/layer.py:3")], [])
            >>> moved = d.with_sources({"m.py:7": "m.py:8", "lib/layer.py:3": "lib/layer.py:4"}).peak_buffers[0]
            >>> moved.source, moved.library
            ('m.py:8', 'lib/layer.py:4')
        """
        def moved(items: list) -> list:
            out = []
            for i in items:
                if i.source:
                    i = dataclasses.replace(i, source=lines.get(i.source, i.source))
                if getattr(i, "library", None):  # Records without the field (yet) keep their one line.
                    i = dataclasses.replace(i, library=lines.get(i.library, i.library))
                out.append(i)
            return out

        fit = (dataclasses.replace(self.fit, buffers_at_max=moved(self.fit.buffers_at_max))
               if self.fit is not None else None)
        return dataclasses.replace(self, peak_buffers=moved(self.peak_buffers), collectives=moved(self.collectives),
                                   unsharded=moved(self.unsharded), uncounted=moved(self.uncounted),
                                   kernels=moved(self.kernels), fallbacks=moved(self.fallbacks), fit=fit)


def details_problem(data: object) -> str | None:
    """Why stored details (a golden's, a cache entry's) cannot be read back, or None.

    Example:
        >>> details_problem({}), details_problem({"peak_buffers": [{"bytes": 1}]})
        (None, "KeyError: 'kind'")
    """
    try:
        Details.from_json(data)  # type: ignore[arg-type]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def value_problem(name: str, value: object) -> str | None:
    """What is wrong with one figure's value, or None: figures are finite numbers, never negative
    (NaN compares false with everything: it would gate nothing).

    Example:
        >>> value_problem("flops", 2.5), value_problem("flops", "9"), value_problem("flops", float("nan"))
        (None, "figure 'flops' must be a number, not '9'", "figure 'flops' is nan; figures are finite and never negative")
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"figure {name!r} must be a number, not {value!r}"
    if not math.isfinite(value) or value < 0:
        return f"figure {name!r} is {value!r}; figures are finite and never negative"
    return None


def figures_problem(figures: object) -> str | None:
    """What is wrong with a figures dict (a required figure missing, a value not a number), or None.

    Example:
        >>> figures_problem({"peak_bytes": 1})  # doctest: +ELLIPSIS
        "figure 'argument_bytes' is missing"
        >>> figures_problem(dict.fromkeys(REQUIRED_FIGURES, 1) | {"comm_all_gather_bytes": "9"})
        "figure 'comm_all_gather_bytes' must be a number, not '9'"
        >>> figures_problem(dict.fromkeys(REQUIRED_FIGURES, 5) | dict.fromkeys(PEAK_FIGURES, 2**20))  # doctest: +ELLIPSIS
        "the peak's classes (peak_params_bytes, ...) do not add up to peak_bytes (5)"
    """
    if not isinstance(figures, dict):
        return f"figures are a {type(figures).__name__}, not a mapping"
    # XLA's raw costs are absent together where its cost analysis failed (the details say why): all or none.
    raw_absent = not any(name in figures for name in RAW_COST_FIGURES)
    for name in REQUIRED_FIGURES:
        if name not in figures and not (raw_absent and name in RAW_COST_FIGURES):
            return f"figure {name!r} is missing"
    for name, value in figures.items():
        problem = value_problem(name, value)
        if problem:
            return problem
    split = [name for name in PEAK_FIGURES if name in figures]
    whole = [name for name in PEAK_FIGURES if name not in LATER_PEAK_FIGURES]  # A split written before them.
    if split and (not set(whole) <= set(split) or sum(figures[n] for n in split) != figures["peak_bytes"]):
        # Attribution splits the peak exactly: classes that do not add up were not written by it.
        return f"the peak's classes ({', '.join(split)}) do not add up to peak_bytes ({figures['peak_bytes']})"
    return None


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
RAW_COST_FIGURES = tuple(name for name, _ in _COST)  # XLA's raw figures: absent when its analysis fails.


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


class RawCost(NamedTuple):
    """XLA's raw cost figures of a program, or why there are none."""

    figures: dict[str, float]  # ``flops_xla``, ``transcendentals_xla``, ``bytes_accessed_xla``; empty on a failure.
    problem: Uncounted | None = None  # Why they are absent (an ``xla_cost`` record for the details).


def cost_figures(compiled: Any) -> RawCost:
    """XLA's own per-device cost figures (a while loop's body counted once). Where XLA's cost analysis
    fails (:func:`_cost_model`), the figures are absent, never zeros (a drop to zero would read as an
    improvement), and the record says why.

    Example (host CPU devices):
        >>> import jax.numpy as jnp
        >>> from aotcheck import compile_function
        >>> x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
        >>> raw = cost_figures(compile_function(lambda a, b: a @ b, x, x, topology="cpu-1"))
        >>> raw.figures, raw.problem
        ({'flops_xla': 524288.0, 'transcendentals_xla': 0.0, 'bytes_accessed_xla': 49152.0}, None)
    """
    cost = compiled.cost_analysis()
    if not cost:
        try:
            cost = _cost_model(compiled)
        except Exception as e:  # jax's internals promise nothing (the binding gone, a module it refuses).
            return RawCost({}, Uncounted("xla_cost", _reason(e), None, 0))
    if isinstance(cost, list):  # Older jax returned one dict per program.
        cost = cost[0] if cost else {}
    return RawCost({name: float(cost.get(key, 0.0)) for name, key in _COST})


def _reason(error: Exception, limit: int = 200) -> str:
    """An exception in one line: its type and the first line of its message, clipped."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _cost_model(compiled: Any) -> dict[str, float]:
    """XLA's HloCostAnalysis of the optimized module, for executables that offer no cost analysis:
    a deviceless GPU executable answers UNIMPLEMENTED. jax has no public path to it; its own
    ``hlo_module_cost_analysis`` runs XLA's generic analysis on the host's client (not the GPU's
    fusion-aware one: raw figures, like the TPU's, never gated on alone). Raises what the import or
    the binding raises (not in this jax, a module it cannot analyse)."""
    from jax._src.lib import _jax  # noqa: PLC0415

    modules = compiled.runtime_executable().hlo_modules()
    return dict(_jax.hlo_module_cost_analysis(host_device().client, modules[0]))


# XLA's raw count includes elementwise work that ``flops`` leaves out: up to a fifth of a tiny model's
# (measured on this repository's reference configs: flops / flops_xla >= 0.82). Under three quarters of
# it, matrix work was lost.
BELOW_XLA = 0.75


def uncounted_work(analysis: HloAnalysis, figures: Mapping[str, int | float]) -> list[Uncounted]:
    """What the loop-aware ``flops`` may miss: loops of unknown trip count, kernels without a declared
    cost, and ``flops`` below XLA's raw figure (which counts each loop body once, so a loop-aware count
    under it has lost work: the telltale of a program read in part).

    Example:
        >>> uncounted_work(HloAnalysis(flops=10.0), {"flops": 10.0, "flops_xla": 12.0})
        []
        >>> uncounted_work(HloAnalysis(flops=10.0), {"flops": 10.0, "flops_xla": 20.0})
        [Uncounted(kind='below_xla', name='flops', source=None, count=0)]
    """
    found = analysis.uncounted()
    if figures.get("flops", 0) < BELOW_XLA * figures.get("flops_xla", 0):
        found.append(Uncounted("below_xla", "flops", None, 0))
    return found


def loop_aware_figures(analysis: HloAnalysis, *, num_devices: int | None = None) -> dict[str, int | float]:
    """Loop-aware matmul FLOPs and collectives (per device), from :mod:`aotcheck.figures.loops`."""
    figures: dict[str, int | float] = {"flops": analysis.flops}
    if num_devices:
        figures["flops_program"] = analysis.flops * num_devices
    for kind, stats in analysis.collectives.items():
        figures[comm(kind, "count")] = stats.count
        figures[comm(kind, "bytes")] = int(stats.bytes)
    return figures


class ProgramFigures(NamedTuple):
    """A program's figures, and what they may miss or leave out (the details' ``uncounted``)."""

    figures: Figures
    uncounted: list[Uncounted]


def measure_program(
    compiled: Any, *, num_devices: int | None = None, analysis: HloAnalysis | None = None
) -> ProgramFigures:
    """:func:`program_figures`, with what they may miss (:func:`uncounted_work`) and, where XLA's
    cost analysis failed, why its raw figures are absent.

    Example (host CPU devices):
        >>> import jax.numpy as jnp
        >>> from aotcheck import compile_function
        >>> x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
        >>> measured = measure_program(compile_function(lambda a, b: a @ b, x, x, topology="cpu-1"))
        >>> measured.figures["flops"], measured.uncounted
        (524288.0, [])
    """
    if num_devices is None:
        num_devices = _num_devices(compiled)
    figures: dict[str, int | float] = {}
    figures.update(memory_figures(compiled))
    raw = cost_figures(compiled)
    figures.update(raw.figures)
    analysis = analysis if analysis is not None else analyze_hlo(compiled.as_text())
    figures.update(loop_aware_figures(analysis, num_devices=num_devices))
    return ProgramFigures(figures, uncounted_work(analysis, figures) + ([raw.problem] if raw.problem else []))


def program_figures(
    compiled: Any, *, num_devices: int | None = None, analysis: HloAnalysis | None = None
) -> dict[str, int | float]:
    """All figures of one compiled program, as a flat dict.

    Memory (``*_bytes``) and ``flops``/``comm_*`` are per device; ``flops`` counts
    each loop body times its trip count, ``flops_xla`` is XLA's raw figure
    (a loop body once), ``flops_program`` is ``flops`` times ``num_devices``.
    XLA's raw figures are absent where its cost analysis failed (:func:`measure_program` says why).

    Example (on host CPU devices, no libtpu needed):
        >>> import jax, jax.numpy as jnp
        >>> from aotcheck import compile_function
        >>> x = jax.ShapeDtypeStruct((256, 256), jnp.float32)
        >>> compiled = compile_function(lambda a, b: a @ b, x, x, topology="cpu-1")
        >>> figures = program_figures(compiled)
        >>> figures["flops"], figures["flops_program"], figures["argument_bytes"]
        (33554432.0, 33554432.0, 524288)
    """
    return measure_program(compiled, num_devices=num_devices, analysis=analysis).figures


def _num_devices(compiled: Any) -> int | None:
    try:
        leaves = [s for s in jax.tree_util.tree_leaves(compiled.input_shardings) if hasattr(s, "num_devices")]
        return leaves[0].num_devices if leaves else None
    except Exception:  # Executables without shardings (none in practice): leave it out.
        return None


def comm_bytes(figures: dict[str, int | float]) -> int:
    """All collectives' bytes per device.

    Example:
        >>> comm_bytes({"comm_all_gather_bytes": 3, "comm_all_reduce_bytes": 4, "comm_all_reduce_count": 1,
        ...             "peak_bytes": 9})
        7
    """
    found = ((parse(name), value) for name, value in figures.items())
    return int(sum(value for name, value in found
                   if name is not None and name.family == "comm" and name.what == "bytes"))


def roofline(figures: dict[str, int | float], topology: str | Topology) -> dict[str, float] | None:
    """Lower bounds on step time from the chip's datasheet (not gated).

    ``compute_seconds``: loop-aware FLOPs / peak bf16 FLOP/s. ``memory_seconds``:
    XLA's bytes accessed / HBM bandwidth (XLA counts a loop body once, so this is
    a lower bound too). ``bound_seconds``: the larger of the two.
    """
    topo = parse_topology(topology)
    if topo.device.peak_flops is None or topo.device.bandwidth is None or "flops" not in figures:
        return None
    compute = figures["flops"] / topo.device.peak_flops
    memory = figures.get("bytes_accessed_xla", 0) / topo.device.bandwidth
    return {"compute_seconds": compute, "memory_seconds": memory, "bound_seconds": max(compute, memory)}
