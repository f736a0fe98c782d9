"""Text columns and their cells (aotcheck.render.tables).

FAKE: rows made by hand: what is tested is the layout and each figure's unit.
"""

import re

from hypothesis import given, strategies as st

from aotcheck.render.tables import clip, fmt_value, table

CELLS = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=10)


@given(st.lists(st.lists(CELLS, min_size=3, max_size=3), max_size=5))
def test_every_column_starts_where_its_header_does(rows):
    lines = table(["a", "bb", "ccc"], rows).splitlines()
    starts = [m.start() for m in re.finditer(r"-+", lines[1])]
    assert len(lines) == len(rows) + 2
    for row, line in zip(rows, lines[2:]):
        assert [line[s:].split()[0] for s in starts] == row


def test_a_figure_is_shown_in_its_unit_and_a_long_name_by_its_end():
    assert fmt_value("peak_bytes", 3 * 2**30) == "3.00 GiB" and fmt_value("compile_cpu_seconds", 1.5) == "1.50s"
    assert fmt_value("flops", None) == "-"
    assert clip("x" * 10 + "dot_general", 14) == "...dot_general" and clip("short", 14) == "short"
