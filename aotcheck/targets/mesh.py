"""Meshes: axis names and shapes, per-topology overrides, multi-slice layout.

A :class:`MeshSpec` is what a config declares; :func:`build_mesh` turns it into
a :class:`jax.sharding.Mesh` over a topology's devices. Device order follows the
physical topology through :mod:`jax.experimental.mesh_utils`; with several
slices, the slices lie along the outermost (data) axis, so only that axis
crosses the data-center network.

Example:
    >>> from aotcheck.targets.mesh import MeshSpec, resolve_mesh_shape
    >>> spec = MeshSpec(("data", "model"), (-1, 4), overrides={"v6e-*": (-1, 8)})
    >>> spec.shape_for("v6e-16")
    (-1, 8)
    >>> resolve_mesh_shape((-1, 4), num_devices=32, num_slices=2)
    (8, 4)
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aotcheck.errors import ConfigError
from aotcheck.targets.platform import TPU
from aotcheck.targets.topology import Topology, parse_topology


class MeshError(ConfigError):
    """A mesh shape that does not fit the devices it is asked to cover."""


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Mesh axis names and shape, with shapes per topology.

    Attributes:
        axis_names: Names of the mesh axes, outermost first. The first is the
            data axis that slices are laid along.
        shape: Size of each axis; one may be -1 (inferred). None puts every device
            on the first axis.
        overrides: Shapes by topology glob, e.g. ``{"v5e-*": (-1, 4)}``; the first
            matching pattern wins.
        adapt: Where the shape's fixed sizes do not fit a slice's devices, shrink each (innermost
            first) to the largest divisor of the devices left, so one chip takes ``(-1, 2)`` as
            ``(1, 1)``; a shape that fits is never changed. Off: such a shape is an error, as
            MaxText's fixed ``ici_*_parallelism`` is.
    """

    axis_names: tuple[str, ...] = ("data",)
    shape: tuple[int, ...] | None = None
    overrides: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    adapt: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "axis_names", tuple(self.axis_names))
        if len(set(self.axis_names)) != len(self.axis_names) or not self.axis_names:
            raise MeshError(f"Mesh axis names must be distinct and non-empty: {self.axis_names}")
        for shape in ([self.shape] if self.shape is not None else []) + list(self.overrides.values()):
            if len(shape) != len(self.axis_names):
                raise MeshError(
                    f"Mesh shape {tuple(shape)} has {len(shape)} axes but the axis names "
                    f"{self.axis_names} have {len(self.axis_names)}."
                )

    def shape_for(self, topology: str | Topology) -> tuple[int, ...]:
        """The (unresolved) shape for a topology: an override, or the default."""
        name = parse_topology(topology).name
        for pattern, shape in self.overrides.items():
            if fnmatch.fnmatchcase(name, pattern):
                return tuple(shape)
        if self.shape is not None:
            return tuple(self.shape)
        return (-1,) + (1,) * (len(self.axis_names) - 1)


def adapt_mesh_shape(shape: Sequence[int], *, num_devices: int, num_slices: int = 1) -> tuple[int, ...]:
    """``shape`` with its fixed sizes shrunk, innermost first, to what a slice's devices divide into,
    where they do not fit them (:attr:`MeshSpec.adapt`); unchanged where they do.

    Example:
        >>> adapt_mesh_shape((-1, 2), num_devices=1), adapt_mesh_shape((-1, 8), num_devices=4)
        ((-1, 1), (-1, 4))
        >>> adapt_mesh_shape((-1, 2), num_devices=16), adapt_mesh_shape((2, 4), num_devices=2)
        ((-1, 2), (1, 2))
    """
    shape = tuple(int(s) for s in shape)
    per_slice = max(1, num_devices // max(1, num_slices))
    fixed = math.prod(s for s in shape if s > 0)
    if per_slice % fixed == 0 or any(s == 0 or s < -1 for s in shape):
        return shape
    left, out = per_slice, list(shape)
    for i in reversed(range(len(shape))):
        if shape[i] > 0:
            out[i] = math.gcd(shape[i], left)
            left //= out[i]
    if -1 not in shape:  # No axis to take the rest: the outermost does, as data parallelism would.
        out[0] *= left
    return tuple(out)


def resolve_mesh_shape(shape: Sequence[int], *, num_devices: int, num_slices: int = 1) -> tuple[int, ...]:
    """Infers a -1 and checks the shape covers ``num_devices`` (all slices together).

    Raises:
        MeshError: The shape does not fit; the message shows both.
    """
    shape = tuple(int(s) for s in shape)
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1 or any(s == 0 or s < -1 for s in shape):
        raise MeshError(f"Mesh shape {shape} may hold positive sizes and at most one -1.")
    known = math.prod(s for s in shape if s != -1)
    if unknown:
        if num_devices % known:
            raise MeshError(
                f"Mesh shape {shape} does not fit {num_devices} devices: "
                f"{num_devices} is not divisible by {known}."
            )
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) != num_devices:
        raise MeshError(
            f"Mesh shape {shape} covers {math.prod(shape)} devices but there are {num_devices}."
        )
    if shape[0] % num_slices:
        raise MeshError(
            f"Mesh shape {shape}: the first (data) axis, {shape[0]}, must be divisible by the "
            f"{num_slices} slices laid along it."
        )
    return shape


def split_ici_dcn(shape: Sequence[int], num_slices: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Splits a resolved global shape into per-slice (ICI) and across-slice (DCN) shapes."""
    ici = (shape[0] // num_slices,) + tuple(shape[1:])
    dcn = (num_slices,) + (1,) * (len(shape) - 1)
    return ici, dcn


def build_mesh(
    spec: MeshSpec, topology: str | Topology, devices: Sequence[Any], *, num_slices: int = 1
) -> "jax.sharding.Mesh":  # noqa: F821
    """Builds the mesh a config asks for over ``devices`` (all slices).

    Args:
        spec: The config's mesh.
        topology: The topology the devices belong to (selects overrides).
        devices: From :func:`aotcheck.targets.devices.get_devices_for_topology`.
        num_slices: How many slices ``devices`` span.
    """
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh

    topo = parse_topology(topology)
    wanted = spec.shape_for(topo)
    if spec.adapt:
        wanted = adapt_mesh_shape(wanted, num_devices=len(devices), num_slices=num_slices)
    shape = resolve_mesh_shape(wanted, num_devices=len(devices), num_slices=num_slices)
    ici, dcn = split_ici_dcn(shape, num_slices)
    if topo.platform is not TPU:
        # Host devices have no physical layout to follow, nor do a host's GPUs (NVLink joins each to
        # each). GPU devices come slice by slice (host by host), so a plain reshape lays the slices
        # along the outermost axis: what create_hybrid_device_mesh does with (ici, dcn) on TPUs.
        return Mesh(np.asarray(devices).reshape(shape), spec.axis_names)

    def create(allow_split: bool) -> np.ndarray:
        if num_slices > 1:
            return mesh_utils.create_hybrid_device_mesh(
                ici, dcn, devices=devices, allow_split_physical_axes=allow_split
            )
        return mesh_utils.create_device_mesh(ici, devices=devices, allow_split_physical_axes=allow_split)

    try:
        array = create(allow_split=False)
    except (NotImplementedError, ValueError):
        # The logical axes do not map onto whole physical axes (e.g. (8, 2) on a 4x4
        # slice): let mesh_utils split physical axes rather than fall back to a reshape.
        array = create(allow_split=True)
    return Mesh(array, spec.axis_names)
