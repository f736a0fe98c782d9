"""aotcheck.gate.why: what grew between a golden's details and a case's (Hypothesis properties of the
matching by class and name), and which classes of the peak grew."""

from hypothesis import given, strategies as st

from aotcheck.figures.attribution import CLASSES, PEAK_FIGURE, PeakBuffer
from aotcheck.gate.why import class_growth, grown

buffers = st.lists(st.builds(lambda b, k, n: PeakBuffer(b, k, f"jit(step)/{n}", "f32[8]"),
                             st.integers(1, 2**40), st.sampled_from(CLASSES), st.sampled_from("abcdef")),
                   max_size=12, unique_by=lambda b: b.key)


@given(buffers, buffers, st.integers(1, 12))
def test_what_grew_is_new_or_larger_under_its_class_and_name_largest_growth_first(before, now, limit):
    found = grown(before, now, limit=limit)
    old = {b.key: b.bytes for b in before}
    expected = [b for b in now if b.bytes > old.get(b.key, 0)]
    assert len(found) == min(limit, len(expected))
    assert all(g.before == old.get(g.now.key) and g.added == g.now.bytes - (g.before or 0) > 0 for g in found)
    assert [g.added for g in found] == sorted((g.added for g in found), reverse=True)
    assert grown(now, now) == []  # Nothing grows against itself.


def test_a_buffer_that_moved_class_is_new_not_grown():
    before = [PeakBuffer(100, "batch", "kv", "f32[8]")]
    (moved,) = grown(before, [PeakBuffer(100, "kv_cache", "kv", "f32[8]")])
    assert moved.before is None and moved.added == 100


@given(st.dictionaries(st.sampled_from(CLASSES), st.integers(0, 2**40)),
       st.dictionaries(st.sampled_from(CLASSES), st.integers(0, 2**40)))
def test_a_class_grew_only_where_both_sides_have_it_and_now_is_larger(golden, now):
    growth = dict(class_growth({PEAK_FIGURE[k]: v for k, v in golden.items()},
                               {PEAK_FIGURE[k]: v for k, v in now.items()}))
    assert growth == {k: now[k] - golden[k] for k in CLASSES if k in golden and k in now and now[k] > golden[k]}


def test_why_a_case_moved_is_a_value_the_gate_finds_and_render_only_words():
    """Issue 55: render/text.py words a Why (gate/why.py), it does not compare details itself. A regressed
    peak names the class that grew and the new buffer; an improvement explains nothing."""
    from pathlib import Path

    from aotcheck.figures.program import Details
    from aotcheck.gate.compare import Change, Row, Tolerance
    from aotcheck.gate.golden import Golden
    from aotcheck.gate.outcome import Outcome
    from aotcheck.gate.verdict import Verdict
    from aotcheck.gate.why import why
    from aotcheck.pipeline.case import Case
    from aotcheck.pipeline.measurement import Measurement
    from aotcheck.render.text import why_lines

    case = Case.of("lm", "step", "v5e-8")
    big = PeakBuffer(1 << 30, "temp", "jit(step)/log_softmax", "f32[16,2048,8192]", "model.py:88")
    measured = Measurement(case, {"peak_bytes": 2 << 30, "peak_temp_bytes": 2 << 30}, {}, 1.0, details=Details([big]))
    golden = Golden({"peak_bytes": 1 << 30, "peak_temp_bytes": 1 << 30}, {}, {}, Path("g"), Details([]).to_json())
    row = Row("peak_bytes", 1 << 30, 2 << 30, Tolerance(0.01), Change.REGRESSION)
    found = why(Outcome(case, Verdict.REGRESSION, measured=measured, golden=golden, changes=[row]))
    assert found.peak_growth == [("temp", 1 << 30)] and [g.now for g in found.buffers] == [big]
    lines = why_lines(Outcome(case, Verdict.REGRESSION, measured=measured, golden=golden, changes=[row]))
    assert lines[0] == "The peak grew in: temp +1.00 GiB" and "model.py:88" in "\n".join(lines)
    better = Row("peak_bytes", 2 << 30, 1 << 30, Tolerance(0.01), Change.IMPROVEMENT)
    assert why(Outcome(case, Verdict.IMPROVEMENT, measured=measured, golden=golden, changes=[better])) == type(found)()
