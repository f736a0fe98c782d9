"""A case's message: what its verdict means for the user, with the fix, worded from the outcome's
records (:class:`~aotcheck.gate.outcome.Outcome`, its :class:`~aotcheck.gate.outcome.Failure`, the
comparison rows, the measurement's details), so the pytest plugin, the CLI and the reports say the
same. The session summary is :mod:`aotcheck.render.summary`'s, ``aotcheck compile`` and ``--explain``
:mod:`aotcheck.render.explain`'s.

Example:
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.pipeline.measurement import Measurement
    >>> from aotcheck.figures.hbm import hbm_verdict
    >>> case = Case.of("lm", "train_step", "v5e-16")
    >>> over = Outcome(case, Verdict.OVER_HBM, measured=Measurement(case, {"peak_bytes": 17 * 2**30}, {}, 1.0),
    ...                error=Failure(Reason.OVER_HBM, hbm=hbm_verdict(17 * 2**30, "v5e-16", headroom=0.9)))
    >>> print(outcome_message(over))
    lm/train_step@v5e-16x1 does not fit: it needs 17.00 GiB of 16.00 GiB HBM per device on v5e-16: 106% (headroom 90% allows 14.40 GiB).
    >>> print(outcome_message(Outcome(case, Verdict.ERROR, error=Failure.of(Reason.USER_CODE, KeyError("vocab")))))
    lm/train_step@v5e-16x1: KeyError while building or lowering it: vocab
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aotcheck.errors import WorkerCrashed
from aotcheck.figures.attribution import CLASSES, PEAK_FIGURE
from aotcheck.figures.fit import Fit, Pools
from aotcheck.figures.hbm import HbmVerdict
from aotcheck.figures.sharding import Unsharded
from aotcheck.figures.table import comm, parse
from aotcheck.gate.compare import Change, Row
from aotcheck.gate.golden import NEWER_GOLDEN
from aotcheck.gate.outcome import Accept, Failure, Outcome, Reason
from aotcheck.gate.verdict import Verdict
from aotcheck.pipeline.export import mismatch_words
from aotcheck.gate.why import why
from aotcheck.render.accept import accept_case_command
from aotcheck.render.memory import oom_words, overflow_phrase
from aotcheck.render.serving import usable_words
from aotcheck.render.tables import buffers_table, clip, fmt_value, source_line, table
from aotcheck.targets.topology import Topology
from aotcheck.units import clip_runs, fmt_bytes, fmt_pct, fmt_share


def change_table(rows: Sequence[Row]) -> str:
    """metric / golden / now / change / % / tolerance / status, one line per metric."""
    return table(
        ["metric", "golden", "now", "change", "%", "tolerance", "status"],
        [
            [r.metric, fmt_value(r.metric, r.golden), fmt_value(r.metric, r.now),
             ("+" if (r.delta or 0) > 0 else "") + fmt_value(r.metric, r.delta) if r.delta is not None else "-",
             fmt_pct(r.ratio), str(r.tolerance), r.change.value]
            for r in rows
        ],
    )


def comm_summary(rows: Sequence[Row]) -> list[str]:
    """One line per collective kind that moved, e.g. ``all-gather bytes +300.0%: 3 new all-gathers``."""
    by_metric = {r.metric: r for r in rows}
    lines = []
    for metric, row in by_metric.items():
        name = parse(metric)
        if name is None or name.family != "comm" or name.what != "bytes" or row.change is Change.OK:
            continue
        kind = name.kind
        count = by_metric.get(comm(kind, "count"))
        text = f"{kind} bytes {fmt_pct(row.ratio) if row.ratio is not None else row.change.value}"
        if count is not None and count.delta:
            text += f": {abs(int(count.delta))} {'new' if count.delta > 0 else 'fewer'} {kind}s"
        lines.append(text)
    return lines


def trim_error(text: str, *, max_lines: int = 12) -> str:
    """The lines of an XLA error that matter: the status line(s), not the C++ trace."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    keep = [line for line in lines if not line.lstrip().startswith(("File ", "@", "*** Begin", "---"))]
    if len(keep) > max_lines:
        keep = keep[:max_lines] + [f"... ({len(lines) - max_lines} more lines in the report)"]
    return "\n".join(keep)


