"""Partition rules: parameter paths to PartitionSpecs, checked against the mesh.

Rules are ``(regex, PartitionSpec)`` pairs or callables; a leaf takes the spec of
the first rule that decides it. A pair decides the leaves whose path (keys joined by
``/``, e.g. ``layers/attn/wq``) its regex ``re.search``-es; a callable
``(path, shape, axis_sizes) -> PartitionSpec | None`` decides where it returns a
spec (None: the next rule decides). Every regex must match something and every
array must be decided, so a typo in a rule fails loudly instead of silently
replicating. :func:`fsdp` and :func:`replicate` are ready-made callables for models
that carry no sharding of their own.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from aotcheck.targets.partition import match_partition_specs
    >>> params = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)}
    >>> match_partition_specs(params, [("w$", P("data", None))], axis_sizes={"data": 4})
    {'w': P('data', None)}
    >>> match_partition_specs(params, [fsdp("data")], axis_sizes={"data": 4, "model": 2})
    {'w': P('data', None)}
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from aotcheck.errors import ConfigError

RuleFn = Callable[[str, tuple[int, ...], Mapping[str, int]], "PartitionSpec | None"]
Rules = Sequence["tuple[str, PartitionSpec] | RuleFn"]


class PartitionError(ConfigError):
    """A partition rule or spec that does not fit the arrays or the mesh."""


def path_to_str(path: Sequence[Any]) -> str:
    """Joins a pytree key path into ``a/b/0/c``."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def check_spec(
    path: str, shape: Sequence[int], spec: PartitionSpec, axis_sizes: Mapping[str, int]
) -> None:
    """Checks that ``spec`` names mesh axes and divides ``shape``; raises PartitionError."""
    where = f"{path} (shape {tuple(shape)}, spec {spec})"
    if len(spec) > len(shape):
        raise PartitionError(f"{where}: the spec has {len(spec)} entries for a {len(shape)}-d array.")
    for dim, entry in zip(shape, spec):
        axes = _axes(entry)
        unknown = [a for a in axes if a not in axis_sizes]
        if unknown:
            raise PartitionError(
                f"{where}: mesh axis {unknown[0]!r} is not in the mesh {dict(axis_sizes)}. If it is a "
                "logical axis name (Flax's with_partitioning), map it to a mesh axis with logical_axis_rules."
            )
        ways = math.prod(axis_sizes[a] for a in axes)
        if dim % ways:
            raise PartitionError(
                f"{where}: dimension {dim} is not divisible by the {ways} devices of mesh "
                f"axes {axes} (mesh {dict(axis_sizes)}). Change the rule or the mesh shape."
            )


def match_partition_specs(
    tree: Any, rules: Rules, *, axis_sizes: Mapping[str, int], what: str = "parameter"
) -> Any:
    """Maps every array leaf of ``tree`` to a PartitionSpec by the first rule that decides it.

    Scalars no rule decides are replicated. Raises PartitionError naming the
    path, shape and spec for anything that does not fit, every array no rule
    decides, and any regex that matched nothing.
    """
    compiled = [rule if callable(rule) else (re.compile(rule[0]), PartitionSpec(*rule[1])) for rule in rules]
    used = [callable(rule) for rule in compiled]  # A callable is not expected to decide something.
    undecided: list[str] = []

    def assign(path: Sequence[Any], leaf: Any) -> PartitionSpec:
        name = path_to_str(path)
        shape = tuple(getattr(leaf, "shape", ()))
        for i, rule in enumerate(compiled):
            if callable(rule):
                spec = rule(name, shape, axis_sizes)
            else:
                spec = rule[1] if rule[0].search(name) else None
            if spec is not None:
                used[i] = True
                check_spec(name, shape, spec, axis_sizes)
                return spec
        if shape:
            undecided.append(f"{name} (shape {shape})")
        return PartitionSpec()

    specs = jax.tree_util.tree_map_with_path(assign, tree)
    if undecided:
        listed = "\n  ".join(undecided[:20]) + (f"\n  ... ({len(undecided)} in all)" if len(undecided) > 20 else "")
        # A rule may know better advice (an adapter's "the model's own shardings" does).
        advice = next((r.undecided_advice for r in rules if getattr(r, "undecided_advice", None)), None)
        raise PartitionError(
            f"No partition rule decides {len(undecided)} {what}(s):\n  {listed}\n" + (advice or
            "Add rules for them, or a last rule that replicates the rest (aotcheck.replicate, or "
            "('.*', PartitionSpec())), or one that shards them (aotcheck.fsdp('data')).")
        )
    unused = [rule[0] for rule, hit in zip(rules, used) if not hit and not callable(rule)]
    if unused:
        raise PartitionError(
            f"Partition rule(s) {unused} match no {what}; "
            f"{what} paths look like: {_sample_paths(tree)}. Fix or remove the rule."
        )
    return specs


def fsdp(axis: str | tuple[str, ...] = "data", *, min_bytes: int = 0, itemsize: int = 4) -> RuleFn:
    """A rule that shards each array's largest dimension the mesh ``axis`` divides (FSDP, ZeRO-3 style).

    Arrays no dimension of which the axis divides are replicated, and so are those under
    ``min_bytes`` (at ``itemsize`` bytes an element), where sharding saves less than it costs
    in collectives. An ``axis`` the mesh lacks (or of size 1) replicates everything.

    Example:
        >>> rule = fsdp("data")
        >>> rule("mlp/wi", (512, 2048), {"data": 8, "model": 2}), rule("bias", (3,), {"data": 8})
        (P(None, 'data'), P())
        >>> fsdp(("data", "model"))("w", (16, 6), {"data": 4, "model": 2})
        P(('data', 'model'), None)
    """
    axes = axis if isinstance(axis, tuple) else (axis,)

    def rule(path: str, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> PartitionSpec:
        if not shape or any(a not in axis_sizes for a in axes):
            return PartitionSpec()
        ways = math.prod(axis_sizes[a] for a in axes)
        if ways == 1 or math.prod(shape) * itemsize < min_bytes:
            return PartitionSpec()
        divisible = [d for d in range(len(shape)) if shape[d] % ways == 0]
        if not divisible:
            return PartitionSpec()
        best = max(divisible, key=lambda d: (shape[d], -d))  # The largest; the first of equals.
        return PartitionSpec(*[(axis if d == best else None) for d in range(len(shape))])

    rule.__name__ = rule.__qualname__ = f"fsdp({axis!r})"
    return rule


def replicate(path: str, shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> PartitionSpec:
    """A rule that replicates whatever reaches it: put it last to say "the rest need no sharding".

    Example:
        >>> replicate("norm/scale", (2048,), {"data": 4})
        P()
    """
    return PartitionSpec()


def _sample_paths(tree: Any, limit: int = 6) -> str:
    paths = [path_to_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    more = f", ... ({len(paths)} in all)" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def named_shardings(specs: Any, mesh: jax.sharding.Mesh) -> Any:
    """PartitionSpec tree -> NamedSharding tree on ``mesh``."""
    return jax.tree_util.tree_map(
        lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """Attaches shardings to a tree of ShapeDtypeStructs."""
    return jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        abstract,
        shardings,
    )
