"""Issue 31, hardening round 3: the gate's own judgement must not be fooled by what it reads.

- a merge of reports that hold the same case (shards never overlap) is an error naming both files,
  and a report's case fails by its verdict whatever its ``failed`` field says;
- a noisy figure (compile CPU seconds) is kept by ``--update-golden`` only while the golden is near
  the new value both ways, and a golden far above it is reported as an improvement;
- a golden or a report whose ``toolchain`` holds a non-string is corrupt, said as such;
- goldens of a *newer* toolchain are a downgrade, never an "upgrade" to accept.

FAKE: no test here compiles. Cases are measured by a fake ``measure`` (chosen figures) or are
made-up outcomes written into reports; the report command runs as a real process
(``python -m aotcheck report``), since what it prints and its exit status are what CI sees.
"""

import json
import subprocess
import sys

import pytest

from aotcheck.gate.compare import Change, Row, Tolerance, compare_metric, parse_tolerances, settle_noisy
from aotcheck.gate.golden import Golden
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.analysis import analyse
from aotcheck.gate.report import Merged, Report, ReportError, load_report, merge_reports, write_report
from aotcheck.gate.upgrade import find_upgrade
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.render.markdown import markdown
from aotcheck.render.summary import session_summary
from aotcheck.session import GateSession
from aotcheck.settings import GateSettings
from aotcheck.render.text import outcome_message

CASE = Case.of("toy", "step", "v5e-4")
FIGURES = {"peak_bytes": 100 * 2**20, "argument_bytes": 10 * 2**20, "flops": 1e9}
NEWER = {"jax": "99.0.0", "jaxlib": "99.0.0", "libtpu": "9.9.9"}


def fake_measure(figures):
    """FAKE measure: the chosen figures for any case."""
    return lambda case: Measurement(case, dict(figures), {"opt": "1"}, 1.5)


def session(tmp_path, figures, **settings):
    parsed = GateSettings.parse(rootdir=tmp_path, topologies=["v5e-4", "v4-8"], cache_dir=None, **settings)
    return GateSession(parsed, measure=fake_measure(figures))


def golden_path(tmp_path, case=CASE):
    return tmp_path / "golden" / case.golden_relpath


def edit_golden(tmp_path, edit, case=CASE):
    path = golden_path(tmp_path, case)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def outcome(case_id, verdict, failed, golden_toolchain=None):
    """FAKE: a made-up outcome (no compile), as a report holds it."""
    case = Case.parse(case_id)
    verdict = Verdict(verdict)
    changes = [Row("peak_bytes", 2**29, 2**30, Tolerance(0.01), Change.REGRESSION)] if verdict is Verdict.REGRESSION \
        else [Row("peak_bytes", 2**31, 2**30, Tolerance(0.01), Change.IMPROVEMENT)] if verdict is Verdict.IMPROVEMENT \
        else []
    golden = Golden({"peak_bytes": 2**29}, golden_toolchain or {}, {}, case.golden_relpath) \
        if golden_toolchain is not None else None
    return Outcome(case, verdict, failed=failed, changes=changes, golden=golden,
                   measured=Measurement(case, {"peak_bytes": 2**30, "flops": 1e12}, {}, 3.0))


def report_command(tmp_path, *args):
    """The report command as CI runs it: a real process."""
    return subprocess.run([sys.executable, "-m", "aotcheck", "report", *map(str, args)], cwd=tmp_path,
                          capture_output=True, text=True)


# 1. A merge that hides a regression.

@pytest.mark.parametrize("order", ["failing-first", "failing-last"])
@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_a_case_in_two_reports_is_an_error_naming_both_files(tmp_path, fmt, order):
    write_report(tmp_path / "fail.json", Report([outcome("lm/prefill@v4-8x1", "regression", True)], shard=(1, 2)))
    write_report(tmp_path / "good.json", Report([outcome("lm/prefill@v4-8x1", "pass", False)], shard=(2, 2)))
    files = ["fail.json", "good.json"] if order == "failing-first" else ["good.json", "fail.json"]
    out = report_command(tmp_path, *files, "--format", fmt, "--annotations", "5")
    assert out.returncode == 2, out  # Bad input, as an unreadable report is: never "passed", exit 0.
    said = (f"{files[0]} and {files[1]} both hold lm/prefill@v4-8x1: shards never share a case, so these reports "
            "are not the shards of one run (or one report was given twice); the merge counts the failing one")
    assert f"aotcheck: {said}" in out.stderr
    assert f"::error title=aotcheck report::{said}" in out.stdout
    # The case is shown as the report that failed it holds it, in the format asked for.
    if fmt == "markdown":
        assert "## aotcheck: ❌ failed" in out.stdout and f"> **Report problem:** {said}" in out.stdout
        assert any(line.startswith("| lm/prefill@v4-8x1") and "regression" in line for line in out.stdout.splitlines())
    else:
        assert f"report problem: {said}" in out.stdout
        assert any(line.startswith("lm/prefill@v4-8x1") and "regression" in line for line in out.stdout.splitlines())
        assert "passed" not in out.stdout


