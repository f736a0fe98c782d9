"""Compiler-option policy: aotcheck's per-chip presets (only those this libtpu accepts for the chip),
the user's launch flags and options over them, and options that only mean something to a running job
stripped.

Layers, later over earlier: aotcheck's presets (``presets=False`` turns them off, so the compile
equals the job's), the config's options, the caller's. A preset the running libtpu refuses for a
chip is not sent (:func:`refused_presets`); a user's option that libtpu refuses stays an error.

Example:
    >>> from aotcheck.programs.options import resolve_compiler_options
    >>> options = resolve_compiler_options("v6e-8", 1, {"xla_dump_to": "/tmp/x"}, {"xla_tpu_enable_latency_hiding_scheduler": False})
    >>> options["xla_tpu_enable_latency_hiding_scheduler"], options["xla_tpu_scoped_vmem_limit_kib"]
    ('false', '98304')
    >>> "xla_dump_to" in options, resolve_compiler_options("cpu-4", 1)
    (False, {})
    >>> resolve_compiler_options("v5e-16", 1, parse_libtpu_init_args("--xla_tpu_scoped_vmem_limit_kib=65536"), presets=False)
    {'xla_tpu_scoped_vmem_limit_kib': '65536'}
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from aotcheck.errors import ConfigError
from aotcheck import _runtime
from aotcheck.targets.topology import CHIPS, Topology, parse_topology


class OptionsError(ConfigError):
    """Compiler options or launch flags that cannot be used; the message names the token and the fix."""


# Production presets for TPU training (from MaxText's and axlearn's launch flags).
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

# Which presets each libtpu refuses, per chip family (measured with tests/test_compile.py's probe
# test, which fails when this table and the running libtpu disagree). libtpu 0.0.50.1 refuses
# continuation fusion for AllGather on every chip but v5e ("not supported/recommended on platforms
# other than TPU v5e"); 0.0.42.1 accepted every preset everywhere. A libtpu not listed here is
# probed: one tiny compile per (family, multi-slice), remembered (see refused_presets).
_ASYNC_FUSION = frozenset(k for k in _TPU_DEFAULTS if k.startswith("xla_tpu_enable_async_collective_fusion"))
KNOWN_REFUSALS: dict[str, dict[str, frozenset[str]]] = {
    "0.0.42.1": {family: frozenset() for family in ("v4", "v5p", "v5e", "v6e", "7x")},
    "0.0.50.1": {"v4": _ASYNC_FUSION, "v5p": _ASYNC_FUSION, "v5e": frozenset(), "v6e": _ASYNC_FUSION,
                 "7x": _ASYNC_FUSION},
}


def preset_options(topology: str | Topology, num_slices: int = 1) -> dict[str, str]:
    """Every preset aotcheck has for this chip (before asking what the running libtpu accepts)."""
    topo = parse_topology(topology)
    if topo.platform != "tpu":
        return {}
    options = dict(_TPU_DEFAULTS)
    options.update(_TPU_FAMILY_DEFAULTS.get(topo.chip.family, {}))
    if num_slices > 1:
        options.update(_MULTI_SLICE_DEFAULTS)
    return options


class Refusal(NamedTuple):
    """The presets the running libtpu refuses for one (family, multi-slice), and how that is known."""

    names: frozenset[str]
    how: str  # "table" (KNOWN_REFUSALS), "probe" (compiled just now) or "remembered" (a probe's file).


def known_refusal(family: str, libtpu: str | None = None) -> frozenset[str] | None:
    """What :data:`KNOWN_REFUSALS` says for ``family`` under ``libtpu`` (default: the running one), or None."""
    version = libtpu if libtpu is not None else _runtime.toolchain()["libtpu"]
    return KNOWN_REFUSALS.get(version or "", {}).get(family)


_probed: dict[tuple[str, bool], Refusal] = {}
_notes: list[str] = []  # What probes found, to be said once (compile workers send them to the session).


def probe_notes() -> list[str]:
    """What this process's probes found that refuses a preset, one line each."""
    return list(_notes)


