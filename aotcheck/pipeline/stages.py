"""The stages of measuring one case, each an object carrying what the next needs (after ``jax.stages``).

    lower(case, config) -> LoweredCase      the program as JAX lowered it: its compiler options, its
                                            figures-cache key, its arguments' paths, its source lines
    LoweredCase.compile() -> CompiledCase   XLA's executable and the dump directory it owns
    CompiledCase.measure() -> Measurement   the figures, and the details that explain them

``LoweredCase.measure(cache)`` is the whole path with the figures cache: a hit skips the compile.

Example (host CPU devices; a TPU topology name works the same, through libtpu):
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> from aotcheck import FunctionConfig
    >>> from aotcheck.pipeline.case import Case
    >>> def make_args(mesh):
    ...     rows = NamedSharding(mesh, P("data"))
    ...     return (jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=rows),
    ...             jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P())))
    >>> config = FunctionConfig(fn=lambda x, w: x @ w, make_args=make_args)
    >>> lowered = lower(Case.of("mm", "step", "cpu-4"), config)
    >>> [a.path for a in lowered.arguments]
    ['args[0]', 'args[1]']
    >>> with lowered.compile() as compiled:
    ...     measured = compiled.measure()
    >>> measured.figures["flops"], measured.cached  # Per device: 16 of the 64 rows.
    (2097152.0, False)
    >>> compiled.measure()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    RuntimeError: CompiledCase.measure() reads XLA's dump, removed when its context ended: ...
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import jax

from aotcheck import _runtime
from aotcheck.errors import OutOfMemory, OutOfMemorySpace
from aotcheck.figures.attribution import PeakBuffer, read_dump
from aotcheck.figures.dump import AttributionError, dump_file, dump_options
from aotcheck.figures.fallbacks import FIGURE as FALLBACKS, read_fallbacks
from aotcheck.figures.frames import stack_frames
from aotcheck.figures.hbm import locate
from aotcheck.figures.hlo import HloParseError, Instruction, check_against, parse_module
from aotcheck.figures.hlo import constants as hlo_constants
from aotcheck.figures.ledger import KERNEL_TARGETS
from aotcheck.figures.loops import analyze_hlo, top_collectives
from aotcheck.figures.program import Details, measure_program
from aotcheck.figures.sharding import Unsharded, batch_inputs, find_unsharded
from aotcheck.figures.splits import dump_options as sharding_dump_options
from aotcheck.figures.splits import read_shardings, sharding_dump
from aotcheck.figures.scoped import default_limit, kernel_memory, smem_limit, space_figures
from aotcheck.figures.sources import anchors, remap, source_sequence
from aotcheck.pipeline.cache import FiguresCache, cache_key
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import CACHED_FIELDS, COST_FIGURES, Measurement
from aotcheck.programs.compile import compile_lowered
from aotcheck.programs.config import Config, FunctionConfig
from aotcheck.programs.model import function_for
from aotcheck.programs.lowering import Argument, argument_kinds_key, arguments, lower_function, place
from aotcheck.programs.options import resolve_compiler_options


def lower(
    case: Case, config: Config, *, compiler_options: Mapping[str, Any] | None = None, presets: bool = True,
    store: Any = None, options: dict[str, str] | None = None,
) -> "LoweredCase":
    """Lowers ``config``'s program of ``case`` on the case's target (no XLA compile).

    ``compiler_options`` (the caller's: the gate's launch flags) go over the config's, which go over
    aotcheck's presets this libtpu accepts for the chip (``presets=False`` leaves those out; ``store``:
    where a probe of which presets it accepts is remembered, the figures cache's directory; ``options``:
    those already resolved so). Raises the config's, the mesh's and partitioning's own errors when the config is wrong.
    """
    if options is None:
        options = resolve_compiler_options(case.topology, case.num_slices, config.options, compiler_options,
                                           presets=presets, store=store)
    cpu = time.process_time()  # The process's own counters (user + sys, every thread), not wall time.
    config = function_for(config, case.program_id)  # A model config given as built: its program's function.
    lowered = lower_function(config, case.target)[case.program_id]
    return LoweredCase(case, config, lowered, options, lower_cpu_seconds=round(time.process_time() - cpu, 2))


class LoweredCase:
    """A case's program as JAX lowered it, with what compiling and caching it need."""

    def __init__(self, case: Case, config: FunctionConfig, lowered: jax.stages.Lowered, options: dict[str, str], *,
                 lower_cpu_seconds: float) -> None:
        self.case, self.config, self.lowered, self.options = case, config, lowered, options
        self.lower_cpu_seconds = lower_cpu_seconds
        # The answer's source lines: the entry's (or the fresh details') line -> the line as the code
        # stands (set by measure(); an index of the cache by inputs keeps it).
        self.lines: dict[str, str] = {}
        self.entry: dict[str, Any] = {}  # The details and anchors those lines were mapped from, as the entry holds them.

    @functools.cached_property
    def module_text(self) -> str:
        """The lowered module as StableHLO, without locations (a moved line is the same program)."""
        return self.lowered.as_text()

    @functools.cached_property
    def program_digest(self) -> str:
        """A digest of the lowered module: equal for two builds of a config that lower to one program."""
        return hashlib.sha256(self.module_text.encode()).hexdigest()[:16]

    @functools.cached_property
    def key(self) -> str:
        """The figures cache's key: the lowered program (with a FunctionConfig's argument kinds, which
        split its peak), the options, the target and the toolchain."""
        return cache_key(module_text=self.module_text + argument_kinds_key(self.lowered, self.config),
                         compiler_options=self.options, topology=self.case.topology.name,
                         num_slices=self.case.num_slices, wraparound=self.case.topology.wraparound,
                         toolchain=self.case.topology.platform.toolchain())

    @functools.cached_property
    def arguments(self) -> list[Argument]:
        """The program's entry parameters in order, by pytree path (what a buffer is named after)."""
        return arguments(self.lowered, self.config)

    @functools.cached_property
    def located_text(self) -> str:
        """The lowered program with its locations and global shapes (the lint's sizes before partitioning)."""
        return self.lowered.as_text(dialect="hlo", debug_info=True)

    @functools.cached_property
    def source_sequence(self) -> list[str | None]:
        """The source line of each op of the lowered program, in order (the cache's line anchors)."""
        return source_sequence(self.located_text)

    def cached(self, cache: FiguresCache) -> Measurement | None:
        """The measurement the cache holds for this program, its details naming the source lines as
        the code stands now; None on a miss, or where a line it names cannot be mapped."""
        entry = cache.get(self.key, toolchain=self.case.topology.platform.toolchain())
        if entry is None:
            return None
        # Every figure as the compile that made the entry measured it (its costs too).
        details = Details.from_json(entry.get("details"))
        lines = remap(entry.get("anchors", {}), self.source_sequence, needed=details.sources())
        if lines is None:
            return None
        self.lines, self.entry = lines, {"details": entry.get("details"), "anchors": entry.get("anchors", {})}
        return Measurement.from_json(entry, case=self.case, compiler_options=self.options, cached=True,
                                     details=details.with_sources(lines))

    def compile(self) -> "CompiledCase":
        """Runs XLA, dumping its buffer assignment and live ranges into a directory the result owns
        (use it as a context manager: leaving removes the directory).

        Raises CompileError when XLA refuses, OutOfMemory (what filled the memory in its ``details``,
        read from the dump XLA wrote before it gave up) when the program does not fit, OutOfMemorySpace
        (naming the op's Python line, found in the lowered program) when an op overflows VMEM or SMEM."""
        dump = _runtime.dump_directory()
        start, cpu = time.perf_counter(), time.process_time()
        try:
            with _runtime.compiler_warnings() as warnings:
                compiled = compile_lowered(self.lowered, {**self.options, **dump_options(dump.name),
                                                          **sharding_dump_options()},
                                           what=self.case.id, topology=self.case.topology)
        except OutOfMemorySpace as e:  # Not HBM: the dump's HBM buffers would answer another question.
            dump.cleanup()
            raise e.located(locate(e.overflow, self.located_text)) from e
        except OutOfMemory as e:
            try:
                details = self._oom_details(dump.name)
            finally:
                dump.cleanup()
            if details is None:
                raise e from None
            raise e.with_details(details.to_json()) from e
        except BaseException:
            dump.cleanup()
            raise
        return CompiledCase(self, compiled, dump, seconds=time.perf_counter() - start,
                            cpu_seconds=round(time.process_time() - cpu, 2), warnings=warnings)

    def measure(self, cache: FiguresCache | None = None) -> Measurement:
        """The cached measurement if ``cache`` has one, else compiled and measured (and cached)."""
        if cache is not None:
            hit = self.cached(cache)
            if hit is not None:  # Its key holds this module's text: its digest is this one's.
                return dataclasses.replace(hit, program=self.program_digest)
        with self.compile() as compiled:
            result = dataclasses.replace(compiled.measure(), program=self.program_digest)
        self.lines = {line: line for line in result.details.sources()}
        self.entry = {"details": result.view("details")["details"], "anchors": {}}
        # An entry whose peak could not be split is never cached: a fresh compile may split it (the cause
        # can be the host's, e.g. a dump that did not fit), and a cached answer must be a fresh one's.
        if cache is not None and result.attribution_problem is None:
            self.entry["anchors"] = anchors(result.details.sources(), self.source_sequence)
            cache.put(self.key, result.view(*CACHED_FIELDS), toolchain=self.case.topology.platform.toolchain(),
                      anchors=self.entry["anchors"])
        return result

    def unsharded(self, module: Mapping[str, Any], buffers: list[PeakBuffer], *, peak_bytes: int,
                  dump: str) -> list[Unsharded]:
        """The lint of :mod:`aotcheck.figures.sharding`: its batch inputs as split in the compiled
        ``module``, its buffers' mesh axes from the propagated module in XLA's ``dump``
        (:mod:`aotcheck.figures.splits`; a tile assignment read against this case's mesh)."""
        inputs = batch_inputs(self.arguments, module)
        if not inputs:  # Nothing split: nothing to keep whole (and no dump to read).
            return []
        mesh = lambda: dict(place(self.config, self.case.target).mesh.shape)  # noqa: E731
        return find_unsharded(buffers, inputs, lambda: read_shardings(sharding_dump(dump) or "", mesh),
                              peak_bytes=peak_bytes,
                              param_shapes=[a.shape for a in self.arguments if a.kind in ("params", "opt_state")])

    def _oom_details(self, dump: str) -> Details | None:
        """What filled the memory of a compile that ran out of it (None if XLA's dump does not say)."""
        try:
            text = dump_file(dump)
            module = parse_module(text)
            found = read_dump(dump, hlo_text=text, module=module, arguments=self.arguments, peak_bytes=None)
        except (AttributionError, HloParseError):  # The verdict stays out-of-memory, without its buffers.
            return None
        return Details(found.buffers, [], unsharded=self.lint(module, found.buffers,
                                                               peak_bytes=sum(found.classes.values()), dump=dump))

    def lint(self, module: Mapping[str, Any], buffers: list[PeakBuffer], *, peak_bytes: int,
              dump: str) -> list[Unsharded]:
        """The lint, which never changes a figure or a verdict: a dump it cannot read finds nothing."""
        try:
            return self.unsharded(module, buffers, peak_bytes=peak_bytes, dump=dump)
        except (HloParseError, ValueError, KeyError, IndexError):
            return []


