"""Where a gated case's time goes, phase by phase, beside a bare ``lower().compile()`` of the same programs.

    python benchmarks/profile.py                                  # lm-tiny on v4-8 and v5e-16, 1 and 2 slices
    python benchmarks/profile.py --configs lm-1b --topologies v5e-16 --slices 1

Each chip family runs in a fresh process (as the gate's workers do), and in it, case by case, the two
sides in alternating order: the bare side (lower, then compile with the case's options), and the gate's own path,
``aotcheck.pipeline.measure.measure`` with a fresh figures cache, then its golden written and checked
(``aotcheck.gate.check.check_case``). The gate's phases are timed by wrapping the library's own functions
in this process only (measurement, not a second implementation): the inputs digest, trace+lower, the
module's text (the cache key), the located text, the compile (with XLA's dump), reading the optimized
HLO, the loop-aware analysis, the attribution (the dump read), the lint, cache writes, golden I/O, and
the measurement's round trip through a worker reply's JSON (what crossing the process boundary costs
besides the pipe). ``other`` is the gate's time its phases do not name.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

SPENT: collections.Counter[str] = collections.Counter()


def timed(phase: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[phase] += time.perf_counter() - start
    return wrapper


def instrument() -> None:
    """Wraps the functions each phase runs, where the gate's modules call them."""
    import jax

    from aotcheck.pipeline import cache, measure, stages

    for module, name, phase in [
        (measure, "inputs_key", "inputs digest"),
        (stages, "lower_function", "trace+lower"),
        (stages, "compile_lowered", "compile (with XLA's dump)"),
        (stages, "parse_module", "HLO read (parse)"),
        (stages, "check_against", "HLO read (checked against XLA's parse)"),
        (stages, "analyze_hlo", "analysis (loops, FLOPs, collectives)"),
        (stages, "measure_program", "analysis (loops, FLOPs, collectives)"),
        (stages, "kernel_memory", "analysis (loops, FLOPs, collectives)"),
        (stages, "read_dump", "attribution (XLA's dump read)"),
    ]:
        setattr(module, name, timed(phase, getattr(module, name)))
    stages.LoweredCase.lint = timed("lint", stages.LoweredCase.lint)
    for prop, phase in (("module_text", "module text (cache key)"), ("located_text", "located text (lines)")):
        wrapped = functools.cached_property(timed(phase, getattr(stages.LoweredCase, prop).func))
        wrapped.__set_name__(stages.LoweredCase, prop)
        setattr(stages.LoweredCase, prop, wrapped)
    cache.FiguresCache.put = timed("cache writes", cache.FiguresCache.put)
    cache.FiguresCache.remember = timed("cache writes", cache.FiguresCache.remember)
    jax.stages.Compiled.as_text = timed("HLO read (text)", jax.stages.Compiled.as_text)


def family_worker(configs: str, topologies: str, slices: str) -> None:
    """One family's cases: bare and gated, alternating; prints JSON seconds per phase."""
    import bench
    from aotcheck.gate.check import check_case
    from aotcheck.gate.golden import GoldenStore
    from aotcheck.gate.worker import WorkerReply
    from aotcheck.pipeline.cache import FiguresCache
    from aotcheck.pipeline.case import Case
    from aotcheck.pipeline.measure import measure
    from aotcheck.programs.compile import warm_up
    from aotcheck.programs.lowering import lower_config
    from aotcheck.programs.registry import REGISTRY

    found = list(bench.cases(configs, topologies, slices))
    entry_of = {id(c): e.name for e in REGISTRY for c in e.programs().values()}
    warm_up(found[0][2].topology.family)  # As a worker does before its first case.
    instrument()
    bare: collections.Counter[str] = collections.Counter()
    gate_total = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        cache, store = FiguresCache(Path(scratch) / "cache"), GoldenStore(Path(scratch) / "golden")
        for i, (config, program, target, options) in enumerate(found):
            case = Case.of(entry_of[id(config)], program, target.topology.name, target.num_slices)

            def bare_side(config=config, program=program, target=target, options=options) -> None:
                start = time.perf_counter()
                lowered = lower_config(config, target, program=program)[program]
                bare["lower"] += time.perf_counter() - start
                start = time.perf_counter()
                lowered.compile(compiler_options=options)
                bare["compile"] += time.perf_counter() - start

            if i % 2 == 0:  # Alternating which side goes first: the second finds JAX's tracing caches warm.
                bare_side()
            start = time.perf_counter()
            result = measure(case, registry=REGISTRY, cache=cache)
            gate_total += time.perf_counter() - start
            if i % 2 == 1:
                bare_side()
            start = time.perf_counter()
            reply = WorkerReply(dataclasses.replace(result, compiled=None))  # A reply carries no executable.
            WorkerReply.from_json(json.loads(json.dumps(reply.to_json())))
            SPENT["worker reply (JSON both ways)"] += time.perf_counter() - start
            gate_total += time.perf_counter() - start
            start = time.perf_counter()
            for update in (True, False):
                check_case(case, measure=lambda c, result=result: result, store=store, update=update)
            SPENT["golden I/O and verdict"] += time.perf_counter() - start
            gate_total += time.perf_counter() - start
    print(json.dumps({"bare": dict(bare), "gate": gate_total, "phases": dict(SPENT), "cases": len(found)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="lm-tiny")
    parser.add_argument("--topologies", default="v4-8,v5e-16")
    parser.add_argument("--slices", default="1,2")
    parser.add_argument("--family-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.family_worker:
        return family_worker(args.configs, args.topologies, args.slices)
    from aotcheck.targets.families import family_of

    by_family: dict[str, list[str]] = {}
    for topology in args.topologies.split(","):
        by_family.setdefault(family_of(topology), []).append(topology)
    bare: collections.Counter[str] = collections.Counter()
    phases: collections.Counter[str] = collections.Counter()
    gate, cases = 0.0, 0
    for topologies in by_family.values():
        out = subprocess.run([sys.executable, __file__, "--family-worker", "--configs", args.configs,
                              "--topologies", ",".join(topologies), "--slices", args.slices],
                             cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(out.stderr[-3000:])
        got = json.loads(out.stdout.splitlines()[-1])
        bare.update(got["bare"])
        phases.update(got["phases"])
        gate += got["gate"]
        cases += got["cases"]
    bare_total = sum(bare.values())
    print(f"{args.configs} on {args.topologies} x {args.slices} slices: {cases} cases, one process per family")
    print(f"{'phase':45} {'seconds':>8} {'of bare':>8}")
    for name, seconds in (("bare: lower", bare["lower"]), ("bare: compile", bare["compile"])):
        print(f"{name:45} {seconds:8.2f} {seconds / bare_total:8.3f}")
    for name, seconds in sorted(phases.items(), key=lambda kv: -kv[1]):
        print(f"{'gate: ' + name:45} {seconds:8.2f} {seconds / bare_total:8.3f}")
    other = gate - sum(phases.values())
    print(f"{'gate: other':45} {other:8.2f} {other / bare_total:8.3f}")
    print(f"{'gate in-process / bare lower+compile':45} {gate / bare_total:8.3f}   ({gate:.1f}s / {bare_total:.1f}s)")


if __name__ == "__main__":
    main()
