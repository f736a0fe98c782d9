"""Mesh shapes, overrides, and multi-slice layout over real libtpu devices."""

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from aotcheck.targets.mesh import MeshError, MeshSpec, build_mesh, resolve_mesh_shape, split_ici_dcn
from aotcheck.targets.devices import get_devices_for_topology


@given(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4), st.data())
def test_minus_one_is_inferred(sizes, data):
    devices = math.prod(sizes)
    i = data.draw(st.integers(0, len(sizes) - 1))
    shape = list(sizes)
    shape[i] = -1
    slices = data.draw(st.sampled_from([d for d in (1, 2, 4) if sizes[0] % d == 0]))
    resolved = resolve_mesh_shape(shape, num_devices=devices, num_slices=slices)
    assert resolved == tuple(sizes)
    ici, dcn = split_ici_dcn(resolved, slices)
    assert tuple(a * b for a, b in zip(ici, dcn)) == resolved
    assert math.prod(dcn) == slices


@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.integers(1, 100))
def test_shapes_that_do_not_fit_show_both(shape, devices):
    if math.prod(shape) == devices:
        return
    with pytest.raises(MeshError) as e:
        resolve_mesh_shape(shape, num_devices=devices)
    assert str(tuple(shape)) in str(e.value) and str(devices) in str(e.value)


def test_bad_shapes():
    with pytest.raises(MeshError, match="at most one -1"):
        resolve_mesh_shape((-1, -1), num_devices=4)
    with pytest.raises(MeshError, match="not divisible by 3"):
        resolve_mesh_shape((-1, 3), num_devices=16)
    with pytest.raises(MeshError, match="divisible by the 2 slices"):
        resolve_mesh_shape((1, -1), num_devices=16, num_slices=2)
    with pytest.raises(MeshError, match="2 axes"):
        MeshSpec(("data",), (2, 2))


def test_default_puts_every_device_on_the_first_axis():
    assert MeshSpec(("data", "model")).shape_for("v4-8") == (-1, 1)


def test_overrides_by_topology_glob():
    spec = MeshSpec(("data", "model"), (-1, 1), overrides={"v5e-*": (-1, 4), "v6e-8": (-1, 8)})
    assert spec.shape_for("v5e-16") == (-1, 4)
    assert spec.shape_for("v5litepod-16") == (-1, 4)
    assert spec.shape_for("v6e-8") == (-1, 8)
    assert spec.shape_for("v6e-16") == (-1, 1)


def test_multi_slice_lays_slices_on_the_outer_data_axis():
    devices, _ = get_devices_for_topology("v5e-16", 2)
    mesh = build_mesh(MeshSpec(("data", "model"), (-1, 2)), "v5e-16", devices, num_slices=2)
    assert mesh.devices.shape == (16, 2)
    slice_of = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    assert (slice_of[:8] == 0).all() and (slice_of[8:] == 1).all()
    assert len({d.id for d in mesh.devices.flat}) == 32


def test_physical_order_via_mesh_utils():
    # (8, 2) on a 4x4 slice needs a split physical axis; still every device once.
    devices, _ = get_devices_for_topology("v5e-16")
    mesh = build_mesh(MeshSpec(("data", "model"), (8, 2)), "v5e-16", devices)
    assert mesh.devices.shape == (8, 2)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


def test_cpu_mesh():
    devices, _ = get_devices_for_topology("cpu-4")
    mesh = build_mesh(MeshSpec(("data", "model"), (-1, 2)), "cpu-4", devices)
    assert mesh.devices.shape == (2, 2)


def test_mesh_that_does_not_fit_the_topology():
    devices, _ = get_devices_for_topology("v4-8")
    with pytest.raises(MeshError, match=r"\(3, -1\).*4"):
        build_mesh(MeshSpec(("data", "model"), (3, -1)), "v4-8", devices)


@given(st.sampled_from([1, 2, 4, 8, 16]), st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3),
       st.sampled_from([1, 2]))
def test_an_adapted_mesh_always_fits_and_a_shape_that_fits_is_never_changed(devices, fixed, slices):
    from aotcheck.targets.mesh import adapt_mesh_shape

    shape = (-1, *fixed)
    adapted = adapt_mesh_shape(shape, num_devices=devices * slices, num_slices=slices)
    resolved = resolve_mesh_shape(adapted, num_devices=devices * slices, num_slices=slices)  # Never raises.
    assert all(a <= f and f % a == 0 for a, f in zip(adapted[1:], fixed))
    if devices % math.prod(fixed) == 0:
        assert adapted == shape and resolved == resolve_mesh_shape(shape, num_devices=devices * slices, num_slices=slices)


def test_a_reference_configs_mesh_adapts_to_one_chip_and_a_users_does_not():
    from aotcheck.models import lm

    assert MeshSpec(("data", "model"), (-1, 2), adapt=True).adapt and lm.TINY.mesh.adapt and lm.ONE_B.mesh.adapt
    with pytest.raises(MeshError, match=r"Mesh shape \(-1, 2\) does not fit 1 devices"):
        resolve_mesh_shape(MeshSpec(("data", "model"), (-1, 2)).shape_for("v5e-1"), num_devices=1)
