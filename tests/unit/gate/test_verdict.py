"""aotcheck.gate.verdict: the verdict vocabulary, defined once (its names in reports, what fails,
how a summary sorts)."""

import pytest

from aotcheck.gate.verdict import Verdict

FAILING = {Verdict.CRASHED, Verdict.COMPILE_ERROR, Verdict.OUT_OF_MEMORY, Verdict.OVER_HBM, Verdict.ERROR,
           Verdict.CORRUPT_GOLDEN, Verdict.REGRESSION, Verdict.METRICS_CHANGED, Verdict.MISSING_GOLDEN}


@pytest.mark.parametrize("verdict", list(Verdict))
def test_each_verdict_reads_back_from_its_report_name_and_fails_as_the_gate_says(verdict):
    assert Verdict(verdict.value) is verdict and str(verdict) == verdict.value
    assert verdict.fails() == (verdict in FAILING)
    # Strict mode fails an improvement too, and changes nothing else.
    assert verdict.fails(strict=True) == (verdict in FAILING or verdict is Verdict.IMPROVEMENT)


def test_failures_sort_first_then_what_moved_then_the_rest():
    ranked = sorted(Verdict, key=Verdict.rank)
    first_passing = next(i for i, v in enumerate(ranked) if not v.fails())
    assert all(v.fails() for v in ranked[:first_passing]) and not any(v.fails() for v in ranked[first_passing:])
    assert ranked.index(Verdict.REGRESSION) < ranked.index(Verdict.MISSING_GOLDEN) < ranked.index(Verdict.PASS)
    assert ranked[-1] is Verdict.SKIPPED


def test_a_name_no_verdict_has_is_a_value_error():
    with pytest.raises(ValueError, match="'bogus' is not a valid Verdict"):
        Verdict("bogus")