def test_merging_reports_keeps_the_failing_copy_of_a_case(tmp_path):
    write_report(tmp_path / "a.json", Report([outcome("lm/prefill@v4-8x1", "pass", False),
                                              outcome("lm/decode@v4-8x1", "pass", False)], shard=(1, 2)))
    write_report(tmp_path / "b.json", Report([outcome("lm/prefill@v4-8x1", "crashed", True),
                                              outcome("lm/decode@v4-8x1", "regression", True)], shard=(2, 2)))
    merged = merge_reports([tmp_path / "a.json", tmp_path / "b.json"], expect_shards=2)
    assert [(o.case.id, o.verdict.value) for o in merged.report.outcomes] == [
        ("lm/prefill@v4-8x1", "crashed"), ("lm/decode@v4-8x1", "regression")]
    # One problem for the pair of files, naming every case they share.
    assert merged.failed and len(merged.problems) == 1
    assert f"{tmp_path / 'a.json'} and {tmp_path / 'b.json'} both hold 2 cases (lm/decode@v4-8x1, " \
           "lm/prefill@v4-8x1)" in merged.problems[0]
    # Shards that do not overlap merge as before.
    write_report(tmp_path / "c.json", Report([outcome("lm/decode@v5e-16x1", "pass", False)], shard=(2, 2)))
    clean = merge_reports([tmp_path / "a.json", tmp_path / "c.json"], expect_shards=2)
    assert clean.problems == [] and not clean.failed


@pytest.mark.parametrize("verdict,failed,status", [
    ("regression", False, 1),  # Edited (or written by a buggy tool) to say it passed: it still fails.
    ("crashed", False, 1),
    ("missing-golden", False, 1),
    ("pass", True, 1),  # The recorded field can add a failure (the session judged it), never remove one.
    ("improvement", False, 0),  # An improvement fails only under strict, which only `failed` records.
    ("improvement", True, 1),
    ("pass", False, 0),
])
@pytest.mark.heavy
def test_a_report_fails_by_its_verdict_whatever_its_failed_field_says(tmp_path, verdict, failed, status):
    write_report(tmp_path / "r.json", Report([outcome("lm/prefill@v4-8x1", "pass", False)]))
    doc = json.loads((tmp_path / "r.json").read_text())
    doc["cases"][0].update(verdict=verdict, failed=failed)  # As a hand edit would leave it.
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert load_report(tmp_path / "r.json").outcomes[0].failed is bool(status)
    for fmt in ("text", "markdown"):
        out = report_command(tmp_path, "r.json", "--format", fmt)
        assert out.returncode == status, (fmt, out)
        if fmt == "markdown":
            assert ("## aotcheck: ❌ failed" if status else "## aotcheck: ✅ passed") in out.stdout


# 2. A gate that ratchets itself off.

