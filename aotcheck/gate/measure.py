"""Measuring one case in this process: build its config, lower, compile, take its figures.

With a figures cache, a case whose lowered program (and options, target and
toolchain) is unchanged takes its figures from there without compiling.
Which *process* measures a case is :mod:`aotcheck.gate.isolation`'s business.

Example (host CPU devices; a TPU topology name works the same, through libtpu):
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> from aotcheck import FunctionConfig
    >>> def make_args(mesh):
    ...     rows = NamedSharding(mesh, P("data"))
    ...     return (jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=rows),
    ...             jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P())))
    >>> config = FunctionConfig(fn=lambda x, w: x @ w, make_args=make_args)
    >>> result = measure(Case.of("mm", "step", "cpu-4"), config=config)
    >>> result.figures["flops"], result.figures["flops_program"], result.cached  # per device: 16 of 64 rows
    (2097152.0, 8388608.0, False)
"""

from __future__ import annotations

import dataclasses
import fnmatch
import time
from collections.abc import Mapping
from typing import Any

from aotcheck import _runtime
from aotcheck.figures.attribution import PEAK_FIGURES, AttributionError, PeakBuffer, dump_file, dump_options, read_dump
from aotcheck.figures.hlo import COLLECTIVES, analyze_hlo, parse_module, top_collectives
from aotcheck.figures.program import REQUIRED_FIGURES, Details, Figures, program_figures
from aotcheck.figures.sharding import Unsharded, batch_inputs, find_unsharded, global_sizes
from aotcheck.figures.sources import anchors, remap, source_sequence
from aotcheck.gate.cache import FiguresCache, cache_key
from aotcheck.gate.case import Case
from aotcheck.figures.fit import Fit, Probe, search
from aotcheck.errors import OutOfMemory
from aotcheck.figures.hbm import hbm_verdict
from aotcheck.programs.compile import compile_lowered
from aotcheck.programs.config import Config
from aotcheck.programs.knobs import knob_of, knobs_offered
from aotcheck.programs.lowering import arguments, lower_config
from aotcheck.programs.options import resolve_compiler_options
from aotcheck.programs.registry import REGISTRY, Registry


# What measuring costs, in the process's CPU seconds: figures like the others, but noisy (not bit-identical
# across runs, unlike every figure of the program itself).
COST_FIGURES = ("compile_cpu_seconds", "lower_cpu_seconds")


# What a figures cache entry keeps of a measurement: what a fresh compile would answer (the rest is
# the run's: the options it resolved, the process's memory, whether it came from the cache).
CACHED_FIELDS = ("figures", "compile_seconds", "details")


