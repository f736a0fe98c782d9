"""A matrix past one machine: the plan at internet scale on paper, and two runners sharing one store, measured.

``plan``: a synthetic 3,000-case matrix (80 models) whose compile seconds are drawn from the committed
goldens' (``compile_cpu_seconds + lower_cpu_seconds``), dealt to shards by the gate's own split
(``assign_shards``, ``job_layout``) on 64 and 256 runners, and costed for three runs: a cold one, a
warm pull request touching one model (its cases lowered and compiled, every other one answered by its
inputs from the shared cache), and a toolchain bump (everything compiled). Printed: predicted wall
time, runner-hours and the jobs' balance (max/mean, and its floor: the largest case over the mean).

``measure``: two runners (two processes, each its own checkout and local cache) sharing one store
(moto's S3-protocol server when it is installed, else a directory): the first compiles cold, the
second compiles and traces nothing; their wall times side by side, and the ratio. ``--project`` runs
another project (a directory with its conftest.py and pytest.ini), e.g. MaxText's, under
``--python`` (a venv with aotcheck[maxtext]).

    python benchmarks/past_one_machine.py plan [--seed 0] [--setup 90] [--hit 0.25] [--cores 2]
    python benchmarks/past_one_machine.py measure [--project DIR --python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aotcheck.gate.shard import assign_shards, job_layout, job_loads  # noqa: E402
from aotcheck.pipeline.case import Case  # noqa: E402


def golden_seconds() -> list[float]:
    """Each committed golden's compile cost (CPU seconds of the compile and the lowering)."""
    found = []
    for path in sorted((ROOT / "golden").rglob("*.json")):
        figures = json.loads(path.read_text()).get("figures", {})
        if "compile_cpu_seconds" in figures:
            found.append(figures["compile_cpu_seconds"] + figures.get("lower_cpu_seconds", 0.0))
    return found


def synthetic_matrix(n: int, models: int, seed: int) -> tuple[list[Case], dict[str, float], dict[str, int]]:
    """``n`` cases over ``models`` models, each case's seconds drawn from the goldens'."""
    draw, pool = random.Random(seed), golden_seconds()
    cases, seconds, model_of = [], {}, {}
    for i in range(n):
        case = Case.parse(f"model{i % models}/program{i // models}@v5e-16x1")
        cases.append(case)
        seconds[case.id], model_of[case.id] = draw.choice(pool), i % models
    return cases, seconds, model_of


def cost(runners: int, cases: list[Case], planned: dict[str, float], actual: dict[str, float], *,
         setup: float, cores: int) -> tuple[float, float, float, float]:
    """(wall s, runner-hours, jobs' max/mean, its floor) of a run whose cases cost ``actual`` seconds,
    dealt by the seconds the goldens recorded (``planned``): each job's wall is its setup plus its cases
    over its cores, or its largest case where that is longer (one compile is one process)."""
    shards = runners  # One shard a runner (job_layout lays more over 256 jobs).
    layout = job_layout(shards)
    split = assign_shards(cases, shards, seconds=planned)
    loads = job_loads(split, actual, layout)
    largest: dict[int, float] = {}
    for case_id, shard in split.items():
        largest[shard] = max(largest.get(shard, 0.0), actual[case_id])
    walls = [setup + max(load / cores, max((largest.get(k, 0.0) for k in job), default=0.0))
             for load, job in zip(loads, layout)]
    mean = sum(loads) / len(loads)
    return max(walls), sum(walls) / 3600, max(loads) / mean, max(actual.values()) / mean


