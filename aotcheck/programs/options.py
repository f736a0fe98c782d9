"""Compiler-option policy: aotcheck's per-chip presets (only those this libtpu accepts for the chip),
the user's launch flags and options over them, and options that only mean something to a running job
stripped.

Layers, later over earlier: aotcheck's presets (``presets=False`` turns them off, so the compile
equals the job's), the config's options, the caller's. A preset the running libtpu refuses for a
chip is not sent (:func:`aotcheck.targets.presets.refused_presets`: what each libtpu accepts is the
chip's policy, in targets/); a user's option that libtpu refuses stays an error.

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

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotcheck.errors import ConfigError
from aotcheck.targets.presets import preset_options, refused_presets
from aotcheck.targets.topology import Topology, parse_topology


class OptionsError(ConfigError):
    """Compiler options or launch flags that cannot be used; the message names the token and the fix."""


# Options that only mean something to a running job (launch barriers, the
# megascale DCN transport, dumps): they do not change the program, so drop them.
_RUNTIME_ONLY = re.compile(
    r"^(megascale_.*|xla_tpu_use_enhanced_launch_barrier|xla_tpu_enable_megascale_barrier|xla_dump_.*)$"
)

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
            name = bare.partition("=")[0]
            odd = sorted({c for c in token.partition("=")[0] if not c.isascii()})
            hint = (f"a flag's name is ASCII letters, digits and _ ({', '.join(map(repr, odd))} is none: a dash or "
                    "letter pasted from a document?)" if odd else
                    f"write it as libtpu reads flags, --{bare}" if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) else
                    "each flag is --name=value, separated by spaces")
            raise OptionsError(f"{what}: {token!r} is not a flag; {hint}")
        name, value = match["name"], match["value"]
        if value and (value[0] in "'\"" or value[-1] in "'\""):
            raise OptionsError(f"{what}: {token!r} keeps its quotes; libtpu does not remove quotes, so give the "
                               f"value without them (--{name}={value.strip(chr(39) + chr(34))})")
        if value is None and name.startswith("no") and name[2:].startswith("xla_"):
            name, value = name[2:], "false"
        if name == SCOPED_VMEM_FLAG:
            _check_scoped_vmem(value, what)
        options[name] = "true" if value is None else value
    return options


SCOPED_VMEM_FLAG = "xla_tpu_scoped_vmem_limit_kib"
# More than any TPU core holds (v5e's and v6e's VMEM: 128 MiB): a larger limit is a typo of units.
_MOST_VMEM_KIB = 1 << 20


def _check_scoped_vmem(value: str | None, what: str) -> None:
    """OptionsError for a scoped VMEM limit libtpu would not read as meant: not a decimal count of KiB
    (``0x10000``: its parser wants digits), none, or more than any core's VMEM (93 TiB: bytes given as KiB).

    Example:
        >>> parse_libtpu_init_args("--xla_tpu_scoped_vmem_limit_kib=0x10000")
        Traceback (most recent call last):
        ...
        aotcheck.programs.options.OptionsError: LIBTPU_INIT_ARGS: --xla_tpu_scoped_vmem_limit_kib=0x10000 is not a count of KiB; give the limit in decimal KiB, 1 to 1048576 (a TPU core's VMEM is 64 to 128 MiB), e.g. --xla_tpu_scoped_vmem_limit_kib=98304
    """
    ok = (value is not None and value.isascii() and value.isdigit() and len(value) <= 8  # int() of 10^5 digits raises.
          and 0 < int(value) <= _MOST_VMEM_KIB)
    if not ok:
        raise OptionsError(f"{what}: --{SCOPED_VMEM_FLAG}={value if value is not None else ''} is not a count of "
                           f"KiB; give the limit in decimal KiB, 1 to {_MOST_VMEM_KIB} (a TPU core's VMEM is 64 to "
                           f"128 MiB), e.g. --{SCOPED_VMEM_FLAG}=98304")


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
    # Flags only another platform's compiler knows (it would refuse them): not sent to this one's.
    foreign = parse_topology(topology).platform.foreign_flag_prefix
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
