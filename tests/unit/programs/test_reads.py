"""aotcheck.programs.reads, and the inputs index it keeps honest (issue 52, V26): a config sized by an
environment variable or a data file its module reads is never answered from the index with the
figures of another value. Real modules written under a temporary directory, real CPU compiles."""

from __future__ import annotations

import importlib
import json
import os
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aotcheck.pipeline.cache import FiguresCache
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measure import measure
from aotcheck.programs import reads
from aotcheck.programs.registry import Registry

VARIABLE = "AOTCHECK_TEST_TOY_WIDTH"
MODULE = textwrap.dedent(f'''
    """A user's model sized at import: a width from the environment, rows from a data file."""
    import json
    import os
    from pathlib import Path

    import jax
    import jax.numpy as jnp

    import aotcheck

    WIDTH = int(os.environ.get("{VARIABLE}", "8"))
    ROWS = json.loads((Path(__file__).parent / "shape.json").read_text())["rows"]


    def build():
        return aotcheck.FunctionConfig(fn=lambda x: jnp.tanh(x) * 2, make_args=lambda mesh: (jax.ShapeDtypeStruct(
            (ROWS, WIDTH), jnp.float32, sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())),))
''')


@pytest.fixture(autouse=True)
def fresh_record(monkeypatch):
    """This test's reads alone (other tests of this process read and unset variables of their own)."""
    reads.install()
    monkeypatch.setattr(reads, "_ENV", {})
    monkeypatch.setattr(reads, "_FILES", set())


def test_the_projects_reads_are_recorded_and_aotchecks_and_installed_packages_are_not(tmp_path, monkeypatch):
    import fsspec.config
    (tmp_path / "data.txt").write_text("x")
    (tmp_path / "user_reads.py").write_text(
        "import os\nfrom pathlib import Path\n\ndef read(path):\n    os.getenv('AOTCHECK_TEST_SECRET')\n"
        "    return Path(path).read_text()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("AOTCHECK_TEST_SECRET", "hunter2")
    import user_reads

    user_reads.read(tmp_path / "data.txt")
    json.dumps(os.environ.get("AOTCHECK_TEST_OTHER"))  # This test's own read is the project's too.
    monkeypatch.setenv("FSSPEC_AOTCHECK_TEST", "1")
    fsspec.config.set_conf_env({})  # An installed package reading every variable for itself: not the project's.
    seen = reads.recorded()
    assert seen["files"][str(tmp_path / "data.txt")] == reads.recorded()["files"][str(tmp_path / "data.txt")]
    assert "AOTCHECK_TEST_SECRET" in seen["environment"] and "hunter2" not in json.dumps(seen)  # A digest only.
    assert not any(path.endswith(".py") for path in seen["files"])  # Code is the closure's business.
    assert set(seen["environment"]) == {"AOTCHECK_TEST_SECRET", "AOTCHECK_TEST_OTHER"}, seen["environment"]
    assert list(seen["files"]) == [str(tmp_path / "data.txt")]
    assert reads.changed(seen) is None
    (tmp_path / "data.txt").write_text("y")
    assert reads.changed(seen) == f"the file {tmp_path / 'data.txt'}, read by the project's code, changed since"
    (tmp_path / "data.txt").write_text("x")
    monkeypatch.setenv("AOTCHECK_TEST_SECRET", "hunter3")
    assert "AOTCHECK_TEST_SECRET" in reads.changed(seen) and "hunter" not in reads.changed(seen)


@pytest.fixture
def user_model(tmp_path, monkeypatch):
    (tmp_path / "toy_sized.py").write_text(MODULE)
    past = time.time_ns() - 3600 * 10**9  # Older than this process, as a project's files are (else not indexed).
    os.utime(tmp_path / "toy_sized.py", ns=(past, past))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_sized", raising=False)
    return tmp_path


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.tuples(st.sampled_from([8, 16, 128]), st.sampled_from([2, 4, 64])), min_size=2, max_size=4))
def test_a_config_sized_by_a_variable_or_a_file_is_never_answered_stale(user_model, monkeypatch, sizes):
    """Each run: the variable and the file set, the module imported afresh (a new process's import), the
    case measured through one cache. Its argument bytes are rows x width x 4 every time (the analytic
    count), answered from the index or not."""
    cache = FiguresCache(user_model / f"cache-{abs(hash(tuple(sizes)))}")
    answered = []
    for width, rows in sizes:
        monkeypatch.setenv(VARIABLE, str(width))
        (user_model / "shape.json").write_text(json.dumps({"rows": rows}))
        module = importlib.import_module("toy_sized") if "toy_sized" not in sys.modules else \
            importlib.reload(sys.modules["toy_sized"])
        registry = Registry()
        registry.register("toy", module.build)
        measured = measure(Case.of("toy", "step", "cpu-1"), registry=registry, cache=cache)
        assert measured.figures["argument_bytes"] == rows * width * 4, (width, rows, measured.cached)
        answered.append(not measured.lowered)
    # A change lowers the case (its figures may still come from the cache, by the lowered program's key).
    assert not any(answered[i] for i in range(1, len(sizes)) if sizes[i] != sizes[i - 1]), (sizes, answered)
    # A repeat of the last sizes is answered without a compile (the index still answers what it may).
    again = measure(Case.of("toy", "step", "cpu-1"), registry=registry, cache=cache)
    assert not again.lowered and again.figures["argument_bytes"] == sizes[-1][1] * sizes[-1][0] * 4
