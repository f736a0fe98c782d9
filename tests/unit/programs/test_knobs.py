"""aotcheck.programs.knobs: which knobs a config offers a fit search, which one a search moves by
default, and a knob's step on a target (a batch divides over the devices it is sharded on)."""

import dataclasses

import pytest
from toy_programs import per_target, rows_program

import aotcheck
from aotcheck.models import lm
from aotcheck.programs.knobs import KnobError, check_knob, default_knob, knob_of, knobs_offered
from aotcheck.targets.topology import Target


def test_a_functions_knob_is_the_default_search_and_is_offered():
    config = rows_program(1024)
    assert knobs_offered(config) == ["rows"] and default_knob(config) == "rows"
    with pytest.raises(KnobError, match=r"offers no knob 'batch'; it offers: rows \(name one with --knob"):
        check_knob(config, "batch")
    bare = aotcheck.FunctionConfig(make_program=per_target)
    assert knobs_offered(bare) == [] and default_knob(bare) == "batch"
    with pytest.raises(KnobError, match=r"offers none \(a function's batch is its own.*: give it a "
                                        r"Knob in knobs="):
        check_knob(bare, "batch")
    two = dataclasses.replace(config, knobs={**config.knobs, "cols": aotcheck.Knob(8, rows_program)})
    assert default_knob(two) == "batch"  # Two knobs, none named: check_knob then lists them.


@pytest.mark.parametrize("target", ["v5e-16x1", "v5e-16x2", "v4-8x1", "h100-8x2", "cpu-2x1"])
def test_a_models_batch_steps_by_the_devices_its_data_axis_spans(target):
    knob = knob_of(lm.trainer_config(lm.TINY), "batch", Target.parse(target))
    data = Target.parse(target).num_devices // lm.TINY.mesh.shape[1]  # TINY's mesh: (data -1, model 2).
    assert (knob.size, knob.step) == (lm.TINY.batch, data)
    rebuilt = knob.rebuild(2 * knob.size)  # The config at another size, as the one compiled kind.
    assert knob_of(rebuilt, "batch", Target.parse(target)).size == 2 * knob.size


def test_a_knob_a_config_does_not_offer_is_named_with_the_ones_it_does():
    with pytest.raises(KnobError, match=r"offers no knob 'seq'; it offers: batch"):
        knob_of(lm.trainer_config(lm.TINY), "seq", Target.of("v4-8"))
    assert knobs_offered(lm.trainer_config(lm.TINY)) == ["batch"]
