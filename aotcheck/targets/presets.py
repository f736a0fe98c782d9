"""What each libtpu accepts of aotcheck's compiler presets for a chip: the chip's policy, with the rest of
what a target is.

A table by libtpu version (:data:`KNOWN_REFUSALS`) answers for the libtpus aotcheck was tested with; any
other is probed (:func:`probe_refused_presets`: a tiny compile on the chip's deviceless devices), once per
process and, under a figures cache, once per libtpu (a presets file, checked before it is trusted).
:mod:`aotcheck.programs.options` layers a config's and a user's options over what is accepted here.

Example:
    >>> sorted(known_refusal("v5e", "0.0.50.1")), known_refusal("v5e", "0.0.1") is None
    ([], True)
    >>> refusals(["v4", "v5e", "h100"], "0.0.50.1")[0] == {KNOWN_REFUSALS["0.0.50.1"]["v4"]: ["v4"]}
    True
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from aotcheck import _runtime
from aotcheck.targets.platform import TPU
from aotcheck.targets.topology import Topology, parse_topology
from aotcheck.targets.tpu import CHIPS

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
    family, multi = topo.family, num_slices > 1
    path = presets_file(store, topo, num_slices) if store else None
    found = presets_without_libtpu(topo, num_slices, store=store)
    if found is not None and found.how != "remembered":
        return found
    if found is None and path is not None:
        names, why = read_presets_file(path, topo, num_slices)
        if names:  # A refusal drops presets, which no compile would contradict: a probe confirms it.
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


def presets_without_libtpu(topology: str | Topology, num_slices: int = 1, *,
                           store: str | Path | None = None) -> Refusal | None:
    """What :func:`refused_presets` answers for ``topology``'s chip without loading libtpu: the table's,
    this process's own probe's, or a presets file's under ``store`` that says libtpu accepts them all;
    None where only a probe would answer. A session that must not load a compiler (it answers cached
    cases in its own process) asks this first.

    Example:
        >>> presets_without_libtpu("h100-8"), presets_without_libtpu("cpu-4").how
        (Refusal(names=frozenset(), how='table'), 'table')
    """
    topo = parse_topology(topology)
    if not topo.platform.option_presets:
        return Refusal(frozenset(), "table")
    known = known_refusal(topo.family)
    if known is not None:
        return Refusal(known, "table")
    if (topo.family, num_slices > 1) in _probed:
        return _probed[(topo.family, num_slices > 1)]
    if store is not None and read_presets_file(presets_file(store, topo, num_slices), topo, num_slices)[0] == frozenset():
        return Refusal(frozenset(), "remembered")  # "Accepts them all": every compile that sends them checks that.
    return None


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


def refusals(families: Iterable[str], libtpu: str | None = None) -> tuple[dict[frozenset[str], list[str]], list[str]]:
    """For the header: the presets the table says ``libtpu`` (default: the running one) refuses, each with
    the TPU families it refuses them on, and the TPU families the table does not know (probed instead).
    Families of other platforms have no presets to refuse."""
    refused: dict[frozenset[str], list[str]] = {}
    unknown = []
    for family in sorted(f for f in set(families) if f in CHIPS):
        names = known_refusal(family, libtpu)
        if names is None:
            unknown.append(family)
        elif names:
            refused.setdefault(names, []).append(family)
    return refused, unknown
