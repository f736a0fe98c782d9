"""XLA's dumps read (aotcheck.figures.dump): the buffer assignment and the values live at the HBM peak.

FAKE: dump texts written here in the forms libtpu 0.0.42.1 and 0.0.50.1 write (the real dumps are read
end to end in tests/unit/figures/test_attribution.py); what is tested is the sweep that finds the peak.
"""

import pytest
from hypothesis import given, strategies as st

from aotcheck.figures.dump import AttributionError, dump_file, off_chip_colors, parse_assignment, peak_live

ASSIGNMENT = """allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:
 value: <1 p0 @0> (size=64,offset=0): f32[16]{0}
allocation 1: size 4096, page 2, maybe-live-out:
 value: <2 a @0> (size=1024,offset=0): f32[256]{0}
 value: <3 b @0> (size=1024,offset=1024): f32[256]{0}
allocation 2: size 4096, color 1:
 value: <4 c @0> (size=4096,offset=0): f32[1024]{0}
"""


def ranges(**spans):
    return "BufferLiveRange:\n" + "".join(f"  {name}:{a}-{b}\n" for name, (a, b) in spans.items())


def test_both_libtpus_assignment_forms_are_read():
    allocations, values = parse_assignment(ASSIGNMENT)
    assert [(a.kind, a.parameter, a.color) for a in allocations.values()] == [
        ("parameter", 0, 0), ("output", None, 0), ("temp", None, 1)]
    assert values["b"] == (1, 1024, "f32[256]")


def test_the_peak_is_where_most_bytes_live_together_arguments_and_other_memories_left_out():
    allocations, values = parse_assignment(ASSIGNMENT)
    live = peak_live(ranges(p0=(0, 9), a=(0, 4), b=(3, 6), c=(0, 9)), allocations, values, off_chip={1})
    assert sorted(v for v, *_ in live) == ["a", "b"]  # c is in an off-chip memory, p0 an argument.
    assert off_chip_colors("Memory Space: smem (color=1)\nMemory Space: hbm (color=0)") == {1}


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=6))
def test_the_sweep_finds_the_largest_sum_of_overlapping_ranges(spans):
    """Against a brute force over every time step: equal sized values, so the peak is the most live at once."""
    spans = [(min(a, b), max(a, b)) for a, b in spans]
    text = "".join(f"allocation {i}: size 4, maybe-live-out:\n value: <{i} v{i} @0> (size=4,offset=0): f32[1]{{0}}\n"
                   for i in range(len(spans)))
    allocations, values = parse_assignment(text)
    live = peak_live(ranges(**{f"v{i}": s for i, s in enumerate(spans)}), allocations, values, off_chip=set())
    brute = max(sum(a <= t <= b for a, b in spans) for t in range(52))
    assert len(live) == brute


def test_a_dump_without_live_ranges_or_files_is_an_error_naming_it(tmp_path):
    with pytest.raises(AttributionError, match="no 'BufferLiveRange:' section"):
        peak_live("nothing", {}, {}, off_chip=set())
    with pytest.raises(AttributionError, match=r"XLA wrote no \*after_optimizations-live-range.txt"):
        dump_file(tmp_path, "live-range")
    assert dump_file(tmp_path, "memory-usage-report", required=False) is None
