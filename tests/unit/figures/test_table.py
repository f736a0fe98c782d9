"""aotcheck.figures.table: each figure's row (its tolerance, which way is worse) is what comparison
reads, for every figure a golden can hold (a Hypothesis property)."""

from hypothesis import given, strategies as st

from aotcheck.figures.table import describe
from aotcheck.gate.compare import DEFAULT_TOLERANCES, Change, compare_metric, tolerance_for
from aotcheck.pipeline.measurement import figure_names


@given(name=st.sampled_from([n.replace("KNOB", "batch") for n in figure_names()]), golden=st.floats(1, 1e12),
       grow=st.booleans())
def test_every_figure_is_compared_as_its_row_of_the_table_says(name, golden, grow):
    """Comparison reads the figure table: each figure's default tolerance is its row's, and moving past
    it the way the row calls worse is a regression, the other way an improvement."""
    row = describe(name)
    tol = tolerance_for(name, DEFAULT_TOLERANCES)
    assert (tol.rel, tol.abs) == row.tolerance and row.glob != "*" or name.endswith("_xla")
    step = tol.allowed(golden) * 1.5 + 1
    now = golden + step if grow else max(golden - step, 0.0)
    if now == 0.0 and not grow and golden <= tol.allowed(golden):
        return  # Cannot drop past the tolerance without going negative.
    worse = grow == (row.worse == "more")
    assert compare_metric(name, golden, now, tol).change is (Change.REGRESSION if worse else Change.IMPROVEMENT)