def test_update_replaces_a_cost_golden_far_above_a_sub_second_compile(tmp_path):
    session(tmp_path, {**FIGURES, "compile_cpu_seconds": 0.5}, update=True).check(CASE)
    edit_golden(tmp_path, lambda doc: doc["figures"].update(compile_cpu_seconds=50.0))  # A slow first machine.
    # Reported, not swallowed: 50 s against 0.5 s is a drop far beyond any noise.
    checked = session(tmp_path, {**FIGURES, "compile_cpu_seconds": 0.5}).check(CASE)
    assert (checked.verdict, checked.failed) == (Verdict.IMPROVEMENT, False)
    assert [(r.metric, r.change) for r in checked.changes] == [("compile_cpu_seconds", Change.IMPROVEMENT)]
    strict = session(tmp_path, {**FIGURES, "compile_cpu_seconds": 0.5}, strict=True).check(CASE)
    assert (strict.verdict, strict.failed) == (Verdict.IMPROVEMENT, True)
    # --update-golden takes the new value: the gate is back at 0.5 s + 10 s, not 50 s * 5.
    accepted = session(tmp_path, {**FIGURES, "compile_cpu_seconds": 0.5}, update=True).check(CASE)
    assert accepted.golden_action is GoldenAction.CHANGED
    assert json.loads(golden_path(tmp_path).read_text())["figures"]["compile_cpu_seconds"] == 0.5
    assert session(tmp_path, {**FIGURES, "compile_cpu_seconds": 11.0}).check(CASE).verdict is Verdict.REGRESSION


@pytest.mark.parametrize("golden,now,kept", [
    (3.0, 3.4, True),  # Noise: the golden stays, byte for byte.
    (3.0, 4.6, True),
    (3.0, 1.6, True),  # Down to half, both ways.
    (3.0, 1.4, False),  # Further down: the golden is no longer near what this machine measures.
    (3.0, 6.5, False),  # Further up (still within the gate's 400% + 10 s: it passes, but is not kept).
    (0.5, 1.4, True),  # Sub-second figures: within 1 s of each other.
    (1.6, 0.5, False),
    (50.0, 0.5, False),  # The case: a 50 s golden for a sub-second compile.
    (0.5, 50.0, False),
])
def test_update_keeps_a_noisy_figure_only_near_the_new_one(golden, now, kept):
    settled = settle_noisy({"compile_cpu_seconds": golden, "peak_bytes": 10}, {"compile_cpu_seconds": now,
                                                                              "peak_bytes": 11})
    assert settled == {"compile_cpu_seconds": golden if kept else now, "peak_bytes": 11}


def test_a_tighter_tolerance_of_ones_own_bounds_what_is_kept():
    tolerances = parse_tolerances(["compile_cpu_seconds = 20%"])
    assert settle_noisy({"compile_cpu_seconds": 3.0}, {"compile_cpu_seconds": 2.7}, tolerances)["compile_cpu_seconds"] == 3.0
    # 3.0 against 2.4 is within 2x, but not within 20% of 2.4: the gate would call it an improvement,
    # so accepting it writes it.
    assert compare_metric("compile_cpu_seconds", 3.0, 2.4, tolerances[0][1]).change is Change.IMPROVEMENT
    assert settle_noisy({"compile_cpu_seconds": 3.0}, {"compile_cpu_seconds": 2.4}, tolerances)["compile_cpu_seconds"] == 2.4


@pytest.mark.parametrize("golden,now,change", [
    (50.0, 0.5, Change.IMPROVEMENT),  # A fifth, and 10 s less: as far down as 5x and 10 s is up.
    (50.0, 9.0, Change.IMPROVEMENT),
    (50.0, 11.0, Change.OK),  # Within 400% of the value now.
    (12.0, 2.5, Change.OK),  # Within 10 s.
    (2.0, 12.5, Change.REGRESSION),  # Growth is judged as it was.
    (2.0, 12.0, Change.OK),
])
def test_noisy_figures_compare_as_a_factor_both_ways(golden, now, change):
    assert compare_metric("compile_cpu_seconds", golden, now, Tolerance(4.0, 10.0)).change is change


def test_other_figures_compare_as_they_did():
    tol = Tolerance(0.01)
    assert compare_metric("peak_bytes", 100.0, 99.0, tol).change is Change.OK  # Measured from the golden.
    assert compare_metric("peak_bytes", 100.0, 98.9, tol).change is Change.IMPROVEMENT


# 3. Malformed toolchain fields are a corrupt golden, or a report error.