def small_vmem_limit_words(small: Mapping[str, int], family: str) -> str:
    """Why a compile under a small scoped VMEM limit died, and the fix (see ``WorkerCrashed.small_vmem_limit``).

    Example:
        >>> print(small_vmem_limit_words({"kib": 1024, "default_kib": 16384}, "v4"))  # doctest: +ELLIPSIS
        It compiled with --xla_tpu_scoped_vmem_limit_kib=1024, below v4's default of 16384 KiB: ... Raise the limit, ...
    """
    return (f"It compiled with --xla_tpu_scoped_vmem_limit_kib={small['kib']}, below {family}'s default of "
            f"{small['default_kib']} KiB: libtpu dies compiling a program's collectives under a scoped VMEM limit "
            f"near 1 MiB (1,280 KiB crashed and 1,536 KiB compiled for a small train step on v4-8, libtpu 0.0.50.1), "
            f"and your job would die the same way at start-up. Raise the limit, or leave it unset for the chip's "
            f"default.")


def crash_words(crash: WorkerCrashed, family: str) -> str:
    """A worker's death as the CLI says it: the crash, and the small VMEM limit that caused it if one did."""
    small = crash.small_vmem_limit
    return f"{crash}\n{small_vmem_limit_words(small, family)}" if small else str(crash)


def load_check_line(check: Any) -> str:
    """What ``aotcheck load --check`` found for one manifest (a :class:`aotcheck.shipping.LoadCheck`).

    Example:
        >>> from types import SimpleNamespace as Found
        >>> print(load_check_line(Found(case="m/step@cpu-8x1", mismatches=(), load_seconds=0.01, compile_seconds=1.2,
        ...                             equal=True)))
        m/step@cpu-8x1: loaded in 0.010 s (a fresh compile: 1.200 s); its outputs equal a fresh JIT's bit for bit
    """
    if check.mismatches:
        return f"{check.case}: refused, not loaded: {mismatch_words(check.mismatches)}"
    if check.equal is None:
        return f"{check.case}: matches this process (not run: no config here to compare with)"
    timing = f"loaded in {check.load_seconds:.3f} s (a fresh compile: {check.compile_seconds:.3f} s)"
    if check.equal:
        return f"{check.case}: {timing}; its outputs equal a fresh JIT's bit for bit"
    return f"{check.case}: {timing}; its outputs differ from a fresh JIT's: {', '.join(check.differing) or 'their structure'}"


def outcome_message(outcome: Outcome) -> str:
    """What a case's verdict means for the user, with the fix: its golden file as the outcome records it
    and its accept command worded (a flag of 100,000 digits shown by its ends)."""
    return clip_runs(_message(outcome, golden_file=outcome.golden_file or outcome.golden_path,
                              accept=accept_case_command(outcome.accept) if outcome.accept is not None else
                              accept_case_command(Accept(outcome.case))))