def figure_names() -> tuple[str, ...]:
    """Every figure a case can have; ``fit_max_<knob>`` stands for any knob's (``fit_max_KNOB``).

    Example:
        >>> names = figure_names()
        >>> "peak_bytes" in names and "comm_all_gather_bytes" in names and "compile_cpu_seconds" in names
        True
    """
    comm = tuple(f"comm_{kind.replace('-', '_')}_{what}" for kind in COLLECTIVES for what in ("count", "bytes"))
    return (*REQUIRED_FIGURES, *PEAK_FIGURES, *comm, *COST_FIGURES, "fit_max_KNOB")


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What measuring a case produced: one record, with one JSON form (:meth:`to_json`). The compile
    worker's reply is that form; the figures cache, the golden file and ``aotcheck compile --json``
    keep views of it (:meth:`view`).

    Example:
        >>> m = Measurement(Case.of("lm", "prefill", "v4-8"), {"peak_bytes": 1024.0}, {"xla_opt": "1"}, 2.5)
        >>> Measurement.from_json(m.to_json()) == m
        True
        >>> m.view("figures", "compile_seconds")
        {'figures': {'peak_bytes': 1024.0}, 'compile_seconds': 2.5}
    """

    case: Case
    figures: Figures
    compiler_options: dict[str, str]
    compile_seconds: float
    # The executable, in the process that compiled it (None from the cache, and across a pipe): not data.
    compiled: Any = dataclasses.field(default=None, repr=False, compare=False)
    cached: bool = False
    host_peak_bytes: int | None = None  # Peak RSS of the process that measured it (not gated).
    details: Details = dataclasses.field(default_factory=Details)  # The peak's largest buffers, collectives.
    attribution_problem: str | None = None  # Why the peak could not be split by class (then no peak_* figures).
    hlo_text: str | None = dataclasses.field(default=None, repr=False)  # The optimized HLO, when asked for.

    def to_json(self) -> dict[str, Any]:
        """The record as JSON: every field but the executable."""
        return {"case": self.case.id, "figures": dict(self.figures), "compiler_options": dict(self.compiler_options),
                "compile_seconds": self.compile_seconds, "cached": self.cached,
                "host_peak_bytes": self.host_peak_bytes, "details": self.details.to_json(),
                "attribution_problem": self.attribution_problem, "hlo_text": self.hlo_text}

    def view(self, *fields: str) -> dict[str, Any]:
        """Some fields of :meth:`to_json`, in the order asked: what a cache entry or a golden keeps."""
        whole = self.to_json()
        return {name: whole[name] for name in fields}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], **given: Any) -> "Measurement":
        """The inverse of :meth:`to_json` (or of a view, the missing fields ``given``); KeyError names
        a field neither has."""
        data = {**data, **given}
        case = data["case"]
        return cls(case if isinstance(case, Case) else Case.parse(case), dict(data["figures"]),
                   dict(data["compiler_options"]), float(data["compile_seconds"]), cached=bool(data.get("cached")),
                   host_peak_bytes=data.get("host_peak_bytes"), details=Details.from_json(data.get("details")),
                   attribution_problem=data.get("attribution_problem"), hlo_text=data.get("hlo_text"))


def unsupported_reason(config: Config, case: Case) -> str | None:
    """Why ``config`` cannot run on the case's target, or None."""
    devices = case.target.num_devices
    if devices < config.min_devices:
        return f"{case.config} needs at least {config.min_devices} devices; {case.target} has {devices}"
    return None


def measure(
    case: Case,
    *,
    registry: Registry = REGISTRY,
    config: Config | None = None,
    compiler_options: Mapping[str, Any] | None = None,
    cache: FiguresCache | None = None,
    fit: str | None = None,
    fit_default: str | None = None,
    hbm_headroom: float = 1.0,
    presets: bool = True,
) -> Measurement:
    """Lowers and compiles one case here and returns its figures.

    ``fit``: also search the largest size of this knob (``"batch"``, or one the
    config names) that fits ``hbm_headroom`` x the device's HBM; by default the
    config's own ``fit``, else ``fit_default`` where the config offers that knob
    (the gate's ``--aot-fit``). Adds the figure ``fit_max_<knob>`` and the search to the
    details (:mod:`aotcheck.figures.fit`); each probe is cached like a case.

    XLA dumps its buffer assignment and live ranges into a temporary directory
    (always removed) for :mod:`aotcheck.figures.attribution` to split the peak by
    class; the dump leaves the program, its figures and its cache key as they are
    (tests/test_attribution.py compares). A dump that cannot be read leaves the
    ``peak_*`` figures out and says why in ``attribution_problem``.

    ``compiler_options`` (the caller's: the gate's launch flags) go over the config's, which go over
    aotcheck's presets this libtpu accepts for the chip; ``presets=False`` leaves the presets out.

    Raises what lowering and compiling raise: CompileError when XLA refuses (OutOfMemory when the
    program does not fit, what filled the memory and the fit search in its ``details``),
    the registry's, mesh's and partitioning's own errors when the config is wrong.
    """
    config = config or registry.get(case.config).program(case.program)
    knob = fit if fit is not None else getattr(config, "fit", None)
    if knob is None and fit_default is not None and fit_default in knobs_offered(config):
        knob = fit_default
    if fit is None and not any(fnmatch.fnmatchcase(str(case.target), glob)
                               for glob in getattr(config, "fit_targets", ("*",))):
        knob = None  # The config asks for its searches elsewhere.
    try:
        result = _measure(case, config, compiler_options, cache, presets=presets)
    except OutOfMemory as e:
        if not knob:
            raise
        # Then how far down it would fit.
        found = fit_search(case, config, knob, compiler_options=compiler_options, cache=cache,
                           hbm_headroom=hbm_headroom, presets=presets)
        details = Details.from_json(e.details) if e.details is not None else Details()
        raise e.with_details(dataclasses.replace(details, fit=found).to_json()) from e
    if knob:
        found = fit_search(case, config, knob, first=result, compiler_options=compiler_options, cache=cache,
                           hbm_headroom=hbm_headroom, presets=presets)
        result = dataclasses.replace(result, figures={**result.figures, f"fit_max_{knob}": found.max_size},
                                     details=dataclasses.replace(result.details, fit=found))
    return result


