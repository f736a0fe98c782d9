"""check_case's decision table, row by row, fast, and each verdict's message (aotcheck.render.text).

FAKE: these tests measure nothing. A fake ``measure`` returns chosen figures or
raises a chosen error, so every row of the table (aotcheck.gate.check) runs in
milliseconds. The same decisions are made with real libtpu compiles in
test_plugin.py and test_gate.py.
"""

import json

import pytest

from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import Measurement
from aotcheck.gate.outcome import Failure, Outcome, Reason
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.errors import CompileError, OutOfMemory, OutOfMemorySpace, WorkerCrashed, error_from_json
from aotcheck.programs.oom import overflow_of
from aotcheck.programs.registry import ProgramNotFound
from aotcheck.session import GateSession
from aotcheck.settings import GateSettings
from aotcheck.render.text import outcome_message

CASE = Case.of("toy", "step", "v5e-4")
FIGURES = {"peak_bytes": 100 * 2**20, "argument_bytes": 10 * 2**20, "flops": 1e9}
OOM = ("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.00G of 15.75G hbm. "
       "Exceeded hbm capacity by 4.25G.")


def fake_measure(result):
    """FAKE measure: returns figures for CASE, or raises ``result`` if it is an exception."""

    def measure(case):
        if isinstance(result, BaseException):
            raise result
        return Measurement(case, dict(result), {"opt": "1"}, 1.5)

    return measure


def session(tmp_path, result, **settings):
    parsed = GateSettings.parse(rootdir=tmp_path, topologies=["v5e-4"], cache_dir=None, **settings)
    return GateSession(parsed, measure=fake_measure(result))


def write_golden(tmp_path, figures):
    session(tmp_path, figures, update=True).check(CASE)


@pytest.mark.parametrize("error,verdict,words", [
    # As the compile raises it: the record read from XLA's words where it raised them.
    (OutOfMemory(OOM, overflow=overflow_of(OOM)), Verdict.OUT_OF_MEMORY, "does not fit: XLA needs 20.00 GiB of the 15.75 GiB"),
    (OutOfMemory(OOM), Verdict.OUT_OF_MEMORY, "does not fit in HBM on v5e-4; XLA says:\nRESOURCE_EXHAUSTED"),
    (CompileError(OOM.replace("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT")), Verdict.COMPILE_ERROR, "INVALID_ARGUMENT"),
    (CompileError("INVALID_ARGUMENT: bad sharding"), Verdict.COMPILE_ERROR, "does not compile:\nINVALID_ARGUMENT"),
    (ProgramNotFound("Config 'toy' has no program 'step'; it has a."), Verdict.ERROR, "has no program 'step'"),
    (ValueError("Mesh shape (3,) does not fit 4 devices"), Verdict.ERROR, "Mesh shape (3,)"),
])
def test_errors_fail_the_case_with_their_explanation(tmp_path, error, verdict, words):
    outcome = session(tmp_path, error).check(CASE)
    assert (outcome.verdict, outcome.failed, outcome.figures) == (verdict, True, None)
    assert outcome_message(outcome).startswith("toy/step@v5e-4x1") and words in outcome_message(outcome)
    assert not (tmp_path / "golden").exists()


def test_over_hbm_fails_and_writes_no_golden_even_when_updating(tmp_path):
    outcome = session(tmp_path, {**FIGURES, "peak_bytes": 17 * 2**30}, update=True).check(CASE)
    assert outcome.verdict is Verdict.OVER_HBM and outcome.failed
    assert "does not fit: it needs 17.00 GiB of 16.00 GiB HBM per device on v5e-4: 106%" in outcome_message(outcome)
    assert not (tmp_path / "golden" / CASE.golden_relpath).exists()
    headroom = session(tmp_path, {**FIGURES, "peak_bytes": 15 * 2**30}, hbm_headroom="0.9").check(CASE)
    assert headroom.verdict is Verdict.OVER_HBM and "headroom 90%" in outcome_message(headroom)


