"""``aotcheck export`` and ``aotcheck load``: ship what the gate checked, and check it where the job runs.

``export CONFIG --topology T --out DIR`` is ``check --export DIR`` over the config's cases at that target:
each case that passes its gate writes its executable and manifest (:mod:`aotcheck.pipeline.export`).
``load DIR --check`` holds every manifest under DIR against this process (toolchain, launch flags,
devices); a case of this host's platform is also loaded and run beside a fresh JIT of its config, on the
same inputs, and the two must agree bit for bit.

Example (the cases ``export`` gates):
    >>> programs = lambda: {"step": "its config", "eval": "its config"}
    >>> [c.id for c in export_cases("m", None, "cpu-4", None, programs=programs,
    ...                             case_of=lambda name, config, target: Case.of(name, "?", target.topology))]
    ['m/?@cpu-4x1', 'm/?@cpu-4x1']
    >>> export_cases("m", ["train"], "cpu-4", None, programs=programs, case_of=None)
    Traceback (most recent call last):
    ...
    ValueError: m has no program train; it has step, eval
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aotcheck.pipeline.case import Case
from aotcheck.records import Record


def export_cases(config: str, wanted: Sequence[str] | None, topology: str, slices: int | None, *,
                 programs: Callable[[], dict[str, Any]], case_of: Any) -> list[Case]:
    """The config's cases at the target (``wanted``: only these programs), in its programs' order."""
    import argparse  # noqa: PLC0415

    from aotcheck.cmdline import read_target  # noqa: PLC0415

    target = read_target(argparse.Namespace(topology=topology, slices=slices))
    found = programs()
    unknown = [p for p in wanted or () if p not in found]
    if unknown:
        raise ValueError(f"{config} has no program {', '.join(unknown)}; it has {', '.join(found)}")
    return [case_of(config, found[p], target) for p in found if not wanted or p in wanted]


@dataclasses.dataclass(frozen=True)
class LoadCheck(Record):
    """What ``load --check`` found for one manifest.

    Attributes:
        case: The case (its id in the JSON).
        mismatches: Fields that differ in this process (``Mismatch`` records): refused, not loaded.
        load_seconds: How long loading the executable took (None: not loaded here).
        compile_seconds: How long the fresh JIT's compile took, for comparison.
        equal: Whether its outputs equal the fresh JIT's bit for bit (None: not run here, another platform).
        differing: The outputs (paths) that differ.
    """

    case: Case
    mismatches: tuple[Any, ...] = ()  # Mismatch records (pipeline.export, imported only when used).
    load_seconds: float | None = None
    compile_seconds: float | None = None
    equal: bool | None = None
    differing: tuple[str, ...] = ()


def check_loads(dest: str, *, only: Sequence[str] = (), registry: Any = None) -> list[LoadCheck]:
    """Every manifest under ``dest`` (``only``: these case ids) held against this process, and those of
    its platform loaded and run beside a fresh JIT (``registry``: where their configs are)."""
    from aotcheck.pipeline.export import job_launch_flags, mismatches, read_manifests  # noqa: PLC0415
    from aotcheck.targets.devices import reserve_cpu_devices  # noqa: PLC0415

    manifests = [m for m in read_manifests(dest) if not only or m.case.id in only]
    from aotcheck.targets.topology import parse_topology  # noqa: PLC0415

    host = [len(m.devices) for m in manifests if parse_topology(m.topology).platform.host_devices]
    if host:
        reserve_cpu_devices(max(host))  # Before jax starts its CPU backend: a cpu-8 case needs 8.
    import jax  # noqa: PLC0415

    out = []
    flags = job_launch_flags()
    for manifest in manifests:
        try:
            devices = jax.devices(manifest.platform)
        except RuntimeError:  # No such backend here: said as the platform that differs.
            devices = jax.devices()
        found = mismatches(manifest, devices, launch_flags=flags)
        if found:
            out.append(LoadCheck(manifest.case, tuple(found)))
            continue
        out.append(_run_beside_jit(dest, manifest, registry))
    return out


def _inputs(compiled: Any, config: Any) -> tuple[Any, ...]:
    """Arguments for ``compiled`` in its shardings, the same on every call: floats from a fixed key,
    integers and booleans zeros, then what the config's ``run_inputs`` replaces."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    (infos, _), (shardings, _) = compiled.args_info, compiled.input_shardings
    counter = iter(range(1 << 30))

    def made(info: Any, sharding: Any) -> Any:
        key = jax.random.key(next(counter))
        value = jax.random.normal(key, info.shape, info.dtype) if jnp.issubdtype(info.dtype, jnp.floating) else \
            jnp.zeros(info.shape, info.dtype)
        return jax.device_put(value, sharding)

    args = tuple(jax.tree_util.tree_map(made, i, s) for i, s in zip(infos, shardings))
    if config.run_inputs is None:
        return args
    return tuple(jax.tree_util.tree_map(lambda v, s: jax.device_put(v, s), a, shardings[i])
                 for i, a in enumerate(config.run_inputs(args)))


