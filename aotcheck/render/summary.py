"""The session in the terminal: its header (from its :class:`~aotcheck.gate.run.RunHeader`), a line per
case as it finishes, an interruption, and the end-of-session summary (the table of cases, notes, what an update did, stale goldens, a toolchain upgrade). The
table's rows are the Markdown summary's too (:mod:`aotcheck.render.markdown`).

Example:
    >>> from aotcheck.gate.report import Report
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.pipeline.measurement import Measurement
    >>> case = Case.of("lm", "prefill", "v5e-16")
    >>> o = Outcome(case, Verdict.PASS, measured=Measurement(case, {"peak_bytes": 4 * 2**30}, {}, 2.0))
    >>> case_line(o), f"{hbm_fraction(o):.0%}"
    ('lm/prefill@v5e-16x1: pass', '25%')
    >>> print("\\n".join(session_summary(Report([o]), update=False)))  # doctest: +NORMALIZE_WHITESPACE
    case                 compile  compile CPU  host RSS  peak/device  of HBM  FLOPs/device  comm/device  step >=  verdict
    -------------------  -------  -----------  --------  -----------  ------  ------------  -----------  -------  -------
    lm/prefill@v5e-16x1  2.0s     -            -         4.00 GiB     25.0%   -             0 B          -        pass
"""

from __future__ import annotations

from collections.abc import Sequence

from aotcheck.figures.program import comm_bytes, roofline
from aotcheck.figures.table import fit_max
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.gate.run import Interrupted, RunHeader
from aotcheck.gate.shard import job_spans
from aotcheck.gate.verdict import GoldenAction, Verdict
from aotcheck.programs.options import format_libtpu_init_args
from aotcheck.render.serving import serving_lines
from aotcheck.render.tables import fmt_value, hbm_fraction, table, verdict_label
from aotcheck.render.text import outcome_message, pools_lines, unsharded_lines
from aotcheck.render.upgrade import upgrade_lines
from aotcheck.spellings import ENVIRONMENT_FLAGS, SPELLINGS, flag_names
from aotcheck.targets.presets import refusals
from aotcheck.units import clip_runs, fmt_bytes, fmt_count, fmt_seconds, fmt_share


def header_lines(header: RunHeader) -> list[str]:
    """The session's header: what it checks, where goldens are, the cache, the shard (with its expected
    compile seconds of the whole matrix's), the toolchain, the presets and launch flags sent, a fit
    search, a golden directory that is not there; each line clipped (a flag of 100,000 digits by its ends)."""
    h = header
    flags = flag_names(h.front_end)
    # An update reads no cache; a read-only store is then not read either (hardening round 5, V23: the two
    # asides said "(read only) (written, not read)" of one run).
    url, shares = (h.cache.url, h.cache.shares) if h.cache else (None, False)
    store = ("" if not url else f", shared through {url}" if shares and not h.update else
             f", shared through {url} (read only)" if not h.update else
             f", shared through {url} (written: not read, goldens take figures from compiles only)"
             if shares else f", shared through {url} (neither read nor written by an update)")
    cache = (f"figures cache {h.cache.dir}{store}"
             f"{' (written, not read: goldens take figures from compiles only)' if h.update and not url else ''}"
             if h.cache else "no figures cache")
    expected = (f" (expected {h.shard_seconds[0]:.1f} s of the matrix's {h.shard_seconds[1]:.1f} s of compile CPU)"
                if h.shard and h.shard_seconds else "")
    lines = [f"aotcheck: {', '.join(h.targets)}; goldens in {h.golden_dir}{' (updating)' if h.update else ''}; {cache}"
             f"{f'; shard {h.shard[0]}/{h.shard[1]}{expected}' if h.shard else ''}; "
             + ", ".join(f"{k} {v if v is not None else 'not installed'}" for k, v in h.toolchain.items())]
    for config, own in h.declared:  # Compiled beyond the run's topologies: said, so nobody is surprised.
        lines.append(f"aotcheck: {config} also on {', '.join(own)}: the targets it declares (its targets=), "
                     f"whatever {flags['topologies']} lists")
    for config in h.no_eval:  # A job's first eval is a program too (marin #6378 failed there, three days in).
        lines.append(f"aotcheck: {config} has a train step and no eval step (a TrainerConfig's eval_step=None, "
                     "MaxText's eval_interval <= 0, or a train step given as a function): a job that evaluates "
                     "runs a program not compiled here")
    for setting, name, value, moot in h.unused_cache:  # A setting that changes nothing is said, not dropped.
        lines.append(f"aotcheck: {name} {value} is not used: {moot} turns every figures cache off, the shared one "
                     "too" if setting == "cache_url" else
                     f"aotcheck: {name} {value} changes nothing: it is the shared cache's mode, and no shared cache "
                     f"is set ({moot})")
    if h.foreign:
        lines.append(f"aotcheck: {len(h.foreign)} golden file(s) were made with another toolchain "
                     f"({h.foreign[0]}): their figures may differ for that reason alone; the summary's upgrade "
                     "table says which moved")
    if h.families is not None:
        lines += refusal_lines(h.families, h.toolchain.get("libtpu"))
    if h.launch_flags is not None:
        lines.append("aotcheck: your launch flags: " + (format_libtpu_init_args(h.launch_flags) or "none")
                     + (f" ({h.dropped} runtime-only dropped)" if h.dropped else "")
                     + (f" (from the environment's {ENVIRONMENT_FLAGS}: sent as compiler options, recorded in "
                        "each golden; no compile process inherits the variable)" if h.environment_flags_used else "")
                     + ("" if h.families is not None else
                        f"; aotcheck's presets off ({SPELLINGS['default_options'].ini} = none)"))
    if h.unused_environment_flags:
        lines.append(f"aotcheck: the environment's {ENVIRONMENT_FLAGS} ({h.unused_environment_flags[:200]}) is not "
                     f"used: {flags['libtpu_init_args']} (or {SPELLINGS['libtpu_init_args'].ini}) gives this run's "
                     "launch flags, and no compile process inherits the variable")
    if h.fit:
        lines.append(f"aotcheck: fit search of {h.fit!r} on every config that offers it (a few compiles each; "
                     f"gated as {fit_max(h.fit)})")
    with_equals = " (with '=')" if h.front_end == "pytest" else ""  # pytest reads a path after a space.
    if h.golden_dir_state in ("a file", "a dangling link"):
        what = ("is a file, not a directory" if h.golden_dir_state == "a file" else
                "is a symbolic link whose target does not exist")
        lines.append(f"aotcheck: WARNING: the golden directory {h.golden_dir} {what}: no golden can be read or "
                     f"written there. Move it aside or repair the link, or pass {flags['golden_dir']}=PATH{with_equals}.")
    elif h.golden_dir_missing:
        lines.append(f"aotcheck: WARNING: the golden directory {h.golden_dir} does not exist, so every case "
                     f"will be missing its golden. The rootdir is {h.rootdir}; if your goldens are elsewhere, "
                     f"pass {flags['golden_dir']}=PATH{with_equals}, or create them with {flags['update']}.")
    return [clip_runs(line) for line in lines]


