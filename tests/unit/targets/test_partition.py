"""Partition rules and the registry: pure logic over abstract shapes."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from aotcheck.programs.config import FunctionConfig
from hypothesis import given
from hypothesis import strategies as st

from aotcheck.targets.partition import PartitionError, check_spec, fsdp, match_partition_specs, replicate
from aotcheck.programs.registry import Registry, RegistryError

PARAMS = {
    "layers": {"wq": jax.ShapeDtypeStruct((2, 64, 32), jnp.float32)},
    "embed": jax.ShapeDtypeStruct((100, 64), jnp.float32),
    "scale": jax.ShapeDtypeStruct((), jnp.float32),
}
AXES = {"data": 4, "model": 2}


def test_first_matching_rule_wins_and_scalars_replicate():
    specs = match_partition_specs(
        PARAMS, [(r"wq$", P(None, "data", "model")), (r"embed", P(None, "data")), (r".*", P())], axis_sizes=AXES
    )
    assert specs == {"layers": {"wq": P(None, "data", "model")}, "embed": P(None, "data"), "scale": P()}


def test_unmatched_parameter_names_path_and_shape():
    with pytest.raises(PartitionError, match=r"(?s)embed \(shape \(100, 64\)\).*replicates the rest"):
        match_partition_specs(PARAMS, [(r"wq$", P())], axis_sizes=AXES)


def test_every_undecided_parameter_is_listed():
    with pytest.raises(PartitionError) as e:
        match_partition_specs(PARAMS, [lambda path, shape, axes: None], axis_sizes=AXES)
    assert "decides 2 parameter(s)" in str(e.value)
    assert "layers/wq (shape (2, 64, 32))" in str(e.value) and "embed (shape (100, 64))" in str(e.value)


def test_a_callable_rule_defers_with_none_and_regexes_override_it():
    specs = match_partition_specs(PARAMS, [(r"embed", P("model", None)), fsdp("data"), replicate], axis_sizes=AXES)
    assert specs == {"layers": {"wq": P(None, "data", None)}, "embed": P("model", None), "scale": P()}
    seen = []
    match_partition_specs(PARAMS, [lambda path, shape, axes: seen.append((path, shape, dict(axes))), replicate],
                          axis_sizes=AXES)
    assert ("embed", (100, 64), AXES) in seen


def test_a_callable_spec_is_checked_against_the_mesh():
    with pytest.raises(PartitionError, match=r"embed .*dimension 100 is not divisible by the 8 devices"):
        match_partition_specs(PARAMS, [lambda path, shape, axes: P(("data", "model"), None), replicate],
                              axis_sizes=AXES)


@given(shape=st.lists(st.integers(1, 4096), min_size=0, max_size=4), ways=st.sampled_from([1, 2, 3, 4, 8, 16]))
def test_fsdp_shards_the_largest_divisible_dimension_or_replicates(shape, ways):
    shape = tuple(shape)
    spec = fsdp("data")(("w"), shape, {"data": ways, "model": 2})
    check_spec("w", shape, spec, {"data": ways, "model": 2})  # Always valid on the mesh.
    divisible = [d for d in shape if d % ways == 0]
    if ways == 1 or not divisible:
        assert spec == P()
    else:
        (dim,) = [i for i, entry in enumerate(spec) if entry == "data"]
        assert shape[dim] == max(divisible) and shape.index(max(divisible)) == dim


def test_rule_matching_nothing_is_named():
    with pytest.raises(PartitionError, match=r"'wk\$'.*layers/wq"):
        match_partition_specs(PARAMS, [(r"wk$", P()), (r".*", P())], axis_sizes=AXES)


def test_spec_that_does_not_divide_names_path_shape_and_spec():
    with pytest.raises(PartitionError) as e:
        match_partition_specs(PARAMS, [(r"embed", P(("data", "model"), None)), (r".*", P())], axis_sizes=AXES)
    msg = str(e.value)
    assert "embed" in msg and "(100, 64)" in msg and "P(('data', 'model'), None)" in msg and "8 devices" in msg


def test_unknown_axis_and_too_long_spec():
    with pytest.raises(PartitionError, match="'fsdp' is not in the mesh"):
        match_partition_specs(PARAMS, [(r"embed", P("fsdp")), (r".*", P())], axis_sizes=AXES)
    with pytest.raises(PartitionError, match="3 entries for a 2-d array"):
        match_partition_specs(PARAMS, [(r"embed", P(None, None, None)), (r".*", P())], axis_sizes=AXES)


def _fn_config():
    return FunctionConfig(fn=lambda x: x, make_args=lambda mesh: ())


def test_registry_register_list_and_duplicates():
    registry = Registry()

    @registry.register("b")
    def build_b():
        return _fn_config()

    registry.register("a", _fn_config())
    assert registry.names() == ["a", "b"]
    assert build_b().program == "step"  # The decorator hands the builder back.
    assert [e.name for e in registry.select(["b*"])] == ["b"]
    with pytest.raises(RegistryError, match="already registered"):
        registry.register("a", _fn_config())
    with pytest.raises(RegistryError, match="No config named 'c'.*a, b"):
        registry.get("c")
    with pytest.raises(RegistryError, match="without '/'"):
        registry.register("x/y", _fn_config())


def test_builder_failure_names_the_config():
    registry = Registry()

    @registry.register("broken")
    def broken():
        raise RuntimeError("boom")

    with pytest.raises(RegistryError, match="'broken' failed: RuntimeError: boom"):
        registry.get("broken").programs()


def test_program_defined_twice_and_wrong_type():
    registry = Registry()
    registry.register("twice", lambda: [_fn_config(), _fn_config()])
    with pytest.raises(RegistryError, match="program 'step' twice"):
        registry.get("twice").programs()
    registry.register("wrong", lambda: 42)
    with pytest.raises(RegistryError, match="built a int"):
        registry.get("wrong").programs()