@pytest.mark.parametrize("value", [["0.12.0.1"], 12, {"v": "1"}, True])
def test_a_golden_whose_toolchain_holds_a_non_string_is_corrupt(tmp_path, value):
    session(tmp_path, FIGURES, update=True).check(CASE)
    edit_golden(tmp_path, lambda doc: doc["toolchain"].update(jax=value))
    gate = session(tmp_path, FIGURES)
    checked = gate.check(CASE)
    assert (checked.verdict, checked.failed) == (Verdict.CORRUPT_GOLDEN, True)
    assert (f"Golden file {golden_path(tmp_path)}: its 'toolchain' field 'jax' must be a version string or null, "
            f"not {type(value).__name__}") in outcome_message(checked)
    # The session's summary and the job summary are written (before: a TypeError from the upgrade table).
    report = Report([checked])
    assert "corrupt-golden" in "\n".join(session_summary(report, update=False))
    assert "corrupt-golden" in markdown(Merged(report, problems=[]))
    # --update-golden replaces it, as any corrupt golden.
    assert session(tmp_path, FIGURES, update=True).check(CASE).golden_action is GoldenAction.CHANGED
    assert session(tmp_path, FIGURES).check(CASE).verdict is Verdict.PASS


@pytest.mark.parametrize("where", ["report", "golden"])
@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_a_report_whose_toolchain_holds_a_non_string_is_a_clear_error(tmp_path, where, fmt):
    write_report(tmp_path / "r.json", Report([outcome("lm/prefill@v4-8x1", "pass", False, golden_toolchain=NEWER)]))
    doc = json.loads((tmp_path / "r.json").read_text())
    (doc if where == "report" else doc["cases"][0]["golden"])["toolchain"]["libtpu"] = ["0.0.50.1"]
    (tmp_path / "r.json").write_text(json.dumps(doc))
    with pytest.raises(ReportError) as raised:
        load_report(tmp_path / "r.json")
    field = "its 'toolchain' field 'libtpu' must be a version string or null, not list (['0.0.50.1'])"
    said = f"{tmp_path / 'r.json'}: " + (field if where == "report" else f"case lm/prefill@v4-8x1, in its golden: {field}")
    assert str(raised.value).startswith(said)
    out = report_command(tmp_path, "r.json", "--format", fmt)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out
    assert f"aotcheck: r.json: " + said.split(": ", 1)[1] in out.stderr


# 4. Goldens of a newer toolchain are a downgrade.

def test_goldens_of_a_newer_toolchain_are_an_older_toolchain_not_an_upgrade(tmp_path):
    other = Case.of("toy", "step", "v4-8")
    for case in (CASE, other):
        session(tmp_path, FIGURES, update=True).check(case)
        edit_golden(tmp_path, lambda doc: doc.update(toolchain=dict(NEWER)), case)
    gate = GateSession(GateSettings.parse(rootdir=tmp_path, topologies=["v5e-4", "v4-8"], cache_dir=None),
                       measure=lambda c: fake_measure({**FIGURES, "peak_bytes": 2 * FIGURES["peak_bytes"]}
                                                      if c == CASE else FIGURES)(c))
    outcomes = [gate.check(CASE), gate.check(other)]  # The upgrade table is the run's analysis, as a session's.
    report = Report(outcomes, upgrade=analyse(outcomes, {}, toolchain=gate.toolchain()).upgrade)
    text = "\n".join(session_summary(report, update=False))
    now = ", ".join(f"{k} {v}" for k, v in report.toolchain.items())
    assert ("aotcheck: older toolchain than the goldens': 2 case(s) judged against goldens made with jax 99.0.0, "
            f"jaxlib 99.0.0, libtpu 9.9.9; now {now}, which is older (a downgrade: the CI lock or this machine is "
            "behind the goldens). 1 moved, 1 did not.") in text
    assert ("Do not accept these figures: they would take the goldens back to an older toolchain. Install the "
            "goldens' toolchain (jax 99.0.0, jaxlib 99.0.0, libtpu 9.9.9) to check against them.") in text
    upgrade = text[text.index("aotcheck: older toolchain"):]  # The table's section, to its end.
    assert "toolchain upgrade" not in text and "--update-golden" not in upgrade
    assert "Did not move (every figure within tolerance): toy/step@v4-8x1" in upgrade
    # The case's own message warns too (its accept line is the case message's, as for any regression).
    assert ("Note: golden made with a newer toolchain than this one (jax 99.0.0 -> ") in outcome_message(report.outcomes[0])
    md = markdown(Merged(report, problems=[]))
    assert "### Older toolchain than the goldens'" in md and "Toolchain upgrade" not in md
    section = md[md.index("### Older toolchain than the goldens'"):]
    section = section[:section.index("\n### ", 4)] if "\n### " in section[4:] else section
    assert "| toy/step@v5e-4x1 | peak_bytes | 100.00 MiB | 200.00 MiB | +100.0% |" in section
    assert "--update-golden" not in section and "Install the goldens' toolchain" in section