def refused_presets(topology: str | Topology, num_slices: int = 1, *, store: str | Path | None = None) -> Refusal:
    """The presets the running libtpu refuses for ``topology``'s chip: from :data:`KNOWN_REFUSALS`,
    else from a probe (a tiny compile on the chip's devices), done once per process and, with
    ``store`` (a directory, e.g. the figures cache), once per libtpu version."""
    topo = parse_topology(topology)
    if topo.platform != "tpu":
        return Refusal(frozenset(), "table")
    family, multi = topo.chip.family, num_slices > 1
    known = known_refusal(family)
    if known is not None:
        return Refusal(known, "table")
    if (family, multi) in _probed:
        return _probed[(family, multi)]
    # Keyed by the libtpu and by aotcheck's own presets for the chip: a new preset is probed anew.
    digest = hashlib.sha256(json.dumps(preset_options(topo, num_slices), sort_keys=True).encode()).hexdigest()[:12]
    name = f"libtpu-{_runtime.toolchain()['libtpu']}-{family}-{'multi' if multi else 'one'}-{digest}.json"
    path = Path(store) / "presets" / name if store else None
    found = None
    if path is not None:
        try:
            found = Refusal(frozenset(json.loads(path.read_text())["refused"]), "remembered")
        except (OSError, ValueError, KeyError, TypeError):  # Not probed yet, or unreadable: probe again.
            found = None
    if found is None:
        found = Refusal(probe_refused_presets(topo, num_slices), "probe")
        if path is not None:
            from aotcheck._files import atomic_write_text  # noqa: PLC0415

            try:
                atomic_write_text(path, json.dumps({"refused": sorted(found.names)}) + "\n")
            except OSError:  # An unwritable cache only costs the next process a probe.
                pass
    _probed[(family, multi)] = found
    if found.names:
        _notes.append(f"aotcheck: libtpu {_runtime.toolchain()['libtpu']} refuses aotcheck's presets "
                      f"{', '.join(sorted(found.names))} on {family}{' (multi-slice)' if multi else ''} "
                      f"({'probed' if found.how == 'probe' else 'probed before'}): not sent there")
    return found


def tiny_lowered(topology: str | Topology, num_slices: int = 1) -> Any:
    """A tiny sharded program lowered for ``topology``'s devices: what a probe or a warm-up compiles."""
    import jax  # noqa: PLC0415  (only a probe or a warm-up needs jax and libtpu)
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: PLC0415

    from aotcheck.targets.topology import get_devices_for_topology  # noqa: PLC0415

    devices = get_devices_for_topology(topology, num_slices).devices
    mesh = Mesh(np.asarray(devices, dtype=object).reshape(-1), ("d",))
    x = jax.ShapeDtypeStruct((8 * len(devices), 128), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("d")))
    return jax.jit(lambda a: (a @ a.T).sum()).lower(x)


def probe_refused_presets(topology: str | Topology, num_slices: int = 1) -> frozenset[str]:
    """Compiles a tiny sharded program for ``topology`` with aotcheck's presets and returns those the
    running libtpu refuses: the ones its error names (with the options that extend them), else, when
    it names none, each preset that breaks a compile the others allow."""
    lowered = tiny_lowered(topology, num_slices)
    presets = preset_options(topology, num_slices)

    def refusal(options: Mapping[str, str]) -> str | None:
        try:
            with _runtime.quiet_compiler_stderr():
                lowered.compile(compiler_options=dict(options))
            return None
        except Exception as e:  # jax's JaxRuntimeError: its message names the option.
            return str(e) or type(e).__name__

    if refusal({}) is not None:  # libtpu cannot compile even this: the real compile will say why.
        return frozenset()
    refused: set[str] = set()
    for _ in range(len(presets)):
        message = refusal({k: v for k, v in presets.items() if k not in refused})
        if message is None:
            return frozenset(refused)
        named = {k for k in presets if k not in refused and re.search(rf"\b{re.escape(k)}\b", message)}
        if not named:
            break
        refused |= {k for k in presets for n in named if k == n or k.startswith(n + "_")}
    accepted: dict[str, str] = {}  # The error named nothing of ours: keep each preset that compiles.
    for key, value in presets.items():
        if refusal({**accepted, key: value}) is None:
            accepted[key] = value
    return frozenset(presets) - set(accepted)


def default_compiler_options(
    topology: str | Topology, num_slices: int = 1, *, store: str | Path | None = None
) -> dict[str, str]:
    """aotcheck's presets for this chip that the running libtpu accepts (empty for ``cpu-N``)."""
    refused = refused_presets(topology, num_slices, store=store).names
    return {k: v for k, v in preset_options(topology, num_slices).items() if k not in refused}


_FLAG = re.compile(r"^--(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:=(?P<value>.*))?$", re.DOTALL)


