"""Ship what you gated: a compiled case's executable, serialized beside a manifest of what it was compiled
for, and loaded by the job instead of compiled again (MaxText's ``compiled_trainstep_file``, with the
checks it lacks: another jax, libtpu or set of flags is refused, naming the field, never run silently).

    export_compiled(case, compiled, ...) -> Exported     the payload and its Manifest (jax's
                                                         ``serialize_executable``: executable + pytrees)
    write_exported(dest, exported)                       <dest>/<config>/<program>@<target>.executable and
                                                         .manifest.json; dest a directory or a store URL
    read_manifests(dest) -> [Manifest]                   every manifest under dest
    mismatches(manifest, devices, launch_flags) -> [...] what differs in this process, field by field
    load(dest, case_id) -> Loaded                        refused (ExportMismatch) when anything differs,
                                                         else a callable on this process's devices

The payload is a pickle (as MaxText's file): load only from a store you trust. Its sha256 is in the
manifest and checked before it is unpickled, so a truncated or swapped payload is refused.

Example (host CPU devices):
    >>> import jax, jax.numpy as jnp, tempfile
    >>> from aotcheck.pipeline.case import Case
    >>> case = Case.of("double", "step", f"cpu-{len(jax.devices('cpu'))}")
    >>> compiled = jax.jit(lambda x: x * 2).lower(jax.ShapeDtypeStruct((4,), jnp.float32)).compile()
    >>> exported = export_compiled(case, compiled, compiler_options={}, figures={"flops": 4.0})
    >>> dest = tempfile.mkdtemp()
    >>> write_exported(dest, exported)
    'double/step@cpu-...x1'
    >>> loaded = load(dest, case.id)
    >>> loaded(jnp.arange(4.0)).tolist(), loaded.manifest.inputs[0].shape
    ([0.0, 2.0, 4.0, 6.0], (4,))
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aotcheck.records import Record
from aotcheck._files import atomic_write_bytes
from aotcheck.errors import AotcheckError
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.store import check_url
from aotcheck.programs.options import parse_libtpu_init_args, runtime_only
from aotcheck.targets.topology import parse_topology

FORMAT = 1
PAYLOAD, MANIFEST = ".executable", ".manifest.json"
LAUNCH_FLAGS = "LIBTPU_INIT_ARGS"


class ExportError(AotcheckError, OSError):
    """An export that cannot be written or read (a missing case, an unreadable store)."""


class ExportMismatch(AotcheckError, ValueError):
    """A manifest that does not match this process: loading would run another program than was gated."""

    @dataclasses.dataclass(frozen=True)
    class FIELDS(Record):
        mismatches: tuple[Mismatch, ...] = ()

    def __init__(self, message: str, *, mismatches: Sequence["Mismatch"] = ()) -> None:
        super().__init__(message)
        self.mismatches = tuple(mismatches)


@dataclasses.dataclass(frozen=True)
class Aval(Record):
    """One argument or result of the executable: its path in the pytree, shape, dtype, sharding and
    layout as jax prints them, and whether it is donated."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    sharding: str
    layout: str = ""
    donated: bool = False


@dataclasses.dataclass(frozen=True)
class Mismatch(Record):
    """One field of a manifest that differs in this process: its value there and here."""

    field: str
    exported: Any
    here: Any


@dataclasses.dataclass(frozen=True)
class Manifest(Record):
    """What an exported executable was compiled for, and what the gate measured of it.

    Attributes:
        case: The case (its id in the file: ``lm-tiny/train_step@v5e-1x1``).
        toolchain: jax, jaxlib and the compiler's package (libtpu, the CUDA plugin), as they were.
        compiler_options: Every option the compile was given (aotcheck's presets and the launch flags).
        launch_flags: The job's own launch flags among them (its ``LIBTPU_INIT_ARGS``): a job must run
            with the same ones. ``xla_flags``: the ``XLA_FLAGS`` the compile ran under.
        platform, topology, num_slices, wraparound, device_kind: The target; ``devices``: the device ids
            in the executable's order; ``mesh``: its axes and their sizes.
        inputs, outputs: The executable's arguments and results (donated arguments marked).
        figures: What the gate measured; ``golden_digest``: sha256 of the golden it passed against.
        payload_sha256, payload_bytes: The serialized executable's.
    """

    case: Case
    toolchain: Mapping[str, str | None]
    compiler_options: Mapping[str, str]
    launch_flags: Mapping[str, str]
    xla_flags: str
    platform: str
    topology: str
    num_slices: int
    wraparound: str
    device_kind: str
    devices: tuple[int, ...]
    mesh: Mapping[str, int]
    inputs: tuple[Aval, ...]
    outputs: tuple[Aval, ...]
    figures: Mapping[str, float]
    golden_digest: str | None
    payload_sha256: str
    payload_bytes: int
    format: int = FORMAT