def _message(outcome: Outcome, *, golden_file: str, accept: str) -> str:
    case, verdict, failure = outcome.case, outcome.verdict, outcome.error
    detail = failure.text if failure is not None else ""
    if verdict is Verdict.CRASHED:
        small = failure.fields.get("small_vmem_limit") if failure is not None else None
        if small:  # The launch flag is the cause: the job would die the same way compiling at start-up.
            return f"{case.id} crashed: {detail}\n{small_vmem_limit_words(small, case.topology.family)}"
        return (f"{case.id} crashed: {detail}\nA crash of the compiler (or the host's out-of-memory killer), "
                f"not a figure of your program: the other cases were checked. Try this case alone "
                f"({accept_case_command(Accept(case)).split(' ', 2)[2]}) to see whether it repeats; a newer {case.topology.platform.upgrade} may fix it.")
    if verdict is Verdict.COMPILE_ERROR:
        return f"{case.id} does not compile:\n{trim_error(detail)}"
    if verdict is Verdict.OUT_OF_MEMORY:
        overflow = failure.overflow if failure is not None else None
        fit = outcome.details.fit if outcome.details is not None else None  # How far down it fits, when searched.
        if overflow is not None and not overflow.hbm:  # An op's VMEM or SMEM, not HBM: its own words, never an HBM table.
            message = f"{case.id} {oom_words(overflow, case.topology, fit=fit)}"
            found = fit_lines(case.id, fit, case.topology) if fit is not None and fit.max_size else []
            return "\n\n".join([message, *(["\n".join(found)] if found else [])])
        message = f"{case.id} {oom_words(overflow, case.topology, text=trim_error(detail))}"
        if outcome.details is not None and outcome.details.peak_buffers:
            message += "\nThe largest buffers at XLA's peak (from its dump):\n" + buffers_table(outcome.details.peak_buffers)
        found = ["\n".join(fit_lines(case.id, fit, case.topology))] if fit is not None else []
        return "\n\n".join([message, *found, *unsharded_lines(outcome)])
    if verdict is Verdict.OVER_HBM:
        # It compiled (a GPU compile never refuses for size; a TPU's may leave less headroom than the
        # project allows): its own peak says what fills the memory, and a fit search how far down it fits.
        over = hbm_words(failure.hbm) if failure is not None and failure.hbm is not None else detail
        message = f"{case.id} does not fit: it {over}."
        details = outcome.details
        if details is not None and details.peak_buffers:
            message += "\nThe largest buffers at its peak:\n" + buffers_table(details.peak_buffers)
        fit = ["\n".join(fit_lines(case.id, details.fit, case.topology))] if details is not None and details.fit else []
        return "\n\n".join([message, *fit, *unsharded_lines(outcome)])
    if verdict is Verdict.ERROR:
        if failure is not None and failure.reason is Reason.INTERNAL:
            return detail  # pytest's report, verbatim.
        return f"{case.id}: {error_words(failure) if failure is not None else detail}"
    if verdict is Verdict.CORRUPT_GOLDEN:
        return f"{detail}\nTo replace it: {accept}"
    if verdict is Verdict.MISSING_GOLDEN:
        return f"{case.id} has no golden file ({golden_file}).\nTo create it: {accept}"
    if verdict is Verdict.ACCEPTED:
        return f"golden {outcome.golden_action.value if outcome.golden_action else 'written'}: {golden_file}"
    drift = [r for r in outcome.changes if r.change in (Change.NEW, Change.GONE)]
    if verdict is Verdict.METRICS_CHANGED or (verdict is Verdict.PASS and outcome.drift_warning):
        lines = [f"{case.id}: its figures and its golden's ({golden_file}) differ in names:"]
        lines += [f"  {r.metric}: {'new, not in the golden' if r.change is Change.NEW else 'in the golden, no longer produced'}"
                  for r in drift]
        if verdict is Verdict.PASS:
            return "\n".join(["warning: " + lines[0], *lines[1:], "These figures are not checked (aot_metric_drift = warn)."])
        lines += ["A figure that is not in both is not checked. If aotcheck or your toolchain changed what it "
                  f"measures, accept the new set: {accept}", "(Or let it pass with a warning: aot_metric_drift = warn.)"]
        return "\n".join(lines)
    if verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT):
        what = "regressed" if verdict is Verdict.REGRESSION else "improved beyond tolerance"
        lines = [f"{case.id} {what} against {golden_file}:", "", change_table(outcome.changes), ""]
        moved = comm_summary(outcome.changes)
        if moved:
            lines += ["Collectives that moved: " + "; ".join(moved), ""]
        why = why_lines(outcome)
        if why:
            lines += [*why, ""]
        lines += [line for found in unsharded_lines(outcome) for line in (found, "")]
        if outcome.toolchain_note:
            lines.append(f"Note: {outcome.toolchain_note}.")
        if outcome.options_changed:
            lines.append(options_note(outcome.options_changed))
        if outcome.measured is not None and outcome.measured.cached_from:
            lines.append(f"Its figures came from the shared cache's entry {outcome.measured.cached_from}, which "
                         "another runner wrote, not from a compile in this run (a run without the cache compiles it here).")
        if not (outcome.toolchain_note or "").startswith(NEWER_GOLDEN):  # A downgrade is never accepted.
            lines.append(f"To accept the new figures: {accept}")
        return "\n".join(lines)
    return outcome.reason if verdict is Verdict.SKIPPED else ""


