"""Flax NNX: a module constructor -> abstract state and the shardings its variables declare.

The constructor runs under ``nnx.eval_shape`` (never allocated), with eager
sharding off so no mesh is needed to read it. ``nnx.Param`` variables are the
parameters (a pure dict, ``nnx.to_pure_dict``); each one's ``out_sharding``
metadata (``nnx.with_partitioning``) is its sharding, mapped through
``logical_axis_rules`` when given (or the variable's own ``sharding_rules``), as
``nnx.get_partition_spec`` does. The loss and methods get the module itself,
rebuilt by ``nnx.merge``; optimizer state follows the parameters.

Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> from flax import nnx
    >>> class MLP(nnx.Module):
    ...     def __init__(self, rngs):
    ...         init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
    ...         self.up = nnx.Linear(64, 256, kernel_init=init, rngs=rngs)
    ...     def __call__(self, x):
    ...         return self.up(x).sum(-1)
    >>> adapted = adapt(lambda: MLP(nnx.Rngs(0)), unannotated="replicate")
    >>> adapted.model_specs
    {'up/bias': None, 'up/kernel': P(None, 'model')}
    >>> config = adapted.trainer(batch_spec={"x": jax.ShapeDtypeStruct((32, 64), jnp.float32)},
    ...                          optimizer=optax.adam(1e-3), loss_fn=lambda model, batch: model(batch["x"]).mean())
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from aotcheck.adapters.base import Adapted, as_rules, constants_like, fallback_rules, leaf_paths, require
from aotcheck.targets.partition import Rules


def adapt(
    make: Callable[[], Any],
    *,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
    overrides: Rules = (),
    unannotated: str | Rules = "error",
) -> Adapted:
    """Reads the NNX module ``make()`` builds (e.g. ``lambda: Model(cfg, rngs=nnx.Rngs(0))``).

    ``logical_axis_rules``: ``(logical name, mesh axis or None)`` pairs, when the
    module's ``out_sharding`` names are logical. ``overrides`` and ``unannotated``
    as in :func:`aotcheck.adapters.base.fallback_rules`.
    """
    nnx = require("flax.nnx", extra="flax", library="Flax")
    spmd = require("flax.core.spmd", extra="flax", library="Flax")

    def build() -> Any:
        with nnx.use_eager_sharding(False):  # No mesh here: the shardings are read, not applied.
            return make()

    rules = tuple(logical_axis_rules) if logical_axis_rules is not None else None
    # The loss runs under the same rules, so logical activation constraints shard as in training.
    context = (lambda: spmd.logical_axis_rules(rules)) if rules else contextlib.nullcontext
    graphdef, params, rest = nnx.split(nnx.eval_shape(build), nnx.Param, ...)
    specs: dict[str, PartitionSpec | None] = {}
    for path, var in leaf_paths(params, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        if not var.get_metadata().get("out_sharding"):
            specs[path] = None
            continue
        with context():
            specs[path] = nnx.get_partition_spec(var).get_value()

    def init_fn(rng: jax.Array) -> Any:
        return nnx.to_pure_dict(nnx.state(build(), nnx.Param))

    def bind(pure: Any) -> Any:
        state = jax.tree_util.tree_map(lambda v: v, params)  # A fresh copy of the template to fill.
        nnx.replace_by_pure_dict(state, pure)
        # Other state (RNG streams, counters, batch statistics) enters the program as constants: a
        # compile needs their shapes, not their values.
        return nnx.merge(graphdef, state, constants_like(rest))

    return Adapted(init_fn=init_fn, bind=bind, model_specs=specs, overrides=as_rules(overrides, what="overrides"),
                   fallback=fallback_rules(unannotated), trace_context=context)