def fit_search(
    case: Case, config: Config, knob_name: str, *, first: Measurement | None = None,
    compiler_options: Mapping[str, Any] | None = None, cache: FiguresCache | None = None, hbm_headroom: float = 1.0,
    presets: bool = True,
) -> Fit:
    """The largest size of ``knob_name`` whose program compiles and fits (see :mod:`aotcheck.figures.fit`).

    ``first`` is the case measured at its configured size, when there is one already.
    Raises KnobError for a knob the config does not offer.
    """
    knob = knob_of(config, knob_name, case.target)
    measured_at: dict[int, Measurement] = {}
    topo = case.topology
    # The affine model aims at what the compiler lets a device use (below the datasheet's HBM).
    limit = int(min(topo.hbm_bytes * hbm_headroom, topo.memory_limit_bytes)) \
        if topo.hbm_bytes is not None and topo.memory_limit_bytes is not None else 2**62

    def probe(size: int) -> Probe:
        if size == knob.size and first is not None:
            measured = first
        else:
            try:
                measured = _measure(case, knob.rebuild(size), compiler_options, cache, presets=presets)
            except OutOfMemory:
                return Probe(size, None, False)
        measured_at[size] = measured
        peak = int(measured.figures["peak_bytes"])
        return Probe(size, peak, hbm_verdict(peak, case.topology, headroom=hbm_headroom) is None)

    found = search(probe, configured=knob.size, step=knob.step, limit=limit, knob=knob_name,
                   upper=getattr(config, "fit_upper", None))
    at_max = measured_at.get(found.max_size)
    if at_max is None:
        return found
    return dataclasses.replace(found, buffers_at_max=at_max.details.peak_buffers,
                               split_at_max={k: int(v) for k, v in at_max.figures.items() if k in PEAK_FIGURES})


