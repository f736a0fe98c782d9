"""Flax Linen: a module and example inputs -> abstract params and the shardings the module declares.

The parameters come from ``module.init`` traced under :func:`jax.eval_shape`
(never allocated). Their shardings are the module's own boxed metadata:
``nn.with_logical_partitioning`` (logical axis names, mapped to mesh axes by
``logical_axis_rules``, as ``nn.logical_to_mesh_axes`` does) and
``nn.with_partitioning`` (mesh axes). The loss and methods get
``module.bind({"params": params})``: call it, or any of its methods.

Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> import flax.linen as nn
    >>> class MLP(nn.Module):
    ...     @nn.compact
    ...     def __call__(self, x):
    ...         init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    ...         return nn.Dense(256, kernel_init=init, use_bias=False)(x).sum(-1)
    >>> x = jax.ShapeDtypeStruct((32, 64), jnp.float32)
    >>> adapted = adapt(MLP(), (x,), logical_axis_rules=[("embed", None), ("mlp", "model")])
    >>> adapted.model_specs
    {'Dense_0/kernel': P(None, 'model')}
    >>> config = adapted.trainer(batch_spec={"x": x}, optimizer=optax.sgd(0.1),
    ...                          loss_fn=lambda model, batch: model(batch["x"]).mean())
    >>> config.programs
    ('train_step', 'eval_step')
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from aotcheck.adapters.base import Adapted, AdapterError, as_abstract, as_rules, constants_like, fallback_rules, \
    leaf_paths, require
from aotcheck.targets.partition import Rules


def adapt(
    module: Any,
    example: Any,
    *,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
    overrides: Rules = (),
    unannotated: str | Rules = "error",
    init_kwargs: Mapping[str, Any] | None = None,
    rng_streams: Sequence[str] = (),
) -> Adapted:
    """Reads a Linen ``module``; ``example`` is what ``module.init`` takes after the rng.

    ``example``: one input, a tuple of positional inputs, or a dict of keyword inputs
    (arrays or ShapeDtypeStructs; only their shapes matter). ``logical_axis_rules``:
    ``(logical name, mesh axis or None)`` pairs for ``nn.with_logical_partitioning``.
    ``overrides`` decide first; ``unannotated`` says what happens to parameters the
    module leaves without a sharding (see :func:`aotcheck.adapters.base.fallback_rules`).
    ``rng_streams``: RNG streams the module draws from when applied (e.g. ``("dropout",)``);
    each gets a key made inside the program. The loss and methods run inside
    ``nn.logical_axis_rules(logical_axis_rules)``, so ``nn.with_logical_constraint`` on
    activations shards as it does in training.
    """
    nn = require("flax.linen", extra="flax", library="Flax")
    args, kwargs = _split_example(as_abstract(example))
    init_kwargs = dict(init_kwargs or {})

    def init_variables(rng: jax.Array) -> Any:
        a, k = constants_like((args, kwargs))
        return module.init(rng, *a, **k, **init_kwargs)

    boxed = jax.eval_shape(init_variables, jax.random.key(0))
    others = sorted(set(boxed) - {"params"})
    if others:
        raise AdapterError(f"{type(module).__name__} has variable collections {others} besides 'params'; the "
                           "Linen adapter trains and serves 'params' only. Write the step as a TrainerConfig "
                           "of your own to carry them.")
    specs: dict[str, PartitionSpec | None] = {}
    for path, leaf in leaf_paths(boxed.get("params", {}), is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata)):
        specs[path] = _spec(nn, path, leaf, logical_axis_rules)

    def init_fn(rng: jax.Array) -> Any:
        return nn.meta.unbox(init_variables(rng))["params"]

    def bind(params: Any) -> Any:
        rngs = {name: jax.random.fold_in(jax.random.key(0), i) for i, name in enumerate(rng_streams)}
        return module.bind({"params": params}, rngs=rngs or None)

    rules = tuple(logical_axis_rules) if logical_axis_rules is not None else None
    return Adapted(init_fn=init_fn, bind=bind, model_specs=specs,
                   overrides=as_rules(overrides, what="overrides"), fallback=fallback_rules(unannotated),
                   trace_context=(lambda: nn.logical_axis_rules(rules)) if rules else contextlib.nullcontext)


def _split_example(example: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example, Mapping):
        return (), dict(example)
    if isinstance(example, tuple):
        return example, {}
    return (example,), {}


def _spec(nn: Any, path: str, leaf: Any, rules: Sequence[tuple[str, Any]] | None) -> PartitionSpec | None:
    if isinstance(leaf, nn.LogicallyPartitioned):
        own = getattr(leaf, "rules", None)
        if rules is None and own is None:
            raise AdapterError(f"Parameter {path} is annotated with logical axis names {leaf.names} but no "
                               "logical_axis_rules were given: pass logical_axis_rules=[(name, mesh axis or None), "
                               "...] (the ones your training loop uses with nn.logical_axis_rules).")
        return nn.logical_to_mesh_axes(leaf.names, own if own is not None else rules)
    if isinstance(leaf, nn.Partitioned):
        return PartitionSpec(*leaf.names)
    return None
