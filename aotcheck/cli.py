"""``python -m aotcheck``: the gate without pytest, the topology table, the registry, one-off compiles.

Examples::

    python -m aotcheck check --topologies v4-8,v5e-16 --slices 1,2 --configs 'lm-*'
    python -m aotcheck check --update-golden --report aot-report.json --shard 1/2
    python -m aotcheck topologies
    python -m aotcheck configs
    python -m aotcheck compile lm-tiny --topology v5e-16 --slices 2
    python -m aotcheck compile lm-tiny --topology v4-8 --method sample_decode --json
    python -m aotcheck fit lm-tiny --topology v5e-16 --program train_step
    python -m aotcheck report aot-report-*.json --format markdown --output summary.md
    python -m aotcheck shards 1024 --json
    python -m aotcheck shards 1000 --format buildkite
    python -m aotcheck bisect 'lm-tiny/train_step@v5e-16x1' --figure peak_bytes --good v1.2
    python -m aotcheck init --model nnx --topologies v5e-16

Example:
    >>> main(["topologies", "--json"])  # doctest: +ELLIPSIS
    [
      {
        "name": "v4-8",
        "libtpu_name": "v4:2x2x1",
    ...
    0
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from aotcheck.pipeline.case import Case
from aotcheck.errors import AotcheckError, OutOfMemory, WorkerCrashed
from aotcheck.figures.hbm import hbm_verdict
from aotcheck.figures.fit import Fit, over_pools
from aotcheck.figures.program import Details
from aotcheck.gate.check import failure_of
from aotcheck.gate.isolation import Measurer
from aotcheck.gate.outcome import Outcome, Reason
from aotcheck.gate.report import merge_reports
from aotcheck.ini import find_ini
from aotcheck.programs.loader import LoaderError, load_config_modules, note_loaded
from aotcheck.programs.registry import REGISTRY, RegistryError, registrations
from aotcheck.scaffold import plan_init, write_init
from aotcheck.render.chart import svg_chart
from aotcheck.render.markdown import annotations, markdown
from aotcheck.programs.knobs import check_knob, default_knob
from aotcheck.render.explain import compile_table, explain
from aotcheck.render.summary import case_line, header_lines, pooled_lines, session_summary, summary_table
from aotcheck.render.tables import table, topologies_table
from aotcheck.render.serving import serving_lines
from aotcheck.render.text import crash_words, fit_lines, hbm_words, outcome_message, pools_lines
from aotcheck.units import clip_runs
from aotcheck.calibrate import add_command as calibrate_command
from aotcheck.shipping import add_commands as shipping_commands
from aotcheck.matrix import add_command as shards_command
from aotcheck.bisect import add_command as bisect_command
from aotcheck.interruption import Interruption
from aotcheck.session import GateSession, exit_status
from aotcheck.settings import GateSettings, SettingsError, add_cli_arguments, read_settings
from aotcheck.usage import invocation_problem
from aotcheck.cmdline import (COMPILE_SETTINGS, Parser, compile_options, count, ini_values, positive, read_target,
                              read_targets)
from aotcheck.targets.platform import GPU, TPU
from aotcheck.targets.topology import topologies


def _load(modules: Sequence[str] | None, rootdir: Path | None = None) -> None:
    """Registers configs as pytest would: the rootdir's conftest.py (module ``conftest``), the ini's
    ``aot_config_modules``, then ``modules``. The rootdir is the pytest configuration's directory."""
    if rootdir is None:
        ini = find_ini(Path.cwd())
        rootdir, modules = ini.rootdir, ini.lines("aot_config_modules") + list(modules or [])
    if (rootdir / "conftest.py").is_file():
        if str(rootdir) not in sys.path:
            sys.path.insert(0, str(rootdir))
        try:
            before = registrations()
            conftest = importlib.import_module("conftest")
            if registrations() != before:
                note_loaded("conftest", conftest.__file__)
        except Exception as e:
            raise LoaderError(f"Importing {rootdir / 'conftest.py'} failed: {type(e).__name__}: {e}") from e
    load_config_modules(modules or [], rootdir=rootdir)


