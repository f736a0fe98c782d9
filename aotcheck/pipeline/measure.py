"""Measuring one case in this process: the stages composed, with the figures cache and the fit search.

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
from collections.abc import Iterable, Mapping
from typing import Any

from aotcheck.errors import ConfigError, OutOfMemory, OutOfMemorySpace
from aotcheck.figures.attribution import PEAK_FIGURES
from aotcheck.figures.fit import Fit, Probe, search
from aotcheck.figures.hbm import hbm_verdict
from aotcheck.figures.program import Details
from aotcheck.pipeline.cache import FiguresCache, entry_digest
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.export import export_compiled, write_exported
from aotcheck.pipeline.inputs import inputs_key, registering_modules
from aotcheck.pipeline.measurement import Measurement
from aotcheck.pipeline.stages import lower
from aotcheck.programs.config import Config
from aotcheck.programs.knob import settings_of
from aotcheck.programs.knobs import knob_of, knobs_offered
from aotcheck.programs.model import function_for
from aotcheck.programs import reads
from aotcheck.targets.globs import target_matches
from aotcheck.targets.presets import presets_without_libtpu
from aotcheck.targets.usable import first_share, usable_memory
from aotcheck.programs.options import resolve_compiler_options
from aotcheck.programs.registry import REGISTRY, Registry


def unsupported_reason(config: Config, case: Case) -> str | None:
    """Why ``config`` cannot run on the case's target, or None."""
    devices = case.target.num_devices
    if devices < config.min_devices:
        return f"{case.config} needs at least {config.min_devices} devices; {case.target} has {devices}"
    if config.platforms and case.topology.platform.name not in config.platforms:
        return (f"{case.config} runs on {' and '.join(p.upper() for p in config.platforms)} targets only "
                f"(its platforms); {case.target} is a {case.topology.platform.name.upper()} target")
    if not any(target_matches(case.target, glob) for glob in config.targets):
        return f"{case.config} is deployed on {', '.join(config.targets)} only (its targets); {case.target} is not one"
    return None


class Uncached(Exception):
    """A case (or a fit search's probe of it) the cache cannot answer by its inputs: it must be lowered."""


def answered(case: Case, **how: Any) -> Measurement | None:
    """The case's measurement as :func:`measure` would give it (``how``: its keyword arguments, a cache
    among them), answered from the cache by its inputs alone, a fit search's every probe included; None
    where any of it must be lowered or compiled, or where libtpu would have to be loaded to know which
    presets it takes. Nothing is traced, and no compiler is loaded: a process that must stay free of
    libtpu (the session's: :mod:`aotcheck.gate.isolation`) answers an unchanged case itself.

    Example (no cache: nothing can be answered):
        >>> answered(Case.parse("lm/train_step@v4-8x1"), cache=None) is None
        True
    """
    if how.get("cache") is None:
        return None
    try:
        return measure(case, **how, lowering=False)
    except Exception:  # Uncached; or an error, which the process that would lower it says in its own words.
        return None


def fit_knob(config: Config, case: Case, *, fit: str | None = None, fit_default: str | None = None) -> str | None:
    """The knob whose largest fitting size to search on ``case``, or None: ``fit`` if asked for (a
    caller's explicit search), else the config's own ``fit`` on the targets its ``fit_targets`` name,
    else ``fit_default`` (the gate's ``--aot-fit``) where the config offers that knob and names none."""
    if fit is not None:
        return fit
    if not any(target_matches(case.target, glob) for glob in getattr(config, "fit_targets", ("*",))):
        return None  # The config asks for its searches elsewhere.
    own = getattr(config, "fit", None)
    if own is not None:
        return own
    return fit_default if fit_default is not None and fit_default in knobs_offered(config) else None