def test_the_report_command_says_downgrade(tmp_path):
    write_report(tmp_path / "r.json", Report([outcome("lm/prefill@v4-8x1", "regression", True,
                                                      golden_toolchain=NEWER)]))
    out = report_command(tmp_path, "r.json", "--format", "markdown")
    assert out.returncode == 1, out
    assert "### Older toolchain than the goldens'" in out.stdout and "--update-golden" not in out.stdout
    assert ("1 case(s) judged against goldens made with jax 99.0.0, jaxlib 99.0.0, libtpu 9.9.9; now jax "
            in out.stdout) and "which is older (a downgrade: the CI lock or this machine is behind the goldens)" \
        in out.stdout


def _upgrade(before, now):
    case = Case.of("lm", "prefill", "v4-8")
    golden = Golden({"peak_bytes": 1}, before, {}, case.golden_relpath)
    return find_upgrade([Outcome(case, Verdict.PASS, golden=golden)], now=now)


@pytest.mark.parametrize("before,now,direction", [
    ({"jax": "0.9.9", "libtpu": "0.0.9"}, {"jax": "0.10.2", "libtpu": "0.0.42.1"}, "upgrade"),  # Not as strings.
    ({"jax": "0.12.0.1", "libtpu": "0.0.50.1"}, {"jax": "0.10.2", "libtpu": "0.0.42.1"}, "downgrade"),
    ({"jax": "0.12.0", "libtpu": "0.0.50.1"}, {"jax": "0.12.0.1", "libtpu": "0.0.50.1"}, "upgrade"),
    ({"jax": "0.12.0.1", "libtpu": "0.0.40"}, {"jax": "0.10.2", "libtpu": "0.0.50.1"}, "change"),  # One each way.
    ({"jax": "0.12.0.1", "libtpu": "/opt/libtpu.so"}, {"jax": "0.12.0.1", "libtpu": "0.0.50.1"}, "change"),
    ({"jax": "0.12.0.1", "libtpu": None}, {"jax": "0.12.0.1", "libtpu": "0.0.50.1"}, "change"),
])
def test_toolchains_compare_as_versions(before, now, direction):
    assert _upgrade(before, now).direction == direction


def test_a_toolchain_change_that_is_neither_way_names_no_direction():
    from aotcheck.render.upgrade import upgrade_lines

    up = _upgrade({"jax": "0.12.0.1", "libtpu": "0.0.40"}, {"jax": "0.10.2", "libtpu": "0.0.50.1"})
    text = "\n".join(upgrade_lines(up, golden_dir="golden"))
    assert text.startswith("aotcheck: toolchain change: 1 case(s) judged against goldens made with jax 0.12.0.1, "
                           "libtpu 0.0.40; now jax 0.10.2, libtpu 0.0.50.1, neither newer nor older throughout "
                           "(jax older, libtpu newer). 0 moved, 1 did not.")
    assert ("If this run's toolchain is the one the goldens should follow, to accept its figures for all of them: "
            "pytest --update-golden --aot-configs=lm --aot-topologies=v4-8x1") in text


def test_a_report_that_records_its_shard_is_incomplete_alone(tmp_path):
    """One shard of two, merged without --expect-shards, was 'passed' (a server's start-up bill judged
    on part of its buckets)."""
    write_report(tmp_path / "a.json", Report([outcome("lm/prefill@v4-8x1", "pass", False)], shard=(1, 2)))
    write_report(tmp_path / "b.json", Report([outcome("lm/decode@v4-8x1", "pass", False)], shard=(2, 2)))
    alone = merge_reports([tmp_path / "a.json"])
    assert alone.problems == ["shard 2/2 has no report: its runner crashed or was cancelled, or its report was not "
                              "given (a shard alone is part of the run, its start-up bills part of a server's)"]
    assert merge_reports([tmp_path / "a.json", tmp_path / "b.json"]).problems == []
    write_report(tmp_path / "c.json", Report([outcome("lm/train@v4-8x1", "pass", False)], shard=(1, 3)))
    mixed = merge_reports([tmp_path / "b.json", tmp_path / "c.json"])
    assert any("shards of runs split differently" in p for p in mixed.problems)
    asked = merge_reports([tmp_path / "a.json", tmp_path / "b.json"], expect_shards=3)
    assert "--expect-shards 3, but the reports say their run was split 2 ways" in asked.problems
    write_report(tmp_path / "whole.json", Report([outcome("lm/prefill@v4-8x1", "pass", False)]))
    assert merge_reports([tmp_path / "whole.json"]).problems == []  # An unsharded run is whole.


