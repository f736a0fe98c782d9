"""The plugin, run for real: pytest in a subprocess, real libtpu compiles of a toy config.

The toy is a jitted ``tanh(x @ w)`` whose width the ``edit_toy`` fixture sets, so a test
can grow its memory between two runs the way an edited config would.
"""

import json
import shutil
import xml.etree.ElementTree as ET

import pytest

from toy import CONFTEST, INI, golden, plant_stale, run, without_noisy

from aotcheck._runtime import toolchain


def test_without_topologies_the_plugin_adds_nothing(project):
    result = run(project)
    result.assert_outcomes(passed=1)
    assert "aotcheck:" not in result.stdout.str() and "aotcheck summary" not in result.stdout.str()


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_update_creates_then_passes_then_leaves_alone(project):
    result = run(project, "--aot-topologies=v4-8", "--update-golden")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*1 created, 0 changed, 0 unchanged*"])
    doc = json.loads(golden(project).read_text())
    assert doc["case"] == "toy/step@v4-8x1" and isinstance(doc["figures"]["peak_bytes"], int)
    assert doc["toolchain"]["libtpu"] and "xla_tpu_enable_latency_hiding_scheduler" in doc["compiler_options"]
    before = golden(project).read_text()

    result = run(project, "--aot-topologies=v4-8")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*toy/step@v4-8x1*pass*"])

    result = run(project, "--aot-topologies=v4-8", "--update-golden")
    result.stdout.fnmatch_lines(["*0 created, 0 changed, 1 unchanged*"])
    assert golden(project).read_text() == before


@pytest.mark.heavy  # A real run of 15 s or more.
def test_growth_fails_with_a_table_and_the_accept_command(project, edit_toy):
    run(project, "--aot-topologies=v4-8", "--update-golden").assert_outcomes(passed=2)
    before = golden(project).read_text()
    edit_toy(width=1024)
    result = run(project, "--aot-topologies=v4-8")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*toy/step@v4-8x1 regressed against*",
        "*metric*golden*now*change*%*tolerance*status*",
        "*argument_bytes*regression*",
        "*To accept the new figures: pytest --update-golden --aot-case=toy/step@v4-8x1",
    ])
    assert golden(project).read_text() == before  # Never rewritten without --update-golden.
    result = run(project, "--aot-topologies=v4-8", "--update-golden")
    result.stdout.fnmatch_lines(["*0 created, 1 changed, 0 unchanged*"])
    run(project, "--aot-topologies=v4-8").assert_outcomes(passed=2)


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_improvement_passes_with_a_note_and_fails_when_strict(project, edit_toy):
    edit_toy(width=1024)
    run(project, "--aot-topologies=v4-8", "--update-golden")
    edit_toy(width=256)
    result = run(project, "--aot-topologies=v4-8")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["note: toy/step@v4-8x1 improved beyond tolerance*", "*improvement*"])
    run(project, "--aot-topologies=v4-8", "--aot-strict").assert_outcomes(passed=1, failed=1)


def test_missing_golden_says_how_to_create_it(project):
    result = run(project, "--aot-topologies=v5e-16x2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*toy/step@v5e-16x2 has no golden file*",
        "*To create it: pytest --update-golden --aot-case=toy/step@v5e-16x2*",
    ])


@pytest.mark.parametrize(
    "text,complaint",
    [("{not json", "is not valid JSON"),
     pytest.param('{"figures": {}, "toolchain": {}}', "has no 'compiler_options' key", marks=pytest.mark.heavy),
     pytest.param('{"figures": {"peak_bytes": "big"}, "toolchain": {}, "compiler_options": {}}',
                  "figure 'peak_bytes' must be a number", marks=pytest.mark.heavy)],  # One kind in the default run.
    ids=["invalid-json", "missing-key", "wrong-type"],
)
def test_corrupt_golden_fails_naming_the_file_and_is_kept(project, text, complaint):
    path = golden(project)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    result = run(project, "--aot-topologies=v4-8")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*Golden file {path}*{complaint}*"])
    assert path.read_text() == text
    run(project, "--aot-topologies=v4-8", "--update-golden").assert_outcomes(passed=2)
    assert json.loads(path.read_text())["figures"]["peak_bytes"] > 0


