"""Equinox: a module constructor -> its array leaves (``eqx.filter``), sharded by rules.

Equinox modules are pytrees that carry no sharding, so every parameter is
decided by ``rules``: regex pairs over paths such as ``layers/0/weight``, or a
callable such as :func:`aotcheck.fsdp`. The constructor is traced under
``eqx.filter_eval_shape`` (never allocated); the loss and methods get the module,
rebuilt by ``eqx.combine``. Its configs trace outside any mesh (``trace_in_mesh=False``):
Equinox keeps arrays it computes while tracing (rotary tables), which must not carry
one target's mesh into the next; Equinox code takes its shardings from its inputs.

Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> import equinox as eqx
    >>> from aotcheck import fsdp
    >>> adapted = adapt(lambda key: eqx.nn.MLP(64, 8, width_size=256, depth=1, key=key), rules=[fsdp("data")])
    >>> sorted(adapted.model_specs)
    ['layers/0/bias', 'layers/0/weight', 'layers/1/bias', 'layers/1/weight']
    >>> config = adapted.trainer(batch_spec={"x": jax.ShapeDtypeStruct((32, 64), jnp.float32)},
    ...                          optimizer=optax.sgd(0.1),
    ...                          loss_fn=lambda model, batch: jax.vmap(model)(batch["x"]).mean())
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from aotcheck.adapters.base import Adapted, as_rules, constants_like, fallback_rules, leaf_paths, require
from aotcheck.targets.partition import Rules


def adapt(make: Callable[[jax.Array], Any], *, rules: Rules = (), unannotated: str | Rules = "error") -> Adapted:
    """Reads the Equinox module ``make(key)`` builds; ``rules`` shard its array leaves.

    ``unannotated``: what happens to array leaves no rule decides
    (see :func:`aotcheck.adapters.base.fallback_rules`).
    """
    eqx = require("equinox", extra="equinox", library="Equinox")
    abstract = eqx.filter_eval_shape(make, jax.random.key(0))
    # Floating arrays are the parameters (what gradients flow to); other arrays (integer buffers,
    # stored PRNG keys) enter the program as constants, as eqx.filter_grad would leave them alone.
    is_param = lambda x: isinstance(x, jax.ShapeDtypeStruct) and jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)  # noqa: E731
    is_other = lambda x: isinstance(x, jax.ShapeDtypeStruct) and not is_param(x)  # noqa: E731
    params, rest = eqx.partition(abstract, is_param)
    others, static = eqx.partition(rest, is_other)

    def init_fn(rng: jax.Array) -> Any:
        return eqx.filter(make(rng), eqx.is_inexact_array)

    return Adapted(init_fn=init_fn, bind=lambda p: eqx.combine(p, constants_like(others), static),
                   model_specs={path: None for path, _ in leaf_paths(params)},
                   overrides=as_rules(rules, what="rules"), fallback=fallback_rules(unannotated), trace_in_mesh=False)