def search_cap(config: Config, case: Case, knob_name: str) -> int | None:
    """The config's ``fit_upper`` as the cap of a search over ``knob_name``: a ConfigError where it is
    below that knob's configured size (the search would stop at once and call the configured size the
    largest that fits). The config checks its own knob when built; the gate's ``--aot-fit`` may ask
    for another one."""
    upper = getattr(config, "fit_upper", None)
    size = knob_of(config, knob_name, case.target).size
    if upper is not None and upper < size:
        raise ConfigError(f"{case.config}: fit_upper={upper} is below the configured {knob_name} ({size}) that the "
                          f"fit search on {case.id} moves, so it would stop at once; give a fit_upper of at least "
                          f"{size} (e.g. fit_upper={8 * size}), or None for the default (4096 x the configured size).")
    return upper


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
    memory_fraction: tuple[float | None, str] | None = None,
    presets: bool = True,
    export: str | None = None,
    lowering: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Measurement:
    """Lowers and compiles one case here and returns its figures (:mod:`aotcheck.pipeline.stages`).

    ``fit``/``fit_default``: also search the largest size of a knob (:func:`fit_knob`) that fits
    ``hbm_headroom`` x the device's HBM and, on a GPU, the process's share of it (the config's
    ``memory_fraction``, else ``memory_fraction``: the ini's share and its name, else the environment's
    variable, else JAX's 0.75; :func:`aotcheck.targets.usable.usable_memory`). Adds the figure ``fit_max_<knob>`` and the search to the
    details (:mod:`aotcheck.figures.fit`); each probe is cached like a case.

    XLA dumps its buffer assignment and live ranges into a temporary directory
    (always removed) for :mod:`aotcheck.figures.attribution` to split the peak by
    class; the dump leaves the program, its figures and its cache key as they are
    (tests/unit/figures/test_attribution.py compares). A dump that cannot be read leaves the
    ``peak_*`` figures out and says why in ``attribution_problem``.

    ``compiler_options`` (the caller's: the gate's launch flags) go over the config's, which go over
    aotcheck's presets this libtpu accepts for the chip; ``presets=False`` leaves the presets out.

    ``export``: a directory where the case's executable is written with its manifest
    (:mod:`aotcheck.pipeline.export`); the case is then compiled whatever the cache holds.

    ``lowering=False``: answer from the cache by the case's inputs alone, or raise :class:`Uncached`
    (nothing is traced, and no compiler is loaded: see :func:`answered`); ``environ``: the environment
    of the process that would lower it (its inputs read JAX's and XLA's variables from there).

    Raises what lowering and compiling raise: CompileError when XLA refuses (OutOfMemory when the
    program does not fit, what filled the memory and the fit search in its ``details``),
    the registry's, mesh's and partitioning's own errors when the config is wrong.

    A program refused for another memory space than HBM (:class:`OutOfMemorySpace`: a Pallas kernel's
    VMEM) is searched like one refused for HBM, and the answer says which: the search ends at the
    smallest size when that is refused too (the overflow does not depend on the knob: two compiles,
    then the error, its fit saying so), or finds the largest size that compiles, its ``refused``
    naming the kernel that stops the next size. Sizes are never searched past such a refusal.
    """
    # A model config given as built is its program's function config, as the registry's are.
    config = function_for(config, case.program_id) if config is not None else \
        registry.get(case.config).program(case.program_id)
    knob = fit_knob(config, case, fit=fit, fit_default=fit_default)
    if knob:
        search_cap(config, case, knob)  # Before anything compiles.
    at = dict(compiler_options=compiler_options, cache=cache, presets=presets,
              registering=registering_modules(registry), lowering=lowering, environ=environ)
    try:
        result = _measured(case, config, **at, export=export)
    except OutOfMemory as e:
        if not knob:
            raise
        # Then how far down it would fit.
        found = fit_search(case, config, knob, hbm_headroom=hbm_headroom, memory_fraction=memory_fraction, **at)
        details = Details.from_json(e.details) if e.details is not None else Details()
        raise e.with_details(dataclasses.replace(details, fit=found).to_json()) from e
    if knob:
        result = result.with_fit(fit_search(case, config, knob, first=result, hbm_headroom=hbm_headroom,
                                            memory_fraction=memory_fraction, **at))
    return result


def fit_search(
    case: Case, config: Config, knob_name: str, *, first: Measurement | None = None,
    compiler_options: Mapping[str, Any] | None = None, cache: FiguresCache | None = None, hbm_headroom: float = 1.0,
    memory_fraction: tuple[float | None, str] | None = None, presets: bool = True, registering: Iterable[str] = (),
    lowering: bool = True, environ: Mapping[str, str] | None = None,
) -> Fit:
    """The largest size of ``knob_name`` whose program compiles and fits (see :mod:`aotcheck.figures.fit`):
    each probe is the config rebuilt at that size, lowered, compiled and measured by the same stages.

    ``first`` is the case measured at its configured size, when there is one already.
    Raises KnobError for a knob the config does not offer.
    """
    knob = knob_of(config, knob_name, case.target)
    measured_at: dict[int, Measurement] = {}
    topo = case.topology
    # The affine model aims at what the compiler lets a device use (below the datasheet's HBM).
    limit = int(min(topo.device.memory_bytes * hbm_headroom, topo.device.memory_limit_bytes)) \
        if topo.device.memory_bytes is not None and topo.device.memory_limit_bytes is not None else 2**62
    # A GPU process holds its share of memory, not all of it (hardening round 5, V54: the boot budget read
    # the share, and the fit search did not).
    usable = usable_memory(topo, fraction=first_share((config.memory_fraction, f"{case.config}'s memory_fraction"),
                                                      memory_fraction or (None, ""))) \
        if topo.platform.memory_fraction is not None else None
    if usable is not None:
        limit = min(limit, usable.bytes)

    def probe(size: int) -> Probe:
        if size == knob.size and first is not None:
            measured = first
        else:
            try:
                measured = _measured(case, knob.rebuild(size), compiler_options=compiler_options, cache=cache,
                                     presets=presets, registering=registering, lowering=lowering, environ=environ)
            except OutOfMemorySpace as e:  # Not HBM: a kernel's VMEM (say). Too large all the same, and said.
                return Probe(size, None, False, refused=e.overflow)
            except OutOfMemory as e:  # What XLA says it needs (its record) is a point on the line too.
                return Probe(size, None, False, needed=e.overflow.size_bytes if e.overflow is not None else None)
        measured_at[size] = measured
        peak = int(measured.figures["peak_bytes"])
        return Probe(size, peak, hbm_verdict(peak, case.topology, headroom=hbm_headroom) is None
                     and (usable is None or peak <= usable.bytes))

    found = search(probe, configured=knob.size, step=knob.step, limit=limit, knob=knob_name,
                   upper=search_cap(config, case, knob_name))
    found = dataclasses.replace(found, usable=usable)
    at_max = measured_at.get(found.max_size)
    if at_max is None:
        return found
    return dataclasses.replace(found, buffers_at_max=at_max.details.peak_buffers,
                               split_at_max={k: int(v) for k, v in at_max.figures.items() if k in PEAK_FIGURES})