def options_note(changed: Sequence[tuple[str, str | None, str | None]]) -> str:
    """A golden compiled with other compiler options than this run's, in words (each option, then the fix).

    Example:
        >>> print(options_note([("xla_tpu_enable_latency_hiding_scheduler", None, "true")]))
        Note: the golden was compiled with other compiler options than this run's (1 differs: xla_tpu_enable_latency_hiding_scheduler not sent there, true here); figures may differ for that reason alone. Options sent here and not there are aotcheck's presets or launch flags the golden's run did not have (aot_default_options = none, or other aot_libtpu_init_args): judge with the settings the goldens were made with, or accept these figures.
    """
    def value(v: str | None, where: str) -> str:
        return f"not sent {where}" if v is None else f"{str(v)[:40]} {where}"

    shown = "; ".join(f"{k} {value(a, 'there')}, {value(b, 'here')}" for k, a, b in changed[:6])
    more = f"; and {len(changed) - 6} more" if len(changed) > 6 else ""
    return (f"Note: the golden was compiled with other compiler options than this run's ({len(changed)} "
            f"differ{'s' if len(changed) == 1 else ''}: {shown}{more}); figures may differ for that reason alone. "
            "Options sent here and not there are aotcheck's presets or launch flags the golden's run did not have "
            "(aot_default_options = none, or other aot_libtpu_init_args): judge with the settings the goldens were "
            "made with, or accept these figures.")


def error_words(failure: Failure) -> str:
    """What went wrong, in words, after the case's id: the error's own message, with what aotcheck
    knows of it (user code's error named by its class; the golden file that could not be written).

    Example:
        >>> error_words(Failure.of(Reason.GOLDEN_UNWRITABLE, PermissionError(13, "Permission denied"),
        ...                        text="Permission denied", path="golden/lm/step@v4-8x1.json"))
        "cannot write its golden file golden/lm/step@v4-8x1.json: Permission denied. Check the golden directory's permissions."
    """
    if failure.reason is Reason.USER_CODE:
        return f"{failure.type_name} while building or lowering it: {failure.text}"
    if failure.reason is Reason.GOLDEN_UNWRITABLE:
        return f"cannot write its golden file {failure.path}: {failure.text}. Check the golden directory's permissions."
    return failure.text


def hbm_words(verdict: HbmVerdict) -> str:
    """A peak over the HBM allowed (:func:`aotcheck.figures.hbm.hbm_verdict`), in words: how much of the
    device's HBM it needs, and what the headroom allows when it is not all of it.

    Example:
        >>> from aotcheck.figures.hbm import hbm_verdict
        >>> print(hbm_words(hbm_verdict(int(17.3 * 2**30), "v5e-16")))
        needs 17.30 GiB of 16.00 GiB HBM per device on v5e-16: 108%
        >>> print(hbm_words(hbm_verdict(int(15.3 * 2**30), "v5e-16", headroom=0.9)))
        needs 15.30 GiB of 16.00 GiB HBM per device on v5e-16: 96% (headroom 90% allows 14.40 GiB)
    """
    allowed = f" (headroom {verdict.headroom:.0%} allows {fmt_bytes(verdict.limit_bytes)})" if verdict.headroom != 1.0 else ""
    return (f"needs {fmt_bytes(verdict.peak_bytes)} of {fmt_bytes(verdict.capacity_bytes)} HBM per device on "
            f"{verdict.topology}: {verdict.share:.0%}{allowed}")


UNSHARDED_CAUSES = (
    "Likely causes: the model skips its sharding constraints on a CPU host (a helper that checks "
    "jax.devices() or jax.default_backend(); decide by the mesh in context instead: "
    "jax.sharding.get_abstract_mesh().empty), or the partitioner dropped a constraint (constrain this "
    "activation's batch dimension). The figures are those of this program, which is not the one the accelerator "
    "would run. See docs/configs.md, \"How a model finds its mesh\".")