def _measure(
    case: Case, config: Config, compiler_options: Mapping[str, Any] | None, cache: FiguresCache | None, *,
    presets: bool = True,
) -> Measurement:
    options = resolve_compiler_options(case.topology, case.num_slices, config.options, compiler_options,
                                       presets=presets, store=cache.root if cache is not None else None)
    cpu = time.process_time()  # The process's own counters (user + sys, every thread), not wall time.
    lowered = lower_config(config, case.target, program=case.program)[case.program]
    lower_cpu = round(time.process_time() - cpu, 2)
    key, located = None, _Located(lowered)
    if cache is not None:
        key = cache_key(module_text=lowered.as_text(), compiler_options=options, topology=case.topology.name,
                        num_slices=case.num_slices, toolchain=_runtime.toolchain())
        entry = cache.get(key, toolchain=_runtime.toolchain())
        if entry is not None:
            # Every figure as the compile that made the entry measured it (its costs too); the lines its
            # details name, as the code stands now. An entry whose lines cannot be mapped is compiled afresh.
            details = Details.from_json(entry.get("details"))
            lines = remap(entry.get("anchors", {}), located.sequence(), needed=details.sources())
            if lines is not None:
                return Measurement.from_json(entry, case=case, compiler_options=options, cached=True,
                                             details=details.with_sources(lines).to_json())
    with _runtime.dump_directory() as dump:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            compiled = compile_lowered(lowered, {**options, **dump_options(dump)}, what=case.id,
                                       topology=case.topology)
        except OutOfMemory as e:  # What filled the memory, from the dump XLA wrote before it gave up.
            try:
                args, text = arguments(lowered, config), dump_file(dump)
                found = read_dump(dump, hlo_text=text, arguments=args, peak_bytes=None)
            except AttributionError:
                raise e from None
            details = Details(found.buffers, [], unsharded=_unsharded(
                located, args, parse_module(text), found.buffers, peak_bytes=sum(found.classes.values())))
            raise e.with_details(details.to_json()) from e
        seconds, compile_cpu = time.perf_counter() - start, round(time.process_time() - cpu, 2)
        text = compiled.as_text()
        module = parse_module(text)
        analysis = analyze_hlo(text, module=module)
        figures = program_figures(compiled, num_devices=case.target.num_devices, analysis=analysis)
        figures.update(zip(COST_FIGURES, (compile_cpu, lower_cpu)))
        problem, buffers, excess, unsharded = None, [], 0, []
        try:
            args = arguments(lowered, config)
            attribution = read_dump(dump, hlo_text=text, module=module, arguments=args,
                                    peak_bytes=int(figures["peak_bytes"]))
            figures.update(attribution.figures())
            buffers, excess = attribution.buffers, attribution.excess
            unsharded = _unsharded(located, args, module, buffers, peak_bytes=int(figures["peak_bytes"]))
        except AttributionError as e:
            full = _runtime.scratch_problem(dump)
            if full:  # Not the program's doing: nothing is cached or written for this case.
                raise _runtime.HostError(f"{full}; nothing was cached or written for this case.") from None
            problem = f"the peak is not split by class: {e}"
    result = Measurement(case, figures, options, seconds, compiled=compiled,
                         details=Details(buffers, top_collectives(analysis), peak_excess_bytes=excess,
                                         unsharded=unsharded),
                         attribution_problem=problem)
    # An entry whose peak could not be split is never cached: a fresh compile may split it (the cause
    # can be the host's, e.g. a dump that did not fit), and a cached answer must be a fresh one's.
    if cache is not None and key is not None and problem is None:
        cache.put(key, result.view(*CACHED_FIELDS), toolchain=_runtime.toolchain(), anchors=anchors(result.details.sources(), located.sequence()))
    return result


class _Located:
    """The lowered program with its locations (``as_text(dialect="hlo", debug_info=True)``), printed
    once and only when asked for: the lint's sizes before partitioning, the cache's line anchors."""

    def __init__(self, lowered: Any) -> None:
        self._lowered, self._text, self._sequence = lowered, None, None

    def text(self) -> str:
        if self._text is None:
            self._text = self._lowered.as_text(dialect="hlo", debug_info=True)
        return self._text

    def sequence(self) -> list[str | None]:
        if self._sequence is None:
            self._sequence = source_sequence(self.text())
        return self._sequence


def _unsharded(located: _Located, args: list, module: Mapping[str, Any], buffers: list[PeakBuffer], *,
               peak_bytes: int) -> list[Unsharded]:
    """The lint of :mod:`aotcheck.figures.sharding` on one compile: its batch inputs as split in the
    compiled program, its buffers' sizes before partitioning from the lowered program."""
    inputs = batch_inputs(args, module)
    if not inputs:  # Nothing split: nothing to keep whole (and no lowered text to print).
        return []
    return find_unsharded(buffers, inputs, lambda: global_sizes(located.text()), peak_bytes=peak_bytes,
                          param_shapes=[a.shape for a in args if a.kind in ("params", "opt_state")])
