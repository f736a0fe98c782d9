"""Bad command lines and ini files, as a new user writes them: a pytest usage error, or ``aotcheck``'s
exit status 2 with one line, naming the input and the fix; never a traceback of aotcheck's own code.
Usage errors are decided before any compile, so these runs are quick.
"""

import json
from pathlib import Path

import pytest
from faults import no_aotcheck_traceback
from toy import CONFTEST, INI, run

from aotcheck import cli
from aotcheck.gate.shard import ShardError
from aotcheck.pipeline.case import Case


# pytest's command line and the ini file: usage errors naming the input --------------------------------------

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
    (["--aot-topologies=v4-8", "--aot-cache-url=ftp://host/cache"], "",
     "--aot-cache-url: 'ftp://host/cache' is not a store aotcheck reads: give gs://BUCKET/PATH, s3://BUCKET/PATH"),
    (["--aot-topologies=v4-8"], "aot_cache_url = gs://bucket/aot",
     "aot_cache_url: 'gs://bucket/aot': a gs:// store is read through fsspec's gcsfs, which is not installed: "
     "pip install gcsfs"),
    (["--aot-topologies=v4-8", "--aot-cache-url=s3://b/aot", "--aot-cache-dir="], "",
     "--aot-cache-url: a shared cache sits behind the local one, and --aot-cache-dir is empty"),
    (["--aot-topologies=v4-8", "--aot-cache-url=s3://b/aot", "--aot-cache-mode=write"], "", "--aot-cache-mode"),
    (["--aot-topologies=v4-8", "--aot-cache-url=s3://AKIAX:topsecret@b/aot"], "",  # Never echoed (tested below too).
     "--aot-cache-url: 's3://***@b/aot' holds credentials, and aotcheck takes none from a URL"),
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
    (["--aot-topologies=v4-8", "-o", "aot_hbm_headrom=0.000001"], "",  # The same typo given with pytest's -o.
     "pytest -o: aot_hbm_headrom is not an aotcheck setting, so nothing reads it; did you mean aot_hbm_headroom?"),
    (["-o", "aot_topology=v4-8"], "", "pytest -o: aot_topology is not an aotcheck setting"),
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
    # Hardening round 5 (V67, V68, V71): hyphens, a missing underscore or capitals switched the check off;
    # a flag given as an ini key was "did you mean aot_strict?".
    (["--aot-topologies=v4-8"], "aot-hbm-headroom = 0.000001",
     "aot-hbm-headroom is not an aotcheck setting, so nothing reads it; write it aot_hbm_headroom"),
    (["--aot-topologies=v4-8"], "aothbm_headroom = 0.000001",
     "aothbm_headroom is not an aotcheck setting, so nothing reads it; write it aot_hbm_headroom"),
    (["--aot-topologies=v4-8"], "AOT_HBM_HEADROOM = 0.000001", "AOT_HBM_HEADROOM is not an aotcheck setting, so "
     "nothing reads it; write it aot_hbm_headroom"),
    (["--aot-topologies=v4-8"], "aot_shard = 1/2", "aot_shard is not an aotcheck setting, so nothing reads it; the "
     "shard is given per run, on the command line: --aot-shard (pytest), --shard (aotcheck check)"),
    (["--aot-topologies=v4-8"], "aot_update_golden = true", "aot_update_golden is not an aotcheck setting, so nothing "
     "reads it; the update is given per run, on the command line: --update-golden (pytest)"),
    # T27: a letter pasted from a document was "fixed" by itself.
    (["--aot-topologies=v4-8", "--aot-libtpu-init-args=--xla_tp\u00fc=1"], "",
     "--aot-libtpu-init-args: '--xla_tp\u00fc=1' is not a flag; a flag's name is ASCII letters, digits and _ ('\u00fc' is none"),
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


def test_credentials_in_a_cache_url_are_refused_and_never_printed(usage_project):
    usage_project.makeini(INI + "aot_cache_url = s3://AKIAX:topsecret@bucket/aot\n")
    result = run(usage_project, "--aot-topologies=v4-8", "--aot-report=r.json", "--junitxml=j.xml")
    said = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "AWS_SECRET_ACCESS_KEY" in said
    assert "topsecret" not in said and "AKIAX" not in said
    assert not any("topsecret" in p.read_text() for p in usage_project.path.rglob("*.xml"))


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
    # No heap of 10,000 entries; past 256 shards, jobs of 40 shards are dealt first (gate.shard.job_layout).
    assert sorted(assign_shards(cases, 10_000).values()) == [1, 41]


