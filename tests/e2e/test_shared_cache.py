"""A matrix past one machine: runners sharing one figures cache through a store, and only what changed
lowered. Real pytest runs of a project of its own, as subprocesses, against a directory store, an S3
endpoint that is down, and (heavy leg) moto's S3-protocol server with real TPU compiles.

The project: ``model_a`` uses ``helper``; ``model_b`` uses ``toylib``, a distribution installed into
``vendor/`` (its version is what counts); ``conftest.py`` registers both.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MODEL = '''
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import {uses}


def step(x, w):
    return {call}(x @ w)


def make_args(mesh):
    return (jax.ShapeDtypeStruct((mesh.devices.size * 8, 64), jnp.float32, sharding=NamedSharding(mesh, P("data"))),
            jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P())))
'''
FILES = {
    "helper.py": "import jax.numpy as jnp\n\n\ndef act(x):\n    return jnp.tanh(x)\n",
    "model_a.py": MODEL.format(uses="helper", call="helper.act"),
    "model_b.py": MODEL.format(uses="toylib", call="toylib.act"),
    "unrelated.py": "VALUE = 1\n",
    "vendor/toylib/__init__.py": "import jax.numpy as jnp\n\n\ndef act(x):\n    return jnp.sin(x)\n",
    "vendor/toylib-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: toylib\nVersion: 1.0\n",
    "vendor/toylib-1.0.dist-info/RECORD": "toylib/__init__.py,,\n",
    "conftest.py": textwrap.dedent('''
        import os, sys
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "vendor"))

        import aotcheck
        import model_a, model_b

        aotcheck.register("a", aotcheck.FunctionConfig(fn=model_a.step, make_args=model_a.make_args))
        aotcheck.register("b", aotcheck.FunctionConfig(fn=model_b.step, make_args=model_b.make_args))
    '''),
    "pytest.ini": "[pytest]\naot_topologies = cpu-2\n",
}


def write_project(root: Path, files: dict[str, str] = FILES) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def run(project: Path, *args: str, env: dict[str, str] | None = None, ok: bool = True
        ) -> tuple[dict[str, dict], subprocess.CompletedProcess]:
    """One pytest run in ``project``; its cases' measurements by config, and the process."""
    report = project / "report.json"
    report.unlink(missing_ok=True)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--aot-report={report}",
                          *args], cwd=project, capture_output=True, text=True, timeout=900,
                         env={**os.environ, **(env or {})})
    assert (out.returncode == 0) == ok, out.stdout[-4000:] + out.stderr[-2000:]
    cases = json.loads(report.read_text())["cases"]
    return {c["case"].split("/")[0]: c["measured"] for c in cases}, out


def lowered(measured: dict[str, dict]) -> set[str]:
    """The configs whose program this run traced and lowered (the rest were answered by their inputs)."""
    return {name for name, m in measured.items() if m["lowered"]}


@pytest.mark.heavy  # Eight runs: 20 s on 2 cores.
def test_only_the_cases_whose_code_changed_are_lowered(tmp_path):
    project = write_project(tmp_path)
    run(project, "--update-golden")
    assert lowered(run(project)[0]) == set()  # Nothing changed: nothing traced.

    def edit(name: str, old: str, new: str) -> None:
        path = project / name
        assert old in path.read_text()
        path.write_text(path.read_text().replace(old, new))

    edit("unrelated.py", "VALUE = 1", "VALUE = 2")  # Imported by nothing a config runs.
    assert lowered(run(project)[0]) == set()
    edit("helper.py", "jnp.tanh(x)", "jnp.tanh(x)  # reviewed")  # A helper model_a imports: a only.
    measured, _ = run(project)
    assert lowered(measured) == {"a"} and measured["a"]["cached"]  # Same program: lowered, not compiled.
    edit("model_b.py", "return toylib.act(x @ w)", "return toylib.act(x @ w) * 2")  # The model itself.
    measured, _ = run(project)
    assert lowered(measured) == {"b"} and not measured["b"]["cached"]  # Another program: compiled.
    # An installed package's new version (its code the same): the case using it, only.
    (project / "vendor/toylib-1.0.dist-info").rename(project / "vendor/toylib-1.1.dist-info")
    edit("vendor/toylib-1.1.dist-info/METADATA", "Version: 1.0", "Version: 1.1")
    assert lowered(run(project)[0]) == {"b"}
    assert lowered(run(project)[0]) == set()


