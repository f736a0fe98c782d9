"""``aotcheck shards N``: the run's matrix laid out for a CI engine, in words or as the engine reads it.

    python -m aotcheck shards 1024 --json                     # GitHub: {"include": [{"shards": "1-4"}, ...]}
    python -m aotcheck shards 1000 --format buildkite         # a dynamic pipeline, for buildkite-agent pipeline upload
    python -m aotcheck shards 1000 --format k8s --image IMG   # an Indexed Job and the merge's Job, for kubectl apply -f
    python -m aotcheck shards 1000 --jobs 250 --job 3         # the shards job 3 (0-based) of 250 runs, one a line

Example:
    >>> from aotcheck.cli import main
    >>> main(["shards", "10", "--jobs", "4", "--job", "0"])
    1
    2
    3
    0
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

import yaml

from aotcheck.cmdline import positive
from aotcheck.gate.engines import buildkite_pipeline, kubernetes_jobs, layout
from aotcheck.gate.shard import MAX_JOBS, ShardError, github_layout, job_spans
from aotcheck.render.summary import layout_lines

FORMATS = ("text", "github", "buildkite", "k8s")


def add_command(sub: Any) -> None:
    """``aotcheck shards``'s parser."""
    p = sub.add_parser("shards", help=f"the CI matrix for N shards: GitHub's (past {MAX_JOBS} jobs, several shards a "
                       "job), a Buildkite pipeline or a Kubernetes Indexed Job")
    p.add_argument("shards", type=positive, help="how many shards (--aot-shard=K/N's N)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="text (default), github (--json), buildkite (a dynamic pipeline, YAML) or k8s (two Jobs, YAML)")
    p.add_argument("--json", action="store_true", help='GitHub\'s, for fromJSON: {"include": [{"shards": "1-4"}, ...]}')
    p.add_argument("--jobs", type=positive, help="Buildkite's parallel jobs or the Indexed Job's completions "
                   "(default: one shard each)")
    p.add_argument("--job", type=int, metavar="I", help="print the shards job I (0-based: BUILDKITE_PARALLEL_JOB, "
                   "JOB_COMPLETION_INDEX) runs, one a line")
    p.add_argument("--select", default="-m aotcheck", help="what each job's pytest runs (default: -m aotcheck)")
    p.add_argument("--image", help="k8s: the container image that holds your project and its venv")
    p.add_argument("--claim", default="aotcheck-reports", help="k8s: the volume claim the reports are written to")
    p.add_argument("--parallelism", type=positive, help="k8s: how many jobs run at a time (default: all)")
    p.set_defaults(func=cmd_shards)


def cmd_shards(args: argparse.Namespace) -> int:
    fmt = "github" if args.json else args.format or "text"
    if args.json and args.format not in (None, "github"):
        raise ShardError(f"--json is --format github; drop it, or --format {args.format}")
    if args.job is not None:
        spans = layout(args.shards, args.jobs)
        if not 0 <= args.job < len(spans):
            raise ShardError(f"--job {args.job}: the layout has jobs 0 to {len(spans) - 1} (0-based, as "
                             "BUILDKITE_PARALLEL_JOB and JOB_COMPLETION_INDEX count)")
        print("\n".join(map(str, spans[args.job])))
        return 0
    select = shlex.split(args.select)
    if fmt == "buildkite":
        print(_yaml(buildkite_pipeline(args.shards, jobs=args.jobs, select=select)), end="")
    elif fmt == "k8s":
        if not args.image:
            raise ShardError("--format k8s needs --image: the container image that holds your project and its venv "
                             "(e.g. --image ghcr.io/me/ci:1)")
        jobs = kubernetes_jobs(args.shards, image=args.image, jobs=args.jobs, parallelism=args.parallelism,
                               claim=args.claim, select=select)
        print(yaml.dump_all([_blocks(job) for job in jobs], Dumper=_Dumper, sort_keys=False, width=1000), end="")
    else:
        spans = github_layout(args.shards) if args.jobs is None else layout(args.shards, args.jobs)
        matrix = {"include": [{"shards": s} for s in job_spans(spans)]}  # For `matrix: ${{ fromJSON(...) }}`.
        print(json.dumps(matrix, separators=(",", ":")) if fmt == "github" else "\n".join(layout_lines(spans)))
    return 0


class _Literal(str):
    """A command of several lines, written as YAML's literal block (``|``), as a person would."""


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, with commands as literal blocks (its own class: yaml's is left as it is)."""


_Dumper.add_representer(_Literal, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text,
                                                                                style="|"))


def _blocks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _blocks(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blocks(v) for v in value]
    return _Literal(value) if isinstance(value, str) and "\n" in value else value


def _yaml(document: Any) -> str:
    return yaml.dump(_blocks(document), Dumper=_Dumper, sort_keys=False, width=1000)

