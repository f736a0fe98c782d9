"""Running one case: build its config, compile its program, time it, take its figures.

This is the library call under both the CLI and the pytest plugin.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from aotcheck import _runtime
from aotcheck.cache import FiguresCache, cache_key
from aotcheck.case import Case
from aotcheck.compile import compile_lowered, lower_config_programs, resolve_compiler_options
from aotcheck.config import Config
from aotcheck.figures import program_figures
from aotcheck.registry import REGISTRY, Registry
from aotcheck.topology import parse_topology


@dataclasses.dataclass
class CaseResult:
    """What compiling a case produced."""

    case: Case
    figures: dict[str, int | float]
    compiler_options: dict[str, str]
    compile_seconds: float
    compiled: Any = dataclasses.field(default=None, repr=False)  # None when the figures came from the cache.
    cached: bool = False


def config_for(case: Case, registry: Registry = REGISTRY) -> Config:
    """The config that defines ``case.program`` under ``case.config``."""
    programs = registry.get(case.config).programs()
    if case.program not in programs:
        raise KeyError(
            f"Config {case.config!r} has no program {case.program!r}; it has {', '.join(programs)}."
        )
    return programs[case.program]


def _num_devices(case: Case) -> int:
    return parse_topology(case.topology).num_devices * case.num_slices


def unsupported_reason(config: Config, case: Case) -> str | None:
    """Why ``config`` cannot run on the case's target, or None."""
    devices = _num_devices(case)
    if devices < config.min_devices:
        return (f"{case.config} needs at least {config.min_devices} devices; "
                f"{case.topology}x{case.num_slices} has {devices}")
    return None


def run_case(
    case: Case,
    *,
    registry: Registry = REGISTRY,
    config: Config | None = None,
    compiler_options: Mapping[str, Any] | None = None,
    cache: FiguresCache | None = None,
) -> CaseResult:
    """Lowers and compiles one case and returns its figures (raises CompileError on failure).

    With a ``cache``, a case whose lowered program (and options, target and
    toolchain) is unchanged takes its figures from there without compiling.
    """
    config = config or config_for(case, registry)
    options = resolve_compiler_options(case.topology, case.num_slices, config.compiler_options, compiler_options)
    lowered = lower_config_programs(config, topology=case.topology, num_slices=case.num_slices, program=case.program)[
        case.program
    ]
    key = None
    if cache is not None:
        key = cache_key(module_text=lowered.as_text(), compiler_options=options, topology=case.topology,
                        num_slices=case.num_slices, toolchain=_runtime.toolchain())
        entry = cache.get(key)
        if entry is not None:
            return CaseResult(case, entry["figures"], options, float(entry.get("compile_seconds", 0.0)), cached=True)
    start = time.perf_counter()
    compiled = compile_lowered(lowered, options, what=case.id, topology=case.topology)
    seconds = time.perf_counter() - start
    figures = program_figures(compiled, num_devices=_num_devices(case))
    if cache is not None and key is not None:
        cache.put(key, figures, compile_seconds=seconds)
    return CaseResult(case, figures, options, seconds, compiled=compiled)