def test_shards_of_two_different_matrices_are_not_one_run(tmp_path):
    """Hardening round 5, V36: shard 1/2 of one matrix and 2/2 of another merged as one pass."""
    write_report(tmp_path / "a.json", Report([outcome("lm/prefill@v4-8x1", "pass", False)], shard=(1, 2), matrix="aa"))
    write_report(tmp_path / "b.json", Report([outcome("lm/decode@v5e-16x1", "pass", False)], shard=(2, 2), matrix="bb"))
    merged = merge_reports([tmp_path / "a.json", tmp_path / "b.json"])
    assert merged.problems == [f"these reports are shards of different matrices ({tmp_path / 'a.json'}: matrix aa, "
                               f"{tmp_path / 'b.json'}: matrix bb; each shard of one run records the same digest of "
                               "the whole case list): merge the shards of one run, made with the same configs, "
                               "targets and slices"]
    write_report(tmp_path / "c.json", Report([outcome("lm/decode@v4-8x1", "pass", False)], shard=(2, 2), matrix="aa"))
    assert merge_reports([tmp_path / "a.json", tmp_path / "c.json"]).problems == []


def test_a_plans_matrix_digest_is_its_case_list_not_its_shard():
    import tempfile

    from aotcheck.gate.golden import GoldenStore
    from aotcheck.plan import make_plan
    from aotcheck.programs.registry import REGISTRY
    from aotcheck.settings import GateSettings

    root = tempfile.mkdtemp()
    plans = [make_plan(GateSettings.parse(rootdir=root, topologies=t, shard=k), REGISTRY, GoldenStore(root))
             for t, k in (("cpu-2,cpu-4", "1/2"), ("cpu-2,cpu-4", "2/2"), ("cpu-2", "1/2"))]
    assert plans[0].matrix_digest == plans[1].matrix_digest != plans[2].matrix_digest


def test_reports_of_two_toolchains_are_not_one_run(tmp_path):
    """Hardening round 4: the first file's toolchain won, and in one order every case was said to be judged
    on the other toolchain."""
    one = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "libtpu": "0.0.50.1"}
    two = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
    write_report(tmp_path / "a.json", Report([outcome("lm/prefill@v4-8x1", "pass", False)], shard=(1, 2), toolchain=one))
    write_report(tmp_path / "b.json", Report([outcome("lm/decode@v4-8x1", "pass", False)], shard=(2, 2), toolchain=two))
    for order in ([tmp_path / "a.json", tmp_path / "b.json"], [tmp_path / "b.json", tmp_path / "a.json"]):
        merged = merge_reports(order)
        first, second = (one, two) if order[0].name == "a.json" else (two, one)
        words = lambda t: ", ".join(f"{k} {v}" for k, v in sorted(t.items()))  # noqa: E731
        assert merged.problems == [f"these reports were made with different toolchains ({order[0]}: {words(first)}; "
                                   f"{order[1]}: {words(second)}): merge the shards of one run, each made with the "
                                   "same lock file"]
        assert merged.failed
    result = report_command(tmp_path, "a.json", "b.json")
    assert result.returncode == 2 and "made with different toolchains" in result.stderr


def test_a_report_field_of_the_wrong_shape_is_named(tmp_path):
    write_report(tmp_path / "r.json", Report([outcome("lm/prefill@v4-8x1", "pass", False)]))
    doc = json.loads((tmp_path / "r.json").read_text())
    for field, value, words in [("cases", 3, "its 'cases' is int, not a list"),
                                ("startup_bills", {"a": 1}, "its 'startup_bills' is dict, not a list"),
                                ("startup_bills", [{"config": "llm"}],
                                 "a start-up bill in this report is malformed (KeyError: 'target')")]:
        (tmp_path / "bad.json").write_text(json.dumps({**doc, field: value}))
        with pytest.raises(ReportError) as raised:
            load_report(tmp_path / "bad.json")
        assert str(raised.value).startswith(f"{tmp_path / 'bad.json'}: {words}"), str(raised.value)
        assert str(raised.value).endswith("write the report again (--aot-report=PATH)")


