"""Chip families are compiled in separate processes, because libtpu carries state across them."""

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from aotcheck.targets import families
from quirks import WIDE, quirk_counts

@pytest.mark.heavy
def test_the_locked_libtpu_no_longer_carries_this_state_across_families(tmp_path):
    # Why aotcheck isolates families: with libtpu 0.0.42.1 (the oldest lock; tests/e2e/test_toolchains.py
    # checks it there) the same v4 x2 program compiled differently after a v5e compile in the same
    # process. libtpu 0.0.50.1 compiles it the same. Isolation stays: the oldest toolchain needs it, a
    # crash fails one case only, and other programs may still show state; it costs a worker start.
    counts = quirk_counts(sys.executable, tmp_path)
    assert counts["fresh"] == counts["after-v5e"], counts


@pytest.mark.heavy
def test_plugin_runs_other_families_in_their_own_process(pytester):
    pytester.makeconftest(WIDE)
    pytester.makeini("[pytest]\naot_golden_dir = golden\n")
    run = lambda *a: pytester.runpytest_subprocess("-p", "no:cacheprovider", "--aot-no-cache", *a)  # noqa: E731
    # Goldens from processes that compile one family each: what a real job sees.
    run("--aot-topologies=v4-8x2", "--update-golden").assert_outcomes(passed=1)
    run("--aot-topologies=v5e-4", "--update-golden").assert_outcomes(passed=1)
    # v5e first, then v4 x2 in the same session: still the fresh-process figures.
    result = run("--aot-topologies=v5e-4,v4-8x2", "-p", "no:randomly", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*wide/prefill@v5e-4x1 PASSED*", "*wide/prefill@v4-8x2 PASSED*"])


def test_note_family_warns_once_on_a_second_family():
    # tests/conftest.py gives each test fresh books, so this test sees only its own compiles.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        families.note_family("v4-8")
        families.note_family("v4-16")
        assert families._compiled == {"v4"}
        assert caught == []  # One family: nothing to say.
        families.note_family("v5e-4")
        assert [str(w.message) for w in caught if "now compiles for v5e" in str(w.message)] and len(caught) == 1
        families.note_family("v6e-4")  # Once is enough: a third family adds no warning.
        assert len(caught) == 1
    assert families._compiled == {"v4", "v5e", "v6e"}


@pytest.mark.heavy
def test_7x_compiles_with_the_locked_libtpu_and_passes_its_goldens(pytester):
    # libtpu 0.0.42.1 (the oldest lock) kills the compiler on lm-tiny's 7x train_step and sample_decode
    # (SIGSEGV, a stack overflow; tests/e2e/test_toolchains.py checks those crashes end as 'crashed' cases);
    # the locked libtpu compiles all three, and they pass the committed 7x goldens.
    pytester.makeconftest(
        "import aotcheck\nfrom aotcheck.models import lm\n"
        "aotcheck.register('lm-tiny', lambda: lm.gate_configs(lm.TINY, fit_upper=8))\n")  # As the repo does.
    pytester.makeini("[pytest]\naot_golden_dir = golden\n")
    repo_goldens = Path(__file__).resolve().parents[3] / "golden" / "lm-tiny"
    shutil.copytree(repo_goldens, pytester.path / "golden" / "lm-tiny")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--aot-topologies=tpu7x-8",
                                           "--aot-report=report.json")
    result.assert_outcomes(passed=4)
    verdicts = {c["case"]: c["verdict"] for c in json.loads((pytester.path / "report.json").read_text())["cases"]}
    assert verdicts == {f"lm-tiny/{p}@7x-8x1": "pass" for p in ("train_step", "eval_step", "prefill", "sample_decode")}
    result.stdout.fnmatch_lines(["*aotcheck summary*"])


def test_workers_started_early_are_stopped_when_no_selected_case_needs_them(tmp_path):
    """The front ends start the compile workers of every TPU topology before the configs are built (their
    start-up overlaps with that); once the cases are selected, a family none of them needs is stopped,
    its process gone. Real worker processes."""
    from aotcheck.pipeline.case import Case
    from aotcheck.session import GateSession
    from aotcheck.settings import GateSettings

    settings = GateSettings.parse(rootdir=tmp_path, topologies=["v4-8", "v5e-4", "cpu-2"], cache_dir=None)
    with GateSession(settings) as session:
        session.start_workers()
        workers = dict(session._measurer._workers)  # noqa: SLF001  (the processes themselves are the evidence)
        assert sorted(workers) == ["v4", "v5e"]  # cpu-N waits for prepare(), which sets its device count.
        session.prestart([Case.of("toy", "step", "v4-8")])
        assert sorted(session._measurer._workers) == ["v4"]  # noqa: SLF001
        assert workers["v5e"].proc.poll() is not None and workers["v4"].proc.poll() is None
    assert workers["v4"].proc.poll() is not None  # Closing the session stops the rest.


