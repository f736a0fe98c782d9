"""A server's start-up bill (aotcheck.gate.bill) and its table (aotcheck.render.serving): the sum of its
buckets' compile CPU seconds per target, gated like one case's, and the buckets worded largest first.

Outcomes are made by hand here (no compile): pure logic over the records. The gate's real runs of
the reference server are in tests/e2e/test_serving.py.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, strategies as st

from aotcheck.errors import OutOfMemorySpace, Overflow
from aotcheck.gate.bill import Bill, accept_bills, split_groups, startup_bills
from aotcheck.gate.compare import Change, Tolerance
from aotcheck.gate.golden import Golden, GoldenStore
from aotcheck.gate.outcome import Failure, Outcome, Reason
from aotcheck.gate.report import Report, load_report, merge_reports, write_report
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.markdown import markdown
from aotcheck.gate.report import Merged
from aotcheck.render.serving import memory_spaces, serving_lines

TOLERANCE = [("compile_cpu_seconds", Tolerance(1.0, 1.0))]  # 100% + 1 s, measured from the smaller.


def bucket(program: str, now: float | None, before: float | None, target: str = "v5e-8") -> Outcome:
    case = Case.of("llm", program, target)
    measured = Measurement(case, {"compile_cpu_seconds": now, "peak_bytes": 2**30}, {}, now) if now is not None else None
    golden = Golden({"compile_cpu_seconds": before}, {}, {}, Path("g")) if before is not None else None
    return Outcome(case, Verdict.PASS, measured=measured, golden=golden)


def test_many_small_slowdowns_within_each_buckets_tolerance_fail_the_bill():
    """Each bucket 0.1 s -> 0.6 s is within 100% + 1 s; the nine together, 0.9 s -> 5.4 s, are not."""
    outcomes = [bucket(f"step[tokens={16 * 2**i}]", 0.6, 0.1) for i in range(9)]
    bill, = startup_bills(outcomes, TOLERANCE)
    assert (round(bill.seconds, 9), round(bill.row.golden, 9), bill.row.change, bill.failed) == \
        (5.4, 0.9, Change.REGRESSION, True)
    assert not Report(outcomes, bills=[bill]).passed
    assert Report(outcomes, bills=startup_bills(outcomes, TOLERANCE, judge=False)).passed  # --update-golden accepts.


@given(st.lists(st.tuples(st.floats(0.01, 100), st.floats(0.01, 100)), min_size=1, max_size=12))
def test_a_bill_is_the_sum_of_its_buckets_and_judged_as_one_figure(seconds):
    outcomes = [bucket(f"step[tokens={i + 1}]", now, before) for i, (now, before) in enumerate(seconds)]
    bill, = startup_bills(outcomes, TOLERANCE)
    total, golden = sum(n for n, _ in seconds), sum(b for _, b in seconds)
    assert abs(bill.seconds - total) < 1e-9 and abs(bill.row.golden - golden) < 1e-9
    grew = total - golden > max(min(total, golden), 1.0)
    assert bill.failed == grew
    assert Bill.from_json(bill.to_json()) == bill


def test_a_bill_with_a_bucket_that_did_not_compile_or_has_no_golden_is_not_judged():
    failed = bucket("step[tokens=64]", None, 0.1)
    new = bucket("step[tokens=32]", 9.0, None)
    bills = startup_bills([bucket("step[tokens=16]", 9.0, 0.1), failed, new], TOLERANCE)
    assert [(b.buckets, b.seconds, b.complete, b.row, b.failed) for b in bills] == [(3, 18.0, False, None, False)]


def test_bills_are_per_server_and_target_and_leave_other_cases_out():
    outcomes = [bucket("step[tokens=16]", 1.0, 1.0), bucket("step[tokens=16]", 2.0, 2.0, target="h100-8"),
                Outcome(Case.of("lm-tiny", "train_step", "v5e-8"), Verdict.PASS),
                Outcome.skip(Case.of("llm", "step[tokens=32]", "v5e-8"), "too few devices")]
    assert [(b.config, b.target, b.buckets) for b in startup_bills(outcomes)] == [("llm", "v5e-8x1", 1),
                                                                                 ("llm", "h100-8x1", 1)]


def test_a_shard_sums_its_part_of_a_bill_and_the_merge_judges_the_whole(tmp_path):
    """A server's buckets on one target split over two shards: neither judges its part (the first's two
    would pass, the second's one would fail alone); the merge sums all three under the shards' tolerance."""
    one = [bucket("step[tokens=16]", 0.6, 0.1), bucket("step[tokens=32]", 0.6, 0.1)]
    two = [bucket("step[tokens=64]", 5.0, 0.1)]
    split = split_groups([o.case for o in one + two], [o.case for o in one])
    assert split == {("llm", "v5e-8x1")}
    paths = []
    for k, outcomes in enumerate((one, two), start=1):
        report = Report(outcomes, shard=(k, 2), bills=startup_bills(outcomes, TOLERANCE, partial=split))
        paths.append(tmp_path / f"{k}.json")
        write_report(paths[-1], report)
        assert load_report(paths[-1]).bills == report.bills and report.passed
        assert report.bills[0].row is None and report.bills[0].tolerance == Tolerance(1.0, 1.0)
    merged = merge_reports(paths, expect_shards=2)
    bill, = merged.report.bills
    assert (bill.buckets, bill.seconds, bill.failed) == (3, 6.2, True) and merged.failed
    update = [Report(o, bills=startup_bills(o, TOLERANCE, judge=False)) for o in (one, two)]
    for path, report in zip(paths, update):
        write_report(path, report)
    assert not merge_reports(paths).report.bills[0].failed  # Shards of an update run: accepted, not judged.


def vmem_overflow(program: str) -> Outcome:
    case = Case.of("llm", program, "v5e-8")
    error = OutOfMemorySpace("E1001: CompileTimeScopedVmemOom", overflow=Overflow(
        "vmem", 348160, 337920, "scoped", instruction="ragged_paged_attention_kernel.2", kernel=True))
    return Outcome(case, Verdict.OUT_OF_MEMORY, failed=True, error=Failure.of(Reason.OUT_OF_MEMORY, error))


def test_the_table_names_a_bucket_whose_kernel_overflows_vmem_and_lists_buckets_largest_first():
    outcomes = [bucket("step[tokens=16]", 0.5, 0.5), vmem_overflow("step[tokens=32]"),
                bucket("sample[tokens=16,seqs=8]", 0.1, 0.1), bucket("sample[tokens=16,seqs=16]", 0.1, 0.1)]
    report = Report(outcomes, bills=startup_bills(outcomes, TOLERANCE))
    lines = serving_lines(report)
    assert lines[0] == ("aotcheck: server llm on v5e-8x1: 4 buckets, start-up bill 0.70s of compile CPU")
    rows = lines[1].splitlines()[2:]
    # Programs as the report orders its cases (failures first), each's buckets largest first.
    assert [row.split()[0] for row in rows] == ["step[tokens=32]", "step[tokens=16]", "sample[tokens=16,seqs=16]",
                                                "sample[tokens=16,seqs=8]"]
    assert memory_spaces(outcomes[1]) == "VMEM 340.00 KiB > 330.00 KiB (ragged_paged_attention_kernel.2)"
    assert "VMEM 340.00 KiB > 330.00 KiB" in rows[0] and rows[0].endswith("out-of-memory")
    assert "  fit  " in rows[1]
    summary = markdown(Merged(report, []))
    assert "### Servers: buckets, largest first, and the start-up bill" in summary
    assert "| step[tokens=32] |" in summary and "server llm on v5e-8x1: 4 buckets" in summary


def test_a_judged_bill_says_how_it_compares():
    outcomes = [bucket(f"step[tokens={16 * 2**i}]", 0.6, 0.1) for i in range(9)]
    line = serving_lines(Report(outcomes, bills=startup_bills(outcomes, TOLERANCE)))[0]
    assert line == ("aotcheck: server llm on v5e-8x1: 9 buckets, start-up bill 5.40s of compile CPU "
                    "(goldens 0.90s: REGRESSION, beyond its tolerance 100% + 1); if expected, accept it: "
                    "pytest --update-golden --aot-configs=llm --aot-topologies=v5e-8x1")


def accepted_bucket(store: GoldenStore, program: str, kept: float, measured: float) -> Outcome:
    """A bucket as an --update-golden run leaves it: its golden written with the seconds it kept."""
    case = Case.of("llm", program, "v5e-8")
    store.write(case, {"compile_cpu_seconds": kept, "peak_bytes": 2**30}, toolchain={}, compiler_options={},
                usable={"bytes": 2**34})
    measured_record = Measurement(case, {"compile_cpu_seconds": measured, "peak_bytes": 2**30}, {}, measured)
    return Outcome(case, Verdict.ACCEPTED, measured=measured_record)


def test_an_update_accepts_a_bill_its_kept_goldens_would_fail(tmp_path):
    """Hardening round 4: each bucket near its last golden keeps it, and the nine still sum beyond the
    bill's tolerance; the update writes the measured seconds so the next check passes, and says so."""
    store = GoldenStore(tmp_path)
    outcomes = [accepted_bucket(store, f"step[tokens={16 * 2**i}]", 0.1, 0.6) for i in range(9)]
    bill, = accept_bills(outcomes, store, TOLERANCE)
    assert bill.accepted and not bill.failed and round(bill.row.golden, 9) == 0.9
    assert all(store.read(o.case).figures["compile_cpu_seconds"] == 0.6 for o in outcomes)
    assert store.read(outcomes[0].case).figures["peak_bytes"] == 2**30  # Nothing else moved,
    assert store.read(outcomes[0].case).usable == {"bytes": 2**34}  # what a device held when it was made included.
    line = serving_lines(Report(outcomes, bills=[bill]))[0]
    assert line.endswith("(the goldens kept summed 0.90s, beyond its tolerance 100% + 1: accepted, each bucket's "
                         "compile_cpu_seconds written as measured)")
    checked = [bucket(o.case.program_id, 0.6, store.read(o.case).figures["compile_cpu_seconds"]) for o in outcomes]
    assert not startup_bills(checked, TOLERANCE)[0].failed  # The next check, against what was written.
    assert Bill.from_json(bill.to_json()) == bill