def cmd_check(args: argparse.Namespace) -> int:
    ini = find_ini(Path.cwd())
    values = read_settings(option=lambda s: getattr(args, s.name, None) if s.cli else None, ini=ini_values(ini))
    settings = GateSettings.parse(rootdir=ini.rootdir, **values, front_end="cli")
    if args.topologies is not None and not args.topologies.strip():
        raise SettingsError("--topologies is empty; name the topologies to check, e.g. --topologies v4-8,v5e-16")
    if not settings.targets:
        raise SettingsError("no topologies to check: pass --topologies (e.g. --topologies v4-8,v5e-16) "
                            "or set aot_topologies in the [pytest] section of your ini file")
    _load([], settings.rootdir)
    with GateSession(settings) as session:
        session.start_workers()
        session.prepare()
        for line in header_lines(session.header()):
            print(line)
        session.interruption.install()
        try:
            report = session.check_all(on_outcome=lambda o: print(case_line(o), flush=True))
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: the finished cases are reported, the workers stopped.
            session.interruption.note()
            report = session.finish()
        finally:
            session.interruption.restore()
    try:
        print("\n".join(["", *session_summary(report, update=settings.update, accept_args=session.accept_args())]))
        for outcome in report.failed:
            print(f"\n{outcome.case.id} FAILED:\n{outcome_message(outcome)}")
        sys.stdout.flush()
    except OSError:  # After SIGHUP the terminal may be gone: the report is written, there is no one to tell.
        if session.interruption.signal != "SIGHUP":
            raise
        sys.stdout = sys.stderr = open(os.devnull, "w")  # Nor at exit, when Python flushes them.
    if session.interruption.signal:
        return INTERRUPTED_STATUS[session.interruption.signal]
    return exit_status(report)


# What a shell reports for a command ended by the signal: 128 + its number.
INTERRUPTED_STATUS = {"SIGHUP": 129, "SIGINT": 130, "SIGTERM": 143}


def cmd_topologies(args: argparse.Namespace) -> int:
    records = [t.listing() for t in topologies()]
    sources = (topologies(TPU)[0].device.source, topologies(GPU)[0].device.source)
    print(json.dumps(records, indent=2) if args.json else topologies_table(records, sources=sources))
    return 0


def cmd_configs(args: argparse.Namespace) -> int:
    _load(args.config_modules)
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


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Sends what config modules and builders print (a banner, a ``print`` left in) to stderr, at the
    descriptor too (a C library's or a subprocess's output): stdout is the command's product, the
    JSON of ``compile --json`` that a script parses."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError):  # No real descriptor (an embedded interpreter): Python's prints alone.
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def cmd_compile(args: argparse.Namespace) -> int:
    with _stdout_to_stderr():  # Importing and building configs: their prints are not the JSON.
        _load(args.config_modules)
        target = read_target(args)
        entry = REGISTRY.get(args.config)
        programs = [args.method] if args.method else list(entry.programs())
        for program in programs:
            entry.program(program)  # ProgramNotFound before any compile.
    # Compiles run in a worker process: a libtpu crash is reported, not suffered.
    options = compile_options(args)
    headroom = options.pop("hbm_headroom")  # The ini's aot_hbm_headroom: the verdict --json says.
    measurer = Measurer(keep_hlo=bool(args.dump_hlo or args.explain), **options)
    results, case = [], None
    try:
        for program in programs:
            case = None  # Until this program's case is built: a failure before it is not another case's.
            case = Case.for_config(entry.name, entry.program(program), target)
            with _stdout_to_stderr():  # The session builds the config again (a builder must give the same one).
                results.append(measurer(case))
    except Exception as e:  # Classified as the gate classifies it, and worded from its record as the gate words it.
        verdict, failure = failure_of(e)
        if failure.reason is Reason.INPUT or case is None:
            raise  # aotcheck's own error explains itself: one line, exit status 2.
        print(f"aotcheck: error: {outcome_message(Outcome(case, verdict, error=failure))}", file=sys.stderr)
        return 3 if failure.reason is Reason.CRASHED else 2
    finally:
        measurer.close()
    if args.dump_hlo:
        out = Path(args.dump_hlo)
        out.mkdir(parents=True, exist_ok=True)
        for r in results:
            path = out / f"{r.case.config}.{r.case.program_id}@{r.case.target}.hlo.txt"
            path.write_text(r.hlo_text or "")
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        hbm = target.topology.device.memory_bytes
        print(json.dumps({r.case.program_id: {  # A view of each measurement, with its share of the chip's HBM.
            **r.view("case", "figures", "compiler_options", "host_peak_bytes", "details", "attribution_problem"),
            "compile_seconds": round(r.compile_seconds, 3), "hbm_bytes_per_device": hbm,
            "peak_share_of_hbm": r.figures["peak_bytes"] / hbm if hbm else None,
            # aotcheck's own check (a GPU compile never refuses a program for its size): None when it fits.
            "hbm_verdict": hbm_words(over) if (over := hbm_verdict(int(r.figures["peak_bytes"]), target.topology,
                                                                   headroom=headroom)) is not None else None,
        } for r in results}, indent=2, sort_keys=True))
        return 0
    print(compile_table(results, target.topology))
    if args.explain:
        for r in results:
            print("\n" + explain(r.hlo_text or "", r.figures, details=r.details))
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    _load(args.config_modules)
    targets = read_targets(args)  # Several: every pool a job may land on (v5p-8, else v4-8).
    entry = REGISTRY.get(args.config)
    program = args.program or next(iter(entry.programs()))
    # Bad input before any compile, and without libtpu in this process (compiles run in workers).
    config = entry.program(program)
    knob = args.knob or default_knob(config)
    check_knob(config, knob)
    if not 0 < args.headroom <= 1:
        raise SettingsError(f"--headroom: {args.headroom} must be a number in (0, 1], e.g. 0.95")
    options = compile_options(args)
    del options["hbm_headroom"]  # --headroom, not the ini's, as documented.
    measurer = Measurer(fit=knob, hbm_headroom=args.headroom, **options)
    cases = [Case.for_config(entry.name, config, target) for target in targets]
    fits, too_big = {}, []  # too_big: pools where the configured size itself does not fit.
    try:
        for case in cases:  # One family's worker per chip family, as the gate's.
            searched = _fit_on(measurer, case, quiet=args.json)
            if searched is None:
                return 3
            fits[case.target.name] = searched[0]
            too_big += [case.target.name] if not searched[1] else []
    finally:
        measurer.close()
    if len(cases) == 1:
        (case,), (found,) = cases, fits.values()
        if args.json:
            print(json.dumps({"case": case.id, "fit": found.to_json()}, indent=2, sort_keys=True))
        else:
            print("\n".join(fit_lines(case.id, found, case.topology)))
        return 0 if found.max_size and not too_big else 1
    pools = over_pools(fits)
    if args.json:
        print(json.dumps({"config": entry.name, "program": program, "pools": pools.to_json()}, indent=2,
                         sort_keys=True))
    else:
        for case in cases:
            print("\n".join(fit_lines(case.id, fits[case.target.name], case.topology)) + "\n")
        print("\n".join(pools_lines(f"{entry.name}/{program}", pools)))
    return 0 if pools.max_size and not too_big else 1  # A pool the configured size does not fit: a job there OOMs.