def plan(args: argparse.Namespace) -> None:
    cases, seconds, model_of = synthetic_matrix(args.cases, args.models, args.seed)
    pool = golden_seconds()
    print(f"{args.cases:,} cases over {args.models} models; compile seconds drawn from {len(pool)} goldens "
          f"(mean {sum(pool) / len(pool):.1f} s, median {sorted(pool)[len(pool) // 2]:.1f} s, max {max(pool):.0f} s); "
          f"matrix total {sum(seconds.values()) / 3600:.1f} CPU-hours")
    print(f"assumed: {args.cores} cores a runner (-n {args.cores}), {args.setup:.0f} s a job to start (checkout, "
          f"install, compile workers), {args.hit:.2f} s a case answered by its inputs (two reads of the store)\n")
    per_model: dict[int, float] = {}
    for case_id, model in model_of.items():
        per_model[model] = per_model.get(model, 0.0) + seconds[case_id]
    by_cost = sorted(per_model, key=lambda m: (per_model[m], m))
    typical, heaviest = by_cost[len(by_cost) // 2], by_cost[-1]
    runs = {"cold (empty store)": seconds}
    for label, model in (("typical", typical), ("heaviest", heaviest)):
        touched = {c.id for c in cases if model_of[c.id] == model}
        print(f"a pull request touching the {label} model (model{model}): {len(touched)} cases, "
              f"{per_model[model]:.0f} CPU s, its largest {max(seconds[c] for c in touched):.0f} s")
        runs[f"warm PR, {label} model"] = {k: v if k in touched else args.hit for k, v in seconds.items()}
    runs["toolchain bump (all compile)"] = seconds
    print(f"{'run':34} {'runners':>7} {'wall':>9} {'runner-h':>9} {'max/mean':>9} {'floor':>6}")
    for name, actual in runs.items():
        for runners in (64, 256) if not name.startswith("warm") else (8, 64, 256):
            wall, hours, balance, floor = cost(runners, cases, seconds, actual, setup=args.setup, cores=args.cores)
            print(f"{name:34} {runners:7} {wall / 60:7.1f} m {hours:9.2f} {balance:9.2f} {floor:6.2f}")
    print("\nfloor: the largest case over a job's mean load; no split of whole cases does better.")


def measure(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="aot-two-runners-"))
    url, stop, env = _store(work)
    try:
        times, measured = [], []
        for runner in ("one", "two"):
            checkout = work / runner
            if args.project:
                shutil.copytree(args.project, checkout)
            else:
                checkout.mkdir()
                (checkout / "conftest.py").write_text(
                    "import aotcheck\nfrom aotcheck.models import lm\n\n"
                    "aotcheck.register('lm-tiny', lambda: [lm.trainer_config(lm.TINY), lm.inference_config(lm.TINY)])\n")
                (checkout / "pytest.ini").write_text("[pytest]\naot_topologies = v5e-4 v4-8\n")
            if runner == "two":  # The goldens are committed: the second checkout has the first's.
                shutil.copytree(work / "one" / "golden", checkout / "golden")
            report = checkout / "report.json"
            command = [args.python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", str(args.workers),
                       f"--aot-cache-url={url}", f"--aot-report={report}",
                       *(["--update-golden"] if runner == "one" else [])]
            start = time.perf_counter()
            out = subprocess.run(command, cwd=checkout, capture_output=True, text=True, env=env)
            times.append(time.perf_counter() - start)
            if out.returncode != 0:
                raise SystemExit(f"runner {runner} failed:\n{out.stdout[-3000:]}{out.stderr[-2000:]}")
            measured.append([c["measured"] for c in json.loads(report.read_text())["cases"]])
        cold, warm = times
        compiled = sum(not m["cached"] for m in measured[1])
        traced = sum(m["lowered"] for m in measured[1])
        for m in measured[1]:
            if m["lowered"] or not m["cached"]:
                print(f"  {m['case']}: {'compiled' if not m['cached'] else 'lowered'}")
        print(f"store: {url}; {len(measured[0])} cases")
        print(f"runner one (cold): {cold:6.1f} s wall, {sum(not m['cached'] for m in measured[0])} compiled")
        print(f"runner two (warm): {warm:6.1f} s wall, {compiled} compiled, {traced} lowered")
        print(f"warm / cold: {warm / cold:.3f}")
        if compiled or traced:
            raise SystemExit("the second runner compiled or lowered cases the first had shared")
    finally:
        stop()


def _store(work: Path):
    """moto's S3 server (the protocol a cloud store speaks) with a bucket, else a directory."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        return f"file://{work}/store", lambda: None, dict(os.environ)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # The server's request log is not the benchmark's output.
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="bench",
                 aws_secret_access_key="bench", region_name="us-east-1").create_bucket(Bucket="aot")
    return "s3://aot/figures", server.stop, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--cases", type=int, default=3000)
    p.add_argument("--models", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--setup", type=float, default=90.0, help="seconds a job takes before its first case")
    p.add_argument("--hit", type=float, default=0.25, help="seconds a case answered by its inputs costs")
    p.add_argument("--cores", type=int, default=2)
    p.set_defaults(func=plan)
    p = sub.add_parser("measure")
    p.add_argument("--project", type=Path, help="a project directory (conftest.py, pytest.ini); default: lm-tiny")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(func=measure)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