def test_an_update_leaves_a_bill_within_its_tolerance_and_a_split_one_alone(tmp_path):
    store = GoldenStore(tmp_path)
    outcomes = [accepted_bucket(store, f"step[tokens={16 * 2**i}]", 0.5, 0.6) for i in range(3)]
    bill, = accept_bills(outcomes, store, TOLERANCE)
    assert not bill.accepted and bill.row is None
    assert store.read(outcomes[0].case).figures["compile_cpu_seconds"] == 0.5
    far = [accepted_bucket(store, f"step[tokens={16 * 2**i}]", 0.1, 5.0) for i in range(3)]
    bill, = accept_bills(far, store, TOLERANCE, partial={("llm", "v5e-8x1")})  # Another shard holds the rest.
    assert not bill.accepted and store.read(far[0].case).figures["compile_cpu_seconds"] == 0.1


def test_a_bill_that_grew_names_the_command_that_accepts_it():
    outcomes = [bucket(f"step[tokens={16 * 2**i}]", 0.6, 0.1) for i in range(9)]
    report = Report(outcomes, golden_dir="ci/golden", bills=startup_bills(outcomes, TOLERANCE))
    line = serving_lines(report, accept_args=["-o", "aot_default_options=none"])[0]
    assert line.endswith("REGRESSION, beyond its tolerance 100% + 1); if expected, accept it: pytest --update-golden "
                         "--aot-configs=llm --aot-topologies=v5e-8x1 --aot-golden-dir=ci/golden -o "
                         "aot_default_options=none")
