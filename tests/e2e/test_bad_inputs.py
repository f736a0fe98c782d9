"""A sweep of bad inputs and faults, as a new user meets them. Each asserts the exact class of
outcome: a usage error naming the input, a failed case with a one-paragraph message, or a warning;
never a traceback of aotcheck's own code. Real pytest runs and real processes throughout (usage
errors are decided before any compile, so those runs are quick).
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aotcheck import cli
from aotcheck.pipeline.measurement import COST_FIGURES
from aotcheck.gate.shard import ShardError
from aotcheck.pipeline.case import Case
from toy import CONFTEST, INI, golden, plant_stale, run

AOTCHECK_SOURCE = str(Path(cli.__file__).resolve().parent)


def no_aotcheck_traceback(text):
    assert "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]


# --- 1. The command line and the ini file: pytest usage errors naming the input --------------------

USAGE = [
    # (command-line arguments, ini lines, words the error must contain)
    (["--aot-topologies=v5e-17"], "", "--aot-topologies: Unknown topology 'v5e-17'. Closest valid names: v5e-8, v5e-16"),
    (["--aot-topologies=v9-8"], "", "--aot-topologies: Unknown topology 'v9-8'"),
    (["--aot-topologies=tpu-8"], "", "Valid families: v4-N, v5p-N, v5e-N, v6e-N, 7x-N"),
    (["--aot-topologies=v4-8x0"], "", "The number of slices must be >= 1, got 0"),
    (["--aot-topologies=cpu-0"], "", "Unknown topology 'cpu-0'"),
    (["--aot-topologies="], "", "--aot-topologies is empty ('' names no topology). To turn the gate off for this run, say so: --aot-topologies=none"),
    (["--aot-topologies", ""], "", "--aot-topologies is empty"),
    (["--aot-topologies=,"], "aot_topologies = v4-8", "--aot-topologies is empty (',' names no topology)"),
    (["--aot-topologies= "], "", "--aot-topologies is empty"),
    ([], "aot_topologies = ,", "is empty (',' names no topology): name topologies (e.g. aot_topologies = v4-8 v5e-16)"),
    (["--aot-topologies=v4-8", "--aot-slices=0"], "", "--aot-slices: '0' is not a slice count"),
    (["--aot-topologies=v4-8x1000000"], "", "--aot-topologies: 1000000 slices is more than aotcheck compiles for (at most 1024;"),
    (["--aot-topologies=v4-8x99999999999999999999"], "", "99999999999999999999 slices is more than aotcheck compiles for"),
    (["--aot-topologies=v4-8", "--aot-slices=2000"], "", "--aot-slices: 2000 slices is more than aotcheck compiles for"),
    (["--aot-topologies=v5p-17920x8"], "", "v5p-17920x8 has 71680 devices, more than aotcheck compiles for (at most 65536"),
    (["--aot-topologies=v4-8", "--aot-configs=tooy"], "",
     "nothing to check: no registered config matches --aot-configs=tooy (registered: toy); to run without the gate, "
     "say so: --aot-topologies=none"),
    ([], "aot_topologies = v4-8\naot_configs = nothing-*", "no registered config matches --aot-configs=nothing-*"),
    (["--aot-topologies=v4-8"], "aot_tolerances = peak_byte = 0%",
     "aot_tolerances: 'peak_byte' in 'peak_byte = 0%' matches no figure, so it would tolerate nothing; figures are: "
     "alias_bytes, argument_bytes,"),
    (["--aot-topologies=v4-8"], "aot_tolerances =\n    peak_* = 1%\n    Flops = 1%", "'Flops' in 'Flops = 1%' matches no figure"),
    (["--aot-topologies=v4-8", "--aot-slices=two"], "", "--aot-slices: 'two' is not a slice count"),
    (["--aot-topologies=v4-8", "--aot-slices=-1"], "", "--aot-slices: '-1' is not a slice count"),
    (["--aot-topologies=v4-8", "--aot-slices=1.5"], "", "--aot-slices: '1.5' is not a slice count"),
    (["--aot-topologies=v4-8", "--aot-shard=3/2"], "", "--aot-shard: '3/2': K must be between 1 and N"),
    (["--aot-topologies=v4-8", "--aot-shard=0/2"], "", "--aot-shard: '0/2': K must be between 1 and N"),
    (["--aot-topologies=v4-8", "--aot-shard=1/0"], "", "--aot-shard: '1/0'"),
    (["--aot-topologies=v4-8", "--aot-shard=a/b"], "", "--aot-shard: 'a/b' is not K/N"),
    (["--aot-topologies=v4-8", "--aot-shard=2"], "", "--aot-shard: '2' is not K/N"),
    (["--aot-topologies=v4-8", "--aot-golden-dir", "golden"], "", "write --aot-golden-dir=golden"),
    (["--aot-topologies=v4-8", "--aot-cache-dir", "cache"], "", "write --aot-cache-dir=cache"),
    (["--aot-topologies=v4-8", "--aot-report", "r.json"], "", "write --aot-report=r.json"),
    (["--aot-topologies=v4-8", "--aot-report=."], "", "--aot-report: . is a directory; give a file path"),
    (["--aot-topologies=v4-8", "--aot-report=adir"], "", "--aot-report: adir is a directory"),
    (["--aot-topologies=v4-8", "--aot-report=afile/r.json"], "", "--aot-report: afile/r.json lies under a file"),
    (["--aot-topologies=v4-8", "--update-golden", "--aot-golden-dir=afile"], "", "golden directory"),
    (["--aot-topologies=v4-8"], "aot_hbm_headroom = 2", "aot_hbm_headroom: '2' must be a number in (0, 1]"),
    (["--aot-topologies=v4-8"], "aot_hbm_headroom = lots", "aot_hbm_headroom: 'lots' must be a number in (0, 1]"),
    (["--aot-topologies=v4-8"], "aot_hbm_headroom = 0", "aot_hbm_headroom: '0' must be a number"),
    (["--aot-topologies=v4-8"], "aot_tolerances = peak_bytes is big", "aot_tolerances: Cannot parse tolerance"),
    (["--aot-topologies=v4-8"], "aot_tolerances = peak_bytes = 1% + 3 parsecs", "Unknown unit 'parsecs'"),
    (["--aot-topologies=v4-8"], "aot_tolerances = = 1%", "aot_tolerances: Cannot parse tolerance"),
    (["--aot-topologies=v4-8"], "aot_config_modules = no_such_module",
     "aot_config_modules: Importing config module 'no_such_module' failed: ModuleNotFoundError"),
    (["--aot-topologies=v4-8"], "aot_config_modules = missing.py", "missing.py does not exist"),
    (["--aot-topologies=v4-8"], "aot_config_modules = raising", "Importing config module 'raising' failed: RuntimeError: boom"),
    (["--aot-topologies=v4-8"], "aot_metric_drift = maybe", "aot_metric_drift: 'maybe' must be 'fail'"),
    (["--aot-topologies=v4-8"], "aot_strict = maybe", "invalid truth value 'maybe'"),  # pytest's own check
    (["--aot-topologies=v4-8", "--aot-fit=3x"], "", "--aot-fit: '3x' is not a knob name; name what to search"),
    (["--aot-topologies=v4-8"], "aot_fit = max batch", "aot_fit: 'max batch' is not a knob name"),
    (["--aot-topologies=v4-8", "--aot-libtpu-init-args=xla_tpu_foo=1"], "",
     "--aot-libtpu-init-args: 'xla_tpu_foo=1' is not a flag; write it as libtpu reads flags, --xla_tpu_foo=1"),
    (["--aot-topologies=v4-8"], "aot_libtpu_init_args = --xla_a=1 ,--xla_b=2",
     "aot_libtpu_init_args: ',--xla_b=2' is not a flag; each flag is --name=value, separated by spaces"),
    (["--aot-topologies=v4-8"], "aot_libtpu_init_args = --xla_a='1'", "aot_libtpu_init_args: \"--xla_a='1'\" keeps its quotes"),
    (["--aot-topologies=v4-8"], "aot_default_options = off",
     "aot_default_options: 'off' must be 'aotcheck' (aotcheck's per-chip presets under your options) or 'none'"),
    # A misspelt key would switch its check off without a word (the headroom, the gate itself).
    (["--aot-topologies=v4-8"], "aot_hbm_headrom = 0.000001",
     "aot_hbm_headrom is not an aotcheck setting, so nothing reads it; did you mean aot_hbm_headroom?"),
    (["--aot-topologies=v4-8", "--aot-fit=btach"], "",
     "--aot-fit=btach: no selected case offers a knob named 'btach', so the fit search would run on nothing; no "
     "registered config offers a knob"),
    (["--aot-topologies=v4-8"], "aot_fit = seq_len", "aot_fit = seq_len: no selected case offers a knob named 'seq_len'"),  # Was named --aot-fit.
    ([], "aot_topology = v4-8", "aot_topology is not an aotcheck setting, so nothing reads it; did you mean aot_topologies?"),
    (["--aot-topologies=none"], "AOT_Strict = true", "AOT_Strict is not an aotcheck setting"),
    # Hardening round 4: given twice, the last won without a word; launch flags after a space were pytest's
    # "expected one argument".
    (["--aot-topologies=v4-8", "--aot-topologies", "v5e-16"], "",
     "--aot-topologies is given 2 times; give it once (its last value would win without a word)"),
    (["--aot-topologies=v4-8", "--aot-fit=batch", "--aot-fit=seq"], "", "--aot-fit is given 2 times"),
    (["--aot-topologies=v4-8", "--aot-libtpu-init-args", "--xla_tpu_scoped_vmem_limit_kib=65536"], "",
     "--aot-libtpu-init-args needs its value after '=': --aot-libtpu-init-args=--xla_tpu_scoped_vmem_limit_kib=65536 "
     "(given after a space, pytest reads '--xla_tpu_scoped_vmem_limit_kib=65536' as an option of its own"),
    (["--aot-topologies=v4-8", "--aot-libtpu-init-args"], "", "--aot-libtpu-init-args needs its value after '='"),
    (["--aot-topologies=v4-8"], "addopts = --aot-libtpu-init-args", "--aot-libtpu-init-args needs its value after '='"),
    (["--aot-topologies=v4-8", "--aot-slices=\u00b2"], "", "--aot-slices: '\u00b2' is not a slice count"),  # isdigit()'s.
    (["--aot-topologies=v4-8"], "aot_zzzz = 1", "aot_zzzz is not an aotcheck setting, so nothing reads it; aotcheck reads "),
]


@pytest.fixture
def usage_project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(raising="raise RuntimeError('boom')\n")
    (pytester.path / "adir").mkdir()
    (pytester.path / "afile").write_text("")
    return pytester


@pytest.mark.parametrize("args,ini,words", USAGE, ids=[" ".join(a) + (f" [{i}]" if i else "") for a, i, _ in USAGE])
def test_usage_errors_name_the_input(usage_project, args, ini, words):
    usage_project.makeini(INI + ini + "\n")
    result = run(usage_project, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    assert words in result.stderr.str(), result.stderr.str()[-2000:]
    no_aotcheck_traceback(result.stderr.str() + result.stdout.str())


BIG = "9" * 100_000


@pytest.mark.parametrize("args", [["--aot-topologies=v4-8", f"--aot-fit=a{BIG}"],
                                  ["--aot-topologies=v4-8", f"--aot-configs={BIG}"],
                                  ["--aot-topologies=v4-8", f"--aot-slices={BIG}"],  # Was an INTERNALERROR.
                                  [f"--aot-topologies=v4-8x{BIG}"], [f"--aot-topologies=v4-{BIG}"],
                                  ["--aot-topologies=v4-8", f"--aot-shard=1/{BIG}"]],  # Was killed for memory.
                         ids=["fit", "configs", "slices", "topology-slices", "topology-size", "shard"])
def test_a_value_of_100000_digits_is_shown_by_its_ends(usage_project, args):
    """Hardening round 4 (from round 3): a 100,000-digit value was echoed as a 200 KB line; read as a
    count, Python refused it (an INTERNALERROR) or a shard count filled the memory."""
    usage_project.makeini(INI + "\n")
    result = run(usage_project, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = (result.stderr.str() + result.stdout.str()).splitlines()
    assert max(map(len, lines)) < 1000 and any("characters)" in line or "is more than" in line for line in lines), \
        [line[:200] for line in lines]


def test_a_shard_count_past_any_ci_is_refused_and_a_large_one_costs_nothing():
    from aotcheck.gate.shard import assign_shards, parse_shard

    with pytest.raises(ShardError, match=r"'1/1000000000': 1,000,000,000 shards is more than a CI matrix runs"):
        parse_shard("1/1000000000")
    cases = [Case.of("lm", p, "v4-8") for p in ("a", "b")]
    assert sorted(assign_shards(cases, 10_000).values()) == [1, 2]  # No heap of 10,000 entries.


def test_launch_flags_of_100000_digits_are_shown_by_their_ends(usage_project):
    usage_project.makeini(INI + "\n")
    result = run(usage_project, "--aot-topologies=v4-8", "--co", f"--aot-libtpu-init-args=--xla_tpu_scoped_vmem_limit_kib={BIG}")
    lines = result.stdout.str().splitlines()
    assert max(map(len, lines)) < 1000 and any(line.startswith("aotcheck: your launch flags: --xla_tpu_scoped_vmem_limit_"
                                                                "kib=999") for line in lines), lines[:5]


def test_turning_the_gate_off_is_explicit_and_said(usage_project):
    usage_project.makeini(INI + "aot_topologies = v4-8\n")
    usage_project.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = run(usage_project, "--aot-topologies=none")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["aotcheck: off for this run (--aot-topologies=none)"])


# --- 2. Faults in a run: each fails its own case (or warns), the rest are checked --------------------

FAULTS = CONFTEST + '''
import signal, sys

def crash_while_tracing(kind):
    def fn(x, w):
        print(f"about to die by {kind}", file=sys.stderr, flush=True)
        if kind == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if kind == "kill":  # What the host's OOM killer sends.
            os.kill(os.getpid(), signal.SIGKILL)
        os.abort()
    return fn

aotcheck.register("segv", aotcheck.FunctionConfig(fn=crash_while_tracing("segv"), make_args=make_args))
aotcheck.register("abort", aotcheck.FunctionConfig(fn=crash_while_tracing("abort"), make_args=make_args))
aotcheck.register("oomkilled", aotcheck.FunctionConfig(fn=crash_while_tracing("kill"), make_args=make_args))
aotcheck.register("typeerror", aotcheck.FunctionConfig(fn=lambda x, w: x @ x, make_args=make_args))
aotcheck.register("keyerror", aotcheck.FunctionConfig(fn=lambda x, w: {}["logits"], make_args=make_args))

def bad_args(mesh):
    raise ValueError("make_args does not like this mesh")

aotcheck.register("badargs", aotcheck.FunctionConfig(fn=lambda x: x, make_args=bad_args))
aotcheck.register("badmesh", aotcheck.FunctionConfig(fn=lambda x, w: x @ w, make_args=make_args,
                                                     mesh=aotcheck.MeshSpec(("data",), (3,))))
'''


@pytest.fixture
def faults(project):
    """The toy project (tests/conftest.py) with configs that fail in every way FAULTS lists."""
    project.makeconftest(FAULTS)
    (project.path / "test_plain.py").unlink()
    return project


def test_crashes_and_user_errors_fail_only_their_case(faults):
    report = faults.path / "report.json"
    result = run(faults, "--aot-topologies=v4-8", "--update-golden", f"--aot-report={report}", "--aot-no-cache")
    # The crashes do not take the session down: the healthy toy case after them still passes.
    result.assert_outcomes(passed=1, failed=7)
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
    assert cases["segv/step@v4-8x1"]["verdict"] == "crashed" and cases["abort/step@v4-8x1"]["verdict"] == "crashed"
    assert cases["toy/step@v4-8x1"]["verdict"] == "accepted" and cases["toy/step@v4-8x1"]["measured"]["host_peak_bytes"] > 2**20
    assert {cases[c]["verdict"] for c in ("typeerror/step@v4-8x1", "keyerror/step@v4-8x1")} == {"error"}
    assert golden(faults).exists() and not golden(faults, "segv/step@v4-8x1.json").exists()


def test_the_cli_reports_a_crash_and_user_errors(faults):
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "segv", "--topology", "v4-8"],
                         cwd=faults.path, capture_output=True, text=True)
    assert out.returncode == 3
    assert "aotcheck: error: the v4 compile process died with SIGSEGV (signal 11)" in out.stderr
    assert "about to die by segv" in out.stderr
    no_aotcheck_traceback(out.stderr)
    out = subprocess.run([sys.executable, "-m", "aotcheck", "compile", "keyerror", "--topology", "v4-8"],
                         cwd=faults.path, capture_output=True, text=True)
    assert out.returncode == 2
    assert "aotcheck: error: KeyError while building or lowering keyerror: 'logits'" in out.stderr
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
    ("DIRECTORY", "corrupt-golden", "cannot be read"),
    ("\udcff", "corrupt-golden", "cannot be read"),
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


# --- 3. The command line tool: exit status 2 and one line naming the input ----------------------------

def measured(figures):
    return {"case": "lm/p@v4-8x1", "figures": figures, "compiler_options": {}, "compile_seconds": 1.0}


def report_doc(**overrides):
    case = {"case": "lm/prefill@v4-8x1", "verdict": "pass"}
    return {"aotcheck_report": 3, "cases": [case], **overrides}


CLI = [
    (["compile", "lm-tiny", "--topology", "v5e-17"], "Closest valid names: v5e-8, v5e-16, v5e-32"),
    (["compile", "lm-nope", "--topology", "v4-8"], "No config named 'lm-nope'; registered: eqx-tiny, esm2-8m, linen-tiny, "),
    (["compile", "lm-tiny", "--topology", "v4-8", "--slices", "0"], "The number of slices must be >= 1, got 0"),
    (["compile", "lm-tiny", "--topology", "v4-8", "--method", "nope"], "Config 'lm-tiny' has no program 'nope'"),
    (["compile", "lm-tiny", "--topology", "v4-8", "--module", "no_such_module"], "Importing config module 'no_such_module'"),
    (["fit", "lm-tiny", "--topology", "v4-8", "--knob", "seq"], "This config offers no knob 'seq'; it offers: batch"),
    (["fit", "lm-tiny", "--topology", "v4-8", "--headroom", "0"], "--headroom: 0.0 must be a number in (0, 1]"),
    (["fit", "lm-tiny", "--topology", "v4-8", "--program", "nope"], "Config 'lm-tiny' has no program 'nope'"),
    (["check", "--topologies", "v5e-17"], "--topologies: Unknown topology 'v5e-17'"),
    (["check", "--topologies", ""], "--topologies is empty"),
    (["check", "--topologies", "v4-8", "--slices", "x"], "--slices: 'x' is not a slice count"),
    (["check", "--topologies", "v4-8x5000"], "--topologies: 5000 slices is more than aotcheck compiles for"),
    (["check", "--topologies", "v4-8", "--configs", "tooy"],
     "nothing to check: no registered config matches --configs=tooy (registered: "),
    (["check", "--topologies", "v4-8", "--shard", "5/2"], "--shard: '5/2': K must be between 1 and N"),
    (["check", "--topologies", "v4-8", "--report", "."], "--report: . is a directory"),
    (["check", "--topologies", "v4-8", "--fit", "max-batch"], "--fit: 'max-batch' is not a knob name"),
    (["check", "--topologies", "v4-8", "--configs", "lm-tiny", "--fit", "btach"],
     "--fit=btach: no selected case offers a knob named 'btach', so the fit search would run on nothing; did you mean batch?"),
    (["check", "--topologies", "v4-8", "--libtpu-init-args=xla_x=1"],
     "--libtpu-init-args: 'xla_x=1' is not a flag; write it as libtpu reads flags, --xla_x=1"),
    (["check", "--topologies", "v4-8", "--default-options", "some"], "--default-options: 'some' must be 'aotcheck'"),
    (["compile", "lm-tiny", "--topology", "v4-8", "--libtpu-init-args=-xla_x"], "--libtpu-init-args: '-xla_x' is not a flag"),
    (["fit", "lm-tiny", "--topology", "v4-8", "--default-options", "off"], "--default-options: 'off' must be"),
    (["report", "missing.json"], "missing.json: not a readable JSON report"),
    (["report", "notjson.json"], "notjson.json: not a readable JSON report"),
    (["report", "format1.json"], "format1.json: not an aotcheck report of format 3 (found 1)"),
    (["report", "badverdict.json"], "badverdict.json: a case in this report is malformed (ValueError: 'bogus'"),
    (["report", "badcase.json"], "badcase.json: a case in this report is malformed (ValueError: Not a case id"),
    (["report", "badfigure.json"], "badfigure.json: case lm/p@v4-8x1: figure 'peak_bytes' must be a number, not 'big'; "
     "write the report again"),
    (["report", "nanfigure.json"], "nanfigure.json: case lm/p@v4-8x1: figure 'flops' is nan; figures are finite and "
     "never negative (in its golden)"),
    (["report", "nocases.json"], "nocases.json: its 'cases' is str, not a list; write the report again"),  # Was: not format 3 (found 3).
    (["report", "ok.json", "--output", "adir"], "adir: Is a directory"),
]


@pytest.fixture
def cli_dir(tmp_path):
    (tmp_path / "notjson.json").write_text("{oops")
    (tmp_path / "format1.json").write_text(json.dumps({"aotcheck_report": 1, "cases": []}))
    (tmp_path / "badverdict.json").write_text(json.dumps(report_doc(cases=[{"case": "lm/p@v4-8x1", "verdict": "bogus"}])))
    (tmp_path / "badfigure.json").write_text(json.dumps(report_doc(cases=[
        {"case": "lm/p@v4-8x1", "verdict": "pass", "measured": measured({"peak_bytes": "big"})}])))
    (tmp_path / "nanfigure.json").write_text(json.dumps(report_doc(cases=[
        {"case": "lm/p@v4-8x1", "verdict": "pass", "measured": measured({"flops": 1.0}),
         "golden": {"figures": {"flops": float("nan")}}}])))
    (tmp_path / "badcase.json").write_text(json.dumps(report_doc(cases=[{"case": "nonsense", "verdict": "pass"}])))
    (tmp_path / "nocases.json").write_text(json.dumps({"aotcheck_report": 3, "cases": "none"}))
    (tmp_path / "ok.json").write_text(json.dumps(report_doc()))
    (tmp_path / "adir").mkdir()
    return tmp_path


@pytest.mark.parametrize("ini_file, text", [
    ("pytest.ini", "[pytest]\naot_topologies = v4-8\naot_hbm_headrom = 0.000001\n"),
    ("tox.ini", "[pytest]\naot_topologies = v4-8\naot_hbm_headrom = 0.000001\n"),
    ("pyproject.toml", "[tool.pytest.ini_options]\naot_topologies = ['v4-8']\naot_hbm_headrom = '0.000001'\n"),
])
def test_the_cli_refuses_an_ini_key_it_does_not_read(tmp_path, monkeypatch, capsys, ini_file, text):
    """``aotcheck check`` passed with the headroom check off (the key misspelt)."""
    (tmp_path / ini_file).write_text(text)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["check"])
    err = capsys.readouterr().err
    assert code == 2 and "aot_hbm_headrom is not an aotcheck setting" in err and "aot_hbm_headroom?" in err, err
    assert ini_file in err


@pytest.mark.parametrize("args,words", CLI, ids=[" ".join(a) for a, _ in CLI])
def test_cli_bad_input_is_one_clear_line(cli_dir, args, words, capsys, monkeypatch):
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root if args[0] in ("compile", "fit") else cli_dir)
    code = cli.main(args)
    err = capsys.readouterr().err
    assert code == 2 and words in err, (code, err)  # README: "exits ... 2 on bad input".
    no_aotcheck_traceback(err)


@pytest.mark.parametrize("args, words", [(["--expect-shards", "0"], "'0' is not a count >= 1"),
                                         (["--annotations", "-1"], "'-1' is not a count >= 0"),
                                         (["--annotations", "two"], "'two' is not a count >= 0")])
def test_cli_argument_errors_are_argparse_usage(capsys, args, words):
    """``--annotations -1`` used to slice away the last failure's annotation."""
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "x.json", *args])
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("args", [["check", "--topologies", "v4-8", "--topologies=v5e-16"],
                                  ["check", "--fit", "batch", "--topologies", "v4-8", "--fit", "seq"]])
