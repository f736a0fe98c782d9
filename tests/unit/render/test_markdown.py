"""The job summary and annotations (aotcheck.render.markdown), worded from a report's records.

FAKE: outcomes made by hand (no compile); tests/e2e/test_gate.py renders real shards' reports.
"""

from aotcheck.gate.compare import Change, Row, Tolerance
from aotcheck.gate.outcome import Accept, Outcome
from aotcheck.gate.report import Merged, Report
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.markdown import annotations, markdown

CASE = Case.of("llm", "step[tokens=16]", "v5e-16")
GREW = Outcome(CASE, Verdict.REGRESSION, failed=True, measured=Measurement(CASE, {"peak_bytes": 2**31}, {}, 1.0),
               changes=[Row("peak_bytes", 2**30, 2**31, Tolerance(0.01), Change.REGRESSION)],
               accept=Accept(CASE, ("--aot-golden-dir=ci/golden",)))


def test_a_failed_case_is_explained_with_its_accept_command_from_its_record():
    text = markdown(Merged(Report([GREW], golden_dir="ci/golden"), []))
    assert "## aotcheck: ❌ failed" in text
    assert "To accept the new figures: pytest --update-golden '--aot-case=llm/step[tokens=16]@v5e-16x1' " \
           "--aot-golden-dir=ci/golden" in text


def test_annotations_point_at_the_golden_and_escape_the_message():
    line, problem = annotations(Merged(Report([GREW], golden_dir="ci/golden"), ["shard 2 wrote no report"]))
    assert line.startswith("::error file=ci/golden/llm/step[tokens=16]@v5e-16x1.json,title=aotcheck ")
    assert "\n" not in line and "%0A" in line and "+100.0%25" in line
    assert problem == "::error title=aotcheck report::shard 2 wrote no report"


def test_the_counts_say_how_many_cases_the_cache_answered_without_lowering():
    fresh, other = CASE, Case.of("llm", "step[tokens=32]", "v5e-16")
    outcomes = [Outcome(c, Verdict.PASS, measured=Measurement(c, {"peak_bytes": 1}, {}, 0.0, cached=True, lowered=lowered))
                for c, lowered in ((fresh, True), (other, False))]
    text = markdown(Merged(Report(outcomes, golden_dir="golden"), []))
    assert "2 cases: 2 pass; 2 from the figures cache (1 of them not even lowered: their inputs unchanged)." in text
