"""aotcheck.gate.outcome: the record of one case's check, with one JSON form read back whole (its
measurement, golden, changes, error and accept command), and what it says about itself. FAKE:
outcomes made by hand (the decision table that makes them is gate/test_check.py's)."""

import json
from pathlib import Path

import pytest

from aotcheck.errors import OutOfMemory
from aotcheck.gate.compare import Change, Row, Tolerance
from aotcheck.gate.golden import Golden
from aotcheck.gate.outcome import Accept, Failure, Outcome, Reason, sort_outcomes
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement

CASE = Case.of("llm", "step[tokens=64]", "v5e-16", 2)
TOOLCHAIN = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "libtpu": "0.0.50.1"}


def regressed():
    measured = Measurement(CASE, {"peak_bytes": 130, "flops": 7}, {"xla_a": "true"}, 2.0, host_peak_bytes=10,
                           hlo_text="HloModule m")
    golden = Golden({"peak_bytes": 100, "flops": 7}, TOOLCHAIN, {}, Path(CASE.golden_relpath))
    return Outcome(CASE, Verdict.REGRESSION, failed=True, measured=measured, golden=golden,
                   changes=[Row("peak_bytes", 100.0, 130.0, Tolerance(0.01), Change.REGRESSION),
                            Row("flops", 7.0, 7.0, Tolerance(0.01), Change.OK)],
                   notes=["a note"], reason="peak_bytes grew", golden_file="golden/llm/x.json",
                   accept=Accept(CASE, ("-o", "aot_default_options=none")))


@pytest.mark.parametrize("outcome", [
    regressed(),
    Outcome(CASE, Verdict.OUT_OF_MEMORY, failed=True, error=Failure.of(Reason.OUT_OF_MEMORY, OutOfMemory(
        "RESOURCE_EXHAUSTED: Ran out of memory", details={"peak_buffers": []}))),
    Outcome(CASE, Verdict.ACCEPTED, golden_action=GoldenAction.CHANGED),
    Outcome.skip(CASE, "needs 64 devices"),
], ids=["regression", "out-of-memory", "accepted", "skipped"])
def test_an_outcome_reads_back_from_its_json_through_text(outcome):
    text = json.dumps(outcome.to_json())
    again = Outcome.from_json(json.loads(text))
    assert again.to_json() == outcome.to_json() and again.case.bucket == outcome.case.bucket
    assert "hlo_text" not in text  # The program's text is --explain's, never the report's.


def test_what_an_outcome_says_about_itself():
    outcome = regressed()
    assert [r.metric for r in outcome.moved()] == ["peak_bytes"] and outcome.golden_path == CASE.golden_relpath
    assert outcome.options_changed == [("xla_a", None, "true")]  # Sent now, not when the golden was made.
    assert outcome.toolchain_note is None  # The golden's toolchain is this process's.
    drift = Outcome(CASE, Verdict.PASS, changes=[Row("peak_kv_cache_bytes", None, 0.0, Tolerance(0.01), Change.NEW)])
    assert drift.drift_warning and not regressed().drift_warning


def test_failures_sort_first_then_by_verdict_then_by_id():
    a, b = Case.of("a", "p", "v4-8"), Case.of("b", "p", "v4-8")
    outcomes = [Outcome(a, Verdict.PASS), Outcome(b, Verdict.REGRESSION, failed=True),
                Outcome(a, Verdict.MISSING_GOLDEN, failed=True), Outcome(b, Verdict.PASS)]
    assert [(o.verdict.value, o.case.config) for o in sort_outcomes(outcomes)] == [
        ("regression", "b"), ("missing-golden", "a"), ("pass", "a"), ("pass", "b")]


def test_a_report_orders_buckets_by_their_sizes_as_values_not_their_ids_text():
    ids = ["llm/step[tokens=1024]@v5e-8x1", "llm/step[tokens=128]@v5e-8x1", "llm/step[tokens=16]@v5e-8x1"]
    ordered = sort_outcomes([Outcome(Case.parse(i), Verdict.PASS) for i in ids])
    assert [o.case.bucket["tokens"] for o in ordered] == [16, 128, 1024]
    assert sorted(ids) == ids  # Their text would have put 1024 first.