def _measured(case: Case, config: Config, *, compiler_options: Mapping[str, Any] | None,
              cache: FiguresCache | None, presets: bool, registering: Iterable[str] = (),
              export: str | None = None, lowering: bool = True,
              environ: Mapping[str, str] | None = None) -> Measurement:
    """One program at one size: answered by its unchanged inputs, else lowered, then cached or compiled
    and measured (``registering``: the modules that register configs, :mod:`aotcheck.pipeline.inputs`;
    ``lowering=False``: :class:`Uncached` instead of lowering)."""
    # A presets file is a cache too: an update run probes libtpu instead of reading one.
    store = cache.root if cache is not None and cache.read else None
    if not lowering and (cache is None or export is not None or (
            presets and presets_without_libtpu(case.topology, case.num_slices, store=store) is None)):
        raise Uncached(case)
    options = resolve_compiler_options(case.topology, case.num_slices, config.options, compiler_options,
                                       presets=presets, store=store)
    if export is not None:  # The executable is the answer: compiled whatever the cache holds.
        return _exported(case, config, options, compiler_options, export)
    inputs = None
    if cache is not None:
        inputs = inputs_key(case, function_for(config, case.program_id), options=options, registering=registering,
                            environ=environ)
        answered = by_inputs(cache, inputs, case, options, environ=environ) if inputs is not None else None
        if answered is not None:  # Unchanged inputs: the entry's program digest, the config's settings.
            return dataclasses.replace(answered, settings=settings_of(function_for(config, case.program_id)))
    if not lowering:
        raise Uncached(case)
    lowered = lower(case, config, options=options)
    result = lowered.measure(cache)
    read = reads.recorded()  # What the project's code read, lowering this case included.
    if inputs is not None and result.attribution_problem is None and read is not None:  # What the cache holds.
        cache.remember(inputs, lowered.key, lowered.lines, lowered.entry, read)
    return dataclasses.replace(result, settings=settings_of(lowered.config))


def _exported(case: Case, config: Config, options: dict[str, str], compiler_options: Mapping[str, Any] | None,
              export: str) -> Measurement:
    """Compiled and measured, its executable written under ``export`` with its manifest (the job's launch
    flags in it: the config's ``libtpu_init_args`` and the caller's)."""
    lowered = lower(case, config, options=options)
    with lowered.compile() as compiled:
        result = compiled.measure()
        flags = resolve_compiler_options(case.topology, case.num_slices, config.options, compiler_options,
                                         presets=False)
        write_exported(export, export_compiled(case, compiled.compiled, compiler_options=options,
                                               figures=result.figures, launch_flags=flags))
    return result


def by_inputs(cache: FiguresCache, inputs: str, case: Case, options: dict[str, str], *,
              environ: Mapping[str, str] | None = None) -> Measurement | None:
    """The measurement the cache holds for a case whose inputs digest to ``inputs``, not lowered; None
    when no run recorded them, what the project's code read then reads otherwise now, or the entry they
    point to is gone, was changed since (its details or
    anchors are not those the index's lines were mapped from), or names lines the index does not map."""
    found = cache.key_for(inputs)
    if found is None:
        return None
    key, lines, mapped_from, read = found
    if reads.changed(read, environ) is not None:  # A variable or a file the project's code read: lower it again.
        return None
    entry = cache.get(key, toolchain=case.topology.platform.toolchain())
    if entry is None or entry_digest(entry) != mapped_from:  # Changed since: lower it.
        return None
    details = Details.from_json(entry.get("details"))
    if not set(details.sources()) <= set(lines):
        return None
    return Measurement.from_json(entry, case=case, compiler_options=options, cached=True, lowered=False,
                                 details=details.with_sources(lines))