@pytest.mark.heavy
def test_stale_goldens_reported_not_when_deselected_and_removed_only_unfiltered(project):
    run(project, "--aot-topologies=v4-8", "--update-golden")
    stale = plant_stale(project)

    result = run(project, "--aot-topologies=v4-8", "-k", "nothing_matches_this")
    result.stdout.fnmatch_lines(["*1 stale golden file(s) with no registered case: gone/step@v4-8x1.json*"])
    assert "toy/step" not in result.stdout.str().split("stale golden")[1]  # deselected is not stale

    result = run(project, "--aot-topologies=v5e-16")  # v4-8's golden did not run: not stale either
    assert "toy/step@v4-8x1.json" not in result.stdout.str().split("stale golden")[1]

    run(project, "--aot-topologies=v4-8", "--update-golden", "-k", "plain")
    assert stale.exists()  # A filtered update removes nothing.
    run(project, "--aot-topologies=v4-8", "--update-golden", "--aot-configs=toy")
    assert stale.exists()  # Nor one naming its configs, all registered now or not (hardening round 5, V85).
    result = run(project, "--aot-topologies=v4-8", "--update-golden")
    result.stdout.fnmatch_lines(["*removed stale golden gone/step@v4-8x1.json*"])
    assert not stale.exists() and golden(project).exists()


@pytest.mark.heavy
def test_xdist_gives_the_same_verdicts_figures_and_files(project):
    run(project, "--aot-topologies=v4-8,v5e-16", "--aot-slices=1,2", "--update-golden", "-n", "2")
    files = {p.name: without_noisy(p.read_text()) for p in (project.path / "golden").rglob("*.json")}
    assert len(files) == 4
    shutil.rmtree(project.path / "golden")
    run(project, "--aot-topologies=v4-8,v5e-16", "--aot-slices=1,2", "--update-golden", "-n", "0")
    # Each update compiles afresh: every figure equal but the measured seconds.
    assert files == {p.name: without_noisy(p.read_text()) for p in (project.path / "golden").rglob("*.json")}

    reports = {}
    for n in ("0", "2"):
        out = project.path / f"report-{n}.json"
        result = run(project, "--aot-topologies=v4-8,v5e-16", "--aot-slices=1,2", "-n", n, f"--aot-report={out}")
        result.assert_outcomes(passed=5)
        result.stdout.fnmatch_lines(["*aotcheck summary*", "*toy/step@v5e-16x2*pass*"])
        reports[n] = {c["case"]: (c["verdict"], c["measured"]["figures"]) for c in json.loads(out.read_text())["cases"]}
    assert reports["0"] == reports["2"] and len(reports["0"]) == 4


def test_ids_select_with_k(project):
    result = run(project, "--aot-topologies=v4-8,v5e-16", "--aot-slices=1,2", "--collect-only", "-q", "-k", "v5e")
    result.stdout.fnmatch_lines(["aotcheck::toy/step@v5e-16x1", "aotcheck::toy/step@v5e-16x2"])
    assert "v4-8" not in result.stdout.str()


def test_usage_errors(project, tmp_path):
    result = run(project, "--aot-topologies=v5e-17")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--aot-topologies: Unknown topology 'v5e-17'. Closest valid names: v5e-8, v5e-16*"])
    result = run(project, "--aot-topologies=v4-8", "--aot-slices=1,two")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--aot-slices: 'two' is not a slice count*"])
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run(project, "--aot-topologies=v4-8", "--update-golden", f"--aot-golden-dir={blocker}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*golden directory {blocker} is a file, not a directory; --update-golden writes*"])