def refusal_lines(families: Sequence[str], libtpu: str | None) -> list[str]:
    """What the header says about presets for these chip families under ``libtpu``.

    Example:
        >>> refusal_lines(["v5e", "h100"], "0.0.50.1"), len(refusal_lines(["v4"], "0.0.50.1"))
        ([], 1)
        >>> refusal_lines(["v4"], "9.9")[0].startswith("aotcheck: libtpu 9.9 is not in aotcheck's table")
        True
    """
    refused, unknown = refusals(families, libtpu)
    lines = [f"aotcheck: libtpu {libtpu} refuses aotcheck's presets {', '.join(sorted(names))} on "
             f"{', '.join(fams)}: not sent there (each golden records the options sent)"
             for names, fams in refused.items()]
    if unknown:
        lines.append(f"aotcheck: libtpu {libtpu} is not in aotcheck's table of accepted presets: each of "
                     f"{', '.join(unknown)} is probed once with a tiny compile, and refused presets are not sent")
    return lines


def interruption_line(stop: Interrupted) -> str:
    """What an interrupted run kept and what it did not do.

    Example:
        >>> interruption_line(Interrupted("SIGTERM", done=3, planned=10, update=True))
        'aotcheck: interrupted (SIGTERM) after 3 of 10 cases: the finished ones are reported and their goldens written; the rest did not run, and no stale golden was removed.'
    """
    return (f"aotcheck: interrupted ({stop.signal}) after {stop.done} of {stop.planned} cases: the finished ones are "
            "reported" + (" and their goldens written" if stop.update else "")
            + "; the rest did not run, and no stale golden was removed.")


def case_line(outcome: Outcome) -> str:
    """One line as a case finishes (the CLI's progress); a skipped case says why (its targets, its platforms).

    Example:
        >>> from aotcheck.gate.outcome import Outcome
        >>> from aotcheck.gate.verdict import Verdict
        >>> from aotcheck.pipeline.case import Case
        >>> case_line(Outcome(Case.of("srv", "step", "v5e-16"), Verdict.SKIPPED, reason="srv is deployed on v5e-1 only"))
        'srv/step@v5e-16x1: skipped (srv is deployed on v5e-1 only)'
    """
    why = f" ({outcome.reason})" if outcome.verdict is Verdict.SKIPPED and outcome.reason else ""
    return f"{outcome.case.id}: {verdict_label(outcome)}{why}" + (" FAILED" if outcome.failed else "")


SUMMARY_HEADERS = ["case", "compile", "compile CPU", "host RSS", "peak/device", "of HBM", "FLOPs/device", "comm/device", "step >=",
                   "verdict"]


