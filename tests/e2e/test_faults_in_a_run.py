"""Faults inside a run (a config that crashes its worker, raises, or cannot be written; a golden or a
cache entry that is broken or wrong): each fails its own case with a one-paragraph message, or is a
note, and the rest of the run is checked. Real pytest runs, real compiles.
"""

import json
import os
import subprocess
import sys

import pytest
from faults import no_aotcheck_traceback
from toy import INI, golden, run

from aotcheck.pipeline.measurement import COST_FIGURES


def test_crashes_and_user_errors_fail_only_their_case(faults):
    report = faults.path / "report.json"
    result = run(faults, "--aot-topologies=v4-8", "--update-golden", f"--aot-report={report}", "--aot-no-cache")
    # The crashes do not take the session down: the healthy toy case after them still passes.
    result.assert_outcomes(passed=1, failed=8)
    out = result.stdout.str()
    for lines in (
        ["*segv/step@v4-8x1 crashed: the v4 compile process died with SIGSEGV (signal 11) while compiling "
         "segv/step@v4-8x1. Its last lines:", "*about to die by segv", "*SIGSEGV*received by PID*"],
        ["*oomkilled/step@v4-8x1 crashed: the v4 compile process died with SIGKILL (signal 9) while compiling "
         "oomkilled/step@v4-8x1 (SIGKILL: most likely the host's OOM killer or a memory limit; this host has *GiB "
         "of memory; the compile needs more host memory than it had*"],
        ["*abort/step@v4-8x1 crashed: the v4 compile process died with SIGABRT (signal 6)*",
         "*about to die by abort", "*SIGABRT received by PID*"],
        ["*typeerror/step@v4-8x1: TypeError while building or lowering it: dot_general requires contracting "
         "dimensions to have the same shape*"],
        # The cause named, not "a newer libtpu may fix it": the job's own flag would kill its start-up.
        ["*smallvmem/step@v4-8x1 crashed: the v4 compile process died with SIGABRT*",
         "*max_vmem_kib > 0*", "It compiled with --xla_tpu_scoped_vmem_limit_kib=1024, below v4's default of 16384 "
         "KiB: libtpu dies compiling*Raise the limit, or leave it unset for the chip's default."],
        ["*keyerror/step@v4-8x1: KeyError while building or lowering it: logits*"],
        # A ValueError of the user's own is named by its class, as any other class their code raises.
        ["*badargs/step@v4-8x1: ValueError while building or lowering it: make_args does not like this mesh*"],
        ["*badmesh/step@v4-8x1: Mesh shape (3,)*"],
        ["*aotcheck summary*"],
    ):
        result.stdout.fnmatch_lines(lines)
    assert "coredump_hook" not in out.split("aotcheck summary")[0].split("Its last lines:")[1].split("A crash of")[0]
    no_aotcheck_traceback(out)
    # The crash handler's stack goes to the report, not the terminal (no captured-output section).
    assert "Captured stderr" not in out and "FailureSignalHandler" not in out + result.stderr.str(), out[-3000:]
    cases = {c["case"]: c for c in json.loads(report.read_text())["cases"]}
    log = "\n".join(cases["segv/step@v4-8x1"]["error"]["log"])
    assert "about to die by segv" in log and "FailureSignalHandler" in log and "coredump_hook" in log, log[-2000:]
    assert cases["smallvmem/step@v4-8x1"]["error"]["fields"]["small_vmem_limit"] == {"kib": 1024, "default_kib": 16384}
    assert cases["segv/step@v4-8x1"]["verdict"] == "crashed" and cases["abort/step@v4-8x1"]["verdict"] == "crashed"
    assert cases["toy/step@v4-8x1"]["verdict"] == "accepted" and cases["toy/step@v4-8x1"]["measured"]["host_peak_bytes"] > 2**20
    assert {cases[c]["verdict"] for c in ("typeerror/step@v4-8x1", "keyerror/step@v4-8x1")} == {"error"}
    assert golden(faults).exists() and not golden(faults, "segv/step@v4-8x1.json").exists()


def test_the_cli_reports_a_crash_and_user_errors(faults):
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "segv", "--topology", "v4-8"],
                         cwd=faults.path, capture_output=True, text=True)
    assert out.returncode == 3
    assert "aotcheck: error: segv/step@v4-8x1 crashed: the v4 compile process died with SIGSEGV (signal 11)" in out.stderr
    assert "about to die by segv" in out.stderr
    no_aotcheck_traceback(out.stderr)
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "keyerror", "--topology", "v4-8"],
                         cwd=faults.path, capture_output=True, text=True)
    assert out.returncode == 2
    assert "aotcheck: error: keyerror/step@v4-8x1: KeyError while building or lowering it: logits" in out.stderr
    no_aotcheck_traceback(out.stderr)


