"""What every adapter makes of a user's model: an :class:`Adapted` model, from which configs follow.

An adapter (:mod:`~aotcheck.adapters.flax_linen`, :mod:`~aotcheck.adapters.flax_nnx`,
:mod:`~aotcheck.adapters.equinox`) reads the model the way its library does: its
abstract parameters (never allocated) and the shardings the model itself declares.
What it hands on is plain: an ``init_fn`` for the parameter pytree, a ``bind``
that turns parameters back into a callable model, and the per-path
PartitionSpecs the model said (None where it said nothing). :meth:`Adapted.trainer`
and :meth:`Adapted.inference` then build the ordinary :class:`TrainerConfig` /
:class:`InferenceConfig`, so everything downstream (lowering, figures, goldens)
is unchanged.

Sharding rules, in the order they decide a parameter: the user's ``overrides``
(regex pairs or callables, see :mod:`aotcheck.targets.partition`), then what
the model says, then ``fallback`` (e.g. :func:`aotcheck.fsdp` or
:func:`aotcheck.replicate`). A parameter none of them decides is a
PartitionError listing every such parameter.

Example (a model written as plain functions, to show the pieces):
    >>> import jax, jax.numpy as jnp, optax
    >>> from jax.sharding import PartitionSpec as P
    >>> adapted = Adapted(
    ...     init_fn=lambda rng: {"w": jnp.zeros((64, 16))},
    ...     bind=lambda params: (lambda x: x @ params["w"]),
    ...     model_specs={"w": P(None, "data")})
    >>> config = adapted.trainer(
    ...     batch_spec={"x": jax.ShapeDtypeStruct((32, 64), jnp.float32)},
    ...     loss_fn=lambda model, batch: jnp.mean(model(batch["x"]) ** 2), optimizer=optax.sgd(0.1))
    >>> from aotcheck.programs.lowering import place
    >>> from aotcheck.programs.model import trainer_state_specs
    >>> state, batch = trainer_state_specs(config, place(config, "cpu-4").mesh)
    >>> state["params"]["w"].sharding.spec, state["opt_state"]
    (P(None, 'data'), (EmptyState(), EmptyState()))
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import jax
from jax.sharding import PartitionSpec

from aotcheck.errors import ConfigError
from aotcheck.programs.config import BatchSpec, InferenceConfig, TrainerConfig
from aotcheck.targets.partition import Rules, path_to_str, replicate


class AdapterError(ConfigError):
    """A model the adapter cannot read as given (missing extra, mutable collections, ...)."""


def require(module: str, *, extra: str, library: str) -> ModuleType:
    """``import module``, or an AdapterError that says which extra installs it.

    Example:
        >>> require("no_such_library_xyz", extra="flax", library="Flax")
        Traceback (most recent call last):
        ...
        aotcheck.adapters.base.AdapterError: This adapter needs Flax, which is not installed (no_such_library_xyz): pip install 'aotcheck[flax]'
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        # Only the library itself missing is "not installed"; an import error from inside an installed
        # library (e.g. a version that does not match your jax) is raised as it is, since it says more.
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise
        raise AdapterError(f"This adapter needs {library}, which is not installed ({e.name}): "
                           f"pip install 'aotcheck[{extra}]'") from None


