"""A case's inputs: everything that decides the program it lowers to, known before it is traced.

Lowering a large model costs seconds to tens of seconds (MaxText's lower in 14-17 s) before the
figures cache, keyed by the lowered program, can answer. A case whose inputs are unchanged lowers to
the same program, so a digest of them answers it from the cache without tracing: the code the config
runs and everything it imports (:mod:`aotcheck.programs.closure`: the project's files by content,
installed packages by version), the config as built (:mod:`aotcheck.programs.fingerprint`), the
toolchain, the compiler options, the flags JAX and XLA read from the environment, the target and the
figures' version. Any change in any of it is another digest: the case is lowered, and compiled only
if its lowered program changed too.

Example (a function config on host devices):
    >>> import jax, jax.numpy as jnp
    >>> from aotcheck import FunctionConfig
    >>> from aotcheck.pipeline.case import Case
    >>> config = FunctionConfig(fn=jnp.tanh, make_args=lambda mesh: (jax.ShapeDtypeStruct((8,), jnp.float32),))
    >>> key = inputs_key(Case.of("t", "step", "cpu-2"), config, options={})
    >>> key == inputs_key(Case.of("t", "step", "cpu-2"), config, options={})
    True
    >>> key == inputs_key(Case.of("t", "step", "cpu-2"), config, options={"xla_cpu_enable_fast_math": "true"})
    False
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import jax

from aotcheck.pipeline.cache import FIGURES_VERSION
from aotcheck.pipeline.case import Case
from aotcheck.figures.frames import short_source
from aotcheck.programs.closure import CUT_SHORT, EDITED, code_closure, code_roots
from aotcheck.programs.config import FunctionConfig
from aotcheck.programs.fingerprint import fingerprint
from aotcheck.programs.registry import Registry

# Aotcheck's own code that turns a config into a lowered program: in every case's closure, so an edit
# of an editable aotcheck (this repository's own gate) is one of the inputs too.
LOWERING_MODULES = ("aotcheck.pipeline.stages", "aotcheck.programs.lowering", "aotcheck.programs.model")
# Settings that say where or how a process runs, not what it lowers: the host's device count (grown per
# run for cpu-N targets), its platforms, JAX's own compilation cache, logging.
_NOT_INPUTS = ("NUM_CPU_DEVICES", "PLATFORMS", "COMPILATION_CACHE", "PERSISTENT_CACHE", "LOG")


# What JAX, XLA and libtpu read from the environment when a program is traced and compiled (less
# _NOT_INPUTS: where logs go, a compile process's own directory, changes no program).
ENVIRONMENT_PREFIXES = ("JAX_", "XLA_", "LIBTPU_", "TPU_")


def _compiles_with(name: str) -> bool:
    return name.startswith(ENVIRONMENT_PREFIXES) and not any(word in name for word in _NOT_INPUTS)


def registering_modules(registry: Registry) -> list[str]:
    """The modules that register ``registry``'s configs, counted by content with only the imports a
    config reads walked (:func:`~aotcheck.programs.closure.code_closure`): a script's too, under either
    of its names (``__main__`` in the session, ``__aotcheck_main__`` in a worker)."""
    return [module for module, _ in registry.sources()] + ["__main__", "__aotcheck_main__"]


def inputs_key(case: Case, config: FunctionConfig, *, options: Mapping[str, str],
               registering: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> str | None:
    """The digest of a case's inputs (the module's docstring); ``config``: its program's function config,
    ``options``: the compiler options it compiles with, ``registering``: the modules that register configs
    (:func:`~aotcheck.programs.closure.code_closure`), ``environ``: the environment of the process that
    lowers it (default: this one's). None when they cannot be known whole: a project file changed while
    this process ran, or a config too large to walk."""
    record = inputs(case, config, options=options, registering=registering, environ=environ)
    if CUT_SHORT in record["code"] or EDITED in record["code"].values():
        return None
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def inputs(case: Case, config: FunctionConfig, *, options: Mapping[str, str],
           registering: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What :func:`inputs_key` digests, as a record (a test's or a curious user's view). Project files
    are named as a report's source lines name them (relative to the working directory), so a run from
    another directory, whose details would name other paths, has other inputs."""
    roots = dict(code_roots(config))
    for module in LOWERING_MODULES:
        roots.setdefault(module, frozenset())
    files: dict[str, str] = {}
    code = code_closure(roots, registering=registering, files=files)
    return {
        "case": case.id,
        "topology": case.topology.name, "slices": case.num_slices, "wraparound": list(case.topology.wraparound),
        "build": fingerprint(config).digest,
        "code": code,
        "paths": {module: short_source(path, 0) for module, path in sorted(files.items())},
        "options": dict(sorted(options.items())),
        "toolchain": dict(sorted(case.topology.platform.toolchain().items())),
        "environment": {k: v for k, v in sorted((os.environ if environ is None else environ).items())
                        if _compiles_with(k)},
        "jax_config": jax_settings(),
        "python": sys.version,
        "figures_version": FIGURES_VERSION,
    }


def jax_settings() -> dict[str, str]:
    """JAX's configuration as it stands (flags set in code, not only the environment): values that
    read the same in every process (no object's address), less where and how the process runs."""
    out = {}
    for name, value in sorted(getattr(jax.config, "values", {}).items()):
        text = repr(value)
        if " at 0x" not in text and not any(word.lower() in name for word in _NOT_INPUTS):
            out[name] = text
    return out


__all__ = ["ENVIRONMENT_PREFIXES", "LOWERING_MODULES", "inputs", "inputs_key", "jax_settings", "registering_modules"]