def test_update_creates_changes_and_leaves_alone(tmp_path):
    actions = []
    for figures in (FIGURES, FIGURES, {**FIGURES, "flops": 2e9}):
        outcome = session(tmp_path, figures, update=True).check(CASE)
        assert outcome.verdict is Verdict.ACCEPTED and not outcome.failed
        actions.append(outcome.golden_action)
    assert actions == [GoldenAction.CREATED, GoldenAction.UNCHANGED, GoldenAction.CHANGED]
    doc = json.loads((tmp_path / "golden" / CASE.golden_relpath).read_text())
    assert doc["figures"]["flops"] == 2e9 and doc["compiler_options"] == {"opt": "1"}


def test_missing_and_corrupt_goldens_say_how_to_fix(tmp_path):
    missing = session(tmp_path, FIGURES).check(CASE)
    assert missing.verdict is Verdict.MISSING_GOLDEN and missing.failed
    assert outcome_message(missing).endswith(
        "To create it: pytest --update-golden --aot-case=toy/step@v5e-4x1")
    path = tmp_path / "golden" / CASE.golden_relpath
    path.parent.mkdir(parents=True)
    path.write_text("{oops")
    corrupt = session(tmp_path, FIGURES, golden_dir_option="golden").check(CASE)
    assert corrupt.verdict is Verdict.CORRUPT_GOLDEN and "is not valid JSON" in outcome_message(corrupt)
    assert outcome_message(corrupt).endswith("--aot-golden-dir=golden")  # The accept command keeps a given golden dir.
    assert path.read_text() == "{oops"  # Never rewritten without --update-golden.


def test_the_outcome_carries_the_errors_record_and_render_words_it(tmp_path):
    """gate/ records why a case failed and the error's one JSON form; render/ words it."""
    outcome = session(tmp_path, KeyError("vocab_size")).check(CASE)
    failure = outcome.error
    assert (failure.reason, failure.type, failure.text, failure.type_name) == (
        Reason.USER_CODE, "builtins.KeyError", "vocab_size", "KeyError")
    assert error_from_json(failure.record).args == ("vocab_size",)
    assert outcome_message(outcome) == "toy/step@v5e-4x1: KeyError while building or lowering it: vocab_size"
    crash = WorkerCrashed("the v5e compile process died with SIGKILL", signal_name="SIGKILL", tail=("last",), log=("all",))
    crashed = session(tmp_path, crash).check(CASE).error
    assert (crashed.reason, crashed.log, crashed.fields) == (Reason.CRASHED, ("all",), {"signal_name": "SIGKILL", "tail": ["last"]})
    assert type(error_from_json(crashed.record)) is WorkerCrashed
    over = session(tmp_path, {**FIGURES, "peak_bytes": 17 * 2**30}).check(CASE).error
    assert (over.reason, over.hbm.peak_bytes, over.hbm.topology, over.text) == (Reason.OVER_HBM, 17 * 2**30, "v5e-4", "")
    for failed in (outcome, session(tmp_path, crash).check(CASE), session(tmp_path, {**FIGURES, "peak_bytes": 17 * 2**30}).check(CASE)):
        assert Outcome.from_json(json.loads(json.dumps(failed.to_json()))) == failed
    # A report written before reasons were recorded still reads: its verdict says what its error was.
    old = {**outcome.to_json(), "verdict": "over-hbm", "error": {"text": "needs 17.00 GiB", "details": None, "log": []}}
    assert Outcome.from_json(old).error == Failure(Reason.OVER_HBM, "needs 17.00 GiB")


def test_an_unwritable_golden_is_recorded_with_its_path(tmp_path):
    gate = session(tmp_path, FIGURES, update=True)

    def refuse(*args, **kwargs):  # FAKE: the store's write, refused as a read-only directory refuses it.
        raise PermissionError(13, "Permission denied", "somewhere")

    gate.store.write = refuse
    outcome = gate.check(CASE)
    assert (outcome.verdict, outcome.error.reason, outcome.error.path) == (
        Verdict.ERROR, Reason.GOLDEN_UNWRITABLE, gate.golden_file(CASE))
    assert outcome_message(outcome) == (f"toy/step@v5e-4x1: cannot write its golden file {gate.golden_file(CASE)}: "
                               "Permission denied. Check the golden directory's permissions.")


