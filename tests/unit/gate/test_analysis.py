"""aotcheck.gate.analysis: a run's analyses (bills with their boots, pools, the upgrade table) computed once,
from outcomes and the plan's servers, by a session and by a merge of its shards alike.

FAKE outcomes made by hand (no compile): pure logic over the records.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings, strategies as st

from aotcheck.figures.fit import Fit
from aotcheck.figures.program import Details
from aotcheck.gate.analysis import analyse
from aotcheck.gate.bill import split_groups
from aotcheck.gate.compare import Tolerance
from aotcheck.gate.golden import Golden, GoldenStore
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report, load_report, merge_reports, write_report
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.programs.serving import Server

GiB, MiB = 2**30, 2**20
TOLERANCE = [("compile_cpu_seconds", Tolerance(1.0, 1.0))]
SERVER = Server("llm", ("step", "sample"), "pages", 64)
TOOLCHAIN = {"jax": "0.0.2"}


def boot_figures(temp: int) -> dict[str, float]:
    return {"peak_params_bytes": 8 * GiB, "peak_kv_cache_bytes": 4 * GiB, "generated_code_bytes": 64 * MiB,
            "temp_bytes": temp, "argument_bytes": 12 * GiB, "output_bytes": 4 * GiB, "alias_bytes": 4 * GiB}


def bucket(program: str, now: float, before: float, temp: int = GiB, target: str = "v5e-1") -> Outcome:
    case = Case.of("llm", program, target)
    figures = {**boot_figures(temp), "compile_cpu_seconds": now}
    golden = Golden({**boot_figures(temp), "compile_cpu_seconds": before}, {"jax": "0.0.2"}, {}, Path("g"))
    return Outcome(case, Verdict.PASS, measured=Measurement(case, figures, {}, now), golden=golden)


def test_a_bill_and_its_boot_read_the_servers_facts():
    """The server's declared order decides which bucket tips a boot that does not fit (the first in load
    order whose run finds no room), and its configured pages size the pool's bytes per page."""
    outcomes = [bucket("sample[tokens=16,seqs=8]", 1.0, 1.0, temp=5 * GiB), bucket("step[tokens=16]", 1.0, 1.0, temp=5 * GiB)]
    (bill,) = analyse(outcomes, {"llm": SERVER}, toolchain=TOOLCHAIN, tolerances=TOLERANCE).bills
    assert bill.boot.tips == "step[tokens=16]" and bill.boot.bytes_per_page == 4 * GiB / 64
    (by_name,) = analyse(outcomes, {}, toolchain=TOOLCHAIN, tolerances=TOLERANCE).bills  # No server: by name.
    assert by_name.boot.tips == "sample[tokens=16,seqs=8]" and by_name.boot.bytes_per_page is None
    assert bill.row.golden == 2.0 and not bill.failed


def test_an_update_accepts_a_bill_and_marks_its_buckets_changed(tmp_path):
    """Each bucket kept its golden (near its last), but the three sum beyond the bill's tolerance: the update
    writes them, and none of their outcomes is unchanged any more."""
    store = GoldenStore(tmp_path)
    outcomes = []
    for tokens in (16, 32, 64):
        case = Case.of("llm", f"step[tokens={tokens}]", "v5e-1")
        store.write(case, {"compile_cpu_seconds": 0.1}, toolchain={}, compiler_options={})
        outcomes.append(Outcome(case, Verdict.ACCEPTED, golden_action=GoldenAction.UNCHANGED,
                                measured=Measurement(case, {"compile_cpu_seconds": 2.0}, {}, 2.0)))
    found = analyse(outcomes, {"llm": SERVER}, toolchain=TOOLCHAIN, tolerances=TOLERANCE, accept_into=store)
    assert [b.accepted for b in found.bills] == [True]
    assert {o.golden_action for o in found.outcomes} == {GoldenAction.CHANGED}
    assert store.read(outcomes[0].case).figures["compile_cpu_seconds"] == 2.0
    within = analyse(outcomes, {"llm": SERVER}, toolchain=TOOLCHAIN, tolerances=TOLERANCE, accept_into=store)
    assert {o.golden_action for o in within.outcomes} == {GoldenAction.UNCHANGED}  # Now within: nothing written.


def searched(topology: str, size: int) -> Outcome:
    case = Case.of("canary", "train_step", topology)
    fit = Fit("batch", 32, 4, size, None, None, probes=4)
    return Outcome(case, Verdict.PASS, measured=Measurement(case, {}, {}, 1.0, details=Details(fit=fit)))


def test_pools_and_the_upgrade_are_the_analysis_s_and_a_merge_derives_them_again(tmp_path):
    outcomes = [searched("v5p-8", 96), searched("v4-8", 20), bucket("step[tokens=16]", 1.0, 1.0)]
    found = analyse(outcomes, {"llm": SERVER}, toolchain={"jax": "0.0.3"})
    assert [(p, pools.max_size) for p, pools in found.pools] == [("canary/train_step", 20)]
    assert [c.id for c in found.upgrade.cases] == ["llm/step[tokens=16]@v5e-1x1"] and found.upgrade.direction == "upgrade"
    write_report(tmp_path / "r.json", Report(found.outcomes, bills=found.bills, pools=found.pools,
                                             upgrade=found.upgrade, servers={"llm": SERVER}, toolchain={"jax": "0.0.3"}))
    assert "pools" not in json.loads((tmp_path / "r.json").read_text())  # Derived, not written,
    merged = merge_reports([tmp_path / "r.json"]).report
    assert merged.pools == found.pools and merged.upgrade == found.upgrade  # and the merge derives them alike.
    assert merged.servers == {"llm": SERVER} and merged.bills == found.bills


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["step[tokens=16]", "step[tokens=32]", "sample[tokens=16,seqs=8]",
                                           "sample[tokens=32,seqs=8]"]), st.floats(0.1, 20.0), st.floats(0.1, 20.0),
                          st.integers(1, 4), st.booleans()),
                min_size=1, max_size=4, unique_by=lambda t: t[0]))
def test_a_merge_of_shards_judges_as_the_whole_run_does(buckets):
    """However a server's buckets fall over two shards, the merge's bills (seconds, judgement, boot) are the
    whole run's: both come from the one analysis, the merge with the servers the shards recorded."""
    outcomes = [bucket(program, now, before, temp=temp * GiB // 2) for program, now, before, temp, _ in buckets]
    first = [o for o, (*_, in_first) in zip(outcomes, buckets) if in_first]
    second = [o for o in outcomes if o not in first]
    whole = analyse(outcomes, {"llm": SERVER}, toolchain=TOOLCHAIN, tolerances=TOLERANCE).bills
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for k, part in enumerate((first, second), start=1):
            found = analyse(part, {"llm": SERVER}, toolchain=TOOLCHAIN, tolerances=TOLERANCE,
                            partial=split_groups([o.case for o in outcomes], [o.case for o in part]))
            paths.append(Path(tmp) / f"{k}.json")
            write_report(paths[-1], Report(part, shard=(k, 2), bills=found.bills, servers={"llm": SERVER},
                                           toolchain=TOOLCHAIN))
            assert load_report(paths[-1]).servers == ({"llm": SERVER} if part else {})  # From its bills.
        merged = merge_reports(paths, expect_shards=2).report.bills
    assert [(b.seconds, b.row, b.boot, b.failed) for b in merged] == [(b.seconds, b.row, b.boot, b.failed) for b in whole]