@pytest.mark.parametrize("layout,verdict,words", [
    ("golden-dir-is-a-file", "error", "cannot write its golden file"),
    ("config-dir-is-a-file", "error", "cannot write its golden file"),
])
def test_unwritable_golden_paths_fail_the_case_not_the_session(faults, layout, verdict, words):
    faults.makeini(INI + "filterwarnings = error\n")
    if layout == "golden-dir-is-a-file":
        target = faults.path / "golden-file"
        target.mkdir()
        (target / "toy").write_text("")  # golden-file/toy should be a directory
        args = [f"--aot-golden-dir={target.name}"]
    else:
        (faults.path / "golden").mkdir()
        (faults.path / "golden" / "toy").write_text("")
        args = []
    result = run(faults, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden", "--aot-no-cache", *args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*toy/step@v4-8x1: {words}*"])
    no_aotcheck_traceback(result.stdout.str())


GOLDEN_FAULTS = [
    ("{not json", "corrupt-golden", "is not valid JSON"),
    ("[]", "corrupt-golden", "must hold a JSON object"),
    ('{"figures": {}, "toolchain": {}}', "corrupt-golden", "has no 'compiler_options' key"),
    ('{"figures": [], "toolchain": {}, "compiler_options": {}}', "corrupt-golden", "'figures' must be an object"),
    ('{"figures": {"peak_bytes": "big"}, "toolchain": {}, "compiler_options": {}}', "corrupt-golden",
     "figure 'peak_bytes' must be a number"),
    ('{"figures": {"peak_bytes": true}, "toolchain": {}, "compiler_options": {}}', "corrupt-golden",
     "figure 'peak_bytes' must be a number"),
    ('{"figures": {}, "toolchain": {}, "compiler_options": {}, "details": "x"}', "corrupt-golden",
     "its 'details' (peak buffers, collectives) cannot be read"),
    ('{"figures": {}, "toolchain": {}, "compiler_options": {}, "details": {"peak_buffers": [{"bytes": 1}]}}',
     "corrupt-golden", "its 'details' (peak buffers, collectives) cannot be read (KeyError"),
    ('{"figures": {"peak_bytes": NaN}, "toolchain": {}, "compiler_options": {}}', "corrupt-golden",
     "figure 'peak_bytes' is nan; figures are finite and never negative, so this golden is corrupt"),
    ('{"case": "toy/step@v5e-16x1", "figures": {}, "toolchain": {}, "compiler_options": {}}', "corrupt-golden",
     "holds the figures of 'toy/step@v5e-16x1', not of 'toy/step@v4-8x1'. Regenerate it with --update-golden."),
    ('{"case": "Toy/step@v4-8x1", "figures": {}, "toolchain": {}, "compiler_options": {}}', "corrupt-golden",
     "not of 'toy/step@v4-8x1' (their names differ only in letter case, and this filesystem keeps one file for both"),
    ('{"figures": {}, "toolchain": {}, "compiler_options": {}}', "corrupt-golden", "names no case (it should hold 'toy/step@v4-8x1')"),
    ("DIRECTORY", "corrupt-golden", "is a directory, not a golden file: remove it"),  # Not "fix its permissions".
    ("\udcff", "corrupt-golden", "is not UTF-8 text. Remove it, then regenerate it"),
]


@pytest.mark.heavy
def test_broken_golden_files_fail_their_case_and_are_left_alone(faults):
    run(faults, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden").assert_outcomes(passed=1)
    path = golden(faults)
    for text, verdict, words in GOLDEN_FAULTS:
        if path.is_dir():
            path.rmdir()
        if text == "DIRECTORY":
            path.unlink()
            path.mkdir()
        elif text == "\udcff":
            path.write_bytes(b"\xff\xfe\x00 not utf-8")
        else:
            path.write_text(text)
        result = run(faults, "--aot-topologies=v4-8", "--aot-configs=toy")
        result.assert_outcomes(failed=1)
        assert words in result.stdout.str(), (text, result.stdout.str()[-1500:])
        assert "To replace it: pytest --update-golden --aot-case=toy/step@v4-8x1" in result.stdout.str()
        no_aotcheck_traceback(result.stdout.str())
        if text not in ("DIRECTORY", "\udcff"):
            assert path.read_text() == text  # Never rewritten without --update-golden.


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_metrics_missing_or_extra_in_the_golden_are_never_silent(faults):
    run(faults, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden").assert_outcomes(passed=1)
    doc = json.loads(golden(faults).read_text())
    del doc["figures"]["flops"]
    doc["figures"]["figure_from_the_future"] = 1
    golden(faults).write_text(json.dumps(doc))
    result = run(faults, "--aot-topologies=v4-8", "--aot-configs=toy")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*toy/step@v4-8x1: its figures and its golden's (*) differ in names:*",
        "*figure_from_the_future: in the golden, no longer produced*",
        "*flops: new, not in the golden*",
        "*accept the new set: pytest --update-golden --aot-case=toy/step@v4-8x1*",
    ])
    faults.makeini(INI + "aot_metric_drift = warn\n")
    result = run(faults, "--aot-topologies=v4-8", "--aot-configs=toy")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*warning: toy/step@v4-8x1: its figures and its golden's*",
                                 "*These figures are not checked (aot_metric_drift = warn).*"])


