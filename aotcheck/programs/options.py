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
from aotcheck.targets.platform import TPU
from aotcheck.targets.topology import Topology, parse_topology
from aotcheck.targets.tpu import CHIPS


class OptionsError(ConfigError):
    """Compiler options or launch flags that cannot be used; the message names the token and the fix."""


# Options that only mean something to a running job (launch barriers, the
# megascale DCN transport, dumps): they do not change the program, so drop them.
_RUNTIME_ONLY = re.compile(
    r"^(megascale_.*|xla_tpu_use_enhanced_launch_barrier|xla_tpu_enable_megascale_barrier|xla_dump_.*)$"
)

# Which presets each libtpu refuses, per chip family (measured with tests/unit/programs/test_compile.py's probe
# test, which fails when this table and the running libtpu disagree). libtpu 0.0.50.1 refuses
# continuation fusion for AllGather on every chip but v5e ("not supported/recommended on platforms
# other than TPU v5e"); 0.0.42.1 accepted every preset everywhere. A libtpu not listed here is
# probed: one tiny compile per (family, multi-slice), remembered (see refused_presets).
_ASYNC_FUSION = frozenset(k for k in TPU.presets if k.startswith("xla_tpu_enable_async_collective_fusion"))
KNOWN_REFUSALS: dict[str, dict[str, frozenset[str]]] = {
    "0.0.42.1": {family: frozenset() for family in ("v4", "v5p", "v5e", "v6e", "7x")},
    "0.0.50.1": {"v4": _ASYNC_FUSION, "v5p": _ASYNC_FUSION, "v5e": frozenset(), "v6e": _ASYNC_FUSION,
                 "7x": _ASYNC_FUSION},
}


def preset_options(topology: str | Topology, num_slices: int = 1) -> dict[str, str]:
    """Every preset aotcheck has for this chip (before asking what the running libtpu accepts)."""
    topo = parse_topology(topology)
    return topo.platform.preset_options(topo.family, num_slices)


class Refusal(NamedTuple):
    """The presets the running libtpu refuses for one (family, multi-slice), and how that is known."""

    names: frozenset[str]
    how: str  # "table" (KNOWN_REFUSALS), "probe" (compiled just now) or "remembered" (a probe's file).


def known_refusal(family: str, libtpu: str | None = None) -> frozenset[str] | None:
    """What :data:`KNOWN_REFUSALS` says for ``family`` under ``libtpu`` (default: the running one), or None."""
    version = libtpu if libtpu is not None else _runtime.toolchain()[_runtime.LIBTPU]
    return KNOWN_REFUSALS.get(version or "", {}).get(family)


_probed: dict[tuple[str, bool], Refusal] = {}
_files: dict[tuple[str, bool], Path] = {}  # The presets file each probe's answer is remembered in.
_notes: list[str] = []  # What probes found, to be said once (compile workers send them to the session).


def probe_notes() -> list[str]:
    """What this process's probes found that refuses a preset, one line each."""
    return list(_notes)


def _note(line: str) -> None:
    if line not in _notes:
        _notes.append(line)


def presets_file(store: str | Path, topology: str | Topology, num_slices: int = 1) -> Path:
    """Where a probe's answer for ``topology``'s chip is remembered under ``store`` (the figures cache):
    keyed by the libtpu and by aotcheck's own presets for the chip, so a new preset is probed anew."""
    topo = parse_topology(topology)
    digest = hashlib.sha256(json.dumps(preset_options(topo, num_slices), sort_keys=True).encode()).hexdigest()[:12]
    multi = "multi" if num_slices > 1 else "one"
    return Path(store) / "presets" / f"libtpu-{_runtime.toolchain()[_runtime.LIBTPU]}-{topo.family}-{multi}-{digest}.json"


def _presets_document(topo: Topology, num_slices: int, refused: Iterable[str]) -> dict[str, Any]:
    """What a presets file holds, ``check`` (a digest of the rest) included: a file edited by hand no
    longer matches its check, and is probed again rather than trusted."""
    body = {"libtpu": _runtime.toolchain()[_runtime.LIBTPU], "family": topo.family, "multi_slice": num_slices > 1,
            "presets": preset_options(topo, num_slices), "refused": sorted(refused)}
    return {**body, "check": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}


def read_presets_file(path: Path, topology: str | Topology, num_slices: int = 1) -> tuple[frozenset[str] | None, str | None]:
    """A presets file read and checked: ``(refused, None)`` from a file aotcheck wrote for this libtpu,
    chip and set of presets; ``(None, why)`` for one it cannot trust (not JSON, another schema, a name
    that is no preset of the chip, edited since it was written); ``(None, None)`` when there is none."""
    topo = parse_topology(topology)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"it cannot be read ({e.strerror or e})"
    try:
        document = json.loads(text)
    except ValueError as e:
        return None, f"it is not JSON ({e})"
    expected = _presets_document(topo, num_slices, ())
    if not isinstance(document, dict) or set(document) != set(expected):
        keys = ", ".join(sorted(document)) if isinstance(document, dict) else type(document).__name__
        return None, f"it holds {keys or 'nothing'}, not the fields aotcheck writes ({', '.join(sorted(expected))})"
    refused = document["refused"]
    if not isinstance(refused, list) or not all(isinstance(name, str) for name in refused):
        return None, f"its 'refused' is {refused!r}, not a list of option names"
    unknown = sorted(set(refused) - set(expected["presets"]))
    if unknown:
        return None, f"it names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} no preset of aotcheck's for {topo.family}"
    for key in ("libtpu", "family", "multi_slice", "presets"):
        if document[key] != expected[key]:
            return None, f"its {key} is {document[key]!r}, not this run's {expected[key]!r}"
    if document["check"] != _presets_document(topo, num_slices, refused)["check"]:
        return None, "it was changed since aotcheck wrote it (its check does not match)"
    return frozenset(refused), None