def test_launch_flags_of_100000_digits_are_shown_by_their_ends(usage_project):
    usage_project.makeini(INI + "\n")
    result = run(usage_project, "--aot-topologies=v4-8", "--co", f"--aot-libtpu-init-args=--xla_tpu_rwb_fusion_limit={BIG}")
    lines = result.stdout.str().splitlines()
    assert max(map(len, lines)) < 1000 and any(line.startswith("aotcheck: your launch flags: --xla_tpu_rwb_fusion_"
                                                                "limit=999") for line in lines), lines[:5]
    # The scoped VMEM limit of as many digits is refused (no core holds it), its value clipped in the error.
    refused = run(usage_project, "--aot-topologies=v4-8", "--co", f"--aot-libtpu-init-args=--xla_tpu_scoped_vmem_limit_kib={BIG}")
    err = refused.stderr.str()
    assert refused.ret == 4 and "is not a count of KiB" in err and max(map(len, err.splitlines())) < 1000, err[:2000]


def test_turning_the_gate_off_is_explicit_and_said(usage_project):
    usage_project.makeini(INI + "aot_topologies = v4-8\n")
    usage_project.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = run(usage_project, "--aot-topologies=none")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["aotcheck: off for this run (--aot-topologies=none)"])


# The command line tool: exit status 2 and one line naming the input -----------------------------------------

def measured(figures):
    return {"case": "lm/p@v4-8x1", "figures": figures, "compiler_options": {}, "compile_seconds": 1.0}


def report_doc(**overrides):
    case = {"case": "lm/prefill@v4-8x1", "verdict": "pass"}
    return {"aotcheck_report": 3, "cases": [case], **overrides}


CLI = [
    # Hardening round 5, V16: an empty mode silently meant readwrite.
    (["check", "--cache-mode", "", "--topologies", "v4-8"], "--cache-mode is given empty; give 'readwrite' (answer "
     "from the shared cache and add what this run compiles) or 'read'"),
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
    (["check", "--topologies", "v4-8", "--cache-url", "bucket/aot"], "--cache-url: 'bucket/aot' is not a store"),
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
    assert code == 2 and words in err, (code, err)  # docs/getting-started.md: "exits ... 2 on bad input".
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


@pytest.mark.parametrize("value", ["abc", "1.5", "0", "-1"])
def test_a_memory_share_in_the_environment_no_process_runs_with_is_refused_by_name(tmp_path, monkeypatch, capsys, value):
    """Hardening round 5, V47/V48: 'abc' printed jax's traceback, then "install aotcheck[cuda]"; 1.5, 0 and -1
    fell back to the default without a word."""
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", value)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["check", "--topologies", "h100-8"])
    err = capsys.readouterr().err
    assert code == 2 and f"XLA_PYTHON_CLIENT_MEM_FRACTION={value!r} (in the environment) is not a share of a GPU's " \
        "memory: give a number in (0, 1]" in err and "Traceback" not in err, err


def test_a_value_after_a_space_that_reads_as_an_option_names_the_fix(capsys):
    """Hardening round 5, V30: `--shard -1/4` got argparse's bare "expected one argument"."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["check", "--shard", "-1/4"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.strip().splitlines()[-1] == (
        "python -m aotcheck: error: --shard -1/4: write --shard=-1/4 (given after a space, '-1/4' reads as an option "
        "of its own); --shard is K/N, 1 <= K <= N, e.g. --shard=1/4"), err


@pytest.mark.parametrize("kib", ["0x10000", "100000000000", "0", ""])
def test_a_scoped_vmem_limit_libtpu_would_not_read_as_meant_is_refused_with_the_flag(capsys, kib):
    """Hardening round 5, V63/V64: 0x10000 got Python's "invalid literal"; 93 TiB was accepted."""
    code = cli.main(["check", "--topologies", "v5e-16", f"--libtpu-init-args=--xla_tpu_scoped_vmem_limit_kib={kib}"])
    err = capsys.readouterr().err
    assert code == 2 and f"--xla_tpu_scoped_vmem_limit_kib={kib} is not a count of KiB; give the limit in decimal " \
        "KiB, 1 to 1048576" in err, err