def program_figures_of(path):
    """A golden's document less its compile-cost figures: CPU seconds differ between two compiles."""
    doc = json.loads(path.read_text())
    assert all(doc["figures"].pop(name) > 0 for name in COST_FIGURES)
    return doc


@pytest.mark.heavy
def test_plausible_but_wrong_cache_entries_are_recompiled_never_copied(faults):
    cache = faults.path / "cache"
    run(faults, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden", f"--aot-cache-dir={cache}")
    right = program_figures_of(golden(faults))
    entry = next(cache.rglob("*.json"))
    good = json.loads(entry.read_text())
    for wrong in (
        {**good, "figures": {**good["figures"], "peak_bytes": "1"}},  # not a number
        {**good, "figures": {k: v for k, v in good["figures"].items() if k != "temp_bytes"}},  # incomplete
        {**good, "figures_version": good["figures_version"] - 1},  # older figure code
        {**good, "toolchain": {**good["toolchain"], "libtpu": "0.0.1"}},  # another compiler
        {**good, "figures": {**good["figures"], "peak_bytes": 5}},  # its classes sum to far more
        {**good, "figures": {**good["figures"], "flops": float("nan")}},  # NaN: every comparison passes
        {**good, "details": {"peak_buffers": [{"bytes": 1}]}},  # details that cannot be read back
        {**good, "details": "corrupt"},
        {**good, "attribution_problem": "the dump did not fit"},  # an unsplit peak: a fresh compile may split it
    ):
        entry.write_text(json.dumps(wrong))
        golden(faults).unlink()
        result = run(faults, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden", f"--aot-cache-dir={cache}")
        result.assert_outcomes(passed=1)
        assert "cached" not in result.stdout.str().split("aotcheck summary")[1]  # Recompiled...
        assert program_figures_of(golden(faults)) == right  # ...and the golden has the true figures.


def test_an_unwritable_cache_is_a_note_even_under_filterwarnings_error(faults):
    faults.makeini(INI + "filterwarnings = error\n")
    (faults.path / "not-a-dir").write_text("")
    result = run(faults, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden",
                 "--aot-cache-dir=not-a-dir")
    result.assert_outcomes(passed=1)
    assert result.stdout.str().count("is not writable; running uncached") == 1
    no_aotcheck_traceback(result.stdout.str())


def test_files_are_written_with_the_users_umask(faults):
    old = os.umask(0o022)
    try:
        run(faults, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden", "--aot-report=r.json",
            "--aot-cache-dir=cache")
    finally:
        os.umask(old)
    for path in (golden(faults), faults.path / "r.json", next((faults.path / "cache").rglob("*.json"))):
        assert path.stat().st_mode & 0o777 == 0o644, path


def test_a_missing_golden_under_another_golden_dir_names_it_in_the_accept_command(faults):
    result = run(faults, "--aot-topologies=v4-8", "--aot-configs=toy", "--aot-golden-dir=other")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*To create it: pytest --update-golden --aot-case=toy/step@v4-8x1 "
                                 "--aot-golden-dir=other"])


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_a_cache_that_fails_mid_run_is_noted_once_even_under_xdist(faults):
    # The cache directory is writable (the start-up probe passes), but every entry's
    # subdirectory is taken by a file, so each write fails in the compile workers: the note
    # travels with the case to the controller, and is said once.
    cache = faults.path / "cache"
    cache.mkdir()
    for i in range(256):
        (cache / f"{i:02x}").write_text("")
    result = run(faults, "--aot-topologies=v4-8,v5e-16", "--aot-configs=toy", "--update-golden",
                 f"--aot-cache-dir={cache}", "-n", "2")
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count(f"the figures cache {cache} is not writable") == 1, result.stdout.str()[-2000:]
    no_aotcheck_traceback(result.stdout.str())