@dataclasses.dataclass(frozen=True)
class Exported:
    """A serialized executable and its manifest, ready to write."""

    payload: bytes
    manifest: Manifest


def _avals(infos: Any, formats: Any, *, donated: bool) -> tuple[Aval, ...]:
    import jax  # noqa: PLC0415

    leaves = jax.tree_util.tree_leaves_with_path(infos)
    layouts = jax.tree_util.tree_leaves(formats, is_leaf=lambda f: hasattr(f, "layout"))
    out = []
    for i, (path, info) in enumerate(leaves):
        fmt = layouts[i] if i < len(layouts) else None
        sharding = getattr(info, "sharding", None) or getattr(fmt, "sharding", None)
        out.append(Aval(jax.tree_util.keystr(path) or "args", tuple(info.shape), str(info.dtype),
                        str(getattr(sharding, "spec", sharding)), str(getattr(fmt, "layout", "") or ""),
                        bool(getattr(info, "donated", False)) if donated else False))
    return tuple(out)


def export_compiled(case: Case, compiled: Any, *, compiler_options: Mapping[str, str],
                    figures: Mapping[str, float], golden_digest: str | None = None,
                    launch_flags: Mapping[str, str] | None = None) -> Exported:
    """``compiled`` (a ``jax.stages.Compiled`` of ``case``) serialized, with its manifest."""
    from jax.experimental import serialize_executable  # noqa: PLC0415

    serialized, in_tree, out_tree = serialize_executable.serialize(compiled)
    payload = pickle.dumps((serialized, in_tree, out_tree), protocol=pickle.HIGHEST_PROTOCOL)
    shardings = _leaves(compiled.input_shardings[0])
    first = next((s for s in shardings if hasattr(s, "mesh")), None)
    devices = tuple(int(d.id) for d in first.mesh.devices.flat) if first is not None else tuple(
        int(d.id) for d in shardings[0].device_set) if shardings else ()
    mesh = {str(k): int(v) for k, v in first.mesh.shape.items()} if first is not None else {}
    kind = str(first.mesh.devices.flat[0].device_kind) if first is not None else ""
    topology = case.topology
    formats = getattr(compiled, "input_formats", None)
    manifest = Manifest(
        case=case, toolchain=dict(topology.platform.toolchain()), compiler_options=dict(compiler_options),
        launch_flags=dict(launch_flags or {}), xla_flags=os.environ.get("XLA_FLAGS", ""),
        platform=topology.platform.name, topology=topology.name, num_slices=case.num_slices,
        wraparound="".join(axis for axis, w in zip("xyz", topology.wraparound) if w) or "none",
        device_kind=kind, devices=devices, mesh=mesh,
        inputs=_avals(compiled.args_info[0], formats[0] if formats else None, donated=True),
        outputs=_avals(compiled.out_info, None, donated=False),
        figures={k: float(v) for k, v in figures.items() if isinstance(v, (int, float))},
        golden_digest=golden_digest, payload_sha256=hashlib.sha256(payload).hexdigest(), payload_bytes=len(payload))
    return Exported(payload, manifest)


def _leaves(tree: Any) -> list[Any]:
    import jax  # noqa: PLC0415

    return jax.tree_util.tree_leaves(tree, is_leaf=lambda s: hasattr(s, "device_set"))


