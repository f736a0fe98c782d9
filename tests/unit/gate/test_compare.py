"""aotcheck.gate.compare, as Hypothesis properties: tolerances (parsed and applied both ways),
each metric compared once, the verdict the worst change."""

import pytest
from hypothesis import given, strategies as st

from aotcheck.gate.compare import (Change, Row, Tolerance, ToleranceError, compare, compare_metric,
                                   parse_tolerance_line, verdict)
from aotcheck.gate.verdict import Verdict

values = st.integers(0, 2**50)
tolerances = st.builds(Tolerance, rel=st.floats(0, 1), abs=st.integers(0, 2**20))


@given(values, values, tolerances)
def test_direction_growth_regresses_drop_improves(golden, now, tol):
    row = compare_metric("peak_bytes", golden, now, tol)
    allowed = tol.allowed(golden)
    if now - golden > allowed:
        assert row.change is Change.REGRESSION
    elif golden - now > allowed:
        assert row.change is Change.IMPROVEMENT
    else:
        assert row.change is Change.OK
    # Swapping golden and now swaps the direction.
    flipped = compare_metric("peak_bytes", now, golden, tol).change
    if row.change is Change.REGRESSION and tol.rel == 0:
        assert flipped is Change.IMPROVEMENT


@given(values, st.integers(0, 2**20))
def test_absolute_floor_absorbs_small_changes(golden, floor):
    tol = Tolerance(rel=0.0, abs=floor)
    assert compare_metric("x", golden, golden + floor, tol).change is Change.OK
    assert compare_metric("x", golden, golden + floor + 1, tol).change is Change.REGRESSION


@given(st.dictionaries(st.sampled_from(["a_bytes", "flops", "b_bytes"]), values),
       st.dictionaries(st.sampled_from(["a_bytes", "flops", "c"]), values))
def test_every_metric_is_compared_once(golden, now):
    rows = compare(golden, now)
    assert [r.metric for r in rows] == sorted(set(golden) | set(now))
    assert {r.metric for r in rows if r.change is Change.NEW} == set(now) - set(golden)
    assert {r.metric for r in rows if r.change is Change.GONE} == set(golden) - set(now)
    assert verdict(compare(now, now)) is Verdict.PASS


@given(st.lists(st.sampled_from(list(Change)), max_size=6))
def test_the_verdict_is_the_worst_change(changes):
    rows = [Row(f"m{i}", 1, 1, Tolerance(), c) for i, c in enumerate(changes)]
    expected = (Verdict.REGRESSION if Change.REGRESSION in changes else
                Verdict.IMPROVEMENT if Change.IMPROVEMENT in changes else Verdict.PASS)
    assert verdict(rows) is expected
    assert [Row.from_json(r.to_json()) for r in rows] == rows


@given(st.floats(0, 500, allow_nan=False).map(lambda x: round(x, 3)), st.integers(0, 10**6),
       st.sampled_from(["", "B", "KiB", "MiB", "GiB", "K", "M", "G"]))
def test_tolerance_lines_parse(rel, absolute, unit):
    glob, tol = parse_tolerance_line(f"peak_* = {rel}% + {absolute}{unit}")
    assert glob == "peak_*"
    assert tol.rel == pytest.approx(rel / 100)
    factor = {"": 1, "B": 1, "KiB": 1024, "MiB": 2**20, "GiB": 2**30, "K": 1e3, "M": 1e6, "G": 1e9}[unit]
    assert tol.abs == pytest.approx(absolute * factor)


@pytest.mark.parametrize("line", ["peak_bytes", "peak_bytes = ", "= 1%", "x = 1% + 3 parsecs", "x = lots"])
def test_bad_tolerance_lines(line):
    with pytest.raises(ToleranceError):
        parse_tolerance_line(line)


@pytest.mark.parametrize("space, use", [("vmem", "vmem_scoped_bytes"), ("smem", "smem_bytes")])
def test_a_memory_spaces_limit_is_judged_as_headroom_not_as_a_cost(space, use):
    """Hardening round 5, V66: raising vmem_limit_bytes was a regression, halving it an improvement."""
    limit, MiB = f"{space}_limit_bytes", 2**20
    golden = {use: 10 * MiB, limit: 16 * MiB}
    judged = lambda now: {r.metric: r.change.value for r in compare(golden, now, parse_tolerances([]))}  # noqa: E731
    from aotcheck.gate.compare import parse_tolerances

    assert judged({use: 10 * MiB, limit: 32 * MiB}) == {f"{space}_headroom_bytes": "improvement", use: "ok"}
    assert judged({use: 10 * MiB, limit: 12 * MiB}) == {f"{space}_headroom_bytes": "regression", use: "ok"}
    assert judged({use: 10 * MiB, limit: 16 * MiB}) == {f"{space}_headroom_bytes": "ok", use: "ok"}
    # A golden without the pair (made before the kernel had a limit): the limit is new, as itself.
    assert {r.metric: r.change.value for r in compare({use: 10 * MiB}, {use: 10 * MiB, limit: 16 * MiB},
                                                      parse_tolerances([]))} == {limit: "new", use: "ok"}
