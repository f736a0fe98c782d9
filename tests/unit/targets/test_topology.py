"""The topology table, checked row by row against its names and against libtpu."""


import pytest
from hypothesis import given, strategies as st

from aotcheck import _runtime
from aotcheck.targets.devices import get_devices_for_topology
from aotcheck.targets.platform import TPU
from aotcheck.targets.tpu import CHIPS
from aotcheck.targets.topology import (
    TopologyError,
    topologies,
    check_num_slices,
    Target,
    split_target,
    parse_topology,
    MAX_DEVICES,
    MAX_SLICES,
    topology_names,
)


@pytest.mark.parametrize("topo", topologies(TPU), ids=lambda t: t.name)
def test_every_row_agrees_with_its_name(topo):
    family, n = topo.name.rsplit("-", 1)
    chip = CHIPS[family]
    assert topo.num_chips * chip.name_units_per_chip == int(n), "N counts cores (v4/v5p/7x) or chips"
    assert topo.num_devices == topo.num_chips * chip.devices_per_chip
    assert len(topo.shape) == (2 if family in ("v5e", "v6e") else 3)
    assert topo.libtpu_name.startswith(chip.libtpu_prefix + ":")
    assert chip.hbm_limit_bytes < chip.hbm_bytes


# Across families and sizes: the smallest, a 1024-device one (v5p-2048), the
# largest v4, v5p-3072 (a table once had 4x12x16 = 768 chips for it), 7x.
@pytest.mark.parametrize(
    "name,slices",
    [("v4-8", 1), ("v4-4096", 1), ("v5p-8", 2), ("v5p-2048", 1), ("v5p-3072", 1), ("v5e-1", 1),
     ("v5e-16", 2), ("v5litepod-256", 1), ("v6e-8", 1), ("v6e-256", 2), ("7x-2", 1), ("tpu7x-128", 1),
     # Tori (wraparound passed to libtpu), one of them multi-slice.
     ("v4-128", 1), ("v5p-128", 2), ("v5e-128", 1), ("7x-384", 1)],
)
def test_libtpu_device_count_matches_table(name, slices):
    topo = parse_topology(name)
    devices, per_slice = get_devices_for_topology(name, slices)
    assert per_slice == topo.num_devices
    assert len(devices) == topo.num_devices * slices
    if slices > 1:
        assert sorted({d.slice_index for d in devices}) == list(range(slices))


# The sizes where the torus changes, as MaxText's own table (maxtext/utils/accelerator_to_spec_map.py,
# 0.2.5; xpk's is the same) gives them: (libtpu name, chip config, chips per host, devices, wrap). The
# MaxText leg compares every row of that table with ours (tests/e2e/test_maxtext.py).
MAXTEXT_ROWS = {
    "v4-64": ("v4:2x4x4", "megacore", (2, 2, 1), 32, (False, False, False)),
    "v4-128": ("v4:4x4x4", "megacore", (2, 2, 1), 64, (True, True, True)),
    "v4-384": ("v4:4x4x12", "megacore", (2, 2, 1), 192, (True, True, True)),
    "v5p-64": ("v5:2x4x4", "megacore", (2, 2, 1), 32, (False, False, False)),
    "v5p-128": ("v5:4x4x4", "megacore", (2, 2, 1), 64, (True, True, True)),
    "v5p-640": ("v5:4x4x20", "megacore", (2, 2, 1), 320, (True, True, True)),
    "v5p-1024": ("v5:8x8x8", "megacore", (2, 2, 1), 512, (True, True, True)),
    "v5e-1": ("v5e:1x1", "default", (1, 1, 1), 1, (False, False, False)),
    "v5e-64": ("v5e:8x8", "default", (2, 2, 1), 64, (False, False, False)),
    "v5e-128": ("v5e:8x16", "default", (2, 2, 1), 128, (False, True, False)),
    "v5e-256": ("v5e:16x16", "default", (2, 2, 1), 256, (True, True, False)),
    "v6e-128": ("v6e:8x16", "default", (2, 2, 1), 128, (False, True, False)),
    "v6e-256": ("v6e:16x16", "default", (2, 2, 1), 256, (True, True, False)),
    "7x-64": ("tpu7x:2x4x4", "default", (2, 2, 1), 64, (False, False, False)),
    "7x-128": ("tpu7x:4x4x4", "default", (2, 2, 1), 128, (True, True, True)),
}


@pytest.mark.parametrize("name", sorted(MAXTEXT_ROWS))
def test_the_device_description_is_the_real_slices(name):
    topo = parse_topology(name)
    assert (topo.libtpu_name, topo.hardware.chip_config, topo.chips_per_host_bounds, topo.num_devices,
            topo.wraparound) == MAXTEXT_ROWS[name]


@pytest.mark.parametrize("topo", topologies(TPU), ids=lambda t: t.name)
def test_a_torus_is_made_of_whole_cubes_or_whole_pod_rows(topo):
    """Every row: an axis wraps only where it spans whole 4-chip cube edges (3-D families, all axes
    together) or a whole 16-chip pod row (v5e/v6e), and slices under 64 chips never wrap."""
    if len(topo.shape) == 3:
        assert set(topo.wraparound) == {all(n % 4 == 0 for n in topo.shape)}
    else:
        assert topo.wraparound == (*(n == 16 for n in topo.shape), False)
    assert not any(topo.wraparound) or topo.num_chips >= 64


