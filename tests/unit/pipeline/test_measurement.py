"""aotcheck.pipeline.measurement: one record with one JSON form, read back whole (a Hypothesis
property), its views what a cache entry and a golden keep, a fit's answer as its figure."""

import json

import pytest
from hypothesis import given, strategies as st

from aotcheck.figures.fit import Fit
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import CACHED_FIELDS, Measurement, figure_names

figures = st.dictionaries(st.sampled_from([n for n in figure_names() if "KNOB" not in n]),
                          st.one_of(st.integers(0, 2**60), st.floats(0, 1e30)), min_size=1)
records = st.builds(Measurement, st.sampled_from([Case.of("lm", "prefill", "v4-8"),
                                                  Case.of("llm", "step[tokens=64]", "v5e-16", 2)]),
                    figures, st.dictionaries(st.sampled_from(["xla_a", "xla_b"]), st.sampled_from(["true", "1"])),
                    st.floats(0, 1e4), cached=st.booleans(), host_peak_bytes=st.none() | st.integers(0, 2**40),
                    attribution_problem=st.none() | st.text(max_size=20),
                    settings=st.dictionaries(st.sampled_from(["batch", "remat"]), st.integers(1, 64) | st.text(max_size=8)),
                    program=st.none() | st.text("0123456789abcdef", min_size=16, max_size=16))


@given(records)
def test_a_record_reads_back_from_its_json_even_through_text(record):
    assert Measurement.from_json(record.to_json()) == record
    assert Measurement.from_json(json.loads(json.dumps(record.to_json()))) == record  # As the worker's pipe sends it.


@given(records)
def test_a_cache_entrys_view_plus_what_the_run_knows_is_the_record(record):
    view = record.view(*CACHED_FIELDS)
    assert list(view) == [f for f in CACHED_FIELDS if f != "program" or record.program is not None]
    again = Measurement.from_json(view, case=record.case, compiler_options=record.compiler_options,
                                  cached=record.cached, host_peak_bytes=record.host_peak_bytes,
                                  attribution_problem=record.attribution_problem, settings=record.settings)
    assert again == record


def test_a_view_missing_a_field_names_it():
    with pytest.raises(KeyError, match="compiler_options"):
        Measurement.from_json({"case": "lm/p@v4-8x1", "figures": {}, "compile_seconds": 1.0})


def test_a_fits_answer_is_a_figure_named_for_its_knob_and_the_search_is_in_the_details():
    record = Measurement(Case.of("lm", "train_step", "v5e-16"), {"peak_bytes": 10}, {}, 1.0)
    fit = Fit("seq", configured=2048, step=128, max_size=8192, peak_at_max=9, peak_at_configured=5, probes=4)
    found = record.with_fit(fit)
    assert found.figures == {"peak_bytes": 10, "fit_max_seq": 8192} and found.details.fit == fit