def _run_beside_jit(dest: str, manifest: Any, registry: Any) -> LoadCheck:
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from aotcheck.pipeline.export import load  # noqa: PLC0415
    from aotcheck.programs.lowering import lower_function  # noqa: PLC0415
    from aotcheck.programs.model import function_for  # noqa: PLC0415
    from aotcheck.targets.devices import on_this_host  # noqa: PLC0415

    case = manifest.case
    start = time.perf_counter()
    loaded = load(dest, manifest.case.id)
    load_seconds = time.perf_counter() - start
    config = function_for(registry.get(case.config).program(case.program_id), case.program_id)
    start = time.perf_counter()
    with _compiler_logs_off(), on_this_host():  # A TPU target's devices: this host's chips, not deviceless ones.
        fresh = lower_function(config, case.target)[case.program_id].compile()
    compile_seconds = time.perf_counter() - start
    ours = jax.tree_util.tree_leaves_with_path(loaded(*_inputs(fresh, config)))
    theirs = jax.tree_util.tree_leaves(fresh(*_inputs(fresh, config)))
    differing = tuple(jax.tree_util.keystr(path) or "output" for (path, a), b in zip(ours, theirs)
                      if not np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))
    return LoadCheck(manifest.case, (), round(load_seconds, 4), round(compile_seconds, 4),
                     not differing and len(ours) == len(theirs), differing)


@contextlib.contextmanager
def _compiler_logs_off() -> Iterator[None]:
    """File descriptor 2 to /dev/null while the fresh JIT compiles: XLA's partitioner logs its warnings
    there from C++ (a refusal is raised as an exception all the same)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def add_commands(sub: Any, load: Callable[[Sequence[str] | None], None], check: Callable[[Sequence[str]], int]) -> None:
    """``aotcheck export`` and ``aotcheck load``'s parsers (``load`` registers configs; ``check`` runs
    ``aotcheck check`` with the arguments given)."""
    p = sub.add_parser("export", help="gate a config's programs at one target and write each that passes as its "
                       "executable and manifest", description="aotcheck check --export DIR over CONFIG's cases.")
    p.add_argument("config")
    p.add_argument("--topology", required=True, help="e.g. v5e-1, v5e-16 or cpu-8")
    p.add_argument("--slices", type=int, default=None, help="number of slices (default 1)")
    p.add_argument("--program", action="append", default=[], help="only this program (repeatable)")
    p.add_argument("--out", required=True, help="a directory or a store URL (gs://, s3://, az://, file://)")
    p.add_argument("--module", dest="config_modules", action="append", default=[], help="a module registering configs")
    p.add_argument("--golden-dir", help="golden directory (default: aot_golden_dir, or golden/)")
    p.add_argument("--update-golden", action="store_true", help="accept the figures as goldens first")
    p.set_defaults(func=lambda args: export_command(args, load, check))

    p = sub.add_parser("load", help="check exported executables against this process, and run those of its platform",
                       description="Exits 2 when a manifest does not match this process (the field and both "
                       "values named), 1 when a loaded executable's outputs differ from a fresh JIT's.")
    p.add_argument("dest", help="the export's directory or store URL")
    p.add_argument("--check", action="store_true", help="hold every manifest against this process (the default)")
    p.add_argument("--case", action="append", default=[], metavar="ID", help="only this case (repeatable)")
    p.add_argument("--module", dest="config_modules", action="append", default=[], help="a module registering configs")
    p.add_argument("--report", metavar="PATH", help="write each manifest's check as JSON here (load and compile seconds)")
    p.set_defaults(func=lambda args: load_command(args, load))


def export_command(args: Any, load: Callable[[Sequence[str] | None], None], check: Callable[[Sequence[str]], int]) -> int:
    """``check --export`` over the config's cases at the target."""
    from aotcheck.programs.registry import REGISTRY  # noqa: PLC0415

    load(args.config_modules)
    entry = REGISTRY.get(args.config)
    cases = export_cases(args.config, args.program, args.topology, args.slices, programs=entry.programs,
                         case_of=Case.for_config)
    return check([*(f"--case={c.id}" for c in cases), f"--export={args.out}",
                  *(f"--module={m}" for m in args.config_modules), *(["--update-golden"] if args.update_golden else []),
                  *([f"--golden-dir={args.golden_dir}"] if args.golden_dir else [])])


def load_command(args: Any, load: Callable[[Sequence[str] | None], None]) -> int:
    """2 where a manifest does not match, 1 where outputs differ, else 0."""
    from aotcheck.programs.registry import REGISTRY  # noqa: PLC0415
    from aotcheck.render.text import load_check_line  # noqa: PLC0415

    load(args.config_modules)
    checks = check_loads(args.dest, only=args.case, registry=REGISTRY)
    for found in checks:
        print(load_check_line(found))
    if args.report:  # The load seconds as figures, beside the gate's report (written whole).
        import json  # noqa: PLC0415
        from pathlib import Path  # noqa: PLC0415

        from aotcheck._files import atomic_write_text  # noqa: PLC0415

        atomic_write_text(Path(args.report), json.dumps({"dest": args.dest, "checks": [c.to_json() for c in checks]},
                                                        indent=1) + "\n")
    if not checks:
        print(f"aotcheck: no manifest under {args.dest}")
        return 2
    return 2 if any(c.mismatches for c in checks) else 1 if any(c.equal is False for c in checks) else 0