def test_the_text_report_of_a_servers_shards_shows_its_bill_and_why_it_fails(tmp_path):
    """Hardening round 4: two shards of a server merged by `aotcheck report` (text) said rc 1 with four
    `pass` rows and no bill line."""
    tolerance = [("compile_cpu_seconds", Tolerance(1.0, 1.0))]
    from aotcheck.gate.bill import split_groups, startup_bills

    def bucket(tokens):
        case = Case.of("llm", f"step[tokens={tokens}]", "v5e-8")
        return Outcome(case, Verdict.PASS, measured=Measurement(case, {"compile_cpu_seconds": 3.0}, {}, 3.0),
                       golden=Golden({"compile_cpu_seconds": 0.1}, {}, {}, case.golden_relpath))
    one, two = [bucket(16), bucket(32)], [bucket(64), bucket(128)]
    split = split_groups([o.case for o in one + two], [o.case for o in one])
    for k, outcomes in enumerate((one, two), start=1):
        write_report(tmp_path / f"{k}.json", Report(outcomes, shard=(k, 2), accept_args=["-o", "aot_default_options=none"],
                                                    bills=startup_bills(outcomes, tolerance, partial=split)))
    result = report_command(tmp_path, "1.json", "2.json")
    assert result.returncode == 1
    # The accept command repeats the run's options the shards recorded (presets off here).
    assert ("aotcheck: server llm on v5e-8x1: 4 buckets, start-up bill 12.00s of compile CPU (goldens 0.40s: "
            "REGRESSION, beyond its tolerance 100% + 1); if expected, accept it: pytest --update-golden "
            "--aot-configs=llm --aot-topologies=v5e-8x1 -o aot_default_options=none") in result.stdout


def test_a_report_read_back_has_its_servers_from_its_bills(tmp_path):
    """A report's file keeps its format: each bill carries its server's load order and pages (no field of
    servers of its own); read back, they are the report's servers, so a merge of them judges boots as a run."""
    from aotcheck.gate.bill import startup_bills
    from aotcheck.programs.serving import Server

    server = Server("llm", ("step", "sample"), "pages", 64)
    case = Case.of("llm", "step[tokens=16]", "v5e-8")
    report = Report([Outcome(case, Verdict.PASS)], bills=startup_bills([Outcome(case, Verdict.PASS)],
                                                                       servers={"llm": server}))
    doc = report.to_json()
    assert "servers" not in doc and doc["startup_bills"][0]["load_order"] == ["step", "sample"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = load_report(tmp_path / "old.json")
    assert old.servers == {"llm": server} and old.bills == report.bills
    assert merge_reports([tmp_path / "old.json"]).report.servers == old.servers
    doc["startup_bills"][0].update(load_order=[], pages=None)  # A bill that knew neither: a server by name only.
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert load_report(tmp_path / "old.json").servers == {"llm": Server("llm", ())}


def test_a_servers_buckets_are_listed_in_its_load_order_each_programs_largest_first():
    """The serving table's order is the report's (Report.served), from values: a server's programs in the order
    it loads them, each's buckets by their sizes (128 above 32 above 16: not by their ids' text)."""
    from aotcheck.gate.bill import Bill

    ids = ("step[tokens=16]", "sample[tokens=16,seqs=8]", "step[tokens=128]", "step[tokens=32]",
           "sample[tokens=16,seqs=16]")
    outcomes = [Outcome(Case.of("llm", p, "v5e-8"), Verdict.PASS) for p in ids]
    bill = Bill("llm", "v5e-8x1", 5, 1.0, False, load_order=("step", "sample"))
    [(found, listed)] = Report(outcomes, bills=[bill]).served()
    assert found is bill and [o.case.program_id for o in listed] == [
        "step[tokens=128]", "step[tokens=32]", "step[tokens=16]", "sample[tokens=16,seqs=16]", "sample[tokens=16,seqs=8]"]
    [(_, by_appearance)] = Report(outcomes, bills=[Bill("llm", "v5e-8x1", 5, 1.0, False)]).served()
    assert [o.case.program for o in by_appearance][0] == "sample"  # No load order known: the report's order.