def _write_presets_file(path: Path, topo: Topology, num_slices: int, refused: Iterable[str]) -> None:
    from aotcheck._files import atomic_write_text  # noqa: PLC0415

    try:
        atomic_write_text(path, json.dumps(_presets_document(topo, num_slices, refused), indent=2, sort_keys=True) + "\n")
    except OSError:  # An unwritable cache only costs the next process a probe.
        pass


def refused_presets(topology: str | Topology, num_slices: int = 1, *, store: str | Path | None = None) -> Refusal:
    """The presets the running libtpu refuses for ``topology``'s chip: from :data:`KNOWN_REFUSALS`,
    else from a probe (a tiny compile on the chip's devices), done once per process and, with
    ``store`` (a directory, e.g. the figures cache), once per libtpu version: its answer is remembered
    in a file (:func:`presets_file`), read back only when it checks out (:func:`read_presets_file`;
    one that does not is probed again and rewritten, with a note naming it). A file saves the probe
    only when it says libtpu accepts every preset, which each compile that sends them verifies
    (:func:`recheck_presets`); a file that refuses some is confirmed by a probe, as an edit of it (its
    check recomputed) would change the options sent and so the answer."""
    topo = parse_topology(topology)
    if not topo.platform.option_presets:
        return Refusal(frozenset(), "table")
    family, multi = topo.family, num_slices > 1
    known = known_refusal(family)
    if known is not None:
        return Refusal(known, "table")
    if (family, multi) in _probed:
        return _probed[(family, multi)]
    path = presets_file(store, topo, num_slices) if store else None
    found = None
    if path is not None:
        names, why = read_presets_file(path, topo, num_slices)
        if names is not None and not names:  # "Accepts them all": every compile that sends them checks that.
            found = Refusal(names, "remembered")
        elif names:  # A refusal drops presets, which no compile would contradict: a probe confirms it.
            found = Refusal(probe_refused_presets(topo, num_slices), "probe")
            if found.names != names:
                _note(f"aotcheck: the presets cache file {path} said libtpu refuses {', '.join(sorted(names))} on "
                      f"{family}, and a probe refuses {', '.join(sorted(found.names)) or 'none'}: the file was "
                      "stale or edited. It is rewritten, and the probe's answer taken.")
                _write_presets_file(path, topo, num_slices, found.names)
        elif why is not None:
            _note(f"aotcheck: the presets cache file {path} was not used: {why}. libtpu was probed again "
                  "and the file rewritten.")
    if found is None:
        found = Refusal(probe_refused_presets(topo, num_slices), "probe")
        if path is not None:
            _write_presets_file(path, topo, num_slices, found.names)
    _probed[(family, multi)] = found
    if path is not None:
        _files[(family, multi)] = path
    if found.names:  # Only a probe's answer refuses any (a remembered refusal is probed again).
        _note(f"aotcheck: libtpu {_runtime.toolchain()[_runtime.LIBTPU]} refuses aotcheck's presets "
              f"{', '.join(sorted(found.names))} on {family}{' (multi-slice)' if multi else ''} (probed): not sent there")
    return found


def recheck_presets(topology: str | Topology, num_slices: int = 1) -> str | None:
    """After a compile with aotcheck's presets failed: when what this process knows of the presets libtpu
    refuses for the chip came from a presets file, probes libtpu again. If the probe refuses presets the
    file said libtpu accepts (a stale or edited file), rewrites the file, takes the probe's answer and
    returns a note naming the file: the caller compiles the case again, once. None when the file agrees
    with the probe, or nothing was remembered (the compile's error is the program's)."""
    topo = parse_topology(topology)
    if not topo.platform.option_presets:
        return None
    key = (topo.family, num_slices > 1)
    known, path = _probed.get(key), _files.get(key)
    if known is None or known.how != "remembered" or path is None:
        return None
    probed = probe_refused_presets(topo, num_slices)
    _probed[key] = Refusal(probed, "probe")
    if probed != known.names:
        _write_presets_file(path, topo, num_slices, probed)
    if probed <= known.names:
        return None
    newly = ", ".join(sorted(probed - known.names))
    note = (f"aotcheck: the presets cache file {path} said libtpu {_runtime.toolchain()[_runtime.LIBTPU]} accepts "
            f"{newly} on {topo.family}, but a compile failed and a new probe refuses "
            f"{'it' if len(probed - known.names) == 1 else 'them'}: the file was stale or edited. "
            "It is rewritten, and the case compiled again without them.")
    _note(note)
    return note


def tiny_lowered(topology: str | Topology, num_slices: int = 1) -> Any:
    """A tiny sharded program lowered for ``topology``'s devices: what a probe or a warm-up compiles."""
    import jax  # noqa: PLC0415  (only a probe or a warm-up needs jax and libtpu)
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: PLC0415

    from aotcheck.targets.devices import get_devices_for_topology  # noqa: PLC0415

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
            with _runtime.quiet_compiler_stderr(), _runtime.no_persistent_cache():
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


def refusal_lines(families: Iterable[str]) -> list[str]:
    """What the header says about presets for these chip families under the running libtpu.

    Example:
        >>> lines = refusal_lines(["v4", "v5e"])
        >>> all(line.startswith("aotcheck: ") for line in lines)
        True
    """
    libtpu = _runtime.toolchain()[_runtime.LIBTPU]
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