def test_cli_option_given_twice_is_a_usage_error(capsys, args):
    """Hardening round 4: the last value won without a word."""
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    flag = "--topologies" if args[1] == "--topologies" else "--fit"
    assert e.value.code == 2 and f"error: {flag} is given 2 times; give it once" in capsys.readouterr().err


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


@pytest.mark.parametrize("name,text,words", [
    ("pyproject.toml", "[tool.pytest\nx = 1\n", "pyproject.toml: cannot read it as a pytest configuration"),
    ("tox.ini", "[pytest]\naot_topologies = v4-8\naot_strict = maybe\n", "aot_strict = 'maybe' is not a boolean"),
    ("tox.ini", "[pytest]\naot_topologies = v4-8\naot_hbm_headroom = 3\n", "aot_hbm_headroom: '3' must be a number"),
    ("pytest.toml", "[pytest]\naot_topologies = ['v9-8']\n", "aot_topologies: Unknown topology 'v9-8'"),
])
def test_check_command_reads_bad_ini_files_as_clear_errors(tmp_path, monkeypatch, capsys, name, text, words):
    (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert words in err, err
    no_aotcheck_traceback(err)


# --- 4. Nothing a user wrote is lost or overwritten ---------------------------------------------------

def test_a_full_update_removes_only_goldens_aotcheck_wrote(project):
    run(project, "--aot-topologies=v4-8", "--update-golden").assert_outcomes(passed=2)
    mine = {"OWNERS.json": '{"owners": ["@ml-infra"]}\n', "toy/notes.json": '["why the peak is what it is"]\n',
            "toy/step@v5e-4x1.json": '{"figures": {"peak_bytes": 1}}\n',  # A case's name, not aotcheck's text.
            "toy/hand-made@v4-8x1.json": '{"format": 1, "case": "toy/step@v4-8x1", "figures": {}}\n'}
    for rel, text in mine.items():
        (project.path / "golden" / rel).write_text(text)
    stale = plant_stale(project)  # One aotcheck wrote, for a config that is gone.
    result = run(project, "--aot-topologies=v4-8", "--update-golden")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*removed stale golden gone/step@v4-8x1.json*"])
    assert not stale.exists() and result.stdout.str().count("stale golden") == 1, result.stdout.str()[-2000:]
    assert {rel: (project.path / "golden" / rel).read_text() for rel in mine} == mine
    no_aotcheck_traceback(result.stdout.str())


CASE_TWINS = '''
def fn(name="step"):
    return aotcheck.FunctionConfig(fn=lambda x, w: jnp.tanh(x @ w), make_args=make_args, program=name)

aotcheck.register("Toy2", fn())
aotcheck.register("toy2", fn())
aotcheck.register("twin-programs", lambda: [fn("Decode"), fn("decode")])
aotcheck.register("nothing", lambda: [])
aotcheck.register("no-methods", aotcheck.InferenceConfig(
    init_fn=lambda rng: {}, partition_rules=(), methods={}, input_batch_spec={}))
aotcheck.register("bad-program", fn("my step"))
aotcheck.register("slashed", fn("a/b"))
'''


def test_configs_that_cannot_have_a_golden_of_their_own_fail_to_build(project):
    project.makeconftest(CONFTEST + CASE_TWINS)
    result = run(project, "--aot-topologies=v4-8", "--update-golden")
    result.assert_outcomes(passed=2, failed=7)
    out = result.stdout.str()
    for words in [
        "Configs 'Toy2', 'toy2' differ only in letter case: their golden files would be one file on macOS and Windows",
        "Config 'twin-programs' defines programs 'Decode' and 'decode', which differ only in letter case",
        "Config 'nothing' built no config (its builder returned an empty list)",
        "Config 'no-methods' defines no program (an InferenceConfig with methods={})",
        "Config 'bad-program': Program name 'my step' must be non-empty, without '/', '@', '[', ']' or spaces.",
        "Config 'slashed': Program name 'a/b' must be non-empty",
    ]:
        assert words in out, (words, out[-3000:])
    assert out.count("Configs 'Toy2', 'toy2' differ only in letter case") >= 2  # Both fail: neither is the real one.
    assert sorted(p.name for p in (project.path / "golden").iterdir()) == ["toy"]
    no_aotcheck_traceback(out)


def test_the_accept_command_selects_a_config_named_with_glob_characters(project):
    project.makeconftest(CONFTEST + '\naotcheck.register("toy[v2]", aotcheck.FunctionConfig(fn=lambda x, w: x @ w, '
                         'make_args=make_args))\n')
    result = run(project, "--aot-topologies=v4-8")
    result.assert_outcomes(passed=1, failed=2)
    line = next(line for line in result.stdout.lines if line.startswith("To create it: ") and "toy[v2]" in line)
    command = shlex.split(line.split(": ", 1)[1])
    assert command[:2] == ["pytest", "--update-golden"] and "--aot-case=toy[v2]/step@v4-8x1" in command, line
    accepted = run(project, *command[1:])
    accepted.assert_outcomes(passed=2)  # toy[v2]'s case alone (not toy's), and the project's own plain test.
    assert golden(project, "toy[v2]/step@v4-8x1.json").exists() and not golden(project).exists()


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_a_golden_that_is_a_symbolic_link_is_written_through(project, tmp_path_factory, monkeypatch):
    # A golden kept elsewhere (a shared checkout) and linked in: an update writes its target, the link stays.
    elsewhere = tmp_path_factory.mktemp("shared") / "toy-step-v4-8.json"
    run(project, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden").assert_outcomes(passed=2)
    golden(project).rename(elsewhere)
    golden(project).symlink_to(elsewhere)
    run(project, "--aot-topologies=v4-8", "--aot-configs=toy").assert_outcomes(passed=2)  # Read through it.
    before = json.loads(elsewhere.read_text())["figures"]["peak_bytes"]
    monkeypatch.setenv("TOY_WIDTH", "512")
    result = run(project, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden")
    result.assert_outcomes(passed=2)
    assert golden(project).is_symlink() and golden(project).resolve() == elsewhere.resolve()
    assert json.loads(elsewhere.read_text())["figures"]["peak_bytes"] > before
    no_aotcheck_traceback(result.stdout.str())


# --- 5. The host's faults: said as the host's, never cached, never blamed on the config -----------------

def _in_tiny_tmpdir(command, *, cwd, free_kib):
    """Runs ``command`` with TMPDIR on a tmpfs of its own with ``free_kib`` left, in a user and
    mount namespace (no root needed); None where this host allows neither."""
    tmp = cwd / "tiny-tmp"
    tmp.mkdir()
    script = (f'mount -t tmpfs -o size=4m tmpfs {tmp} && head -c $((4096 - {free_kib}))K /dev/zero > {tmp}/fill '
              f'&& TMPDIR={tmp} exec "$@"')
    for prefix in (["unshare", "-rm"], ["unshare", "-m"]):
        probe = subprocess.run([*prefix, "true"], capture_output=True)
        if probe.returncode == 0:
            return subprocess.run([*prefix, "sh", "-c", script, "sh", *command], cwd=cwd, capture_output=True,
                                  text=True, timeout=600)
    return None


def test_a_full_tmpdir_is_said_as_such_and_nothing_is_cached_or_written(project):
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--aot-topologies=v4-8", "--aot-configs=toy",
               "--update-golden", "--aot-cache-dir=cache"]
    out = _in_tiny_tmpdir(command, cwd=project.path, free_kib=8)
    if out is None:
        pytest.skip("this host can make no tmpfs (no mount namespace): a full TMPDIR cannot be staged")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "toy/step@v4-8x1: the temporary directory" in out.stdout and "(TMPDIR) is out of space" in out.stdout
    assert "nothing was cached or written for this case" in out.stdout and "while building or lowering" not in out.stdout
    no_aotcheck_traceback(out.stdout + out.stderr)
    assert not golden(project).exists() and not list((project.path / "cache").rglob("*.json"))
    result = run(project, "--aot-topologies=v4-8", "--aot-configs=toy", "--update-golden", "--aot-cache-dir=cache")
    result.assert_outcomes(passed=2)  # With room again: compiled afresh, the peak split.
    assert "cached" not in result.stdout.str().split("aotcheck summary")[1]
    assert json.loads(golden(project).read_text())["figures"]["peak_temp_bytes"] >= 0


# --- 6. Interruptions: Ctrl-C and SIGTERM (CI's cancel and timeout) end a run cleanly -------------------

SLOW = '''
import time

def slow(x, w):  # Traced in the compile worker: a case that is still running when the signal comes.
    time.sleep(120)
    return x

aotcheck.register("zslow", aotcheck.FunctionConfig(fn=slow, make_args=make_args))
'''

HELD = '''
def held(x, w):  # Holds the GIL for seconds at a time, as a long C call in a trace or a compile can.
    for _ in range(100):
        sum(range(10**8))
    return x

aotcheck.register("zheld", aotcheck.FunctionConfig(fn=held, make_args=make_args))
'''


def _processes_with(marker):
    """Pids of live processes whose environment holds the variable ``AOTCHECK_TEST_RUN=<marker>`` exactly (a
    run's compile workers among them): a whole entry, so that the marker of one run is never a prefix
    matching another's running beside it (``...-pytest`` and ``...-pytest -n 2``)."""
    found = []
    entry_bytes = b"\0AOTCHECK_TEST_RUN=" + marker.encode() + b"\0"
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry_bytes in b"\0" + (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


INTERRUPTIONS = [
    # (front end, signal, to the whole process group?, exit status)
    ("pytest", signal.SIGTERM, True, pytest.ExitCode.INTERRUPTED),
    ("pytest -n 2", signal.SIGINT, True, pytest.ExitCode.INTERRUPTED),  # 14 s: in the heavy leg (below).
    ("pytest -n 2", signal.SIGTERM, True, pytest.ExitCode.INTERRUPTED),  # A CI runner's cancel.
    # In the heavy leg too: in the full default run (only there, three runs of three on 2026-12-06) the CLI did
    # not end within 60 s of this signal; alone, in its file under -n 2 and beside every unit test it passes.
    # Undiagnosed (issue 41's note): kept running where its context is the one it passes in, not skipped.
    ("cli", signal.SIGINT, True, 130),
    ("cli", signal.SIGTERM, False, 143),
]
HEAVY_INTERRUPTIONS = {("pytest -n 2", signal.SIGINT), ("cli", signal.SIGINT)}


@pytest.mark.parametrize("front,sig,group,status", [
    pytest.param(*row, id=f"{row[0]}-{row[1].name}-{'group' if row[2] else 'process'}",
                 marks=[pytest.mark.heavy] if row[:2] in HEAVY_INTERRUPTIONS else [])
    for row in INTERRUPTIONS])
def test_an_interrupted_run_keeps_what_it_finished_and_stops_its_workers(project, front, sig, group, status):
    project.makeconftest(CONFTEST + SLOW)
    tmp = project.path / "tmp"
    tmp.mkdir()
    leftover = tmp / "aotcheck-dump-999999999-left"  # A kill -9 trial's leftover: no such process.
    leftover.mkdir()
    marker = f"{project.path}-{front}"  # The full path: xdist's workers give their tests the same names.
    env = dict(os.environ, TMPDIR=str(tmp), AOTCHECK_TEST_RUN=marker)
    report = project.path / "r.json"
    if front == "cli":
        command = [sys.executable, "-m", "aotcheck", "check", "--topologies=v4-8", "--update-golden", f"--report={report}"]
    else:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--aot-topologies=v4-8", "--update-golden",
                   f"--aot-report={report}", *front.split()[1:]]
    # A session of its own, as a terminal or a CI runner starts a job: SIGINT is not ignored there.
    proc = subprocess.Popen(command, cwd=project.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not golden(project).exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert golden(project).exists(), proc.communicate()[0][-3000:]
    time.sleep(2)  # zslow is tracing now.
    (os.killpg if group else os.kill)(proc.pid, sig)
    start = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - start
    assert took < 15, (took, out[-3000:])
    assert proc.returncode == status, out[-3000:]
    assert f"aotcheck: interrupted ({sig.name}) after 1 of 2 cases: the finished ones are reported and their goldens " \
           "written; the rest did not run, and no stale golden was removed." in out, out[-3000:]
    assert "toy/step@v4-8x1" in out and "created" in out  # The summary, with the finished case.
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    cases = json.loads(report.read_text())["cases"]
    assert [c["case"] for c in cases] == ["toy/step@v4-8x1"] and golden(project).exists()
    time.sleep(1)
    assert _processes_with(marker) == [], "a compile worker outlived its run"
    assert not list(tmp.glob("aotcheck-dump-*")), list(tmp.iterdir())  # Its own dumps and the leftover removed.


def test_a_worker_whose_run_was_killed_stops_at_once(project):
    # kill -9 of the session process alone: nothing can stop its workers but themselves.
    project.makeconftest(CONFTEST + HELD)
    tmp = project.path / "tmp"
    tmp.mkdir()
    marker = f"{project.path}-orphan"
    env = dict(os.environ, TMPDIR=str(tmp), AOTCHECK_TEST_RUN=marker)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--aot-topologies=v4-8",
                             "--aot-configs=zheld"], cwd=project.path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(_processes_with(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(5)  # The worker is tracing zheld, the GIL held by one long C call after another.
    workers = [p for p in _processes_with(marker) if p != proc.pid]
    assert workers, "no compile worker started"
    proc.kill()
    killed = time.monotonic()
    proc.wait()
    # README: "stops at once". The watchdog thread alone took 1.6 to 8 s (a trace holds the GIL); the kernel's
    # parent-death signal ends it as the session ends.
    while _processes_with(marker) and time.monotonic() < killed + 5:
        time.sleep(0.05)
    assert _processes_with(marker) == [], "the orphaned worker kept running"
    assert time.monotonic() - killed < 1.0, f"the orphaned worker ran {time.monotonic() - killed:.1f} s more"
    # Its dump directories (if it had made any) go with the next run.
    subprocess.run([sys.executable, "-c", "from aotcheck import _runtime; _runtime.remove_dumps()"],
                   env=dict(os.environ, TMPDIR=str(tmp)), check=True, capture_output=True)
    assert not list(tmp.glob("aotcheck-dump-*"))


def test_a_libtpu_that_cannot_load_is_the_hosts_error_not_the_configs(project, monkeypatch):
    fake = project.path / "broken-libtpu.so"  # Not libtpu.so: Python would import that as a module "libtpu".
    fake.write_text("not a shared library\n")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(fake))
    result = run(project, "--aot-topologies=v4-8", "--aot-configs=toy", "--aot-no-cache")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert (f"toy/step@v4-8x1: libtpu could not be loaded (INTERNAL: Failed to open {fake}: {fake}: file too short); "
            f"this host's libtpu, not the config: TPU_LIBRARY_PATH={fake} points at it") in out, out[-3000:]
    assert "while building or lowering" not in out
    no_aotcheck_traceback(out)


HOG = '''
import numpy as np

def hog(x, w):  # Traced in the compile worker: more host memory than the run's memory limit allows.
    block = np.ones(4 * 2**30 // 8)
    return x * float(block[-1])

aotcheck.register("hog", aotcheck.FunctionConfig(fn=hog, make_args=make_args))
'''


def _memory_cgroup(limit_bytes):
    """A cgroup (v1 or v2) limiting memory to ``limit_bytes``, as a directory to add pids to; None where
    this host allows none (not root, no memory controller)."""
    for root, limit, swap in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
                              ("/sys/fs/cgroup", "memory.max", "memory.swap.max")):
        group = Path(root) / f"aotcheck-test-{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            (group / limit).write_text(str(limit_bytes))
            if (group / swap).exists():
                (group / swap).write_text(str(limit_bytes) if swap.startswith("memory.memsw") else "0")
            return group
        except OSError:
            if group.is_dir():
                group.rmdir()
    return None


@pytest.mark.heavy  # A real run of 15 s or more.
def test_a_worker_the_hosts_oom_killer_ends_is_a_crashed_case_said_as_such(project):
    # A real memory limit on the run (a cgroup, as a CI runner's container has): the kernel's OOM
    # killer picks the largest process, the compile worker, and the session lives to say so.
    project.makeconftest(CONFTEST + HOG)
    group = _memory_cgroup(3 * 2**30)
    if group is None:
        pytest.skip("this host gives no memory cgroup (needs root and a memory controller)")
    try:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--aot-topologies=v4-8", "--aot-no-cache",
                   "--update-golden"]
        # The shell joins the group, then becomes the run (no preexec_fn: a fork of this process, which
        # has JAX's threads, is what JAX warns about).
        out = subprocess.run(["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh", *command],
                             cwd=project.path, capture_output=True, text=True, timeout=300)
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert ("hog/step@v4-8x1 crashed: the v4 compile process died with SIGKILL (signal 9) while compiling "
            "hog/step@v4-8x1 (SIGKILL: most likely the host's OOM killer or a memory limit") in out.stdout, out.stdout[-3000:]
    assert "toy/step@v4-8x1" in out.stdout and golden(project).exists()  # The next case got a fresh worker.
    no_aotcheck_traceback(out.stdout + out.stderr)
