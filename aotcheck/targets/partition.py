"""Partition rules: parameter paths to PartitionSpecs, checked against the mesh.

Rules are ``(regex, PartitionSpec)`` pairs; a leaf takes the spec of the first
rule whose regex ``re.search``-es its path (keys joined by ``/``, e.g.
``layers/attn/wq``). Every rule must match something and every array must be
matched, so a typo in a rule fails loudly instead of silently replicating.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from aotcheck.targets.partition import match_partition_specs
    >>> params = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)}
    >>> match_partition_specs(params, [("w$", P("data", None))], axis_sizes={"data": 4})
    {'w': P('data', None)}
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

Rules = Sequence[tuple[str, PartitionSpec]]


class PartitionError(ValueError):
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
                f"{where}: mesh axis {unknown[0]!r} is not in the mesh {dict(axis_sizes)}."
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
    """Maps every array leaf of ``tree`` to a PartitionSpec by the first matching rule.

    Scalars no rule matches are replicated. Raises PartitionError naming the
    path, shape and spec for anything that does not fit, and naming any rule
    that matched nothing.
    """
    compiled = [(re.compile(pattern), PartitionSpec(*spec)) for pattern, spec in rules]
    used = [False] * len(compiled)

    def assign(path: Sequence[Any], leaf: Any) -> PartitionSpec:
        name = path_to_str(path)
        shape = tuple(getattr(leaf, "shape", ()))
        for i, (regex, spec) in enumerate(compiled):
            if regex.search(name):
                used[i] = True
                check_spec(name, shape, spec, axis_sizes)
                return spec
        if not shape:
            return PartitionSpec()
        raise PartitionError(
            f"No partition rule matches {what} {name} (shape {shape}). Add a rule for it, "
            f"or a last catch-all rule ('.*', PartitionSpec()) to replicate the rest."
        )

    specs = jax.tree_util.tree_map_with_path(assign, tree)
    unused = [pattern for (pattern, _), hit in zip(rules, used) if not hit]
    if unused:
        raise PartitionError(
            f"Partition rule(s) {unused} match no {what}; "
            f"{what} paths look like: {_sample_paths(tree)}. Fix or remove the rule."
        )
    return specs


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