def test_every_accept_command_comes_from_one_builder(tmp_path):
    from aotcheck.gate.outcome import Accept
    from aotcheck.render.accept import accept_case_command

    gate = session(tmp_path, FIGURES, golden_dir_option="ci/golden", libtpu_init_args_option="--xla_a=1")
    expected = accept_case_command(Accept(CASE, ("--aot-golden-dir=ci/golden", "--aot-libtpu-init-args=--xla_a=1")))
    assert expected == f"pytest --update-golden --aot-case={CASE.id} --aot-golden-dir=ci/golden --aot-libtpu-init-args=--xla_a=1"
    assert accept_case_command(gate.accept(CASE)) == expected
    assert outcome_message(gate.check(CASE)).endswith("To create it: " + expected)


@pytest.mark.parametrize("factor,strict,verdict,failed", [
    (1.0, False, Verdict.PASS, False),
    (1.005, False, Verdict.PASS, False),  # Within the default 1% tolerance.
    (1.5, False, Verdict.REGRESSION, True),
    (0.5, False, Verdict.IMPROVEMENT, False),
    (0.5, True, Verdict.IMPROVEMENT, True),
    (1.5, True, Verdict.REGRESSION, True),
])
def test_comparison_with_the_golden(tmp_path, factor, strict, verdict, failed):
    write_golden(tmp_path, FIGURES)
    now = {**FIGURES, "peak_bytes": int(FIGURES["peak_bytes"] * factor)}
    outcome = session(tmp_path, now, strict=strict).check(CASE)
    assert (outcome.verdict, outcome.failed) == (verdict, failed)
    assert outcome.golden_figures == FIGURES and outcome.measured.compile_seconds == 1.5
    if verdict is not Verdict.PASS:
        assert [r.metric for r in outcome.changes] == ["peak_bytes"]
        assert "peak_bytes" in outcome_message(outcome) and "To accept the new figures: pytest --update-golden" in outcome_message(outcome)
    assert Outcome.from_json(json.loads(json.dumps(outcome.to_json()))) == outcome


def test_a_pytest_free_run_finishes_with_a_report_and_stale_goldens(tmp_path):
    write_golden(tmp_path, FIGURES)
    stale = tmp_path / "golden" / "gone" / "step@v5e-4x1.json"
    stale.parent.mkdir()
    stale.write_text((tmp_path / "golden" / CASE.golden_relpath).read_text().replace(CASE.id, "gone/step@v5e-4x1"))
    from aotcheck.programs.registry import Registry

    registry = Registry()
    registry.register("toy", lambda: __import__("aotcheck").FunctionConfig(fn=abs, make_args=abs))
    settings = GateSettings.parse(rootdir=tmp_path, topologies=["v5e-4"], cache_dir=None, report=str(tmp_path / "r.json"))
    with GateSession(settings, registry=registry, measure=fake_measure({**FIGURES, "flops": 3e9})) as gate:
        report = gate.run()
    assert [(o.case.id, o.verdict) for o in report.outcomes] == [("toy/step@v5e-4x1", Verdict.REGRESSION)]
    assert report.stale == ["gone/step@v5e-4x1.json"] and report.golden_dir == "golden" and not report.passed
    assert json.loads((tmp_path / "r.json").read_text())["cases"][0]["golden_path"] == "toy/step@v5e-4x1.json"


def test_a_peak_that_could_not_be_split_is_a_note_and_the_rest_is_judged(tmp_path):
    """A libtpu that wrote no dump (or one this version cannot read): the peak_* figures are missing
    this time; the case says why and passes or fails on the figures it has."""
    split = {"peak_params_bytes": 10, "peak_opt_state_bytes": 0, "peak_batch_bytes": 0, "peak_outputs_bytes": 0,
             "peak_temp_bytes": 90 * 2**20, "peak_other_bytes": 10 * 2**20 - 10}
    write_golden(tmp_path, {**FIGURES, **split})
    problem = "the peak is not split by class: XLA wrote no *after_optimizations-live-range.txt into its dump directory"

    def measure(case, figures=FIGURES):
        return Measurement(case, dict(figures), {"opt": "1"}, 1.5, attribution_problem=problem)

    gate = GateSession(GateSettings.parse(rootdir=tmp_path, topologies=["v5e-4"], cache_dir=None), measure=measure)
    outcome = gate.check(CASE)
    assert (outcome.verdict, outcome.failed) == (Verdict.PASS, False) and problem in outcome.notes
    grown = GateSession(GateSettings.parse(rootdir=tmp_path, topologies=["v5e-4"], cache_dir=None),
                        measure=lambda c: measure(c, {**FIGURES, "peak_bytes": 200 * 2**20}))
    assert grown.check(CASE).verdict is Verdict.REGRESSION  # Judged on the figures it still has.


