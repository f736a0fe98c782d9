"""aotcheck.pipeline.measure: which knob a case's fit search moves, and the cap it moves it under."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.errors import ConfigError
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measure import fit_knob, search_cap


def two_knobs(batch: int = 8, seq: int = 128, **fields) -> aotcheck.FunctionConfig:
    """A program with a batch and a sequence knob (nothing here compiles it)."""

    def make_program(mesh, target):
        x = jax.ShapeDtypeStruct((batch, seq), jnp.float32, sharding=NamedSharding(mesh, P()))
        return jax.jit(lambda x: x * 2), (x,)

    return aotcheck.FunctionConfig(make_program=make_program, program="double", knobs={
        "batch": aotcheck.Knob(batch, lambda b: two_knobs(b, seq, **fields)),
        "seq": aotcheck.Knob(seq, lambda s: two_knobs(batch, s, **fields))}, **fields)


CASE = Case.of("two", "double", "v5e-16")


def test_the_cap_holds_the_knob_the_config_checked_and_refuses_one_the_gate_asks_for_below_its_size():
    config = two_knobs(fit_upper=64)  # Checked when built against batch (8): fine.
    assert search_cap(config, CASE, "batch") == 64
    # The gate's --aot-fit=seq searches seq (128) under the same cap: it would stop at once and call
    # 128 the largest that fits. Refused, naming the config, the knob, its size and the fix.
    with pytest.raises(ConfigError, match=r"two: fit_upper=64 is below the configured seq \(128\) that the fit search "
                                          r"on two/double@v5e-16x1 moves.*at least 128 \(e\.g\. fit_upper=1024\)"):
        search_cap(config, CASE, "seq")
    assert search_cap(two_knobs(), CASE, "seq") is None  # No cap: the search's default.


def test_the_knob_searched_is_the_callers_then_the_configs_then_the_gates_where_offered():
    assert fit_knob(two_knobs(fit="seq"), CASE, fit="batch") == "batch"
    assert fit_knob(two_knobs(fit="seq"), CASE, fit_default="batch") == "seq"
    assert fit_knob(two_knobs(), CASE, fit_default="seq") == "seq"
    assert fit_knob(two_knobs(), CASE, fit_default="pages") is None  # Not offered here: no search.
    assert fit_knob(two_knobs(fit="seq", fit_targets=("v4-*",)), CASE) is None  # Searched elsewhere only.


@pytest.mark.parametrize("glob", ["v5e-16", "v5e-16x1", "v5e-*", "v5litepod-16", "*x1"])
def test_a_target_given_as_a_topology_means_its_slices(glob):
    """Issue 52, V53: targets=('v5e-1',) skipped every case on v5e-1 ("v5e-1x1 is not one")."""
    from aotcheck.pipeline.measure import unsupported_reason

    config = two_knobs(targets=(glob,))
    assert unsupported_reason(config, CASE) is None
    two_slices = unsupported_reason(config, Case.of("two", "double", "v5e-16", 2))
    if glob in ("v5e-16x1", "*x1"):  # One slice named.
        assert two_slices == f"two is deployed on {glob} only (its targets); v5e-16x2 is not one"
    else:  # A topology names each of its slices.
        assert two_slices is None
    assert fit_knob(two_knobs(fit="seq", fit_targets=(glob,)), CASE) == "seq"


@pytest.mark.parametrize("field", ["targets", "fit_targets"])
def test_a_target_glob_that_matches_no_target_is_a_config_error(field):
    with pytest.raises(ConfigError) as raised:
        two_knobs(**{field: ("v5e1",)})
    assert f"{field}=('v5e1',): 'v5e1' names no target" in str(raised.value)
    assert "did you mean 'v5e-1'?" in str(raised.value)
