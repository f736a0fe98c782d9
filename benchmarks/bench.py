"""Speed of the gate, as ratios measured side by side in one run (not a timed test).

    python benchmarks/bench.py                      # lm-tiny on v4-8 and v5e-16, 1 and 2 slices
    python benchmarks/bench.py --configs lm-1b --topologies v5e-16 --slices 1

Prints, each against its baseline:
- the plugin (-n 0, no cache) against bare ``jax.jit(...).lower(...).compile()`` of the
  same cases: against the sum of the lower+compile times alone, and against the wall
  time of bare scripts (one fresh process per chip family, as correct figures need,
  see aotcheck/targets/families.py) that pay the same jax/libtpu start-up (target: under 10%);
- a rerun with a warm figures cache against the cold run (target: under 15%);
- ``-n 2`` against ``-n 0``;
- with ``--attribution``: each case's compile with XLA's dump and the peak attribution read
  from it, against the same compile without (alternating, one process per chip family;
  target: under 10%).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cases(configs: str, topologies: str, slices: str):
    """(config, program, Target, compiler options) of every reference case selected."""
    import fnmatch

    sys.path.insert(0, str(ROOT))
    import conftest  # noqa: F401  (registers the reference configs)
    from aotcheck.programs.options import resolve_compiler_options
    from aotcheck.programs.registry import REGISTRY
    from aotcheck.targets.topology import Target

    for entry in REGISTRY:
        if not any(fnmatch.fnmatchcase(entry.name, g) for g in configs.split(",")):
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


def attribution_cost(configs: str, topologies: str, slices: str) -> None:
    """Per case, alternating: lower+compile, and lower+compile with the dump plus attribution.
    Prints the two sums."""
    from aotcheck.figures.attribution import dump_options, read_dump
    from aotcheck.programs.lowering import arguments, lower_config

    plain = attributed = 0.0
    for config, program, target, options in cases(configs, topologies, slices):
        start = time.perf_counter()
        lower_config(config, target, program=program)[program].compile(compiler_options=options)
        plain += time.perf_counter() - start
        start = time.perf_counter()
        lowered = lower_config(config, target, program=program)[program]
        with tempfile.TemporaryDirectory() as dump:
            compiled = lowered.compile(compiler_options={**options, **dump_options(dump)})
            read_dump(dump, hlo_text=compiled.as_text(), arguments=arguments(lowered, config),
                      peak_bytes=compiled.memory_analysis().peak_memory_in_bytes)
        attributed += time.perf_counter() - start
    print(plain, attributed)


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return seconds, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="lm-tiny")
    parser.add_argument("--topologies", default="v4-8,v5e-16")
    parser.add_argument("--slices", default="1,2")
    parser.add_argument("--attribution", action="store_true", help="measure the peak attribution's cost only")
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--attribution-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare(args.configs, args.topologies, args.slices)
        return
    if args.attribution_worker:
        attribution_cost(args.configs, args.topologies, args.slices)
        return

    py = sys.executable
    select = [f"--aot-configs={args.configs}", f"--aot-topologies={args.topologies}", f"--aot-slices={args.slices}",
              "-m", "aotcheck", "-q"]
    from aotcheck.targets.families import family_of

    by_family: dict[str, list[str]] = {}
    for topology in args.topologies.split(","):
        by_family.setdefault(family_of(topology), []).append(topology)
    if args.attribution:
        plain = attributed = 0.0
        for topologies in by_family.values():
            out = timed([py, __file__, "--attribution-worker", "--configs", args.configs,
                         "--topologies", ",".join(topologies), "--slices", args.slices])[1].split()
            plain, attributed = plain + float(out[-2]), attributed + float(out[-1])
        print(f"compile + dump + attribution / compile: {attributed / plain:.3f} "
              f"({attributed:.1f}s / {plain:.1f}s)  target < 1.10")
        return
    with tempfile.TemporaryDirectory() as cache:
        bare_wall, bare_compile = 0.0, 0.0
        for topologies in by_family.values():
            wall, out = timed([py, __file__, "--bare", "--configs", args.configs,
                               "--topologies", ",".join(topologies), "--slices", args.slices])
            bare_wall += wall
            bare_compile += float(out.split()[-1])
        plugin_s = timed([py, "-m", "pytest", *select, "--aot-no-cache", "-n", "0"])[0]
        cold_s = timed([py, "-m", "pytest", *select, f"--aot-cache-dir={cache}", "-n", "0"])[0]
        warm_s = timed([py, "-m", "pytest", *select, f"--aot-cache-dir={cache}", "-n", "0"])[0]
        parallel_s = timed([py, "-m", "pytest", *select, "--aot-no-cache", "-n", "2"])[0]

    rows = [
        ("plugin -n 0 / bare scripts' wall", plugin_s, bare_wall, "< 1.10"),
        ("plugin -n 0 / sum of lower+compile", plugin_s, bare_compile, "(start-up included)"),
        ("warm figures cache / cold", warm_s, cold_s, "< 0.15"),
        ("-n 2 / -n 0", parallel_s, plugin_s, "< 1 (2 cores)"),
    ]
    print(f"{'ratio':36} {'value':>7}  {'numerator':>10} {'denominator':>12}  target")
    for name, num, den, target in rows:
        print(f"{name:36} {num / den:7.3f}  {num:9.1f}s {den:11.1f}s  {target}")


if __name__ == "__main__":
    main()