def test_update_keeps_a_noisy_cost_within_tolerance_and_takes_one_beyond(tmp_path):
    # FAKE measure, as the whole module: compile seconds chosen, as a loaded machine would give them.
    first = {**FIGURES, "compile_cpu_seconds": 3.0}
    write_golden(tmp_path, first)
    path = tmp_path / "golden" / CASE.golden_relpath
    before = path.read_text()
    noisy = session(tmp_path, {**FIGURES, "compile_cpu_seconds": 4.6}, update=True).check(CASE)
    assert noisy.golden_action is GoldenAction.UNCHANGED and path.read_text() == before
    assert noisy.figures["compile_cpu_seconds"] == 4.6  # The outcome reports what was measured.
    slower = session(tmp_path, {**FIGURES, "compile_cpu_seconds": 16.0}, update=True).check(CASE)
    assert slower.golden_action is GoldenAction.CHANGED
    assert json.loads(path.read_text())["figures"]["compile_cpu_seconds"] == 16.0
    # Gated: growth beyond max(400%, 10 s) of the golden fails; up to it passes.
    assert session(tmp_path, {**FIGURES, "compile_cpu_seconds": 80.0}).check(CASE).verdict is Verdict.PASS
    regressed = session(tmp_path, {**FIGURES, "compile_cpu_seconds": 80.5}).check(CASE)
    assert regressed.verdict is Verdict.REGRESSION and "compile_cpu_seconds" in outcome_message(regressed)


def test_goldens_of_another_toolchain_give_one_upgrade_table(tmp_path):
    # FAKE measure: the "new toolchain" is this process's; the goldens claim an older one.
    from aotcheck.render.markdown import markdown
    from aotcheck.gate.report import Merged
    from aotcheck.render.summary import session_summary

    other = Case.of("toy", "step", "v4-8")
    for case in (CASE, other):
        session(tmp_path, FIGURES, update=True).check(case)
        path = tmp_path / "golden" / case.golden_relpath
        doc = json.loads(path.read_text())
        doc["toolchain"] = {"jax": "0.0.1", "jaxlib": "0.0.1", "libtpu": "0.0.0"}
        path.write_text(json.dumps(doc))
    gate = GateSession(GateSettings.parse(rootdir=tmp_path, topologies=["v5e-4", "v4-8"], cache_dir=None,
                                          libtpu_init_args_option="--xla_a=1"),
                       measure=lambda c: fake_measure({**FIGURES, "peak_bytes": 2 * FIGURES["peak_bytes"]}
                                                      if c == CASE else FIGURES)(c))
    for case in (CASE, other):
        gate.record(gate.check(case))
    report = gate.finish()  # The upgrade table is the run's analysis (aotcheck.gate.analysis), as it finishes.
    text = "\n".join(session_summary(report, update=False, accept_args=gate.accept_args()))
    assert ("toolchain upgrade: 2 case(s) judged against goldens made with jax 0.0.1, jaxlib 0.0.1, libtpu 0.0.0; "
            "now jax ") in text and "1 moved, 1 did not." in text
    row = next(line for line in text.splitlines() if line.startswith("toy/step@v5e-4x1 ") and "peak_bytes" in line)
    assert row.split()[1:] == ["peak_bytes", "100.00", "MiB", "200.00", "MiB", "+100.0%"]
    assert "Did not move (every figure within tolerance): toy/step@v4-8x1" in text
    assert ("To accept the new toolchain's figures for all of them: pytest --update-golden --aot-configs=toy "
            "--aot-topologies=v4-8x1,v5e-4x1 --aot-libtpu-init-args=--xla_a=1") in text
    md = markdown(Merged(report, problems=[]))
    assert "### Toolchain upgrade" in md and "| toy/step@v5e-4x1 | peak_bytes | 100.00 MiB | 200.00 MiB | +100.0% |" in md


