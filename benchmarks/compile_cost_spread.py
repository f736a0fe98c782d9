"""How much the compile-cost figures vary from run to run on this machine (docs/toolchains.md quotes the result).

Runs the same uncached gate N times (``aotcheck check``: one compile at a time) and N times under
load (the plugin with ``-n 2``: two compiles at once on a 2-core machine), and prints, per case,
the spread of ``compile_cpu_seconds`` and ``lower_cpu_seconds``: min, max and max/min. The default
tolerance (``*_cpu_seconds = 400% + 10``, aotcheck/figures/table.py) must exceed what this shows.

    python benchmarks/compile_cost_spread.py [--runs 5] [--topologies v4-8,v5e-16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("compile_cpu_seconds", "lower_cpu_seconds")


def run(kind: str, report: Path, topologies: str) -> None:
    if kind == "sequential":
        args = [sys.executable, "-m", "aotcheck", "check", "--configs", "lm-tiny", "--topologies", topologies,
                "--slices", "1", "--no-cache", f"--report={report}"]
    else:
        # The generated cases only: -m aotcheck alone would also run the suite's main_job tests.
        args = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-m", "aotcheck and not main_job", "--aot-configs=lm-tiny",
                f"--aot-topologies={topologies}", "--aot-slices=1", "--aot-no-cache", f"--aot-report={report}"]
    subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--topologies", default="v4-8,v5e-16")
    parser.add_argument("--kinds", default="sequential,loaded", help="which runs: sequential, loaded or both")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp())
    for kind in args.kinds.split(","):
        values: dict[tuple[str, str], list[float]] = {}
        for i in range(args.runs):
            report = out / f"{kind}-{i}.json"
            run(kind, report, args.topologies)
            for case in json.loads(report.read_text())["cases"]:
                figures = (case["measured"] or {}).get("figures") or {}
                for name in FIGURES:
                    if name in figures:
                        values.setdefault((case["case"], name), []).append(figures[name])
        print(f"\n{kind} ({args.runs} runs{', -n 2' if kind == 'loaded' else ''}):")
        print(f"{'case':34} {'figure':20} {'min':>6} {'max':>6} {'max/min':>8}")
        for (case, name), vs in sorted(values.items()):
            print(f"{case:34} {name:20} {min(vs):6.2f} {max(vs):6.2f} {max(vs) / max(min(vs), 1e-9):8.2f}")


if __name__ == "__main__":
    main()
