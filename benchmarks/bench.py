"""Speed of the gate, as ratios of the same work measured side by side in one run (not a timed test).

    python benchmarks/bench.py                      # lm-tiny on v4-8 and v5e-16, 1 and 2 slices
    python benchmarks/bench.py --configs lm-1b --topologies v5e-16 --slices 1 --no-fit  # ~25 min here
    python benchmarks/bench.py --repeat 2           # gate and bare twice, alternating: the fastest of each

Every row compares like with like. The gate runs the generated cases only (``-m aotcheck_case``:
no test of the suite) of ``bench-<config>`` (benchmarks/bench_configs.py: the reference config
without its fit search), so its work is each program lowered and compiled once:

- gate (pytest -n 0, no cache) / bare ``lower().compile()`` of the same programs, each chip family
  in a fresh process as correct figures need (aotcheck/targets/families.py), paying the same jax
  and libtpu start-up: what the gate adds (its dump and attribution, workers, bookkeeping);
  target <= 1.05;
- warm figures cache / cold: target <= 0.10; what the warm run still spends, per phase (process
  start, imports, building configs, the inputs digest, cache reads: an unchanged case is not
  lowered, and no libtpu loaded), measured alone, in one process as the session;
- ``-n 2`` / ``-n 0`` (no cache);
- the fit search: ``bench-<config>-fit`` against ``bench-<config>`` (its probes, from the report,
  and its seconds);
- the attribution: compile with XLA's dump and the peak read from it / the same compile without
  (alternating, one process per family).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timings import Row, append, here, new_run

ROOT = Path(__file__).resolve().parents[1]
MODULES = "benchmarks/bench_configs.py"  # Not the ini's adapter models: nothing the bare run does not import.


def cases(configs: str, topologies: str, slices: str):
    """(config, program, Target, compiler options) of every case of ``bench-<configs>``."""
    import fnmatch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_configs  # noqa: F401  (registers bench-*)
    from aotcheck.programs.options import resolve_compiler_options
    from aotcheck.programs.registry import REGISTRY
    from aotcheck.targets.topology import Target

    for entry in REGISTRY:
        if not any(fnmatch.fnmatchcase(entry.name, f"bench-{g}") for g in configs.split(",")):
            continue
        for program, config in entry.programs().items():
            for topology in topologies.split(","):
                for n in map(int, slices.split(",")):
                    yield config, program, Target.of(topology, n), resolve_compiler_options(
                        topology, n, config.options)


def bare(configs: str, topologies: str, slices: str) -> None:
    """Compiles every case with plain JAX calls; prints the summed lower+compile seconds."""
    from aotcheck.programs.lowering import lower_config

    total = 0.0
    for config, program, target, options in cases(configs, topologies, slices):
        start = time.perf_counter()
        lower_config(config, target, program=program)[program].compile(compiler_options=options)
        total += time.perf_counter() - start
    print(total)


def phases(configs: str, topologies: str, slices: str, cache_dir: str) -> None:
    """What a warm run's session does for each case, phase by phase, in one process (it starts no compile
    worker and loads no libtpu: gate.isolation); prints JSON seconds."""
    out: dict[str, float] = {}
    start = time.perf_counter()
    import jax  # noqa: F401

    from aotcheck.gate.process import worker_environment
    from aotcheck.pipeline.cache import FiguresCache
    from aotcheck.pipeline.case import Case
    from aotcheck.pipeline.inputs import inputs_key, registering_modules
    from aotcheck.pipeline.measure import by_inputs
    from aotcheck.programs.registry import REGISTRY

    out["imports"] = time.perf_counter() - start
    start = time.perf_counter()
    found = list(cases(configs, topologies, slices))
    entry_of = {id(c): e.name for e in REGISTRY for c in e.programs().values()}
    out["building configs"] = time.perf_counter() - start
    # A warm run answers an unchanged case by its inputs (pipeline.inputs) in the session, digested as its
    # worker would see it: the digest (the code closure, the config's fingerprint), then the cache's index
    # and entry; nothing is lowered.
    registering = registering_modules(REGISTRY)
    cache, digesting, reading, missed = FiguresCache(cache_dir), 0.0, 0.0, 0
    for config, program, target, options in found:
        start = time.perf_counter()
        case = Case.of(entry_of[id(config)], program, target.topology.name, target.num_slices)
        environ = worker_environment(case.topology)
        key = inputs_key(case, config, options=options, registering=registering, environ=environ)
        digesting += time.perf_counter() - start
        start = time.perf_counter()
        missed += key is None or by_inputs(cache, key, case, options, environ=environ) is None
        reading += time.perf_counter() - start
    out["inputs digest"], out["cache reads"] = digesting, reading
    if missed:  # Then a warm run lowers those: this breakdown would not be what it does.
        out["(cases the index missed)"] = float(missed)
    print(json.dumps(out))


def attribution_cost(configs: str, topologies: str, slices: str) -> None:
    """Per case, alternating: lower+compile, and lower+compile with the dump plus attribution.
    Prints the two sums."""
    from aotcheck.figures.attribution import read_dump
    from aotcheck.figures.dump import dump_options
    from aotcheck.figures.splits import dump_options as sharding_dump_options
    from aotcheck.programs.lowering import arguments, lower_config

    plain = attributed = 0.0
    for config, program, target, options in cases(configs, topologies, slices):
        start = time.perf_counter()
        lower_config(config, target, program=program)[program].compile(compiler_options=options)
        plain += time.perf_counter() - start
        start = time.perf_counter()
        lowered = lower_config(config, target, program=program)[program]
        with tempfile.TemporaryDirectory() as dump:
            # The dumps the gate asks for: the optimized program's and, for the lint, the module after
            # sharding propagation (pipeline/stages.py), so both sides compare what a gate compile does.
            compiled = lowered.compile(compiler_options={**options, **dump_options(dump), **sharding_dump_options()})
            read_dump(dump, hlo_text=compiled.as_text(), arguments=arguments(lowered, config),
                      peak_bytes=compiled.memory_analysis().peak_memory_in_bytes)
        attributed += time.perf_counter() - start
    print(plain, attributed)


def pytest_alone() -> float:
    """Seconds of a pytest run over the same directory without aotcheck: its plugin off, and no conftest
    (the repository's registers the reference configs, importing aotcheck and jax); it collects nothing."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-p", "no:aotcheck",
                             "--noconftest", "-q", "-c", "/dev/null", "--rootdir", str(ROOT)], cwd=ROOT, capture_output=True, text=True)
    if result.returncode not in (0, 5):  # 5: no test collected, as expected.
        sys.exit(f"pytest without aotcheck failed:\n{result.stdout[-3000:]}")
    return time.perf_counter() - start


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return seconds, result.stdout


