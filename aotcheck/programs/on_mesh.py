"""Whether a lowered program is the target's: its arguments (or outputs) on the target's whole mesh.
JAX compiles a program given nothing placed for the host CPU, and one placed on part of the mesh for that
part, whatever target aotcheck meant: each is refused before it compiles, naming the fix."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax

_PARTITIONS = re.compile(r"mhlo\.num_partitions = (\d+)")
# An argument's sharding in the lowered program (Shardy's or GSPMD's): a function jitted with its own.
_OWN_SHARDINGS = re.compile(r"@main\([^)]*\{[^}]*(?:sdy|mhlo)\.sharding")


def off_the_mesh(program: str, way: str, args: Sequence[Any], mesh_devices: set[Any], target: str,
                 lowered: Any) -> str | None:
    """Why ``program``, lowered for ``target`` from ``args`` (made by ``way``: ``make_args`` or
    ``make_program``), is not the target's program, before anything compiles; None when it is. JAX
    compiles a program none of whose arguments (nor outputs) is on the target's mesh for the host CPU
    (its goldens would hold a CPU program), and one whose arguments sit on some of the mesh's devices for
    those alone. A function jitted with shardings of its own on the mesh (``make_program``) shows it in
    the lowered program's partitions, and passes.

    Example (a host CPU device; a program of no argument):
        >>> import jax.numpy as jnp
        >>> print(off_the_mesh("step", "make_args", (), set(jax.devices()[:1]), "cpu-1x1",
        ...                    jax.jit(lambda: jnp.ones(2)).lower()))  # doctest: +ELLIPSIS
        step for cpu-1x1: none of its arguments is an array on the target's mesh (it takes none), so JAX would ...
    """
    placed, elsewhere, used = False, [], set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tuple(args))[0]:
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            continue  # A Python scalar: a constant of the program, nowhere to place.
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and set(sharding.device_set) <= mesh_devices:
            placed = True
            used |= set(sharding.device_set)
        else:
            elsewhere.append((jax.tree_util.keystr(path), leaf, sharding))
    for leaf in jax.tree_util.tree_leaves(getattr(lowered, "out_info", ())):  # out_shardings place it too.
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and hasattr(sharding, "device_set") and set(sharding.device_set) <= mesh_devices:
            placed = True
            used |= set(sharding.device_set)
    text = lowered.as_text()
    found = _PARTITIONS.search(text[:2000])
    partitions = int(found[1]) if found else 1
    whole = len(mesh_devices) > 1 and partitions == len(mesh_devices)
    if placed and used < mesh_devices and not whole:
        return (
            f"{program} for {target}: its arguments are on {len(used)} of the target's "
            f"{len(mesh_devices)} devices, so JAX would compile a program of {partitions} partition(s), not one for "
            f"{target}. Place them on the mesh {way} is given (all {len(mesh_devices)} devices; "
            "PartitionSpec() replicates an argument over it), not on a mesh of some of its devices.")
    if placed or whole:
        return None
    if len(mesh_devices) == 1 and _OWN_SHARDINGS.search(text):
        return None  # One device: no partitions to count, but the function's own shardings place it.
    if not elsewhere:  # No array argument at all (none, or Python scalars): nothing says where it runs.
        return (
            f"{program} for {target}: none of its arguments is an array on the target's mesh (it "
            f"takes {'none' if not jax.tree_util.tree_leaves(tuple(args)) else 'Python scalars only'}), so JAX would "
            f"compile the program for the host CPU, not {target}. Give it an argument on the mesh {way} "
            "is given (a ShapeDtypeStruct with a NamedSharding), or jit it with out_shardings on that mesh.")
    where, leaf, sharding = elsewhere[0]
    what = ("a ShapeDtypeStruct without a sharding" if isinstance(leaf, jax.ShapeDtypeStruct) and sharding is None
            else f"a concrete {type(leaf).__name__} on {sorted(str(d) for d in sharding.device_set)[:2]}"
            if sharding is not None else f"a concrete {type(leaf).__name__} (host memory)")
    return (
        f"{program} for {target}: no argument {way} gave is on the target's mesh "
        f"({len(elsewhere)} of them; the first, args{where}, is {what}), so JAX would compile the program for the "
        f"host CPU, not {target}. Give each argument its place on the mesh {way} is given, e.g. "
        "jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(...))) (PartitionSpec() "
        "to replicate it), not a concrete array."
    )
