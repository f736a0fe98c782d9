"""The matrix on CI engines past GitHub's: a Buildkite dynamic pipeline and a Kubernetes Indexed Job, as
data (``aotcheck shards N --format buildkite|k8s`` writes them as YAML).

Each engine runs jobs of the same layout as GitHub's matrix (:func:`aotcheck.gate.shard.job_layout`), and
neither has GitHub's 256 jobs a matrix: by default one shard a job. Every job runs the same command: it
asks ``aotcheck shards N --jobs J --job I`` which shards it holds (``I``: the engine's 0-based index,
``BUILDKITE_PARALLEL_JOB`` or ``JOB_COMPLETION_INDEX``) and runs each as ``--aot-shard=K/N``, writing
``aot-report-K.json``; then a merge renders the reports (``aotcheck report --expect-shards N``, which
names a shard that wrote none).

Example:
    >>> steps = buildkite_pipeline(1000, jobs=250)["steps"]
    >>> steps[0]["parallelism"], steps[1]["depends_on"], steps[1]["allow_dependency_failure"]
    (250, 'aotcheck-shards', True)
    >>> "$$BUILDKITE_PARALLEL_JOB" in steps[0]["command"]  # Read when the job runs, not at the upload.
    True
    >>> shards, merge = kubernetes_jobs(1000, image="ghcr.io/me/ci:1")
    >>> shards["spec"]["completionMode"], shards["spec"]["completions"], merge["metadata"]["name"]
    ('Indexed', 1000, 'aotcheck-report')
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from aotcheck.gate.shard import ShardError, job_layout

ENGINES = ("buildkite", "k8s")
REPORTS = "aot-report-*.json"
STEP_KEY = "aotcheck-shards"
# A gate that fails (pytest's 1: a regression, an out-of-memory) is an answer, not a flake: its index is not run
# again. Anything else (a node lost, pytest's 3 for an internal error) is tried again, twice.
GATE_FAILED = 1
RETRIES = 2


def layout(num_shards: int, jobs: int | None = None) -> list[range]:
    """The shards each job runs: ``jobs`` jobs (default: one shard each), as GitHub's matrix deals them."""
    if jobs is not None and not 1 <= jobs <= num_shards:
        raise ShardError(f"--jobs {jobs}: between 1 and the {num_shards:,} shards (each job runs at least one)")
    return job_layout(num_shards, max_jobs=jobs or num_shards)


def job_command(num_shards: int, jobs: int, index: str, select: Sequence[str] = ("-m", "aotcheck"),
                reports: str = ".") -> str:
    """The shell command of every job: its shards from its 0-based ``index`` (an environment variable's
    reference), each gated in turn, its report beside the others; it fails where any shard failed."""
    pytest = shlex.join(["python", "-m", "pytest", *select])
    return (f'status=0\n'
            f'for k in $(python -m aotcheck shards {num_shards} --jobs {jobs} --job "{index}"); do\n'
            f'  {pytest} "--aot-shard=$k/{num_shards}" "--aot-report={reports}/aot-report-$k.json" || status=$?\n'
            f'done\n'
            f'exit $status\n')


def merge_command(num_shards: int, reports: str = ".") -> str:
    return f"python -m aotcheck report {reports}/{REPORTS} --expect-shards {num_shards} --format markdown"


def buildkite_pipeline(num_shards: int, *, jobs: int | None = None, select: Sequence[str] = ("-m", "aotcheck"),
                       label: str = "aotcheck") -> dict[str, Any]:
    """A dynamic pipeline (``buildkite-agent pipeline upload``): one step of ``jobs`` parallel jobs, each
    uploading its reports as artifacts, then, whatever they found, the merge, posted as the build's annotation.
    Every ``$`` of a command is doubled: the agent reads ``$$`` as ``$`` when the job runs, where a single one
    would be filled in from the uploading job's environment."""
    spans = layout(num_shards, jobs)
    merge = (f'buildkite-agent artifact download "{REPORTS}" .\n'
             f'{merge_command(num_shards)} > aot-report.md; status=$?\n'
             'buildkite-agent annotate --style "$([ $status = 0 ] && echo success || echo error)" '
             '--context aotcheck < aot-report.md\n'
             'exit $status\n')
    return {"steps": [
        {"label": f":mag: {label}: {num_shards:,} shards over {len(spans):,} jobs", "key": STEP_KEY,
         "parallelism": len(spans),
         "command": job_command(num_shards, len(spans), "$BUILDKITE_PARALLEL_JOB", select).replace("$", "$$"),
         "artifact_paths": [REPORTS],
         "retry": {"automatic": [{"exit_status": -1, "limit": RETRIES}]}},  # An agent lost, not a verdict.
        {"label": f":memo: {label}: the report", "key": "aotcheck-report", "depends_on": STEP_KEY,
         "allow_dependency_failure": True, "command": merge.replace("$", "$$")},
    ]}


def kubernetes_jobs(num_shards: int, *, image: str, jobs: int | None = None, parallelism: int | None = None,
                    claim: str = "aotcheck-reports", name: str = "aotcheck",
                    select: Sequence[str] = ("-m", "aotcheck")) -> list[dict[str, Any]]:
    """Two Jobs (``kubectl apply -f``): an Indexed Job of ``jobs`` completions, ``parallelism`` at a time
    (default: all), each writing its reports to the volume claim ``claim``; and the merge, a second Job
    over the same claim, to apply when the first has finished (Kubernetes does not order Jobs): each is
    labelled ``aotcheck/part`` (``shards``, ``report``) for ``kubectl apply -l``."""
    spans = layout(num_shards, jobs)
    volume = [{"name": "reports", "persistentVolumeClaim": {"claimName": claim}}]
    mount = [{"name": "reports", "mountPath": "/reports"}]

    def job(part: str, spec: dict[str, Any], command: str) -> dict[str, Any]:
        job_name = f"{name}-{part}"
        container = {"name": job_name, "image": image, "command": ["/bin/sh", "-c", command], "volumeMounts": mount}
        labels = {"app": name, "aotcheck/part": part}
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job_name, "labels": labels},
                "spec": {**spec, "template": {"metadata": {"labels": {"app": name}}, "spec": {
                    "restartPolicy": "Never", "containers": [container], "volumes": volume}}}}

    shards = job("shards", {
        "completionMode": "Indexed", "completions": len(spans), "parallelism": parallelism or len(spans),
        "backoffLimitPerIndex": RETRIES,
        "podFailurePolicy": {"rules": [{"action": "FailIndex", "onExitCodes": {
            "containerName": f"{name}-shards", "operator": "In", "values": [GATE_FAILED]}}]}},
        job_command(num_shards, len(spans), "$JOB_COMPLETION_INDEX", select, reports="/reports"))
    merge = job("report", {"backoffLimit": 0}, merge_command(num_shards, reports="/reports"))
    return [shards, merge]