def per_family(args: argparse.Namespace, flag: str, *extra: str) -> list[tuple[float, str]]:
    """This script's ``flag`` worker run once per chip family (a fresh process each)."""
    from aotcheck.targets.families import family_of

    by_family: dict[str, list[str]] = {}
    for topology in args.topologies.split(","):
        by_family.setdefault(family_of(topology), []).append(topology)
    return [timed([sys.executable, __file__, flag, "--configs", args.configs, "--topologies", ",".join(t),
                   "--slices", args.slices, *extra]) for t in by_family.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="lm-tiny", help="lm-tiny or lm-1b (benchmarks/bench_configs.py)")
    parser.add_argument("--topologies", default="v4-8,v5e-16")
    parser.add_argument("--slices", default="1,2")
    for worker in ("bare", "phases", "attribution-worker"):
        parser.add_argument(f"--{worker}", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--no-fit", action="store_true", help="leave out the fit search's row (lm-1b: ~25 probes of a minute)")
    parser.add_argument("--repeat", type=int, default=1, help="run the gate and the bare compiles N times, alternating, "
                        "and compare the fastest of each (the machine's speed drifts)")
    args = parser.parse_args()
    if args.bare:
        return bare(args.configs, args.topologies, args.slices)
    if args.phases:
        return phases(args.configs, args.topologies, args.slices, args.cache_dir)
    if args.attribution_worker:
        return attribution_cost(args.configs, args.topologies, args.slices)

    def gate(configs: str, *options: str, golden: str | None = None, update: bool = True) -> tuple[float, dict]:
        """A gate run (``update``: writing goldens, which reads no figures cache; else checking them)."""
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "report.json"
            # benchmarks/ as the only path: it holds no test file, so pytest collects the generated cases alone.
            seconds = timed([sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-q", "-m", "aotcheck_case",
                             "-o", f"aot_config_modules={MODULES}", f"--aot-configs={configs}",
                             f"--aot-topologies={args.topologies}", f"--aot-slices={args.slices}",
                             f"--aot-golden-dir={golden or scratch + '/golden'}", *(["--update-golden"] if update else []),
                             f"--aot-report={report}", *options])[0]
            return seconds, json.loads(report.read_text())

    plain = ",".join(f"bench-{c}" for c in args.configs.split(","))
    searched = ",".join(f"bench-{c}-fit" for c in args.configs.split(","))
    bare_walls, gate_walls = [], []
    for _ in range(max(args.repeat, 1)):  # Alternating, so that a drift of the machine's speed hits both.
        bare_runs = per_family(args, "--bare")
        bare_walls.append((sum(w for w, _ in bare_runs), sum(float(o.split()[-1]) for _, o in bare_runs)))
        gate_walls.append(gate(plain, "--aot-no-cache", "-n", "0")[0])
    (bare_wall, bare_compile), gate_s = min(bare_walls), min(gate_walls)
    with tempfile.TemporaryDirectory() as cache:
        # Cold: checking goldens an uncached update wrote, filling the cache; warm: the same check, from it
        # (an update run reads no cache, so both sides are check runs of the same cases).
        goldens = f"{cache}/golden"
        gate(plain, "--aot-no-cache", "-n", "0", golden=goldens)
        cold_s, _ = gate(plain, f"--aot-cache-dir={cache}/figures", "-n", "0", golden=goldens, update=False)
        warm_s, warm = gate(plain, f"--aot-cache-dir={cache}/figures", "-n", "0", golden=goldens, update=False)
        pytest_s = pytest_alone()
        start_s = timed([sys.executable, "-c", "pass"])[0]
        split: dict[str, float] = {"process start": start_s}
        out = timed([sys.executable, __file__, "--phases", "--configs", args.configs, "--topologies",
                     args.topologies, "--slices", args.slices, "--cache-dir", f"{cache}/figures"])[1]
        split.update(json.loads(out.splitlines()[-1]))
    parallel_s, _ = gate(plain, "--aot-no-cache", "-n", "2")
    fit_s, probes = None, 0
    if not args.no_fit:
        fit_s, fitted = gate(searched, "--aot-no-cache", "-n", "0")
        probes = sum(((c["measured"] or {}).get("details", {}).get("fit") or {}).get("probes", 0) for c in fitted["cases"])
    attribution = [o.split() for _, o in per_family(args, "--attribution-worker")]
    plain_compile, attributed = sum(float(o[-2]) for o in attribution), sum(float(o[-1]) for o in attribution)
    hits = sum(1 for c in warm["cases"] if (c["measured"] or {}).get("cached"))

    rows = [
        ("gate -n 0 / bare lower+compile", gate_s, bare_wall, "<= 1.05"),
        ("warm figures cache / cold", warm_s, cold_s, f"<= 0.10 ({hits}/{len(warm['cases'])} hits)"),
        ("-n 2 / -n 0", parallel_s, gate_s, "< 1 (2 cores)"),
        (f"fit search / none ({probes} probes)", fit_s, gate_s, "its cost"),
        ("compile+dump+attribution / compile", attributed, plain_compile, "its cost"),
    ]
    rows = [row for row in rows if row[1] is not None]
    print(f"{args.configs} on {args.topologies} x {args.slices} slices")
    print(f"{'ratio':40} {'value':>7}  {'numerator':>10} {'denominator':>12}  target")
    for name, num, den, target in rows:
        print(f"{name:40} {num / den:7.3f}  {num:9.1f}s {den:11.1f}s  {target}")
    print(f"bare: {bare_compile:.1f}s of lower+compile in {bare_wall:.1f}s of wall.")
    record(f"{args.configs} on {args.topologies} x {args.slices}", rows)
    print(f"the warm run's {warm_s:.1f}s: pytest alone (no aotcheck, nothing collected) {pytest_s:.1f}s, "
          f"aotcheck's own {warm_s - pytest_s:.1f}s")
    print(f"the warm run's {warm_s:.1f}s, phase by phase (measured alone, in one process as the session): "
          + ", ".join(f"{phase} {seconds:.1f}s" for phase, seconds in split.items()))


def record(what: str, rows: list) -> None:
    """Each ratio's two sides as rows of benchmarks/timings.csv, one run id (docs/performance.md reads them)."""
    run = new_run()
    out: list[Row] = []
    for name, num, den, _ in rows:
        top, bottom = (side.strip() for side in name.split(" / ", 1))
        probes = re.search(r" \(.*\)$", bottom)  # "none (12 probes)": the numerator's count.
        top, bottom = (top + probes[0], bottom[:probes.start()]) if probes else (top, bottom)
        bottom = {"none": "gate -n 0", "-n 0": "gate -n 0"}.get(bottom, bottom)
        for side, seconds in ((bottom, den), (top, num)):
            command = f"bench {what}: {side}"
            if not any(r.command == command for r in out):
                out.append(here(command, seconds, run=run, of="" if side == bottom else f"bench {what}: {bottom}"))
    append(out)


if __name__ == "__main__":
    main()
