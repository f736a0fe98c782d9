"""Issue 31, "Hardening round 3": bad input, as a user writes it, refused before any compile with an
error that names the input and the fix, through the real front ends (a pytest subprocess for the
plugin, ``python -m aotcheck`` for the CLI). Every run here ends before a compile: the plugin's runs
use ``cpu-N`` targets (no compile worker starts before the settings are checked) or ``--collect-only``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aotcheck.gate.compare import parse_tolerances
from aotcheck.pipeline.measurement import figure_names
from aotcheck.targets.topology import MAX_CPU_DEVICES, Target, TopologyError
from toy import CONFTEST, INI, run

REPO = Path(__file__).resolve().parents[2]


def no_traceback(text):
    assert "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]


def aotcheck(*args, cwd, env=None, timeout=180):
    """``python -m aotcheck`` as a user runs it, in ``cwd``; aotcheck importable from this checkout."""
    environ = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "aotcheck", *args], cwd=cwd, capture_output=True, text=True,
                          env=environ, timeout=timeout)


@pytest.fixture
def toy_project(pytester):
    """The toy config (a FunctionConfig: no knobs but the batch's), and a model config offering a knob ``seq``."""
    pytester.makeconftest(CONFTEST + KNOBBED)
    return pytester


KNOBBED = '''
import dataclasses
from aotcheck.models import lm

aotcheck.register("knobbed", lambda: lm.trainer_config(lm.TINY, eval_step=None, knobs={"seq": aotcheck.Knob(
    lm.TINY.seq_len, lambda n: lm.trainer_config(dataclasses.replace(lm.TINY, seq_len=n)), step=128)}))
'''


def usage_error(pytester, ini, *args):
    """The plugin's usage error (pytest's exit status 4) for these ini lines and arguments: its stderr."""
    pytester.makeini(INI + ini + "\n")
    result = run(pytester, *args)
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:] + err[-2000:]
    no_traceback(err + result.stdout.str())
    return err


