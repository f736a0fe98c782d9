"""The peak against capacity, drawn (aotcheck.render.chart): the SVG and the text bars.

FAKE: outcomes made by hand (no compile): what is tested is the drawing of their figures.
"""

import xml.etree.ElementTree as ET

from hypothesis import given, strategies as st

from aotcheck.gate.outcome import Outcome
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.chart import svg_chart, text_bars
from aotcheck.units import fmt_share

SVG = "{http://www.w3.org/2000/svg}"


def measured(name, peak, topology="v5e-16"):
    case = Case.of(name, "prefill", topology)
    return Outcome(case, Verdict.PASS, measured=Measurement(case, {"peak_bytes": peak}, {}, 1.0))


@given(st.integers(0, 40 * 2**30))
def test_a_bar_fills_its_share_of_the_chip_and_says_it(peak):
    line = text_bars([measured("lm", peak)], width=16)
    share = peak / (16 * 2**30)
    filled = line.split()[1]
    assert abs(filled.count("█") - min(16, share * 16)) <= 1 and fmt_share(share) in line


def test_the_svg_has_a_bar_per_case_and_escapes_names():
    root = ET.fromstring(svg_chart([measured("a<b", 2**30), measured("c", 2**31)]))
    assert len(root.findall(f"{SVG}rect")) == 2
    assert "a<b/prefill@v5e-16x1" in [t.text for t in root.findall(f"{SVG}text")]
