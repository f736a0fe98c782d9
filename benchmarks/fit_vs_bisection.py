"""The fit search against a plain bisection over the same knob (a measurement, not a test).

    python benchmarks/fit_vs_bisection.py lm-1b --program train_step --topology v4-8

Runs, in this one process (one chip family per run: see aotcheck/targets/families.py),
the fit search of ``aotcheck.figures.fit`` and then a bisection from one step up to the
search's upper bound, each with its own empty figures cache so neither reuses the other's
compiles. Prints both answers, their compile counts and their seconds. The bisection counts
as "fits" what compiles and passes the HBM verdict, exactly as the search does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--program", default="train_step")
    parser.add_argument("--topology", default="v4-8")
    parser.add_argument("--slices", type=int, default=1)
    parser.add_argument("--knob", default="batch")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    import conftest  # noqa: F401  (registers the reference configs)
    from aotcheck.figures.fit import DEFAULT_UPPER
    from aotcheck.figures.hbm import hbm_verdict
    from aotcheck.pipeline.cache import FiguresCache
    from aotcheck.pipeline.case import Case
    from aotcheck.pipeline.measure import fit_search
    from aotcheck.pipeline.stages import lower
    from aotcheck.programs.compile import CompileError
    from aotcheck.programs.knobs import knob_of
    from aotcheck.programs.registry import REGISTRY

    case = Case.of(args.config, args.program, args.topology, args.slices)
    config = REGISTRY.get(args.config).program(args.program)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        found = fit_search(case, config, args.knob, cache=FiguresCache(Path(tmp) / "search"))
        search_seconds = time.perf_counter() - start
        print(f"search: max {found.max_size} in {found.probes} compiles, {search_seconds:.0f} s"
              f" (bisected: {found.bisected}, upper bound: {found.upper_bound})", flush=True)

        knob = knob_of(config, args.knob, case.target)
        cache = FiguresCache(Path(tmp) / "bisection")
        compiles = 0

        def fits(steps: int) -> bool:
            nonlocal compiles
            compiles += 1
            try:
                peak = lower(case, knob.rebuild(steps * knob.step)).measure(cache).figures["peak_bytes"]
            except CompileError:
                ok = False
            else:
                ok = hbm_verdict(int(peak), case.topology) is None
            print(f"  bisection probe {steps * knob.step}: {'fits' if ok else 'does not fit'}", flush=True)
            return ok

        start = time.perf_counter()
        base = max(1, knob.size // knob.step)
        lo, hi = 0, (getattr(config, "fit_upper", None) or DEFAULT_UPPER * knob.size) // knob.step + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        print(f"bisection: max {lo * knob.step} in {compiles} compiles, {time.perf_counter() - start:.0f} s"
              f" (configured {knob.size}, step {knob.step}, {base} steps)")
        print("agree" if lo * knob.step == found.max_size else "DISAGREE")


if __name__ == "__main__":
    main()
