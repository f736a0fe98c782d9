"""A knob (aotcheck.programs.knob): checked when a config is built, stepped per target where the mesh decides."""

import pytest
from hypothesis import given, strategies as st

from aotcheck.errors import ConfigError
from aotcheck.programs.knob import MAX_KNOB_SIZE, Knob, check_knobs, knob_problem
from aotcheck.targets.topology import Target


@given(st.integers(-5, MAX_KNOB_SIZE + 5), st.integers(-5, 64))
def test_a_knob_is_sound_exactly_when_its_size_and_step_are_sizes(size, step):
    sound = 1 <= size <= MAX_KNOB_SIZE and 1 <= step
    assert (knob_problem(Knob(size, abs, step)) is None) == sound


def test_a_bad_knob_is_refused_naming_it_and_the_form():
    with pytest.raises(ConfigError, match=r"knobs\['seq'\]: its rebuild 3 is not callable.*Give Knob\(size, rebuild, step\)"):
        check_knobs({"seq": Knob(8, 3)}, "knobs")
    with pytest.raises(ConfigError, match=r"knobs=\[1\]: give the knobs by name"):
        check_knobs([1], "knobs")


def test_a_step_the_mesh_decides_is_taken_on_the_target():
    knob = Knob(32, abs, step_on=lambda target: target.num_devices)
    assert knob.step == 1 and knob.on(Target.of("v5e-16", 2)).step == 32
    assert Knob(32, abs, 8).on(Target.of("v5e-16")).step == 8  # A fixed step is its own on every target.
