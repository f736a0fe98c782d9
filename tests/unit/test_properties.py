"""Hypothesis properties of the pure pieces: tolerances, comparison, golden files (case ids: pipeline/test_case.py)."""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from aotcheck.pipeline.case import Case
from aotcheck.gate.compare import (Change, Row, Tolerance, ToleranceError, compare, compare_metric,
                                   parse_tolerance_line, verdict)
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.pipeline.measurement import figure_names
from aotcheck.gate.golden import GoldenError, GoldenStore, golden_document, dumps, parse_document
from aotcheck.targets.topology import MAX_DEVICES, parse_topology, topology_names

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


names = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_."), min_size=1, max_size=12)
targets = st.sampled_from(topology_names() + ["cpu-8"]).flatmap(
    lambda name: st.tuples(st.just(name), st.integers(1, min(64, MAX_DEVICES // parse_topology(name).num_devices))))
cases = st.builds(lambda config, program, target: Case.of(config, program, *target), names, names, targets)


@given(cases, st.dictionaries(st.text(min_size=1, max_size=20), st.one_of(values, st.floats(0, 1e30))),
       st.dictionaries(st.text(max_size=10), st.text(max_size=10)))
def test_golden_round_trip(case, figures, options):
    with tempfile.TemporaryDirectory() as root:
        store = GoldenStore(root)
        toolchain = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
        assert store.write(case, figures, toolchain=toolchain, compiler_options=options) is GoldenAction.CREATED
        golden = store.read(case)
        assert golden.figures == pytest.approx(figures) and golden.compiler_options == options
        assert store.write(case, figures, toolchain=toolchain, compiler_options=options) is GoldenAction.UNCHANGED
        text = store.path(case).read_text()
        assert text == dumps(json.loads(text))  # Sorted keys, stable bytes.
        assert list(Path(root).rglob("*.tmp")) == []  # No temporary left behind.


def test_corrupt_documents_name_their_file():
    path = Path("golden/x/y@v4-8x1.json")
    for text in ("[]", "{", '{"figures": [], "toolchain": {}, "compiler_options": {}}'):
        with pytest.raises(GoldenError, match=str(path)):
            parse_document(text, path)
    doc = golden_document(Case.of("a", "b", "v4-8", 1), {"flops": 2.0**40}, toolchain={}, compiler_options={})
    assert doc["figures"]["flops"] == 2**40 and isinstance(doc["figures"]["flops"], int)


@given(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1", "-0.5"]),
       st.sampled_from(["peak_bytes", "flops", "compile_cpu_seconds"]))
def test_a_golden_figure_that_is_not_finite_or_is_negative_is_a_corrupt_golden(text, name):
    # json reads NaN, Infinity and 1e400 (inf) as floats: NaN compares false with everything, so it would
    # pass every comparison and gate nothing.
    document = '{"figures": {"%s": %s, "argument_bytes": 1}, "toolchain": {}, "compiler_options": {}}' % (name, text)
    with pytest.raises(GoldenError, match=f"figure '{name}' is .*figures are finite and never negative"):
        parse_document(document, Path("g.json"))


@given(name=st.sampled_from([n.replace("KNOB", "batch") for n in figure_names()]), golden=st.floats(1, 1e12),
       grow=st.booleans())
def test_every_figure_is_compared_as_its_row_of_the_table_says(name, golden, grow):
    """Comparison reads the figure table: each figure's default tolerance is its row's, and moving past
    it the way the row calls worse is a regression, the other way an improvement."""
    from aotcheck.figures.table import describe
    from aotcheck.gate.compare import DEFAULT_TOLERANCES, tolerance_for

    row = describe(name)
    tol = tolerance_for(name, DEFAULT_TOLERANCES)
    assert (tol.rel, tol.abs) == row.tolerance and row.glob != "*" or name.endswith("_xla")
    step = tol.allowed(golden) * 1.5 + 1
    now = golden + step if grow else max(golden - step, 0.0)
    if now == 0.0 and not grow and golden <= tol.allowed(golden):
        return  # Cannot drop past the tolerance without going negative.
    worse = grow == (row.worse == "more")
    assert compare_metric(name, golden, now, tol).change is (Change.REGRESSION if worse else Change.IMPROVEMENT)