class _Dest:
    """A directory or a store URL (``gs://``, ``s3://``, ``az://``, ``file://``; credentials refused as the
    shared cache refuses them), read and written whole: a local file by rename, never half-written."""

    def __init__(self, where: str | os.PathLike[str]) -> None:
        text = os.fspath(where)
        self.url = check_url(text).rstrip("/") if "://" in text else None
        self.root = Path(self.url.partition("://")[2]) if self.url and self.url.startswith("file://") else \
            None if self.url else Path(text)
        self._fs: Any = None

    def fs(self) -> Any:
        if self._fs is None:
            import fsspec  # noqa: PLC0415

            self._fs = fsspec.filesystem(self.url.partition("://")[0])  # type: ignore[union-attr]
        return self._fs

    def put(self, name: str, data: bytes) -> None:
        if self.root is not None:
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            return atomic_write_bytes(self.root / name, data)
        return self.fs().pipe_file(f"{self.url.partition('://')[2]}/{name}", data)  # type: ignore[union-attr]

    def get(self, name: str) -> bytes:
        try:
            if self.root is not None:
                return (self.root / name).read_bytes()
            return self.fs().cat_file(f"{self.url.partition('://')[2]}/{name}")  # type: ignore[union-attr]
        except FileNotFoundError:
            raise ExportError(f"{self.where(name)} does not exist: export the case first "
                              "(pytest --aot-export=DIR, or aotcheck export CONFIG --topology T --out DIR)") from None

    def names(self) -> list[str]:
        if self.root is not None and not self.root.is_dir():
            raise ExportError(f"{self.root} is no directory of exports: export the cases first (pytest "
                              "--aot-export=DIR, or aotcheck export CONFIG --topology T --out DIR)")
        if self.root is not None:
            return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob(f"*{MANIFEST}"))
        base = self.url.partition("://")[2]  # type: ignore[union-attr]
        return sorted(p[len(base) + 1:] for p in self.fs().glob(f"{base}/**{MANIFEST}"))

    def where(self, name: str) -> str:
        return f"{self.url}/{name}" if self.url else str(self.root / name)  # type: ignore[operator]


def write_exported(dest: str | os.PathLike[str], exported: Exported) -> str:
    """Writes the payload, then its manifest (a reader finds no manifest without its payload); returns
    the stem both share under ``dest`` (the case's id, as its golden's path)."""
    name = exported.manifest.case.id
    where = _Dest(dest)
    where.put(name + PAYLOAD, exported.payload)
    where.put(name + MANIFEST, (json.dumps(exported.manifest.to_json(), indent=1, sort_keys=True) + "\n").encode())
    return name


def read_manifests(dest: str | os.PathLike[str]) -> list[Manifest]:
    """Every manifest under ``dest``; ExportError naming one that is not a manifest."""
    where = _Dest(dest)
    out = []
    for name in where.names():
        try:
            out.append(Manifest.from_json(json.loads(where.get(name))))
        except (ValueError, KeyError, TypeError) as e:
            raise ExportError(f"{where.where(name)} is not a manifest aotcheck wrote ({type(e).__name__}: {e}); "
                              "export the case again") from None
    return out


