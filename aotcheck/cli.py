"""``python -m aotcheck``: the topology table, the registry, one-off compiles.

Examples::

    python -m aotcheck topologies
    python -m aotcheck configs
    python -m aotcheck compile lm-tiny --topology v5e-16 --slices 2
    python -m aotcheck compile lm-tiny --topology v4-8 --method sample_decode --json
    python -m aotcheck compile lm-tiny --topology v4-8 --dump-hlo /tmp/hlo
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from aotcheck.case import Case
from aotcheck.compile import CompileError
from aotcheck.figures import comm_bytes, roofline
from aotcheck.format import fmt_bytes, fmt_count, fmt_seconds, fmt_share, table
from aotcheck.loader import LoaderError, load_config_modules
from aotcheck.registry import REGISTRY, RegistryError
from aotcheck.topology import CHIPS, TopologyError, all_topologies, check_num_slices, parse_topology


def _load(args: argparse.Namespace) -> None:
    modules = args.module or (["conftest.py"] if Path("conftest.py").is_file() else [])
    load_config_modules(modules)


def cmd_topologies(args: argparse.Namespace) -> int:
    rows = []
    for t in all_topologies():
        chip = t.chip
        rows.append(
            [t.name, t.libtpu_name, chip.chip_config, "x".join(map(str, t.chips_per_host_bounds)),
             t.num_chips, t.num_devices, fmt_bytes(chip.hbm_bytes), fmt_count(chip.peak_bf16_flops),
             fmt_bytes(chip.hbm_bandwidth) + "/s"]
        )
    if args.json:
        print(json.dumps([dict(zip(_TOPO_KEYS, r)) for r in rows], indent=2))
        return 0
    print(table(["name", "libtpu", "chip config", "chips/host", "chips", "devices",
                 "HBM/device", "bf16 FLOP/s/device", "HBM BW/device"], rows))
    print(f"\nAliases: v5litepod-N = v5e-N, tpu7x-N = 7x-N. cpu-N: N host CPU devices (no libtpu).")
    print(f"Per-device figures: {next(iter(CHIPS.values())).source}.")
    return 0


_TOPO_KEYS = ["name", "libtpu_name", "chip_config", "chips_per_host", "chips", "devices",
              "hbm_per_device", "peak_bf16_flops_per_device", "hbm_bandwidth_per_device"]


def cmd_configs(args: argparse.Namespace) -> int:
    _load(args)
    rows = []
    for entry in REGISTRY:
        try:
            programs = ", ".join(entry.programs())
        except RegistryError as e:
            programs = f"ERROR: {e}"
        rows.append([entry.name, programs, entry.description])
    if not rows:
        print("No configs registered. Register them in conftest.py (aotcheck.register) or pass --module.")
        return 1
    print(table(["config", "programs", "description"], rows))
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from aotcheck.runner import config_for, run_case  # Deferred: loads jax.

    _load(args)
    topology = parse_topology(args.topology)
    slices = check_num_slices(args.slices)
    entry = REGISTRY.get(args.config)
    programs = [args.method] if args.method else list(entry.programs())
    results = []
    for program in programs:
        case = Case(entry.name, program, topology.name, slices)
        results.append(run_case(case, config=config_for(case)))
    if args.dump_hlo:
        out = Path(args.dump_hlo)
        out.mkdir(parents=True, exist_ok=True)
        for r in results:
            path = out / f"{r.case.config}.{r.case.program}@{r.case.topology}x{r.case.num_slices}.hlo.txt"
            path.write_text(r.compiled.as_text())
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps({r.case.program: {"case": r.case.id, "compile_seconds": round(r.compile_seconds, 3),
                                           "figures": r.figures, "compiler_options": r.compiler_options}
                          for r in results}, indent=2, sort_keys=True))
        return 0
    hbm = topology.chip.hbm_bytes if topology.chip else None
    rows = []
    for r in results:
        f = r.figures
        bound = roofline(f, topology)
        rows.append([r.case.id, f"{r.compile_seconds:.1f}s", fmt_bytes(f["argument_bytes"]),
                     fmt_bytes(f["output_bytes"]), fmt_bytes(f["alias_bytes"]), fmt_bytes(f["temp_bytes"]),
                     fmt_bytes(f["generated_code_bytes"]), fmt_bytes(f["peak_bytes"]),
                     fmt_share(f["peak_bytes"] / hbm) if hbm else "-", fmt_count(f["flops"]),
                     fmt_count(f["flops_xla"]), fmt_bytes(comm_bytes(f)),
                     fmt_seconds(bound["bound_seconds"]) if bound else "-"])
    print(table(["case", "compile", "argument", "output", "alias", "temp", "code", "peak", "peak/HBM",
                 "FLOPs", "FLOPs (XLA raw)", "collectives", "step >="], rows))
    print("\nPer device. FLOPs count each loop body times its trip count (matmuls and convolutions);"
          "\nXLA's raw figure counts a loop body once. 'step >=' is a roofline lower bound.")
    if args.explain:
        for r in results:
            print("\n" + explain(r.compiled, r.figures))
    return 0


def explain(compiled, figures: dict) -> str:
    """Where the FLOPs and bytes come from: loops with their trip counts, top matmuls, collectives."""
    from aotcheck.hlo import analyze_hlo, iter_loops

    analysis = analyze_hlo(compiled.as_text())
    lines = [f"FLOPs per device: {fmt_count(analysis.flops)} loop-aware vs {fmt_count(figures['flops_xla'])} XLA raw"]
    loops = list(iter_loops(analysis))
    if loops:
        lines.append(table(
            ["loop", "trips", "runs", "FLOPs/trip", "FLOPs in all", "op"],
            [[l.name, l.trip_count if l.trip_count is not None else "unknown (counted once)", l.multiplier,
              fmt_count(l.flops_per_trip), fmt_count(l.flops_per_trip * (l.trip_count or 1) * l.multiplier),
              l.op_name[-60:]] for l in loops[:12]],
        ))
    lines.append(table(["top matmuls", "FLOPs in all", "times run"],
                       [[name[-80:], fmt_count(f), m] for f, name, m in analysis.top_ops]))
    lines.append(table(["collective", "count", "bytes/device"],
                       [[k, v.count, fmt_bytes(v.bytes)] for k, v in analysis.collectives.items()]))
    return "\n\n".join(lines)


def cmd_report(args: argparse.Namespace) -> int:
    from aotcheck.chart import svg_chart
    from aotcheck.report import merge_reports
    from aotcheck.summary import annotations, render

    merged = merge_reports([Path(p) for p in args.reports], expect_shards=args.expect_shards)
    for problem in merged.problems:
        print(f"aotcheck: {problem}", file=sys.stderr)
    text = render(merged, args.format)
    if args.output:
        with open(args.output, "a") as f:  # Appends: $GITHUB_STEP_SUMMARY collects several steps.
            f.write(text)
    else:
        print(text, end="")
    if args.svg:
        Path(args.svg).write_text(svg_chart(merged.outcomes))
    for line in annotations(merged, limit=args.annotations):
        print(line)
    return 1 if merged.failed or merged.problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m aotcheck", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("topologies", help="the topology table")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_topologies)

    module_help = "module or .py file that registers configs (repeatable; default ./conftest.py)"
    p = sub.add_parser("configs", help="the registered configs")
    p.add_argument("--module", action="append", help=module_help)
    p.set_defaults(func=cmd_configs)

    p = sub.add_parser("compile", help="compile one config and print its figures")
    p.add_argument("config")
    p.add_argument("--topology", required=True, help="e.g. v5e-16 (see `topologies`)")
    p.add_argument("--slices", type=int, default=1, help="number of slices (default 1)")
    p.add_argument("--method", help="one program (train_step, sample_decode, prefill, ...); default all")
    p.add_argument("--json", action="store_true", help="print figures as JSON")
    p.add_argument("--dump-hlo", metavar="DIR", help="write each program's optimized HLO text here")
    p.add_argument("--explain", action="store_true", help="show where the FLOPs and bytes come from")
    p.add_argument("--module", action="append", help=module_help)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("report", help="render (and merge) JSON reports from --aot-report")
    p.add_argument("reports", nargs="+", help="report files, e.g. one per CI shard")
    p.add_argument("--format", choices=["markdown", "text"], default="text")
    p.add_argument("--output", help="append the rendering here (e.g. $GITHUB_STEP_SUMMARY) instead of stdout")
    p.add_argument("--svg", help="write the peak-HBM bar chart here")
    p.add_argument("--expect-shards", type=int, help="the number of shards; name those with no report")
    p.add_argument("--annotations", type=int, default=0, metavar="N",
                   help="print up to N GitHub ::error annotations for failed cases")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (TopologyError, RegistryError, LoaderError, CompileError, KeyError, ValueError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"aotcheck: error: {message}", file=sys.stderr)
        return 2