def _fit_on(measurer: Measurer, case: Case, *, quiet: bool) -> tuple[Fit, bool] | None:
    """One pool's search, and whether the configured size fits there; None when the compile process
    died (said on stderr)."""
    try:
        with _stdout_to_stderr() if quiet else contextlib.nullcontext():  # A config's prints are not the JSON.
            return measurer(case).details.fit, True
    except OutOfMemory as e:  # The configured size does not fit: the search's answer below it.
        found = Details.from_json(e.details).fit if e.details is not None else None
        if found is None:
            raise
        return found, False
    except WorkerCrashed as e:
        print(f"aotcheck: error: {case.id}: {crash_words(e, case.topology.family)}", file=sys.stderr)
        return None


def cmd_report(args: argparse.Namespace) -> int:
    merged = merge_reports([Path(p) for p in args.reports], expect_shards=args.expect_shards)
    for problem in merged.problems:
        print(f"aotcheck: {problem}", file=sys.stderr)
    if args.format == "markdown":
        text = markdown(merged)
    else:
        # A server's bill is judged over the merged shards; its accept command repeats the run's options.
        served = serving_lines(merged.report, accept_args=merged.report.accept_args)
        text = "\n".join([summary_table(merged.report.outcomes), *([""] + served if served else []),
                          *pooled_lines(merged.report)]
                         + [f"report problem: {p}" for p in merged.problems]) + "\n"
    if args.output:
        with open(args.output, "a") as f:  # Appends: $GITHUB_STEP_SUMMARY collects several steps.
            f.write(text)
    else:
        print(text, end="")
    if args.svg:
        Path(args.svg).write_text(svg_chart(merged.report.outcomes))
    for line in annotations(merged, limit=args.annotations):
        print(line)
    # A report missing, unreadable or holding a case another holds is bad input (2), said after rendering what
    # could be read (a case in two reports shown as the failing one holds it).
    return 2 if merged.problems else 1 if merged.failed else 0


def cmd_init(args: argparse.Namespace) -> int:
    plan = plan_init(Path(args.dir), model=args.model, topologies=args.topologies)
    write_init(plan)
    for path in [*plan.files, *plan.appends]:
        verb = "added aotcheck's settings to" if path in plan.appends else "wrote"
        print(f"aotcheck init: {verb} {path.relative_to(plan.root).as_posix()}")
    print(f"aotcheck init: conftest.py registers 'my-model' through the {plan.model} adapter; replace the model with "
          "yours, then accept its first figures and commit golden/:\n"
          "    python -m pytest -m aotcheck --update-golden\n"
          "    python -m pytest -m aotcheck")
    return 0