def unsharded_lines(outcome: Outcome, *, limit: int = 5) -> list[str]:
    """The lint's finding on a case (:mod:`aotcheck.figures.sharding`) as one paragraph; none if clean.

    Example:
        >>> from aotcheck.figures.program import Details
        >>> from aotcheck.figures.sharding import Unsharded
        >>> from aotcheck.pipeline.case import Case
        >>> found = Unsharded(2**25, "jit(step)/dot_general", "f32[16,256,256,4]", "model.py:88", "batch/tokens", 16, 8, 2)
        >>> from aotcheck.pipeline.measurement import Measurement
        >>> case = Case.of("llama", "train_step", "v5e-16")
        >>> o = Outcome(case, Verdict.PASS, measured=Measurement(case, {}, {}, 1.0, details=Details(unsharded=[found])))
        >>> print(unsharded_lines(o)[0])  # doctest: +NORMALIZE_WHITESPACE
        llama/train_step@v5e-16x1: 1 activation at the peak keeps the whole batch on every device
        (batch/tokens: 16 rows, split 8 ways):
          bytes/device  shape              split  buffer                 source
          ------------  -----------------  -----  ---------------------  -----------
          32.00 MiB     f32[16,256,256,4]  2      jit(step)/dot_general  model.py:88
        Likely causes: ...
    """
    found = outcome.details.unsharded if outcome.details is not None else []
    return [unsharded_paragraph(found, what=outcome.case.id, limit=limit)] if found else []


def unsharded_paragraph(found: Sequence[Unsharded], *, what: str, limit: int = 5) -> str:
    """The buffers that keep a sharded batch whole, a table and their likely causes (``found`` non-empty)."""
    first = found[0]
    rows = [[fmt_bytes(u.bytes), u.shape, u.split, clip(u.name, 60), source_line(u) or "-"] for u in found[:limit]]
    more = [f"  ... and {len(found) - limit} more (the JSON report has them all)"] if len(found) > limit else []
    head = (f"{what}: {len(found)} activation{'s' if len(found) > 1 else ''} at the peak "
            f"keep{'' if len(found) > 1 else 's'} the whole batch on every device "
            f"({first.input}: {first.batch} rows, split {first.ways} ways):")
    body = "\n".join("  " + line for line in table(["bytes/device", "shape", "split", "buffer", "source"], rows).splitlines())
    return "\n".join([head, body, *more, UNSHARDED_CAUSES])


def _buffer_line(g) -> str:
    b = g.now
    where = f" at {source_line(b)}" if source_line(b) else ""
    status = "new at peak" if g.before is None else f"was {fmt_bytes(g.before)}"
    count = f" x{b.count}" if b.count > 1 else ""
    return f"  {b.kind} +{fmt_bytes(g.added)}: {b.shape}{count} '{clip(b.name, 100)}'{where} ({status})"


def _collective_line(g) -> str:
    op = g.now
    where = f" at {source_line(op)}" if source_line(op) else ""
    status = "new" if g.before is None else f"was {fmt_bytes(g.before)}"
    return f"  {op.kind} +{fmt_bytes(g.added)} ({op.count} per step): '{clip(op.name, 100)}'{where} ({status})"


def why_lines(outcome: Outcome) -> list[str]:
    """Why the figures moved (:func:`aotcheck.gate.why.why`), worded."""
    found = why(outcome)
    lines = []
    if found.peak_growth:
        lines.append("The peak grew in: " + ", ".join(f"{kind} +{fmt_bytes(b)}" for kind, b in found.peak_growth))
    if found.buffers:
        lines += ["Buffers at the peak that are new or grew:", *map(_buffer_line, found.buffers)]
    for h in found.headroom:
        configured = (f"; the configured {h.fit.knob} ({h.fit.configured}) still fits, peak "
                      f"{fmt_bytes(h.fit.peak_at_configured)}" if h.fit and h.fit.peak_at_configured else "")
        lines.append(f"Headroom lost: the largest {h.kind} that fits fell from {h.before} to {h.now}{configured}.")
    if found.collectives:
        lines += ["Collectives that are new or grew:", *map(_collective_line, found.collectives)]
    return lines