def parse_libtpu_init_args(text: str | None, *, what: str = "LIBTPU_INIT_ARGS") -> dict[str, str]:
    """A ``LIBTPU_INIT_ARGS`` string, as launch scripts set it, parsed as libtpu parses it (absl
    flags split on whitespace: ``--name=value``, ``--name`` for true, ``--noname`` for false).
    Runtime-only flags stay in (they are dropped when options are resolved). OptionsError names a
    token that is not a flag.

    Example:
        >>> parse_libtpu_init_args("--xla_tpu_enable_latency_hiding_scheduler=true --xla_enable_async_all_gather "
        ...                        "--noxla_tpu_overlap_compute_collective_tc")
        {'xla_tpu_enable_latency_hiding_scheduler': 'true', 'xla_enable_async_all_gather': 'true', 'xla_tpu_overlap_compute_collective_tc': 'false'}
        >>> parse_libtpu_init_args("xla_foo=1")
        Traceback (most recent call last):
        ...
        aotcheck.programs.options.OptionsError: LIBTPU_INIT_ARGS: 'xla_foo=1' is not a flag; write it as libtpu reads flags, --xla_foo=1
    """
    options: dict[str, str] = {}
    for token in (text or "").split():
        match = _FLAG.match(token)
        if not match:
            bare = token.lstrip("-")
            hint = f"write it as libtpu reads flags, --{bare}" if re.match(r"^[A-Za-z_]\w*(=|$)", bare) else \
                "each flag is --name=value, separated by spaces"
            raise OptionsError(f"{what}: {token!r} is not a flag; {hint}")
        name, value = match["name"], match["value"]
        if value and (value[0] in "'\"" or value[-1] in "'\""):
            raise OptionsError(f"{what}: {token!r} keeps its quotes; libtpu does not remove quotes, so give the "
                               f"value without them (--{name}={value.strip(chr(39) + chr(34))})")
        if value is None and name.startswith("no") and name[2:].startswith("xla_"):
            name, value = name[2:], "false"
        options[name] = "true" if value is None else value
    return options


def format_libtpu_init_args(options: Mapping[str, str]) -> str:
    """The options as one ``LIBTPU_INIT_ARGS`` string (the inverse of :func:`parse_libtpu_init_args`).

    Example:
        >>> format_libtpu_init_args({"xla_b": "2", "xla_a": "true"})
        '--xla_a=true --xla_b=2'
    """
    return " ".join(f"--{k}={v}" for k, v in sorted(options.items()))


def runtime_only(name: str) -> bool:
    """Whether an option only means something to a running job (dropped from compiles).

    Example:
        >>> runtime_only("megascale_port"), runtime_only("xla_dump_to"), runtime_only("xla_tpu_scoped_vmem_limit_kib")
        (True, True, False)
    """
    return bool(_RUNTIME_ONLY.match(name.lstrip("-")))


def _as_option_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Flags only another platform's compiler knows (it would refuse them): not sent to this one's.
_OTHER_PLATFORMS_FLAGS = {"gpu": "xla_tpu_", "tpu": "xla_gpu_"}


def resolve_compiler_options(
    topology: str | Topology, num_slices: int, *layers: Mapping[str, Any] | None, presets: bool = True,
    store: str | Path | None = None,
) -> dict[str, str]:
    """Merges aotcheck's accepted presets (unless ``presets=False``) with each later layer (config,
    then caller), as strings. Runtime-only options are dropped; a value of None removes a preset; the
    other platform's flags (``xla_tpu_*`` for a GPU, ``xla_gpu_*`` for a TPU) are not sent.

    Example:
        >>> resolve_compiler_options("h100-8", 1, {"xla_tpu_scoped_vmem_limit_kib": 98304, "xla_gpu_enable_triton_gemm": False})
        {'xla_gpu_enable_triton_gemm': 'false'}
    """
    options: dict[str, Any] = dict(default_compiler_options(topology, num_slices, store=store)) if presets else {}
    foreign = _OTHER_PLATFORMS_FLAGS.get(parse_topology(topology).platform)
    for layer in layers:
        for key, value in (layer or {}).items():
            key = key.lstrip("-")
            if foreign and key.startswith(foreign):  # One launch-flag set for a TPU and GPU matrix.
                continue
            if value is None:
                options.pop(key, None)
            else:
                options[key] = value
    return {k: _as_option_value(v) for k, v in sorted(options.items()) if not runtime_only(k)}


def refusal_lines(families: Iterable[str]) -> list[str]:
    """What the header says about presets for these chip families under the running libtpu.

    Example:
        >>> lines = refusal_lines(["v4", "v5e"])
        >>> all(line.startswith("aotcheck: ") for line in lines)
        True
    """
    libtpu = _runtime.toolchain()["libtpu"]
    refused: dict[frozenset[str], list[str]] = {}
    unknown = []
    for family in sorted(f for f in set(families) if f in CHIPS):  # TPU families: libtpu's presets.
        names = known_refusal(family)
        if names is None:
            unknown.append(family)
        elif names:
            refused.setdefault(names, []).append(family)
    lines = [f"aotcheck: libtpu {libtpu} refuses aotcheck's presets {', '.join(sorted(names))} on "
             f"{', '.join(fams)}: not sent there (each golden records the options sent)"
             for names, fams in refused.items()]
    if unknown:
        lines.append(f"aotcheck: libtpu {libtpu} is not in aotcheck's table of accepted presets: each of "
                     f"{', '.join(unknown)} is probed once with a tiny compile, and refused presets are not sent")
    return lines