def test_a_second_runner_sharing_a_directory_store_compiles_and_lowers_nothing(tmp_path):
    store = f"file://{tmp_path}/store"
    one, two = (write_project(tmp_path / name) for name in ("one", "two"))
    run(one, "--update-golden", f"--aot-cache-url={store}")
    shutil.copytree(one / "golden", two / "golden")  # The goldens are committed; each runner its checkout.
    measured, _ = run(two, f"--aot-cache-url={store}")
    assert not (two / ".aotcheck-cache").exists() or lowered(measured) == set()
    assert all(m["cached"] and not m["lowered"] for m in measured.values()), measured
    # What the store gave was kept locally: the next run here needs no store at all.
    measured, _ = run(two)
    assert all(m["cached"] and not m["lowered"] for m in measured.values())


def test_a_store_that_is_down_costs_one_note_and_the_run_compiles_locally(tmp_path):
    project = write_project(tmp_path)
    with socket.socket() as s:  # A port nothing listens on: the store is down.
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_DEFAULT_REGION": "us-east-1"}
    measured, out = run(project, "--update-golden", "--aot-cache-url=s3://bucket/aot", env=env)
    assert all(not m["cached"] for m in measured.values())
    said = (out.stdout + out.stderr).count("the shared figures cache s3://bucket/aot is unreachable")
    assert said == 1, out.stdout[-3000:]
    assert "Traceback" not in out.stdout + out.stderr


# The heavy leg: moto's S3-protocol server, real TPU compiles. ------------------------------------------------

LM = textwrap.dedent('''
    import aotcheck
    from aotcheck.models import lm

    aotcheck.register("lm-tiny", lambda: lm.trainer_config(lm.TINY, eval_step=None))
''')


@pytest.fixture
def s3():
    """A moto S3 server on a free port, its bucket, and the environment a runner reaches it by (the
    cloud SDK's own variables: aotcheck has no setting for credentials or endpoints)."""
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket="aot")
    yield env, client
    server.stop()


def objects(client) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket="aot").get("Contents", [])
    return {o["Key"]: client.get_object(Bucket="aot", Key=o["Key"])["Body"].read() for o in listed}


@pytest.mark.heavy
def test_runners_share_real_compiles_through_an_s3_store(tmp_path, s3):
    env, client = s3
    files = {"conftest.py": LM, "pytest.ini": "[pytest]\naot_topologies = v5e-4\naot_cache_url = s3://aot/figures\n"}
    one, two, fork = (write_project(tmp_path / name, files) for name in ("one", "two", "fork"))
    first, _ = run(one, "--update-golden", env=env)
    assert not first["lm-tiny"]["cached"]
    stored = objects(client)
    # One figures entry and one index entry, each a whole JSON object.
    assert sorted(k.split("/")[1] == "inputs" for k in stored) == [False, True]
    assert all(json.loads(v) for v in stored.values())
    for runner in (two, fork):
        shutil.copytree(one / "golden", runner / "golden")
    measured, _ = run(two, env=env)  # A second runner: compiles nothing, traces nothing.
    assert measured["lm-tiny"]["cached"] and not measured["lm-tiny"]["lowered"]

    # A fork's pull request reads and writes nothing: its new case compiles locally, the bucket unchanged.
    (fork / "conftest.py").write_text(LM.replace("lm.TINY)", "dataclasses.replace(lm.TINY, n_layers=3))")
                                      .replace("import aotcheck", "import dataclasses\nimport aotcheck"))
    measured, _ = run(fork, "--aot-cache-mode=read", "--update-golden", env=env)
    assert not measured["lm-tiny"]["cached"] and objects(client) == stored

    # A bad object in the store is a miss, named, and compiled afresh (then rewritten whole).
    key = next(k for k in stored if "/inputs/" not in k)
    client.put_object(Bucket="aot", Key=key, Body=stored[key][:100])
    three = write_project(tmp_path / "three", files)
    shutil.copytree(one / "golden", three / "golden")
    measured, out = run(three, env=env)
    assert not measured["lm-tiny"]["cached"]
    assert f"s3://aot/{key} is not usable (not whole JSON)" in out.stdout
    assert json.loads(objects(client)[key])["key"] == key.rsplit("/", 1)[1].removesuffix(".json")
