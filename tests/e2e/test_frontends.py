"""Two front ends, one gate: `aotcheck check` and the pytest plugin agree byte for byte; config
modules inside packages work in family worker processes; errors cross processes with their class.

Real processes and real libtpu compiles throughout.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from toy import without_noisy

LM_TINY = '''
import aotcheck
from aotcheck.models import lm

aotcheck.register("lm-tiny", lambda: [lm.trainer_config(lm.TINY, eval_step=None), lm.inference_config(lm.TINY)])
'''
MATRIX = "[pytest]\naot_topologies = v4-8 v5e-16\naot_slices = 1 2\naot_golden_dir = golden\n"


def pytest_run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def cli(cwd, *args):
    return subprocess.run([sys.executable, "-m", "aotcheck", *args], cwd=cwd, capture_output=True, text=True)


def without_host_memory(path: Path, *, matrix: bool = True) -> bytes:
    """A report's bytes, less each case's host RSS: the one figure measured anew by every run (and, with
    ``matrix=False``, the matrix digest: pytest's -k deselects within a matrix the CLI's targets narrow)."""
    doc = json.loads(path.read_text())
    if not matrix:
        assert doc.pop("matrix")
    for case in doc["cases"]:
        assert case["measured"].pop("host_peak_bytes") > 0
    return json.dumps(doc, indent=2, sort_keys=True).encode()


def tree(root: Path) -> dict[str, str]:
    """Each golden under ``root``, its measured seconds aside (an update run compiles afresh)."""
    return {p.relative_to(root).as_posix(): without_noisy(p.read_bytes()) for p in sorted(root.rglob("*.json"))}


@pytest.mark.heavy
def test_check_command_and_plugin_give_identical_goldens_and_reports(pytester):
    pytester.makeconftest(LM_TINY)
    pytester.makeini(MATRIX.replace("aot_slices = 1 2", "aot_slices = 1"))  # Both families, one slice: 6 cases.
    golden = pytester.path / "golden"
    # Cold: the plugin compiles the lm-tiny matrix (6 cases) and fills the figures cache; the CLI's
    # update compiles afresh too (an update reads no cache): the same goldens, seconds aside.
    pytest_run(pytester, "--update-golden").assert_outcomes(passed=6)
    by_plugin = tree(golden)
    assert len(by_plugin) == 6
    for path in golden.rglob("*.json"):
        path.unlink()
    out = cli(pytester.path, "check", "--update-golden")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "aotcheck --update-golden: 6 created, 0 changed, 0 unchanged" in out.stdout
    assert tree(golden) == by_plugin

    # Warm (same cache, so the same compile seconds): the same report, byte for byte (host RSS aside).
    pytest_run(pytester, "--aot-report=plugin.json").assert_outcomes(passed=6)
    out = cli(pytester.path, "check", "--report", "cli.json")
    assert out.returncode == 0, out.stdout + out.stderr
    plugin_report = without_host_memory(pytester.path / "plugin.json")
    assert plugin_report == without_host_memory(pytester.path / "cli.json")
    cases = json.loads(plugin_report)["cases"]
    assert len(cases) == 6 and {c["verdict"] for c in cases} == {"pass"} and all(c["measured"]["cached"] for c in cases)

    # A regression: both fail it, with the same message, and the CLI exits 1.
    doc = json.loads((golden / "lm-tiny/prefill@v4-8x1.json").read_text())
    doc["figures"]["peak_bytes"] //= 2
    (golden / "lm-tiny/prefill@v4-8x1.json").write_text(json.dumps(doc))
    result = pytest_run(pytester, "--aot-report=plugin.json", "-k", "v4-8")
    result.assert_outcomes(passed=2, failed=1)
    out = cli(pytester.path, "check", "--topologies", "v4-8", "--report", "cli.json")
    assert out.returncode == 1
    assert "lm-tiny/prefill@v4-8x1 regressed against" in out.stdout
    assert without_host_memory(pytester.path / "plugin.json", matrix=False) == \
        without_host_memory(pytester.path / "cli.json", matrix=False)


def test_check_command_usage_errors_name_the_option(tmp_path):
    out = cli(tmp_path, "check", "--topologies", "v5e-17")
    assert out.returncode == 2 and "aotcheck: error: --topologies: Unknown topology 'v5e-17'" in out.stderr
    out = cli(tmp_path, "check", "--topologies", "v4-8", "--slices", "0")
    assert out.returncode == 2 and "--slices: '0' is not a slice count" in out.stderr
    out = cli(tmp_path, "check")
    assert out.returncode == 2 and "no topologies to check: pass --topologies" in out.stderr
    assert "Traceback" not in out.stderr


PACKAGE = {
    "myconfigs/__init__.py": "",
    "myconfigs/shapes.py": '''
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P

        def make_args(mesh):
            return (jax.ShapeDtypeStruct((mesh.devices.size * 8, 128), jnp.float32,
                                         sharding=NamedSharding(mesh, P("data"))),)
    ''',
    "myconfigs/registry.py": '''
        import jax.numpy as jnp

        import aotcheck
        from .shapes import make_args  # A relative import: the worker must import this as a package module.

        aotcheck.register("pkg", aotcheck.FunctionConfig(fn=lambda x: jnp.tanh(x), make_args=make_args))
    ''',
}


def test_config_modules_in_packages_are_imported_by_name_in_family_workers(pytester):
    for name, text in PACKAGE.items():
        path = pytester.path / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(textwrap.dedent(text))
    pytester.makeini("[pytest]\naot_golden_dir = golden\naot_config_modules = myconfigs.registry\n")
    # The second family runs in a worker process, which must import myconfigs.registry as a package module.
    result = pytest_run(pytester, "--aot-topologies=cpu-2,v4-8,v5e-4", "--update-golden", "--aot-no-cache", "-v")
    result.assert_outcomes(passed=3)
    assert len(tree(pytester.path / "golden")) == 3


ERRORS = '''
import sys
import jax.numpy as jnp
import aotcheck
from aotcheck.pipeline.case import Case
from aotcheck.gate.isolation import Measurer
sys.path.insert(0, ".")
import shapes

aotcheck.register("ok", aotcheck.FunctionConfig(fn=lambda x: x + 1, make_args=shapes.make_args))
aotcheck.register("bad", aotcheck.FunctionConfig(fn=lambda x: x @ x, make_args=shapes.make_args))  # 2-D x 2-D mismatch
if __name__ == "__main__":  # The worker imports this script for its registrations only.
    measurer = Measurer()
    measurer(Case.of("ok", "step", "cpu-2"))  # A cpu worker; the v4 cases go to a v4 worker.
    for case in (Case.of("ok", "nope", "v4-8"), Case.of("nope", "step", "v4-8"), Case.of("bad", "step", "v4-8")):
        try:
            measurer(case)
        except Exception as e:
            print(type(e).__module__, type(e).__name__, "|", str(e).splitlines()[0])
    measurer.close()
'''


def test_errors_cross_the_worker_boundary_with_their_class(tmp_path):
    (tmp_path / "shapes.py").write_text(textwrap.dedent(PACKAGE["myconfigs/shapes.py"]))
    (tmp_path / "errors.py").write_text(ERRORS)
    out = subprocess.run([sys.executable, "errors.py"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "aotcheck.programs.registry ProgramNotFound | Config 'ok' has no program 'nope'; it has step."
    assert lines[1].startswith("aotcheck.programs.registry ConfigNotFound | No config named 'nope'")
    assert lines[2].startswith("builtins TypeError | ")  # jnp's shape error, raised by the user's function.


def test_two_modules_of_one_name_both_register_in_a_worker(tmp_path, monkeypatch):
    # Two conftest.py files (pytest imports both as "conftest" in its default import mode).
    from aotcheck.programs.loader import import_sources

    seen = []
    monkeypatch.setattr(sys, "aotcheck_test_seen", seen, raising=False)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "conftest.py").write_text(f"import sys\nsys.aotcheck_test_seen.append({name!r})\n")
    import_sources([("conftest_twin", str(tmp_path / "a" / "conftest.py")),
                    ("conftest_twin", str(tmp_path / "b" / "conftest.py"))])
    assert seen == ["a", "b"]


RECORD = '''
import dataclasses, json, sys, tempfile
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import aotcheck
from aotcheck.pipeline.cache import FiguresCache
from aotcheck.pipeline.case import Case
from aotcheck.gate.check import check_case
from aotcheck.gate.golden import GoldenStore
from aotcheck.gate.isolation import Measurer
from aotcheck.pipeline.measurement import Measurement
sys.path.insert(0, ".")
import shapes

def huge(mesh):  # 24 GiB per device: more than a v5e has.
    return (jax.ShapeDtypeStruct((mesh.devices.size * 6 * 2**30,), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)

aotcheck.register("ok", aotcheck.FunctionConfig(fn=lambda x: jnp.tanh(x) * 2, make_args=shapes.make_args))
aotcheck.register("oom", aotcheck.FunctionConfig(fn=lambda x: x * 2 + jnp.flip(x), make_args=huge))
if __name__ == "__main__":
    root = tempfile.mkdtemp()
    measurer = Measurer(cache=FiguresCache(root + "/cache"))
    case = Case.of("ok", "step", "v5e-4")
    cold = measurer(case)  # The worker's reply: the record's JSON.
    warm = measurer(case)  # From the cache entry: a view of the record's JSON.
    store = GoldenStore(root + "/golden")
    check_case(case, measure=lambda c: cold, store=store, update=True)
    golden = store.read(case)  # The golden body: a view too.
    try:
        measurer(Case.of("oom", "step", "v5e-4"))
    except aotcheck.OutOfMemory as e:
        oom = e
    measurer.close()
    print(json.dumps({
        "json_round_trip": Measurement.from_json(json.loads(json.dumps(cold.to_json()))) == cold,
        "cold_cached": cold.cached, "warm_cached": warm.cached,
        "warm_lowered": warm.lowered,  # The same process, the same inputs: answered without tracing.
        "warm_is_cold": dataclasses.replace(warm, cached=False, lowered=True, host_peak_bytes=cold.host_peak_bytes) == cold,
        "golden_is_cold": (golden.figures, golden.compiler_options, golden.details)
                          == (cold.figures, cold.compiler_options, cold.details.to_json()),
        "peak": cold.figures["peak_bytes"],
        "oom": [type(oom).__name__, bool(oom.details["peak_buffers"]), str(oom).startswith("Compiling oom/step@v5e-4x1 failed: RESOURCE_EXHAUSTED")],
        # XLA's words read once, in the worker's compile: the record crosses the pipe with the error.
        "overflow": [oom.overflow.space, oom.overflow.size_bytes > oom.overflow.limit_bytes == round(15.75 * 2**30),
                     sorted(oom.overflow.breakdown)],
    }))
'''


def test_one_measurement_record_through_the_worker_the_cache_and_the_golden(tmp_path):
    """A measurement is one record with one JSON form: the compile worker's reply rebuilds the same
    object, a cache hit gives it back (but for being a hit, not lowered, and the process's memory), the golden holds
    its figures, options and details unchanged; an out-of-memory compile crosses the worker as an
    OutOfMemory with what filled the memory and XLA's words as its record. Real worker, real compiles."""
    (tmp_path / "shapes.py").write_text(textwrap.dedent(PACKAGE["myconfigs/shapes.py"]))
    (tmp_path / "record.py").write_text(RECORD)
    out = subprocess.run([sys.executable, "record.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["peak"] > 0 and (found["cold_cached"], found["warm_cached"], found["warm_lowered"]) == (False, True, False)
    assert found["json_round_trip"] and found["warm_is_cold"] and found["golden_is_cold"], found
    assert found["oom"] == ["OutOfMemory", True, True], found
    assert found["overflow"] == ["hbm", True, ["HLO temporaries"]], found
