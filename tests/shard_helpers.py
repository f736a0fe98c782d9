"""The Llama of tests/adapter_models.py with the shard helpers model code is written with
(loaded by tests/test_sharding.py with ``--module``; not in the ini's aot_config_modules).

- ``llama-legacy``: the pre-``jax.set_mesh`` idiom: no constraint when the legacy physical mesh
  (``with mesh:``, ``thread_resources``) is empty.
- ``llama-direct``: ``with_sharding_constraint(x, P(*spec))`` written directly, always.
- ``llama-platform``: no constraint when ``jax.devices()`` says ``cpu`` (so that the model also runs
  on a laptop): under aotcheck on a CPU host the constraints never reach the program.

``nnx-llama`` itself decides by ``jax.sharding.get_abstract_mesh()``, as README advises.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import jax
from jax.sharding import PartitionSpec as P

import aotcheck


def _adapter_models():
    """tests/adapter_models.py as already loaded (by the ini's aot_config_modules, or a test's import):
    importing it again would register its configs twice."""
    path = Path(__file__).with_name("adapter_models.py").resolve()
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
            return module
    import adapter_models

    return adapter_models


llama_config = _adapter_models().llama_config


def by_legacy_mesh(x: jax.Array, *spec) -> jax.Array:
    from jax.interpreters import pxla

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Deprecated since jax 0.8.2; still in model code.
        mesh = pxla.thread_resources.env.physical_mesh
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, P(*spec))


def always(x: jax.Array, *spec) -> jax.Array:
    return jax.lax.with_sharding_constraint(x, P(*spec))


def by_platform(x: jax.Array, *spec) -> jax.Array:
    if jax.devices()[0].platform == "cpu":
        return x
    return jax.lax.with_sharding_constraint(x, P(*spec))


aotcheck.register("llama-legacy", lambda: llama_config(shard=by_legacy_mesh))
aotcheck.register("llama-direct", lambda: llama_config(shard=always))
aotcheck.register("llama-platform", lambda: llama_config(shard=by_platform))