def fit_lines(case_id: str, fit: Fit, topology: Topology) -> list[str]:
    """What a fit search found, in words, with what fills the memory at the max."""
    hbm = topology.device.memory_bytes
    share = (lambda b: f" ({fmt_share(b / hbm)} of {fmt_bytes(hbm)})") if hbm else (lambda b: "")
    how = ("bisection (the affine prediction was not confirmed: memory is not a straight line in the "
           f"{fit.knob} here)" if fit.bisected else "the affine prediction, confirmed")
    if fit.max_size == 0:
        peak = f"; its peak there: {fmt_bytes(fit.smallest_peak)}{share(fit.smallest_peak)}" if fit.smallest_peak else \
            f" ({overflow_phrase(fit.refused)})" if fit.refused else " (XLA ran out of memory)"
        return [f"{case_id}: does not fit even at the smallest {fit.knob} ({fit.step}){peak}. "
                f"{fit.probes} compiles."]
    lines = [f"{case_id}: the largest {fit.knob} that fits is {fit.max_size}"
             + (" (the search's upper bound: the limit is higher)" if fit.upper_bound else "")
             + (f", peak {fmt_bytes(fit.peak_at_max)}{share(fit.peak_at_max)}" if fit.peak_at_max else ""),
             f"  configured {fit.knob} {fit.configured}"
             + (f": peak {fmt_bytes(fit.peak_at_configured)}{share(fit.peak_at_configured)}"
                if fit.peak_at_configured else " (does not fit)")
             + (f"; {fit.max_size / fit.configured:.1f}x room" if fit.configured else ""),
             f"  {fit.probes} compiles ({fit.knob} in steps of {fit.step}), by {how}"
             + ("" if fit.upper_bound else f"; {fit.max_size + fit.step} does not fit")
             + (f": not for HBM, {overflow_phrase(fit.refused)}" if fit.refused and not fit.upper_bound else "")]
    if fit.usable is not None and fit.usable.fraction is not None:  # A GPU process holds its share, not all.
        lines.append(f"  searched within what the process holds of a device, {fmt_bytes(fit.usable.bytes)}: {usable_words(fit.usable)}")
    if fit.split_at_max:
        lines.append("  at the max: " + ", ".join(
            f"{kind} {fmt_bytes(fit.split_at_max[PEAK_FIGURE[kind]])}" for kind in CLASSES
            if PEAK_FIGURE[kind] in fit.split_at_max))
    if fit.buffers_at_max:
        lines.append("What fills the memory at the max:\n" + buffers_table(fit.buffers_at_max, limit=5))
    return lines


def pools_lines(config_program: str, pools: Pools) -> list[str]:
    """What fits every pool a job may land on, which pool limits it, and what the search cost."""
    names = ", ".join(pools.fits)
    own = {name: fit.max_size for name, fit in pools.fits.items()}
    cost = f"{pools.probes} compiles ({', '.join(f'{n} {f.probes}' for n, f in pools.fits.items())})"
    if pools.max_size == 0:
        why = ", ".join(f"{n} fits {'none' if own[n] == 0 else f'at most {own[n]}'}" for n in pools.limiting)
        return [f"{config_program}: no {pools.knob} fits every pool ({names}) in steps of {pools.step}: {why}.",
                f"  {cost}"]
    # A pool whose search stopped at its cap does not limit anything: the answer is at least that.
    stopped = [n for n in pools.limiting if not pools.fits[n].upper_bound]
    capped = [n for n in pools.limiting if pools.fits[n].upper_bound]
    if stopped:
        why = f"; {' and '.join(stopped)} limit{'s' if len(stopped) == 1 else ''} it"
    else:
        why = f" or more: {' and '.join(capped)} reached the search's upper bound (fit_upper), not a limit"
    return [f"{config_program}: the largest {pools.knob} that fits every pool ({names}) is {pools.max_size}{why}",
            "  each pool's own: " + ", ".join(f"{name} {size}" for name, size in own.items())
            + (f" (every pool's {pools.knob} is a multiple of {pools.step})" if pools.max_size < min(own.values()) else ""),
            f"  {cost}"]