def summary_row(o: Outcome) -> list[str]:
    """One case's line in the summary table (terminal and Markdown alike)."""
    figures = o.figures or {}
    bound = roofline(figures, o.case.topology) if figures else None
    m = o.measured
    seconds = m.compile_seconds if m is not None else None
    return [
        o.case.id,
        "cached" if m is not None and m.cached else f"{seconds:.1f}s" if seconds is not None else "-",
        fmt_value("compile_cpu_seconds", figures.get("compile_cpu_seconds")),
        fmt_bytes(m.host_peak_bytes if m is not None else None),
        fmt_bytes(figures.get("peak_bytes")) if figures else "-",
        fmt_share(hbm_fraction(o)),
        fmt_count(figures.get("flops", figures.get("flops_xla"))) if figures else "-",
        fmt_bytes(comm_bytes(figures)) if figures else "-",
        fmt_seconds(bound["bound_seconds"]) if bound else "-",
        verdict_label(o),
    ]


def summary_table(outcomes: Sequence[Outcome]) -> str:
    return table(SUMMARY_HEADERS, [summary_row(o) for o in outcomes])


def pooled_lines(report: Report) -> list[str]:
    """Each program searched on several pools, as one answer over them (each after a blank line)."""
    return [line for program, pools in report.pools for line in ("", *pools_lines(program, pools))]


def empty_shard_line(shard: tuple[int, int]) -> str:
    """What a shard that holds no case says: it passes (a project with fewer cases than shards).

    Example:
        >>> print(empty_shard_line((3, 4)))
        aotcheck: shard 3/4 holds no case of the matrix: nothing to check here, passed (the other shards check them)
    """
    k, n = shard
    return f"aotcheck: shard {k}/{n} holds no case of the matrix: nothing to check here, passed (the other shards check them)"


def session_summary(report: Report, *, update: bool, accept_args: Sequence[str] = ()) -> list[str]:
    """The end-of-session lines: the table, notes on improvements, what an update did, stale goldens."""
    lines = [summary_table(report.outcomes)] if report.outcomes else []
    if report.shard and not report.outcomes and not report.broken:
        lines.append(empty_shard_line(report.shard))
    served = serving_lines(report, accept_args=accept_args)
    lines += ["", *served] if served else []
    lines += pooled_lines(report)
    for o in report.outcomes:
        if (o.verdict is Verdict.IMPROVEMENT and not o.failed) or o.drift_warning:
            lines += ["", outcome_message(o) if o.drift_warning else f"note: {outcome_message(o)}"]
    for o in report.outcomes:
        lines += [line for found in unsharded_lines(o) for line in ("", "note: " + found)]
    for name, error in sorted(report.broken.items()):
        lines += ["", f"aotcheck: config {name!r} could not be built: {error}"]
    if update:
        actions = [o.golden_action for o in report.outcomes]
        counts = {a: actions.count(a) for a in GoldenAction}
        lines += ["", f"aotcheck --update-golden: {counts[GoldenAction.CREATED]} created, "
                      f"{counts[GoldenAction.CHANGED]} changed, {counts[GoldenAction.UNCHANGED]} unchanged; "
                      "golden files of cases that did not run were left alone."]
    lines += [f"aotcheck: removed stale golden {rel}" for rel in report.removed]
    shipped = [o.shipped for o in report.outcomes if o.shipped is not None]
    if shipped:  # Where the job loads them from (docs/export.md), and their size: a figure, not gated.
        lines += ["", f"aotcheck: exported {len(shipped)} passing case(s), {fmt_bytes(sum(s.payload_bytes for s in shipped))} "
                      f"of executables, each beside its manifest (first: {shipped[0].manifest}); "
                      "the job loads one with aotcheck.load(DIR, case_id)"]
    if report.upgrade is not None:
        lines += ["", *upgrade_lines(report.upgrade, golden_dir=report.golden_dir, extra=accept_args)]
    notes = [*([interruption_line(report.interrupted)] if report.interrupted else []), *report.notes]
    if notes:
        lines += ["", *notes]
    if report.stale:
        lines += ["", f"aotcheck: WARNING: {len(report.stale)} stale golden file(s) with no registered case: "
                      + ", ".join(report.stale)
                      + ". Remove them, or run --update-golden over the whole matrix (no -k, no --aot-configs)."]
    return lines


def layout_lines(layout: list[range]) -> list[str]:
    """``aotcheck shards N``'s words: how many jobs, how many shards each, then each job's.

    Example:
        >>> layout_lines([range(1, 4), range(4, 6)])
        ['5 shards over 2 jobs, 3 a job (the last 2):', '  job 1: shards 1-3', '  job 2: shards 4-5']
    """
    last = f" (the last {len(layout[-1])})" if len(layout[-1]) != len(layout[0]) else ""
    return [f"{layout[-1].stop - 1:,} shards over {len(layout):,} jobs, {len(layout[0])} a job{last}:",
            *(f"  job {job}: shard{'s' if len(shards) > 1 else ''} {span}"
              for job, (shards, span) in enumerate(zip(layout, job_spans(layout)), start=1))]