def job_launch_flags(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's launch flags that change a compiled program (runtime-only ones dropped)."""
    text = (os.environ if environ is None else environ).get(LAUNCH_FLAGS, "")
    return {k: v for k, v in parse_libtpu_init_args(text, what=LAUNCH_FLAGS).items() if not runtime_only(k)}


def mismatches(manifest: Manifest, devices: Sequence[Any], *, launch_flags: Mapping[str, str],
               toolchain: Mapping[str, str | None] | None = None) -> list[Mismatch]:
    """What differs between the manifest and this process: the toolchain, the launch flags, the devices'
    platform, kind and number, and the manifest's format. Empty: the executable is the one gated."""
    out = []
    if manifest.format != FORMAT:
        out.append(Mismatch("format", manifest.format, FORMAT))
    here = dict(toolchain if toolchain is not None else parse_topology(manifest.topology).platform.toolchain())
    out += [Mismatch(k, v, here.get(k)) for k, v in manifest.toolchain.items() if here.get(k) != v]
    if dict(manifest.launch_flags) != dict(launch_flags):
        out.append(Mismatch(LAUNCH_FLAGS, dict(manifest.launch_flags), dict(launch_flags)))
    # The devices' platform, then their kind (where the manifest names one), as jax names them.
    exported = {"platform": manifest.platform, "device_kind": manifest.device_kind or None}
    here_facts = {"platform": getattr(devices[0], "platform", None) if devices else None,
                  "device_kind": getattr(devices[0], "device_kind", None) if devices and manifest.device_kind else None}
    differing = next((Mismatch(k, exported[k], here_facts[k]) for k in exported if exported[k] != here_facts[k]), None)
    if differing is not None:
        return [*out, differing]
    ids = {int(d.id) for d in devices}
    if not set(manifest.devices) <= ids:
        out.append(Mismatch("devices", len(manifest.devices), len(ids)))
    return out


def mismatch_words(found: Sequence[Mismatch]) -> str:
    """Each field that differs, with both values: what a refusal and ``load --check`` say.

    Example:
        >>> mismatch_words([Mismatch("jax", "0.1", "0.2")])
        "jax: exported with '0.1', this process has '0.2'"
    """
    return "; ".join(f"{m.field}: exported with {m.exported!r}, this process has {m.here!r}" for m in found)


def refusal(manifest: Manifest, found: Sequence[Mismatch]) -> str:
    """Why a manifest is refused, each field with both values."""
    said = mismatch_words(found)
    return (f"{manifest.case} was not loaded: {said}. A loaded executable runs the program compiled for the "
            "manifest's values, whatever this process has; export it again with this process's toolchain "
            "and flags, or run the job with the manifest's.")


@dataclasses.dataclass(frozen=True)
class Loaded:
    """An exported executable loaded on this process's devices: call it as the jitted function."""

    manifest: Manifest
    executable: Any

    def __call__(self, *args: Any) -> Any:
        return self.executable(*args)


def load(dest: str | os.PathLike[str], case_id: str, *, devices: Sequence[Any] | None = None) -> Loaded:
    """The executable exported for ``case_id`` under ``dest``, loaded on ``devices`` (default: this
    process's devices of the manifest's platform); ExportMismatch when the manifest does not match."""
    import jax  # noqa: PLC0415
    from jax.experimental import serialize_executable  # noqa: PLC0415

    stem = case_id  # The case's id is its path under dest, as a golden's.
    where = _Dest(dest)
    try:
        manifest = Manifest.from_json(json.loads(where.get(stem + MANIFEST)))
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{where.where(stem + MANIFEST)} is not a manifest aotcheck wrote ({e})") from None
    if devices is None:
        try:
            devices = jax.devices(manifest.platform)
        except RuntimeError:
            devices = jax.devices()
    found = mismatches(manifest, devices, launch_flags=job_launch_flags())
    if found:
        raise ExportMismatch(refusal(manifest, found), mismatches=found)
    payload = where.get(stem + PAYLOAD)
    if hashlib.sha256(payload).hexdigest() != manifest.payload_sha256:
        raise ExportMismatch(f"{where.where(stem + PAYLOAD)} is not the payload its manifest names (sha256 "
                             "differs): export the case again", mismatches=[Mismatch("payload_sha256",
                             manifest.payload_sha256, hashlib.sha256(payload).hexdigest())])
    serialized, in_tree, out_tree = pickle.loads(payload)  # noqa: S301  (checked against the manifest's digest)
    by_id = {int(d.id): d for d in devices}
    executable = serialize_executable.deserialize_and_load(
        serialized, in_tree, out_tree, backend=manifest.platform,
        execution_devices=[by_id[i] for i in manifest.devices] or None)
    return Loaded(manifest, executable)


def publish(staging: str | os.PathLike[str], dest: str | os.PathLike[str], case_id: str, *,
            golden_digest: str | None) -> tuple[str, int]:
    """Moves a staged export (written by the compile, before the gate judged it) to ``dest``, naming
    the golden it passed against; returns where its manifest went and the payload's bytes."""
    staged = _Dest(staging)
    manifest = Manifest.from_json(json.loads(staged.get(case_id + MANIFEST)))
    exported = Exported(staged.get(case_id + PAYLOAD), dataclasses.replace(manifest, golden_digest=golden_digest))
    write_exported(dest, exported)
    discard(staging, case_id)
    return _Dest(dest).where(case_id + MANIFEST), len(exported.payload)


def discard(staging: str | os.PathLike[str], case_id: str) -> None:
    """Removes a staged export (its case failed its gate, or was published)."""
    for suffix in (PAYLOAD, MANIFEST):
        (Path(staging) / (case_id + suffix)).unlink(missing_ok=True)