def test_libtpu_is_asked_for_the_torus_of_every_slice(monkeypatch):
    """What aotcheck asks libtpu for (a recording stand-in for jax's topology call: a unit test of the
    request only; the MaxText leg shows the compiled program equal to MaxText's on v5p-128)."""
    from jax.experimental import topologies

    asked = []

    class Desc:
        devices = [object()] * 128

    monkeypatch.setattr(topologies, "get_topology_desc", lambda **kw: asked.append(kw) or Desc())
    get_devices_for_topology("v5p-128", 2)
    assert asked == [dict(platform="tpu", topology_name="v5:4x4x4", chip_config_name="megacore",
                          chips_per_host_bounds=(2, 2, 1), num_slices=2, wrap=(True, True, True))]


def test_aliases_and_case():
    assert parse_topology("v5litepod-16").name == "v5e-16"
    assert parse_topology("TPU7x-8").name == "7x-8"
    assert parse_topology("v5-8").name == "v5p-8"
    assert parse_topology("cpu-4").num_devices == 4


@given(st.sampled_from(topology_names()))
def test_names_round_trip(name):
    assert parse_topology(name).name == name
    assert parse_topology(parse_topology(name)) == parse_topology(name)


@given(st.text(max_size=20))
def test_any_text_parses_or_raises_topology_error(text):
    try:
        parse_topology(text)
    except TopologyError as e:
        assert "topology" in str(e).lower()


def test_unknown_size_lists_closest_names():
    with pytest.raises(TopologyError, match=r"Closest valid names: v5e-8, v5e-16, v5e-32"):
        parse_topology("v5e-17")


def test_unknown_family_lists_closest_names_and_families():
    with pytest.raises(TopologyError) as e:
        parse_topology("v5f-16")
    assert "v5e-16" in str(e.value) and "cpu-N" in str(e.value)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_bad_slice_counts(bad):
    with pytest.raises(TopologyError, match="slices"):
        check_num_slices(bad)
    with pytest.raises(TopologyError, match="slices"):
        get_devices_for_topology("v4-8", bad)


def test_missing_libtpu_says_what_to_install(monkeypatch):
    # Pure logic: pretend the package is absent (it is installed in this environment).
    monkeypatch.setattr(_runtime, "libtpu_available", lambda: False)
    with pytest.raises(TopologyError, match=r"libtpu.*cpu-8"):
        get_devices_for_topology("v5e-16")
    assert len(get_devices_for_topology("cpu-2").devices) == 2  # cpu-N still works


@given(st.sampled_from(topology_names()), st.integers(1, MAX_SLICES))
def test_targets_round_trip_through_their_names_within_the_bounds(name, slices):
    topo, parsed = split_target(f"{name}x{slices}")
    assert (topo.name, parsed) == (name, slices)
    assert split_target(name) == (parse_topology(name), None)
    with pytest.raises(TopologyError, match="names no slice count"):
        Target.parse(name)
    if topo.num_devices * slices > MAX_DEVICES:  # Beyond the bound: refused before libtpu builds it.
        with pytest.raises(TopologyError, match=f"has {topo.num_devices * slices} devices, more than aotcheck"):
            Target.parse(f"{name}x{slices}")
        return
    target = Target.parse(f"{name}x{slices}")
    assert Target.parse(target.name) == target and target.num_devices == topo.num_devices * slices


@given(st.sampled_from(topology_names()), st.integers(MAX_SLICES + 1, 10**30))
def test_slice_counts_over_the_bound_are_refused(name, slices):
    with pytest.raises(TopologyError, match=f"{slices} slices is more than aotcheck compiles for"):
        Target.parse(f"{name}x{slices}")


# Per-chip datasheet figures (design notes; an independent source for the table's per-device figures).
PER_CHIP = {"v4": (275e12, 32 * 2**30), "v5e": (197e12, 16 * 2**30), "v5p": (459e12, 96 * 2**30),
            "v6e": (918e12, 32 * 2**30), "7x": (2307e12, 192 * 2**30)}


@pytest.mark.parametrize("family", sorted(PER_CHIP))
def test_per_device_figures_are_the_chip_figures_over_its_devices(family):
    # A 7x device is half a chip; megacore v4/v5p devices are whole chips.
    chip = CHIPS[family]
    flops, hbm = PER_CHIP[family]
    assert chip.peak_bf16_flops * chip.devices_per_chip == pytest.approx(flops)
    assert chip.hbm_bytes * chip.devices_per_chip == hbm
    assert chip.hbm_limit_bytes < chip.hbm_bytes  # XLA's limit sits below the capacity.


def test_traced_as_answers_jaxs_device_questions_as_the_target_and_restores_them():
    import jax

    from aotcheck.targets.devices import get_devices_for_topology, traced_as

    host = jax.devices()
    for name, backend, kind in (("v5e-8", "tpu", "TPU v5 lite"), ("h100-8", "gpu", "H100")):
        topology = parse_topology(name)
        devices = get_devices_for_topology(topology).devices
        with pytest.raises(KeyError):  # An error inside leaves jax as it was.
            with traced_as(devices, topology):
                assert (jax.default_backend(), jax.device_count(), jax.local_device_count()) == (backend, 8, 8)
                assert kind in jax.devices()[0].device_kind and jax.local_devices() == devices
                assert jax.devices("cpu") == host  # A backend named explicitly is still this host's.
                raise KeyError("inside")
        assert jax.default_backend() == "cpu" and jax.devices() == host
    with traced_as(host, parse_topology("cpu-2")):  # A host target: nothing to answer differently.
        assert jax.devices() == host
