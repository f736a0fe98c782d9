"""A server's matrix in words (aotcheck.render.serving): its buckets from their values, largest first, and its bill.

FAKE: outcomes made by hand (no compile); tests/e2e/test_server.py gates the reference server for real.
"""

from aotcheck.gate.bill import Bill
from aotcheck.gate.compare import Change, Row, Tolerance
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.serving import serving_lines


def bucket(program, peak=2**30):
    case = Case.of("llm", program, "v5e-8")
    return Outcome(case, Verdict.PASS, measured=Measurement(case, {"peak_bytes": peak, "compile_cpu_seconds": 1.0},
                                                            {}, 1.0))


def test_a_grown_bill_ends_with_the_command_that_accepts_it_and_an_unjudged_one_with_none():
    grown = Row("compile_cpu_seconds", 1.0, 10.0, Tolerance(0.1), Change.REGRESSION)
    report = Report([bucket("step[tokens=16]")], bills=[Bill("llm", "v5e-8x1", 1, 10.0, True, grown, Tolerance(0.1))])
    line = serving_lines(report, accept_args=["--aot-fit=pages"])[0]
    assert line.startswith("aotcheck: server llm on v5e-8x1: 1 buckets, start-up bill 10.00s of compile CPU")
    assert line.endswith("pytest --update-golden --aot-configs=llm --aot-topologies=v5e-8x1 --aot-fit=pages"), line
    unjudged = Report([bucket("step[tokens=16]")], bills=[Bill("llm", "v5e-8x1", 1, 1.0, False)])
    assert "pytest" not in serving_lines(unjudged)[0]