def model_rule(specs: Mapping[str, PartitionSpec | None]) -> Callable[..., PartitionSpec | None]:
    """A partition rule that returns what the model declared for a path (None where it declared nothing).

    Example:
        >>> rule = model_rule({"dense/kernel": PartitionSpec(None, "model"), "dense/bias": None})
        >>> rule("dense/kernel", (64, 256), {"model": 2}), rule("dense/bias", (256,), {"model": 2})
        (P(None, 'model'), None)
    """

    def rule(path: str, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> PartitionSpec | None:
        return specs.get(path)

    rule.__name__ = rule.__qualname__ = "the model's own shardings"
    rule.undecided_advice = (  # type: ignore[attr-defined]  (read by match_partition_specs)
        "The model declares no sharding for them: pass unannotated='replicate' or "
        "unannotated=[aotcheck.fsdp('data')] to the adapter, or overrides=[(regex, PartitionSpec(...))] "
        "for some (overrides decide before the model).")
    return rule


def leaf_paths(tree: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> list[tuple[str, Any]]:
    """``(path, leaf)`` for every leaf, with paths spelled as partition rules see them."""
    return [(path_to_str(p), leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Adapted:
    """A user's model, read by an adapter: parameters, how to call them, and their declared shardings.

    Attributes:
        init_fn: ``rng -> params`` (a pytree of arrays); only ever traced.
        bind: ``params -> model``: the callable the user's loss and methods receive.
        model_specs: PartitionSpec (mesh axes) per parameter path as the model
            declares it; None for a parameter it leaves unannotated.
        overrides: Rules that decide before the model's own shardings.
        fallback: Rules for what neither decides (e.g. ``(aotcheck.fsdp("data"),)``).
        trace_in_mesh: The configs' default for tracing under the target's abstract mesh
            (see :class:`aotcheck.programs.config.TrainerConfig`).
        trace_context: Entered around every call of the user's loss and methods, e.g.
            Flax's ``logical_axis_rules``, so the model's activation constraints
            (``nn.with_logical_constraint``) shard as they do in training.
    """

    init_fn: Callable[[jax.Array], Any]
    bind: Callable[[Any], Any]
    model_specs: Mapping[str, PartitionSpec | None]
    overrides: Rules = ()
    fallback: Rules = ()
    trace_in_mesh: bool = True
    trace_context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    @property
    def partition_rules(self) -> list[Any]:
        """Overrides, then the model's shardings, then the fallback."""
        return [*self.overrides, model_rule(self.model_specs), *self.fallback]

    @property
    def unannotated(self) -> list[str]:
        """Parameter paths the model declares no sharding for."""
        return [path for path, spec in self.model_specs.items() if spec is None]

    def trainer(
        self, *, batch_spec: BatchSpec, loss_fn: Callable[[Any, Mapping[str, jax.Array]], jax.Array], optimizer: Any,
        **fields: Any,
    ) -> TrainerConfig:
        """A TrainerConfig whose ``loss_fn(model, batch)`` gets the bound model.

        ``fields``: any other TrainerConfig field (``mesh``, ``batch_partition``,
        ``fit``, ``compiler_options``, ...).
        """
        return TrainerConfig(init_fn=self.init_fn, partition_rules=self.partition_rules,
                             loss_fn=self._call(loss_fn), optimizer=optimizer, batch_spec=batch_spec,
                             **{"trace_in_mesh": self.trace_in_mesh, **fields})

    def inference(
        self, *, methods: Mapping[str, Callable[[Any, Mapping[str, jax.Array]], Any]], input_batch_spec: BatchSpec,
        **fields: Any,
    ) -> InferenceConfig:
        """An InferenceConfig whose methods ``fn(model, batch)`` get the bound model."""
        return InferenceConfig(init_fn=self.init_fn, partition_rules=self.partition_rules,
                               methods={name: self._call(fn) for name, fn in methods.items()},
                               input_batch_spec=input_batch_spec,
                               **{"trace_in_mesh": self.trace_in_mesh, **fields})

    def _call(self, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """``(params, batch) -> fn(model, batch)``, inside the adapter's trace context."""
        bind, context = self.bind, self.trace_context

        def call(params: Any, batch: Any) -> Any:
            with context():
                return fn(bind(params), batch)

        return call


def as_rules(rules: Any, *, what: str) -> tuple[Any, ...]:
    """``rules`` as a tuple of partition rules: one rule alone is taken as a list of one.

    Example:
        >>> from aotcheck import fsdp
        >>> [r.__name__ for r in as_rules(fsdp("data"), what="rules")]
        ["fsdp('data')"]
        >>> as_rules([(".*", PartitionSpec())], what="overrides")
        (('.*', P()),)
        >>> as_rules([("w", "data")], what="overrides")
        Traceback (most recent call last):
        ...
        aotcheck.adapters.base.AdapterError: overrides: ('w', 'data') is not a rule: give (regex, PartitionSpec(...)) pairs or callables (path, shape, axis_sizes) -> PartitionSpec | None, e.g. aotcheck.fsdp('data')
    """
    if callable(rules) or _is_pair(rules):
        rules = [rules]
    out = tuple(rules)
    for rule in out:
        if not (callable(rule) or _is_pair(rule)):
            raise AdapterError(f"{what}: {rule!r} is not a rule: give (regex, PartitionSpec(...)) pairs or callables "
                               "(path, shape, axis_sizes) -> PartitionSpec | None, e.g. aotcheck.fsdp('data')")
    return out


def _is_pair(rule: Any) -> bool:
    return isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], str) and isinstance(rule[1], PartitionSpec)


def _quiet(rule: tuple[str, PartitionSpec]) -> Callable[..., PartitionSpec | None]:
    """A regex pair as a callable: a fallback that matches nothing is fine (the model said it all)."""
    pattern, spec = re.compile(rule[0]), rule[1]

    def decide(path: str, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> PartitionSpec | None:
        return spec if pattern.search(path) else None

    decide.__name__ = decide.__qualname__ = repr(rule)
    return decide


def fallback_rules(unannotated: str | Rules) -> Rules:
    """The rules for parameters neither the overrides nor the model decide.

    ``"error"`` (default: every such parameter is listed in a PartitionError),
    ``"replicate"``, or rules of your own (e.g. ``[aotcheck.fsdp("data")]``).

    Example:
        >>> fallback_rules("error"), [r.__name__ for r in fallback_rules("replicate")]
        ((), ['replicate'])
        >>> fallback_rules("shard")
        Traceback (most recent call last):
        ...
        aotcheck.adapters.base.AdapterError: unannotated='shard': say 'error' (list them), 'replicate', or give rules, e.g. [aotcheck.fsdp('data')]
    """
    if isinstance(unannotated, str):
        if unannotated == "error":
            return ()
        if unannotated == "replicate":
            return (replicate,)
        raise AdapterError(f"unannotated={unannotated!r}: say 'error' (list them), 'replicate', or give rules, "
                           "e.g. [aotcheck.fsdp('data')]")
    return tuple(rule if callable(rule) else _quiet(rule) for rule in as_rules(unannotated, what="unannotated"))


def as_abstract(example: Any) -> Any:
    """Arrays and ShapeDtypeStructs alike as ShapeDtypeStructs (an example input is never kept)."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), example)


def constants_like(tree: Any) -> Any:
    """Values shaped like a tree of ShapeDtypeStructs, made inside the trace (PRNG keys included).

    State that is not trained (RNG streams, counters, integer buffers, example inputs) enters
    the program this way: a compile needs its shapes, not its values.

    Example:
        >>> import jax.numpy as jnp
        >>> tree = {"n": jax.ShapeDtypeStruct((2,), jnp.int32), "key": jax.eval_shape(lambda: jax.random.key(0))}
        >>> out = jax.eval_shape(lambda: constants_like(tree))
        >>> out["n"].shape, jax.dtypes.issubdtype(out["key"].dtype, jax.dtypes.prng_key)
        ((2,), True)
    """
    return jax.tree_util.tree_map(_constant, tree)


def _constant(leaf: jax.ShapeDtypeStruct) -> jax.Array:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        impl = getattr(leaf.dtype, "_impl", None) or jax.random.key_impl(jax.random.key(0))
        return jax.random.split(jax.random.key(0, impl=impl), max(1, math.prod(leaf.shape))).reshape(leaf.shape)
    return jax.numpy.zeros(leaf.shape, leaf.dtype)


__all__: Sequence[str] = ("Adapted", "AdapterError", "as_abstract", "as_rules", "constants_like", "fallback_rules",
                          "leaf_paths", "model_rule", "require")
