"""aotcheck.gate.engines and ``aotcheck shards --format``: the matrix as Buildkite and Kubernetes read it,
each validated by the engine's own schema (Buildkite's pipeline schema as check-jsonschema vendors it;
Kubernetes' Job as kubernetes-validate holds it, strictly: no field Kubernetes does not know), and a
1,000-shard plan's jobs covering the whole case list once."""

import importlib.resources
import json
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from aotcheck.cli import main
from aotcheck.gate.engines import buildkite_pipeline, job_command, kubernetes_jobs, layout
from aotcheck.gate.shard import ShardError, assign_shards
from aotcheck.pipeline.case import Case

BUILDKITE = json.loads(importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
                       .joinpath("buildkite.json").read_text())
KUBERNETES = "1.33.0"  # Indexed Jobs with backoffLimitPerIndex and podFailurePolicy: GA in Kubernetes 1.33.


def shards_cli(*args):
    return subprocess.run([sys.executable, "-m", "aotcheck", "shards", *args], capture_output=True, text=True)


def test_the_buildkite_pipeline_of_1000_shards_is_what_buildkites_schema_accepts():
    out = shards_cli("1000", "--format", "buildkite")
    assert out.returncode == 0, out.stderr
    pipeline = yaml.safe_load(out.stdout)
    jsonschema.validate(pipeline, BUILDKITE)
    shards, merge = pipeline["steps"]
    assert shards["parallelism"] == 1000 and shards["artifact_paths"] == ["aot-report-*.json"]
    assert "--job \"$$BUILDKITE_PARALLEL_JOB\"" in shards["command"] and "$k" not in shards["command"].replace("$$", "")
    assert merge["depends_on"] == shards["key"] and merge["allow_dependency_failure"]
    assert "--expect-shards 1000" in merge["command"] and "buildkite-agent annotate" in merge["command"]
    with pytest.raises(jsonschema.ValidationError):  # The schema bites: a step with a field of the wrong type.
        jsonschema.validate({"steps": [{**shards, "parallelism": "many"}]}, BUILDKITE)


def test_the_kubernetes_jobs_of_1000_shards_are_what_kubernetes_schema_accepts():
    out = shards_cli("1000", "--format", "k8s", "--image", "ghcr.io/me/ci:1", "--parallelism", "64")
    assert out.returncode == 0, out.stderr
    shards, merge = yaml.safe_load_all(out.stdout)
    for job in (shards, merge):
        kubernetes_validate.validate(job, KUBERNETES, strict=True)
    assert shards["spec"]["completionMode"] == "Indexed" and shards["spec"]["completions"] == 1000
    assert shards["spec"]["parallelism"] == 64 and "$JOB_COMPLETION_INDEX" in str(shards["spec"]["template"])
    assert "--expect-shards 1000" in str(merge["spec"]["template"])
    with pytest.raises(kubernetes_validate.ValidationError):  # Strict: a field Kubernetes does not know.
        kubernetes_validate.validate({**shards, "spec": {**shards["spec"], "shards": 1000}}, KUBERNETES, strict=True)


def test_kubernetes_needs_an_image_and_a_job_index_outside_the_layout_is_named():
    assert "--format k8s needs --image" in shards_cli("8", "--format", "k8s").stderr
    out = shards_cli("8", "--jobs", "4", "--job", "4")
    assert out.returncode == 2 and "--job 4: the layout has jobs 0 to 3" in out.stderr
    with pytest.raises(ShardError, match="--jobs 9: between 1 and the 8 shards"):
        layout(8, 9)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 1000), st.data())
def test_every_case_runs_once_whatever_the_jobs(num_shards, data):
    """The jobs' shards (what ``--job I`` prints) partition 1..N, so a plan's cases run once each."""
    jobs = data.draw(st.integers(1, num_shards))
    spans = layout(num_shards, jobs)
    dealt = [k for span in spans for k in span]
    assert sorted(dealt) == list(range(1, num_shards + 1)) and len(spans) == jobs or len(spans) <= jobs


def test_a_1000_shard_plan_runs_each_case_once_through_the_jobs_commands(capsys):
    cases = [Case.of(f"m{i}", "step", t, n) for i in range(600) for t, n in (("v4-8", 1), ("v5e-16", 2))]
    shard_of = assign_shards(cases, 1000)
    ran = []
    for job in range(250):
        assert main(["shards", "1000", "--jobs", "250", "--job", str(job)]) == 0
        shards = {int(k) for k in capsys.readouterr().out.split()}
        ran += [c for c in cases if shard_of[c.id] in shards]
    assert sorted(c.id for c in ran) == sorted(c.id for c in cases)  # Each case once: none twice, none lost.


def test_each_job_runs_its_shards_and_fails_where_one_did(tmp_path):
    """The job's shell command, run for real with a stand-in for pytest (FAKE: a script that fails shard 2)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text(f"#!/bin/sh\nif [ \"$2\" = aotcheck ]; then exec {sys.executable} \"$@\"; fi\n"
                                 "echo \"$@\" >> ran.txt\ncase \"$*\" in *--aot-shard=2/*) exit 1;; esac\n")
    (fake / "python").chmod(0o755)
    command = job_command(4, 2, "$JOB", ("-m", "aotcheck"))
    out = subprocess.run(["/bin/sh", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": f"{fake}:/usr/bin:/bin", "JOB": "0"})
    assert out.returncode == 1, out.stderr
    ran = (tmp_path / "ran.txt").read_text().splitlines()
    assert [next(w for w in line.split() if w.startswith("--aot-shard")) for line in ran] == [
        "--aot-shard=1/4", "--aot-shard=2/4"]  # Job 0 of 2 holds shards 1-2; shard 2's failure is the job's.


def test_the_engines_data_are_plain():
    assert json.loads(json.dumps(buildkite_pipeline(10))) == buildkite_pipeline(10)
    assert json.loads(json.dumps(kubernetes_jobs(10, image="i"))) == kubernetes_jobs(10, image="i")