# The settings ``compile`` and ``fit`` take (those of the compile itself); ``check`` takes them all.
def _config_and_target(p: argparse.ArgumentParser, *, pools: bool = False) -> None:
    """The config and the target ``compile`` takes (``fit``: one or several pools)."""
    p.add_argument("config")
    p.add_argument("--topology", required=True, help=(
        "one or several pools a job may land on, comma-separated: the largest size that fits every one, "
        "e.g. v5p-8,v4-8 (see `topologies`)" if pools else "e.g. v5e-16, h100-8 or h100-8x2 (see `topologies`)"))
    p.add_argument("--slices", type=int, default=None, help="number of slices (GPU: hosts; default 1)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m aotcheck", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="the gate without pytest: compile the matrix, compare with goldens",
                       description="Reads the aot_* settings of the [pytest] section of your ini file, "
                       "as the pytest plugin does; options override them.")
    add_cli_arguments(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("topologies", help="the topology table")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_topologies)

    p = sub.add_parser("configs", help="the registered configs")
    add_cli_arguments(p, ("config_modules",))
    p.set_defaults(func=cmd_configs)

    p = sub.add_parser("compile", help="compile one config and print its figures")
    _config_and_target(p)
    p.add_argument("--method", help="one program (train_step, sample_decode, prefill, ...); default all")
    p.add_argument("--json", action="store_true", help="print figures as JSON")
    p.add_argument("--dump-hlo", metavar="DIR", help="write each program's optimized HLO text here")
    p.add_argument("--explain", action="store_true", help="show where the FLOPs and bytes come from")
    add_cli_arguments(p, COMPILE_SETTINGS)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("fit", help="the largest batch (or other knob) that compiles and fits HBM")
    _config_and_target(p, pools=True)
    p.add_argument("--program", help="train_step, prefill, sample_decode, ...; default the config's first")
    p.add_argument("--knob", default=None, help="what to search (default: the config's fit, else batch, else the "
                                                "one knob a config offers, e.g. MaxText's per_device_batch_size)")
    p.add_argument("--headroom", type=float, default=1.0, help="share of HBM the max may fill (default 1.0)")
    p.add_argument("--json", action="store_true", help="print the search as JSON")
    add_cli_arguments(p, COMPILE_SETTINGS)
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("init", help="start a project's gate: pytest settings, one config, the CI workflow",
                       description="Writes the aot_* pytest settings (pytest.ini, or added to pyproject.toml), "
                       "conftest.py registering one model, and .github/workflows/aot-gate.yml; writes nothing "
                       "when any of them exist.")
    p.add_argument("--dir", default=".", help="the project's root (default: here)")
    p.add_argument("--model", default="auto", help="adapter of the example: auto (what is installed: Flax NNX, "
                   "then Equinox, else plain JAX), nnx, linen, equinox or jax")
    p.add_argument("--topologies", default="v5e-16", help="topologies to gate (default v5e-16)")
    p.set_defaults(func=cmd_init)

    calibrate_command(sub, _load)
    shipping_commands(sub, _load, lambda argv: main(["check", *argv]))

    shards_command(sub)
    bisect_command(sub)

    p = sub.add_parser("report", help="render (and merge) JSON reports from --aot-report")
    p.add_argument("reports", nargs="+", help="report files, e.g. one per CI shard")
    p.add_argument("--format", choices=["markdown", "text"], default="text")
    p.add_argument("--output", help="append the rendering here (e.g. $GITHUB_STEP_SUMMARY) instead of stdout")
    p.add_argument("--svg", help="write the peak-HBM bar chart here")
    p.add_argument("--expect-shards", type=positive, help="the number of shards; name those with no report")
    p.add_argument("--annotations", type=count, default=0, metavar="N",
                   help="print up to N GitHub ::error annotations for failed cases")
    p.set_defaults(func=cmd_report)
    return parser


# Errors that explain themselves (every error of aotcheck's, and a value a command line cannot use): printed
# as one line, exit status 2.
USER_ERRORS = (AotcheckError, ValueError)


def main(argv: Sequence[str] | None = None) -> int:
    Parser.argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    problem = invocation_problem(Parser.argv, front_end="cli")
    if problem:  # argparse keeps a repeated option's last value without a word, and reads -1/4 as an option.
        parser.error(problem)
    args = parser.parse_args(argv)
    interruption = Interruption().install()
    try:
        return args.func(args)
    except KeyboardInterrupt:  # Outside a gate run (which reports what it finished): one line.
        interruption.note()
        print(f"aotcheck: interrupted ({interruption.signal})", file=sys.stderr)
        return INTERRUPTED_STATUS[interruption.signal or "SIGINT"]
    except USER_ERRORS as e:
        print(f"aotcheck: error: {clip_runs(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # A path the user gave that cannot be written or read.
        print(f"aotcheck: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        interruption.restore()