def test_a_golden_written_before_the_kv_cache_class_is_judged_not_failed_for_the_name(tmp_path):
    """A golden of figures version 17 holds no peak_kv_cache_bytes: read as 0, its split is judged as it
    stands (a training step passes; a server's pool that left batch shows as the class that moved)."""
    split = {"peak_params_bytes": 2**20, "peak_opt_state_bytes": 0, "peak_batch_bytes": 3 * 2**20,
             "peak_outputs_bytes": 0, "peak_temp_bytes": 0, "peak_other_bytes": 0}
    old = {**FIGURES, "peak_bytes": 4 * 2**20, **split}
    write_golden(tmp_path, old)
    training = session(tmp_path, {**old, "peak_kv_cache_bytes": 0}).check(CASE)
    assert training.verdict is Verdict.PASS, outcome_message(training)
    served = session(tmp_path, {**old, "peak_batch_bytes": 2**20, "peak_kv_cache_bytes": 2 * 2**20}).check(CASE)
    assert served.verdict is Verdict.REGRESSION
    assert {r.metric for r in served.changes} == {"peak_kv_cache_bytes", "peak_batch_bytes"}


VMEM = ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out of memory in memory space vmem while allocating on "
        "stack for %f.1 = f32[32768,128]{1,0:T(8,128)} custom-call(%x_ref.1), custom_call_target=\"tpu_custom_call\", "
        "metadata={op_name=\"jit(f)/pallas_call\" stack_frame_id=3}. Scoped allocation with size 32.00M and limit 16.00M "
        "exceeded scoped vmem limit by 16.00M.")


@pytest.mark.parametrize("error, status", [
    (OutOfMemory(OOM, overflow=overflow_of(OOM)), 2),
    (OutOfMemorySpace(VMEM, overflow=overflow_of(VMEM)), 2),
    (WorkerCrashed("the v5e compile process died with SIGSEGV", signal_name="SIGSEGV"), 3),
    (KeyError("vocab_size"), 2),
])
def test_aotcheck_compile_fails_as_the_gate_does_in_its_words(monkeypatch, capsys, tmp_path, error, status):
    """One classification (failure_of) and one wording (outcome_message): `aotcheck compile`'s line is the gate's."""
    import aotcheck.cli as cli

    seen = []

    class FailingMeasurer:  # FAKE: the compile worker, raising what a real one raises.
        def __init__(self, **options):
            pass

        def __call__(self, case):
            seen.append(case)
            raise error

        def close(self):
            pass

    monkeypatch.setattr(cli, "Measurer", FailingMeasurer)
    assert cli.main(["compile", "lm-tiny", "--topology", "v5e-4", "--method", "prefill"]) == status
    stderr = capsys.readouterr().err
    gate = GateSession(GateSettings.parse(rootdir=tmp_path, topologies=["v5e-4"], cache_dir=None),
                       measure=fake_measure(error)).check(seen[0])
    assert stderr == f"aotcheck: error: {outcome_message(gate)}\n"
    assert "RESOURCE_EXHAUSTED" not in stderr  # Worded from the record, never XLA's text.


def test_aotcheck_compile_leaves_its_own_errors_to_say_themselves(monkeypatch, capsys):
    import aotcheck.cli as cli
    from aotcheck.errors import ConfigError

    class FailingMeasurer:  # FAKE: a worker that finds the config wrong.
        def __init__(self, **options):
            pass

        def __call__(self, case):
            raise ConfigError("Mesh shape (3,) does not fit 4 devices")

        def close(self):
            pass

    monkeypatch.setattr(cli, "Measurer", FailingMeasurer)
    assert cli.main(["compile", "lm-tiny", "--topology", "v5e-4", "--method", "prefill"]) == 2
    assert capsys.readouterr().err == "aotcheck: error: Mesh shape (3,) does not fit 4 devices\n"
