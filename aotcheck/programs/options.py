"""Compiler-option policy: aotcheck's per-chip production defaults, the config's and the caller's
options over them, and options that only mean something to a running job stripped.

Example:
    >>> from aotcheck.programs.options import resolve_compiler_options
    >>> options = resolve_compiler_options("v6e-8", 1, {"xla_dump_to": "/tmp/x"}, {"xla_tpu_enable_latency_hiding_scheduler": False})
    >>> options["xla_tpu_enable_latency_hiding_scheduler"], options["xla_tpu_scoped_vmem_limit_kib"]
    ('false', '98304')
    >>> "xla_dump_to" in options, resolve_compiler_options("cpu-4", 1)
    (False, {})
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from aotcheck.targets.topology import Topology, parse_topology

# Production defaults for TPU training (from MaxText's and axlearn's launch
# flags); each is accepted by this libtpu in AOT compiles (tests check it).
_TPU_DEFAULTS: dict[str, str] = {
    "xla_tpu_enable_latency_hiding_scheduler": "true",
    "xla_tpu_spmd_rng_bit_generator_unsafe": "true",
    "xla_tpu_enable_async_collective_fusion": "true",
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": "true",
    "xla_tpu_enable_async_collective_fusion_multiple_steps": "true",
    "xla_tpu_overlap_compute_collective_tc": "true",
    "xla_enable_async_all_gather": "true",
}
_TPU_FAMILY_DEFAULTS: dict[str, dict[str, str]] = {
    "v6e": {"xla_tpu_scoped_vmem_limit_kib": "98304"},  # As axlearn ships for v6e.
}
_MULTI_SLICE_DEFAULTS = {
    # Overlaps the cross-slice (DCN) gradient all-reduce with compute.
    "xla_tpu_enable_data_parallel_all_reduce_opt": "true",
    "xla_tpu_data_parallel_opt_different_sized_ops": "true",
}
# Options that only mean something to a running job (launch barriers, the
# megascale DCN transport, dumps): they do not change the program, so drop them.
_RUNTIME_ONLY = re.compile(
    r"^(megascale_.*|xla_tpu_use_enhanced_launch_barrier|xla_tpu_enable_megascale_barrier|xla_dump_.*)$"
)


def default_compiler_options(topology: str | Topology, num_slices: int = 1) -> dict[str, str]:
    """aotcheck's per-chip defaults (empty for ``cpu-N``)."""
    topo = parse_topology(topology)
    if not topo.is_tpu:
        return {}
    options = dict(_TPU_DEFAULTS)
    options.update(_TPU_FAMILY_DEFAULTS.get(topo.chip.family, {}))
    if num_slices > 1:
        options.update(_MULTI_SLICE_DEFAULTS)
    return options


def _as_option_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def resolve_compiler_options(
    topology: str | Topology, num_slices: int, *layers: Mapping[str, Any] | None
) -> dict[str, str]:
    """Merges the defaults with each later layer (config, then caller), as strings.

    Runtime-only options are dropped; a value of None removes a default.
    """
    options: dict[str, Any] = dict(default_compiler_options(topology, num_slices))
    for layer in layers:
        for key, value in (layer or {}).items():
            key = key.lstrip("-")
            if value is None:
                options.pop(key, None)
            else:
                options[key] = value
    return {k: _as_option_value(v) for k, v in sorted(options.items()) if not _RUNTIME_ONLY.match(k)}
