"""The Llama of tests/adapter_models.py with the shard helpers model code is written with
(loaded by tests/unit/figures/test_sharding.py with ``--module``; not in the ini's aot_config_modules).

- ``llama-legacy``: the pre-``jax.set_mesh`` idiom: no constraint when the legacy physical mesh
  (``with mesh:``, ``thread_resources``) is empty.
- ``llama-direct``: ``with_sharding_constraint(x, P(*spec))`` written directly, always.
- ``llama-platform``: no constraint when ``jax.devices()`` says ``cpu`` (so that the model also runs
  on a laptop), traced as this host (``trace_as_target=False``): the constraints never reach the
  program, and the sharding lint is the net.
- ``llama-as-target``: the same helper traced as the target (aotcheck's default): ``jax.devices()``
  says TPU, and the constraints are there.

``nnx-llama`` itself decides by ``jax.sharding.get_abstract_mesh()``, as docs/configs.md advises.

``small_llama_config`` builds a one-layer Llama on a 2-D mesh ``(fsdp, tp)`` of any shape, for the
lint's tests in mesh axes (compiled in-process by tests/unit/figures/test_sharding.py, not registered);
``heads_over_data`` constrains as ``always`` does, but the attention scores keep the whole batch
with their heads split over ``fsdp`` instead.
"""

from __future__ import annotations

import dataclasses
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


def heads_over_data(x: jax.Array, *spec) -> jax.Array:
    if spec == ("fsdp", "tp", None, None, None):  # The scores (B, kv heads, groups, T, S).
        spec = (None, "fsdp", None, None, None)
    return jax.lax.with_sharding_constraint(x, P(*spec))


def small_llama_config(shard, *, mesh: tuple[int, int] = (4, 4), nested: bool = False) -> aotcheck.TrainerConfig:
    """The Llama of tests/adapter_models.py with one layer and sequences of 128 (a batch of 16), on
    ``(fsdp, tp) = mesh`` (as many kv heads as ``tp`` has devices, at least 4); ``nested``: the
    model called inside a nested ``jax.jit`` (its ops named ``jit(train_step)/.../jit(forward)/...``)."""
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from aotcheck.adapters import flax_nnx

    models = _adapter_models()
    c = dict(models.LLAMA, layers=1, kv_heads=max(mesh[1], 4))
    tokens = jax.ShapeDtypeStruct((16, 128), jnp.int32)

    def loss(model, batch):
        def forward(tokens):
            return model(tokens)

        logits = jax.jit(forward)(batch["tokens"]) if nested else model(batch["tokens"])
        return models.next_token_loss(logits, batch["tokens"])

    adapted = flax_nnx.adapt(lambda: models.Llama(c, shard=shard, rngs=nnx.Rngs(0)))
    # Traced as this host: a helper that asks jax.devices() (by_platform) skips its constraints, as the
    # lint's tests want; traced as the target it would not (llama-as-target).
    return dataclasses.replace(adapted.trainer(batch_spec={"tokens": tokens}, optimizer=optax.adamw(3e-4), loss_fn=loss,
                                               mesh=aotcheck.MeshSpec(("fsdp", "tp"), mesh), eval_step=None),
                               trace_as_target=False)


# Their train steps: the lint's subject (nnx-llama, the reference config, has its eval step too).
aotcheck.register("llama-legacy", lambda: dataclasses.replace(llama_config(shard=by_legacy_mesh), eval_step=None))
aotcheck.register("llama-direct", lambda: dataclasses.replace(llama_config(shard=always), eval_step=None))
aotcheck.register("llama-platform", lambda: dataclasses.replace(llama_config(shard=by_platform), trace_as_target=False,
                                                                eval_step=None))
aotcheck.register("llama-as-target", lambda: dataclasses.replace(llama_config(shard=by_platform), eval_step=None))
