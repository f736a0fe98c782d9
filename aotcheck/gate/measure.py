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

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from aotcheck import _runtime
from aotcheck.figures.peak import Peak, dump_options, read_peak
from aotcheck.figures.program import Figures, program_figures
from aotcheck.gate.cache import FiguresCache, cache_key
from aotcheck.gate.case import Case
from aotcheck.programs.compile import compile_lowered
from aotcheck.programs.config import Config
from aotcheck.programs.lowering import lower_config
from aotcheck.programs.options import resolve_compiler_options
from aotcheck.programs.registry import REGISTRY, Registry


@dataclasses.dataclass
class Measurement:
    """What measuring a case produced."""

    case: Case
    figures: Figures
    compiler_options: dict[str, str]
    compile_seconds: float
    compiled: Any = dataclasses.field(default=None, repr=False)  # None when the figures came from the cache.
    cached: bool = False
    host_peak_bytes: int | None = None  # Peak RSS of the process that measured it (not gated).
    peak: Peak | None = None  # XLA's account of the peak (live values, breakdown), when asked for.
    hlo_text: str | None = dataclasses.field(default=None, repr=False)  # The optimized HLO, when asked for.


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
    dump_peak: bool = False,
) -> Measurement:
    """Lowers and compiles one case here and returns its figures.

    ``dump_peak``: also have XLA dump its live ranges (into a temporary directory,
    always removed) and return its account of the peak; the cache is then not
    consulted, since a cached case is not compiled. The dump leaves the program,
    its figures and its cache key as they are (tests/test_cli.py compares).

    Raises what lowering and compiling raise: CompileError when XLA refuses,
    the registry's, mesh's and partitioning's own errors when the config is wrong.
    """
    config = config or registry.get(case.config).program(case.program)
    options = resolve_compiler_options(case.topology, case.num_slices, config.compiler_options, compiler_options)
    lowered = lower_config(config, case.target, program=case.program)[case.program]
    key = None
    if cache is not None and not dump_peak:
        key = cache_key(module_text=lowered.as_text(), compiler_options=options, topology=case.topology.name,
                        num_slices=case.num_slices, toolchain=_runtime.toolchain())
        entry = cache.get(key, toolchain=_runtime.toolchain())
        if entry is not None:
            return Measurement(case, entry["figures"], options, float(entry.get("compile_seconds", 0.0)), cached=True)
    peak = None
    with tempfile.TemporaryDirectory(prefix="aotcheck-dump-") if dump_peak else contextlib.nullcontext() as dump:
        start = time.perf_counter()
        compiled = compile_lowered(lowered, {**options, **(dump_options(dump) if dump else {})}, what=case.id,
                                   topology=case.topology)
        seconds = time.perf_counter() - start
        if dump:
            peak = read_peak(dump)
    figures = program_figures(compiled, num_devices=case.target.num_devices)
    if cache is not None and key is not None:
        cache.put(key, figures, compile_seconds=seconds, toolchain=_runtime.toolchain())
    return Measurement(case, figures, options, seconds, compiled=compiled, peak=peak)