def accepted(pytester, ini, *args):
    """The run is no usage error: its settings were taken (collect-only: nothing compiles)."""
    pytester.makeini(INI + ini + "\n")
    result = run(pytester, "--collect-only", *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
    return result


# --- 1. fit_upper: 0 (read as no cap), negative, below the configured batch ----------------------------

CAPPED = '''
import os
import aotcheck
from aotcheck.models import lm

aotcheck.register("capped", lambda: lm.trainer_config(lm.TINY, fit="batch", fit_upper=int(os.environ["CAP"]),
                                                     eval_step=None))
'''


@pytest.mark.parametrize("cap,words", [
    ("0", "TrainerConfig.fit_upper=0: the fit search's cap must be a size >= 1 (0 would be read as no cap at all, "
          "a search of minutes); give the largest batch to try, e.g. fit_upper=256, or None for the default"),
    ("-4", "TrainerConfig.fit_upper=-4: the fit search's cap must be a size >= 1 (a negative cap would stop the "
           "search at once, reporting the configured batch)"),
    ("8", "TrainerConfig.fit_upper=8 is below the configured batch (32): the search would stop at once and report "
          "32 as the largest that fits. Give a cap >= 32, e.g. fit_upper=256"),
])
@pytest.mark.heavy
def test_fit_upper_out_of_bounds_is_refused_by_aotcheck_fit(tmp_path, cap, words):
    """Without the check, 0 ran a search of minutes (the timeout fails it) and -4 or 8 reported the
    configured batch as the largest that fits (exit 0)."""
    (tmp_path / "capped.py").write_text(CAPPED)
    out = aotcheck("fit", "capped", "--topology", "cpu-2", "--module", "capped.py", cwd=tmp_path, env={"CAP": cap})
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Building config 'capped' failed: ConfigError: " + words in out.stderr, out.stderr
    no_traceback(out.stderr)


def test_a_fit_upper_below_a_functions_batch_knob_is_refused():
    """docs/configs.md tells a function to name its batch knob ``batch``; a cap below its size was taken (the
    answer: the configured size, with '1.0x room')."""
    from aotcheck import ConfigError, FunctionConfig, Knob

    program = lambda mesh, target, size: (lambda x: x, ())  # noqa: E731  (never built: the config is refused first)
    with pytest.raises(ConfigError, match=r"FunctionConfig.fit_upper=8 is below the configured batch \(32\)"):
        FunctionConfig(make_program=lambda mesh, target: program(mesh, target, 32), fit="batch", fit_upper=8,
                       knobs={"batch": Knob(32, program)})
    kept = FunctionConfig(make_program=lambda mesh, target: program(mesh, target, 32), fit="batch",
                          fit_upper=64, knobs={"batch": Knob(32, program)})
    assert kept.fit_upper == 64


def test_a_fit_upper_at_or_above_the_batch_is_kept():
    from aotcheck.models import lm

    assert lm.trainer_config(lm.TINY, fit="batch", fit_upper=32).fit_upper == 32
    assert [c.fit_upper for c in lm.gate_configs(lm.TINY, fit_upper=8)] == [8 * lm.TINY.batch, 8 * lm.TINY.decode_batch]


# --- 2. a tolerance glob that matches no figure: fit_max_<typo> too ------------------------------------

@pytest.mark.heavy
def test_a_fit_max_typo_is_a_usage_error_naming_the_line_and_the_closest_figure(toy_project):
    err = usage_error(toy_project, "aot_tolerances = fit_max_batchh = 5%", "--aot-topologies=cpu-2")
    assert "aot_tolerances: 'fit_max_batchh' in 'fit_max_batchh = 5%' matches no figure, so it would tolerate " \
           "nothing;" in err, err
    assert "the closest is fit_max_batch: did you mean 'fit_max_batch = 5%'?" in err, err
    assert "fit_max_seq" in err  # The knobs the registered configs offer are figures too.


@pytest.mark.heavy
def test_a_misspelt_figure_names_the_closest(toy_project):
    err = usage_error(toy_project, "aot_tolerances = peak_params_byte = 1%", "--aot-topologies=cpu-2")
    assert "'peak_params_byte' in 'peak_params_byte = 1%' matches no figure" in err
    assert "the closest is peak_params_bytes: did you mean 'peak_params_bytes = 1%'?" in err, err


@pytest.mark.heavy
def test_fit_max_lines_for_knobs_the_configs_offer_are_accepted(toy_project):
    accepted(toy_project, "aot_tolerances =\n    fit_max_batch = 5%\n    fit_max_seq = 10%\n    fit_max_* = 3%",
             "--aot-topologies=cpu-2")


@pytest.mark.heavy
def test_the_cli_refuses_a_fit_max_typo_too(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\naot_tolerances = fit_max_batchh = 5%\n")
    out = aotcheck("check", "--topologies", "cpu-2", cwd=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "aotcheck: error: aot_tolerances: 'fit_max_batchh' in 'fit_max_batchh = 5%' matches no figure" in out.stderr
    assert "did you mean 'fit_max_batch = 5%'?" in out.stderr


# --- 3. a floor in time units for seconds figures; a unit of the wrong kind ------------------------------

def test_time_units_floor_seconds_figures(toy_project):
    """docs/figures.md writes the compile-cost tolerance `400% + 10 s`: written so, it is taken."""
    accepted(toy_project, "aot_tolerances =\n    *_cpu_seconds = 400% + 10 s\n    lower_cpu_seconds = 100% + 2min",
             "--aot-topologies=cpu-2")
    tolerances = dict(parse_tolerances(["*_cpu_seconds = 400% + 10s", "lower_cpu_seconds = 1% + 1.5min",
                                        "compile_cpu_seconds = 1% + 500ms"], known=figure_names()))
    assert (tolerances["*_cpu_seconds"].abs, tolerances["lower_cpu_seconds"].abs,
            tolerances["compile_cpu_seconds"].abs) == (10.0, 90.0, 0.5)


@pytest.mark.parametrize("line,words", [
    ("compile_cpu_seconds = 1% + 1MiB", "'MiB' in 'compile_cpu_seconds = 1% + 1MiB' is a unit of bytes, but "
     "'compile_cpu_seconds' matches seconds figures (compile_cpu_seconds): give a seconds figure's floor in s, ms "
     "or min"),
    ("peak_bytes = 1% + 10s", "'s' in 'peak_bytes = 1% + 10s' is a unit of time, but 'peak_bytes' matches bytes "
     "figures (peak_bytes): give a bytes figure's floor in B, KiB, MiB, GiB, TiB"),
    ("*_cpu_seconds = 400% + 1m", "'m' in '*_cpu_seconds = 400% + 1m' is a multiplier (a power of 1000), not a "
     "unit of time"),
])
@pytest.mark.heavy
def test_a_unit_of_the_wrong_kind_is_a_usage_error(toy_project, line, words):
    err = usage_error(toy_project, f"aot_tolerances = {line}", "--aot-topologies=cpu-2")
    assert f"aot_tolerances: {words}" in err, err


# --- 4. a bad value is named as the user wrote it: the ini key, or the flag ----------------------------

@pytest.mark.parametrize("ini,args,words", [
    ("aot_slices = x", [], "aot_slices: 'x' is not a slice count; give integers >= 1, e.g. aot_slices = 1,2"),
    ("aot_slices = 1", ["--aot-slices=x"], "--aot-slices: 'x' is not a slice count; give integers >= 1, "
     "e.g. --aot-slices=1,2"),
    ("aot_fit = max batch", [], "aot_fit: 'max batch' is not a knob name; name what to search on every config, "
     "e.g. aot_fit = batch"),
    ("aot_libtpu_init_args = --xla_a=1 ,--xla_b=2", [], "aot_libtpu_init_args: ',--xla_b=2' is not a flag"),
    ("aot_topologies = v9-8", [], "aot_topologies: Unknown topology 'v9-8'"),
])
@pytest.mark.heavy
def test_the_plugin_names_an_ini_value_by_its_ini_key(toy_project, ini, args, words):
    """Before, each was said under the plugin's flag (--aot-slices: 'x' ...), which the user never wrote."""
    err = usage_error(toy_project, ini, *args, *([] if "aot_topologies" in ini else ["--aot-topologies=cpu-2"]))
    assert words in err, err


@pytest.mark.parametrize("ini,args,words", [
    ("aot_slices = x", [], "aotcheck: error: aot_slices: 'x' is not a slice count; give integers >= 1, "
     "e.g. aot_slices = 1,2"),
    ("aot_slices = 1", ["--slices", "x"], "aotcheck: error: --slices: 'x' is not a slice count"),
    ("aot_topologies = v9-8", [], "aotcheck: error: aot_topologies: Unknown topology 'v9-8'"),
    ("aot_default_options = off", ["--topologies", "cpu-2"], "aotcheck: error: aot_default_options: 'off' must be "
     "'aotcheck'"),
])
@pytest.mark.heavy
def test_the_cli_names_an_ini_value_by_its_ini_key(tmp_path, ini, args, words):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\n{ini}\n")
    topologies = [] if "aot_topologies" in ini or "--topologies" in args else ["--topologies", "cpu-2"]
    out = aotcheck("check", *topologies, *args, cwd=tmp_path)
    assert out.returncode == 2 and words in out.stderr, out.stdout[-2000:] + out.stderr[-2000:]


# --- 5. --libtpu-init-args FLAGS with a space: argparse's error, with the spelling it takes --------------

@pytest.mark.parametrize("command", [["compile", "lm-tiny", "--topology", "v4-8"], ["fit", "lm-tiny", "--topology", "v4-8"],
                                     ["check", "--topologies", "v4-8"]])
@pytest.mark.heavy
def test_launch_flags_after_a_space_get_the_spelling_that_works(tmp_path, command):
    out = aotcheck(*command, "--libtpu-init-args", "--xla_tpu_scoped_vmem_limit_kib=98304",
                   "--xla_tpu_enable_latency_hiding_scheduler=true", cwd=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "argument --libtpu-init-args: expected one argument; argparse reads a value that starts with -- as an " \
           "option of its own: use --libtpu-init-args='--xla_tpu_scoped_vmem_limit_kib=98304 " \
           "--xla_tpu_enable_latency_hiding_scheduler=true'" in out.stderr, out.stderr


# --- 6. aotcheck init --topologies: each name checked before anything is written ------------------------

@pytest.mark.parametrize("topologies,words", [
    ("v9-9,h100-3", "aotcheck init writes nothing: --topologies: 'v9-9' is not a target aotcheck compiles for. "
     "Unknown topology 'v9-9'. Closest valid names: v5p-8"),
    ("v5e-16,h100-3", "aotcheck init writes nothing: --topologies: 'h100-3' is not a target aotcheck compiles for. "
     "Unknown topology 'h100-3': h100 targets are h100-1, h100-2, h100-4, h100-8"),
    ("v5e-17x2", "'v5e-17x2' is not a target aotcheck compiles for. Unknown topology 'v5e-17'. Closest valid names: "
     "v5e-8, v5e-16, v5e-32."),
    ("cpu-4096", "'cpu-4096' is not a target aotcheck compiles for. cpu-4096 asks for 4096 host CPU devices; aotcheck "
     "compiles for at most 2048"),
])
@pytest.mark.heavy
def test_init_refuses_an_unknown_topology_and_writes_nothing(tmp_path, topologies, words):
    out = aotcheck("init", "--model", "jax", "--topologies", topologies, cwd=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert words in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []
    no_traceback(out.stderr)


# --- 7. cpu-N past what XLA's CPU backend compiles for ----------------------------------------------------

@pytest.mark.heavy
def test_cpu_topologies_are_capped_at_what_xla_compiles_for(toy_project, tmp_path):
    err = usage_error(toy_project, "", "--aot-topologies=cpu-4096")
    assert "--aot-topologies: cpu-4096 asks for 4096 host CPU devices; aotcheck compiles for at most 2048 " \
           "(cpu-2048, over all slices)" in err, err
    err = usage_error(toy_project, "", "--aot-topologies=cpu-1024", "--aot-slices=4")
    assert "cpu-1024x4 asks for 4096 host CPU devices; aotcheck compiles for at most 2048" in err, err
    out = aotcheck("compile", "lm-tiny", "--topology", "cpu-2049", cwd=tmp_path)
    assert out.returncode == 2 and "cpu-2049 asks for 2049 host CPU devices" in out.stderr, out.stderr
    assert Target.of(f"cpu-{MAX_CPU_DEVICES}").num_devices == 2048
    with pytest.raises(TopologyError, match="at most 2048"):
        Target.of("cpu-4", 1024)


# --- 8. a GPU size past one domain, with slices: the one spelling every front end takes ------------------

@pytest.mark.heavy
def test_a_gpu_domain_multiple_with_slices_names_the_spelling_each_front_end_takes(toy_project, tmp_path):
    err = usage_error(toy_project, "", "--aot-topologies=a100-16x2")
    assert "--aot-topologies: a100-16x2 asks for 2 x a100-16, and a100-16 is already 2 x a100-8" in err, err
    for said in ("write a100-8x4", "--aot-topologies=a100-8x4", "ini aot_topologies = a100-8x4",
                 "--topology a100-8x4", "--aot-slices=4", "ini aot_slices = 4", "--slices 4",
                 "topology_num_slices=4"):
        assert said in err, (said, err)
    assert "pass num_slices" not in err
    out = aotcheck("compile", "lm-tiny", "--topology", "h100-16x3", cwd=tmp_path)
    assert out.returncode == 2 and "that is 6 x h100-8; write h100-8x6" in out.stderr, out.stderr
    assert "pass num_slices" not in out.stderr