def test_skips_compile_errors_builder_errors_and_junit(project, edit_toy):
    edit_toy(extras=True)
    xml = project.path / "junit.xml"
    result = run(project, "--aot-topologies=v5e-4", "--update-golden", f"--junitxml={xml}", "-rs")
    result.assert_outcomes(passed=2, failed=2, skipped=1)
    result.stdout.fnmatch_lines([
        "*Building config 'broken' failed: RuntimeError: the builder fell over*",
        "*oom/step@v5e-4x1 does not fit: XLA needs 48.00 GiB for HLO temporaries of the 15.75 GiB HBM a device can use on v5e-4: 305%*",
        "*big needs at least 8 devices; v5e-4x1 has 4*",
    ])
    assert not golden(project, "oom/step@v5e-4x1.json").exists()
    properties = {p.get("name"): p.get("value") for p in ET.parse(xml).iter("property")}
    assert int(properties["aotcheck.peak_bytes"]) > 0
    assert json.loads(properties["aotcheck"])["case"] == "toy/step@v5e-4x1"


@pytest.mark.heavy  # A real run of 7 s (2 cores): the default run's budget keeps one of its kind.
def test_foreign_toolchain_is_named_in_the_header(project):
    run(project, "--aot-topologies=v4-8", "--update-golden")
    doc = json.loads(golden(project).read_text())
    doc["toolchain"]["libtpu"] = "0.0.1"
    doc["figures"]["argument_bytes"] //= 4
    golden(project).write_text(json.dumps(doc))
    result = run(project, "--aot-topologies=v4-8")
    result.stdout.fnmatch_lines([
        "*1 golden file(s) were made with another toolchain (toy/step@v4-8x1.json*libtpu 0.0.1*",
        "*toy/step@v4-8x1 regressed*",
        f"*Note: golden made with another toolchain (libtpu 0.0.1 -> {toolchain()['libtpu']})*",
        "*toolchain upgrade: 1 case(s) judged against goldens made with jax *, libtpu 0.0.1; now jax *"
        "1 moved, 0 did not.*",
        "*case*figure*golden*now*change*",
        "toy/step@v4-8x1*argument_bytes*",
        "*To accept the new toolchain's figures for all of them: pytest --update-golden --aot-configs=toy "
        "--aot-topologies=v4-8x1",
    ])


@pytest.mark.heavy
def test_a_partition_change_moves_the_collectives_and_is_caught(project, edit_toy):
    edit_toy(lm="fsdp")
    run(project, "--aot-topologies=v4-8", "--aot-configs=lm", "--update-golden").assert_outcomes(passed=2)
    edit_toy(lm="replicated")
    result = run(project, "--aot-topologies=v4-8", "--aot-configs=lm")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*lm/train_step@v4-8x1 regressed*", "*argument_bytes*regression*",
                                 "*Collectives that moved: *all-gather bytes -*: * fewer all-gathers*"])


def test_over_the_hbm_headroom_fails_in_plain_words(project):
    project.makeini(INI + "aot_hbm_headroom = 0.00001\n")
    result = run(project, "--aot-topologies=v5e-4", "--update-golden")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*toy/step@v5e-4x1 does not fit: it needs * of 16.00 GiB HBM per device on v5e-4: 0%"
                                 " (headroom 0% allows *)*"])
    assert not golden(project, "toy/step@v5e-4x1.json").exists()
    project.makeini(INI + "aot_hbm_headroom = 2\n")
    assert run(project, "--aot-topologies=v5e-4").ret == pytest.ExitCode.USAGE_ERROR


def test_configs_from_ini_modules(pytester):
    pytester.makepyfile(**{"more_configs": CONFTEST.replace('"toy"', '"from-module"')})
    pytester.makeini(INI + "aot_config_modules = more_configs\n")
    result = run(pytester, "--aot-topologies=v4-8", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["aotcheck::from-module/step@v4-8x1"])
    pytester.makeini(INI + "aot_config_modules = no_such_module\n")
    result = run(pytester, "--aot-topologies=v4-8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*aot_config_modules: Importing config module 'no_such_module' failed*"])