def _xla_modules(compiled: jax.stages.Compiled) -> list[Any]:
    """XLA's own parse of the optimized program (``hlo_modules()``; empty where the toolchain has none)."""
    try:
        return list(compiled.runtime_executable().hlo_modules())
    except (AttributeError, NotImplementedError, RuntimeError):
        return []


class CompiledCase:
    """A case compiled: XLA's executable, what compiling cost, and XLA's dump (removed on leaving the
    context, or by :meth:`close`)."""

    def __init__(self, lowered: LoweredCase, compiled: jax.stages.Compiled, dump: Any, *, seconds: float,
                 cpu_seconds: float, warnings: Sequence[str] = ()) -> None:
        self.lowered, self.compiled, self._dump = lowered, compiled, dump
        self.seconds, self.cpu_seconds = seconds, cpu_seconds
        self.warnings = list(warnings)  # What the compiler logged while it compiled (libtpu's warnings).
        self._closed = False

    @property
    def dump_dir(self) -> str:
        return self._dump.name

    def __enter__(self) -> "CompiledCase":
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._dump.cleanup()
        self._closed = True

    def _constants(self, text: str) -> dict[str, Instruction]:
        """The program's constants printed whole (XLA's dump), where a kernel may read one and the
        program's own text elides some (a splash kernel's block mask)."""
        if "constant({...})" not in text or not any(f'"{t}"' in text for t in KERNEL_TARGETS):
            return {}
        return hlo_constants(dump_file(self.dump_dir, required=False) or "")

    def measure(self) -> Measurement:
        """The figures (memory, loop-aware FLOPs and collectives, the peak split by class, the costs)
        and their details. A dump that cannot be read leaves the ``peak_*`` figures out and says why
        in ``attribution_problem``; a dump the scratch disk could not hold is the host's HostError."""
        if self._closed:
            raise RuntimeError("CompiledCase.measure() reads XLA's dump, removed when its context ended: "
                               "call it inside `with lowered.compile() as compiled:`.")
        case, text = self.lowered.case, self.compiled.as_text()
        module = parse_module(text)
        xla_modules = _xla_modules(self.compiled)
        if xla_modules:  # Every compile's parse checked against XLA's own, instruction by instruction.
            check_against(module, xla_modules[0])
        analysis = analyze_hlo(text, module=module, constants=self._constants(text))
        figures, uncounted = measure_program(self.compiled, num_devices=case.target.num_devices, analysis=analysis)
        figures.update(zip(COST_FIGURES, (self.cpu_seconds, self.lowered.lower_cpu_seconds)))
        scoped = kernel_memory(module, vmem=default_limit(self.lowered.options, case.topology),
                               smem=smem_limit(case.topology))
        figures.update(space_figures(scoped))
        fallbacks = []
        if case.topology.platform.logs_warnings:  # Elsewhere the figure is absent, never a zero that was not read.
            fallbacks = read_fallbacks(self.warnings, frames=stack_frames(sharding_dump(self.dump_dir) or ""))
            figures[FALLBACKS] = sum(f.count for f in fallbacks)
        problem, buffers, excess, unsharded = None, [], 0, []
        try:
            attribution = read_dump(self.dump_dir, hlo_text=text, module=module, arguments=self.lowered.arguments,
                                    peak_bytes=int(figures["peak_bytes"]))
            figures.update(attribution.figures())
            buffers, excess = attribution.buffers, attribution.excess
            unsharded = self.lowered.lint(module, buffers, peak_bytes=int(figures["peak_bytes"]), dump=self.dump_dir)
        except AttributionError as e:
            full = _runtime.scratch_problem(self.dump_dir)
            if full:  # Not the program's doing: nothing is cached or written for this case.
                raise _runtime.HostError(f"{full}; nothing was cached or written for this case.") from None
            problem = f"the peak is not split by class: {e}"
        return Measurement(case, figures, self.lowered.options, self.seconds, compiled=self.compiled,
                           details=Details(buffers, top_collectives(analysis), peak_excess_bytes=excess,
                                           unsharded=unsharded, uncounted=uncounted,
                                           kernels=analysis.kernel_runs(), fallbacks=fallbacks, scoped=scoped),
                           attribution_problem=problem)