OWN_REGISTRY = """
import sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import aotcheck
from aotcheck.render.text import outcome_message
from aotcheck.session import GateSession
from aotcheck.settings import GateSettings, SettingsError


def double(x):
    return 2 * x


def make_args(mesh):
    return (jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)


def run(registry):
    settings = GateSettings.parse(rootdir=sys.argv[1], topologies=["cpu-2"], update=True, cache_dir=None)
    with GateSession(settings, registry=registry) as session:  # No measure=: the compile workers measure.
        session.prepare()
        return [(o.case.id, o.verdict.value, outcome_message(o).splitlines()[0]) for o in session.run().outcomes]


MINE = aotcheck.Registry()
MINE.register("built", aotcheck.FunctionConfig(fn=double, make_args=make_args))  # A config as built...
MINE.register("builder", lambda: aotcheck.FunctionConfig(fn=double, make_args=make_args))  # ... and a builder.



def hidden():
    registry = aotcheck.Registry()  # No module-level name: no worker could find it.
    registry.register("built", aotcheck.FunctionConfig(fn=double, make_args=make_args))
    return registry


if __name__ == "__main__":
    print([found[:2] for found in run(MINE)])
    try:
        run(hidden())
    except SettingsError as e:
        print("refused:", e)
    GUARDED = aotcheck.Registry()  # A module-level name, but one an import does not make.
    GUARDED.register("guarded", aotcheck.FunctionConfig(fn=double, make_args=make_args))
    print(*run(GUARDED))
"""


def test_a_registry_of_ones_own_is_measured_by_the_compile_workers(tmp_path):
    """register() finds the module of what it registers (no frame inspection); a compile worker imports it
    and finds the user's Registry there by its module-level name. Real workers, a real script."""
    script = tmp_path / "own.py"
    script.write_text(OWN_REGISTRY)
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first, refused, guarded = out.stdout.strip().splitlines()[-3:]
    guarded = eval(guarded)  # noqa: S307  (our own script's repr of a tuple)
    assert first == "[('builder/step@cpu-2x1', 'accepted'), ('built/step@cpu-2x1', 'accepted')]", out.stdout
    assert refused.startswith("refused: The compile workers cannot find this Registry"), refused
    assert "module-level name" in refused and "measure=" in refused
    assert guarded[:2] == ("guarded/step@cpu-2x1", "error"), out.stdout
    assert "found no Registry named GUARDED there" in guarded[2] and "top level" in guarded[2], guarded
    assert sorted(p.name for p in (tmp_path / "golden").iterdir()) == ["builder", "built"]


IMPORTED_MODELS = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import aotcheck


def double(x):
    return 2 * x


def make_args(mesh):
    return (jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)


def build():
    return aotcheck.FunctionConfig(fn=double, make_args=make_args)
"""

IMPORTING_CONFTEST = """
import aotcheck
import mymodels
from mymodels import build

aotcheck.register("imported", build)  # A builder defined in another module than the registration...
aotcheck.register("built", aotcheck.FunctionConfig(fn=mymodels.double, make_args=mymodels.make_args))  # ...and a built one.
"""


@pytest.mark.heavy  # A real run of 11 s or more (2 cores, -n 2).
def test_configs_registered_from_another_modules_code_reach_the_compile_workers(tmp_path):
    """register() names no caller; the compile workers import what the parent imported to register (this
    conftest), so a builder or a config whose code lives elsewhere is found there too. Real workers."""
    (tmp_path / "mymodels.py").write_text(IMPORTED_MODELS)
    (tmp_path / "conftest.py").write_text(IMPORTING_CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\naot_golden_dir = golden\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--aot-topologies=cpu-2",
                          "--update-golden"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "2 passed" in out.stdout
    assert sorted(p.name for p in (tmp_path / "golden").iterdir()) == ["built", "imported"]


def test_the_session_answers_from_the_cache_only_while_its_jax_settings_are_a_workers(tmp_path):
    """A case is answered in the session only while JAX's settings are those the registering modules left
    (a worker's): one a test module changed since would digest other inputs than the worker's. Pure logic
    over a real (empty) cache directory: no case is measured."""
    import jax

    from aotcheck.gate.isolation import Measurer
    from aotcheck.pipeline.cache import FiguresCache

    cache = FiguresCache(tmp_path)
    measurer = Measurer(cache=cache)
    assert not measurer._may_answer()  # noqa: SLF001  (a cold cache: no index yet, its cases compile)
    (tmp_path / "inputs").mkdir()
    measurer.settle()
    assert measurer._may_answer()  # noqa: SLF001
    before = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        assert not measurer._may_answer()  # noqa: SLF001
    finally:
        jax.config.update("jax_default_matmul_precision", before)
    assert measurer._may_answer()  # noqa: SLF001
    assert not Measurer(cache=FiguresCache(tmp_path, read=False))._may_answer()  # noqa: SLF001  (an update run)
