"""A case's message in words (aotcheck.render.text).

FAKE: outcomes are made by hand here (no compile): what is tested is the wording of records.
"""

import dataclasses
from pathlib import Path

from aotcheck.gate.compare import Change, Row, Tolerance
from aotcheck.gate.golden import Golden
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.targets.presets import preset_options
from aotcheck.render.text import outcome_message

CASE = Case.of("lm", "train_step", "v4-8")


def regression(golden_options, now_options):
    measured = Measurement(CASE, {"peak_bytes": 2**30}, now_options, 3.0)
    golden = Golden({"peak_bytes": 2**29}, {}, golden_options, Path("g"))
    return Outcome(CASE, Verdict.REGRESSION, measured=measured, golden=golden,
                   changes=[Row("peak_bytes", 2**29, 2**30, Tolerance(0.01), Change.REGRESSION)])


def test_a_golden_made_with_presets_off_judged_with_them_on_says_so():
    """Hardening round 4: a 7-figure regression, the options mismatch not said."""
    presets = preset_options("v4-8")
    outcome = regression({}, presets)
    assert [k for k, before, now in outcome.options_changed] == sorted(presets)
    message = outcome_message(dataclasses.replace(outcome, golden_file="golden/lm/train_step@v4-8x1.json"))
    assert (f"Note: the golden was compiled with other compiler options than this run's ({len(presets)} differ: "
            f"{sorted(presets)[0]} not sent there, {presets[sorted(presets)[0]]} here") in message
    assert "(aot_default_options = none, or other aot_libtpu_init_args)" in message
    assert message.rstrip().endswith("To accept the new figures: pytest --update-golden --aot-case=lm/train_step@v4-8x1")


def test_the_same_options_say_nothing_of_them():
    same = regression({"xla_a": "1"}, {"xla_a": "1"})
    assert same.options_changed == []
    assert "other compiler options" not in outcome_message(same)
    changed = regression({"xla_a": "1"}, {"xla_a": "2"})
    assert changed.options_changed == [("xla_a", "1", "2")]
    assert "(1 differs: xla_a 1 there, 2 here)" in outcome_message(changed)


def test_a_regression_answered_by_another_runners_entry_names_the_store():
    """Hardening round 5, V12: a "regression FAILED" from a shared entry did not say where it came from."""
    outcome = regression({}, {})
    local = outcome_message(outcome)
    shared = outcome_message(dataclasses.replace(outcome, measured=dataclasses.replace(
        outcome.measured, cached=True, cached_from="s3://bucket/aot/ab/abab.json")))
    assert "shared cache" not in local
    assert ("Its figures came from the shared cache's entry s3://bucket/aot/ab/abab.json, which another runner wrote, "
            "not from a compile in this run (a run without the cache compiles it here).") in shared
    data = dataclasses.replace(outcome.measured, cached_from="s3://b/x.json").to_json()
    assert Measurement.from_json(data).cached_from == "s3://b/x.json" and "cached_from" not in outcome.measured.to_json()