def test_host_cpu_topologies_need_no_libtpu_and_no_hbm(project):
    result = run(project, "--aot-topologies=cpu-4x2", "--update-golden")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*toy/step@cpu-4x2*-*created*"])
    assert json.loads(golden(project, "toy/step@cpu-4x2.json").read_text())["figures"]["flops"] > 0


DEPLOYED = """

@aotcheck.register("served")
def served():
    return aotcheck.FunctionConfig(fn=lambda x, w: jnp.tanh(x @ w), make_args=make_args, targets=("cpu-4x2",))
"""


def test_a_config_that_names_its_target_is_compiled_there_and_the_header_says_so(project):
    """Issue 54: one main-job command. ``served`` names its target (cpu-4x2); a run over cpu-2 compiles it
    there too, says so before the first case, and skips it on the run's own target, saying why."""
    project.makeconftest(CONFTEST + DEPLOYED)
    result = run(project, "--aot-topologies=cpu-2", "--aot-configs=served", "--update-golden")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["aotcheck: served also on cpu-4x2: the targets it declares (its targets=), "
                                 "whatever --aot-topologies lists"])
    result.stdout.fnmatch_lines(["*served/step@cpu-4x2*-*created*"])
    assert json.loads(golden(project, "served/step@cpu-4x2.json").read_text())["case"] == "served/step@cpu-4x2"


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_no_libtpu_noise_reaches_the_terminal(project, monkeypatch):
    # Every process here would otherwise print libtpu's start-up errors: pytest's, each xdist worker's
    # (a plain test touching a jax array starts jax's backends) and the compile workers.
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)  # Set by this process's own aotcheck import.
    project.makepyfile(test_jax="import jax.numpy as jnp\n\n\ndef test_jax():\n    assert float(jnp.ones(3).sum()) == 3\n")
    result = run(project, "-n", "2", "--aot-topologies=v4-8,v5e-4", "--update-golden")
    result.assert_outcomes(passed=4)
    out = result.stdout.str() + result.stderr.str()
    for noise in ("E0000", "W0000", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "Source Location Trace",
                  "InitGoogle", "libtpu_init_utils", "unexpected worker hostname"):
        assert noise not in out, out


@pytest.mark.heavy  # A real run of 7 s (2 cores): the default run's budget keeps one of its kind.
def test_launch_flags_with_presets_off_are_exactly_what_is_sent(project):
    project.makeini(INI + "aot_libtpu_init_args = --xla_tpu_scoped_vmem_limit_kib=65536 --megascale_port=8471\n"
                          "aot_default_options = none\n")
    result = run(project, "--aot-topologies=v5e-4", "--update-golden")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["aotcheck: your launch flags: --xla_tpu_scoped_vmem_limit_kib=65536 "
                                 "(1 runtime-only dropped); aotcheck's presets off (aot_default_options = none)"])
    doc = json.loads(golden(project, "toy/step@v5e-4x1.json").read_text())
    assert doc["compiler_options"] == {"xla_tpu_scoped_vmem_limit_kib": "65536"}
    # The command line's flags win over the ini's; with the presets back, both are sent.
    project.makeini(INI + "aot_libtpu_init_args = --xla_tpu_scoped_vmem_limit_kib=65536\n")
    run(project, "--aot-topologies=v5e-4", "--update-golden",
        "--aot-libtpu-init-args=--xla_tpu_scoped_vmem_limit_kib=32768").assert_outcomes(passed=2)
    options = json.loads(golden(project, "toy/step@v5e-4x1.json").read_text())["compiler_options"]
    assert options["xla_tpu_scoped_vmem_limit_kib"] == "32768"
    assert options["xla_tpu_enable_latency_hiding_scheduler"] == "true"
