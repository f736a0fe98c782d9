"""A server's matrix in words: per (config, target) a table by bucket, largest first, and its start-up bill.

Each bucket's row has its peak per device and share of HBM, its compile CPU seconds, its memory
spaces (``fit``, or the space an op of it overflows: a kernel's VMEM or SMEM, by how much) and the KV
budget where it was searched; the bill's line says what compiling the whole matrix costs and how it
compares with the goldens' sum.

Example:
    >>> from aotcheck.gate.bill import Bill
    >>> from aotcheck.gate.report import Report
    >>> from aotcheck.gate.verdict import Verdict
    >>> from aotcheck.pipeline.case import Case
    >>> from aotcheck.pipeline.measurement import Measurement
    >>> def bucket(tokens, peak):
    ...     case = Case.of("llm", f"step[tokens={tokens}]", "v5e-8")
    ...     return Outcome(case, Verdict.PASS, measured=Measurement(case, {"peak_bytes": peak, "compile_cpu_seconds": 1.5}, {}, 1.5))
    >>> report = Report([bucket(16, 2**30), bucket(64, 3 * 2**30)], bills=[Bill("llm", "v5e-8x1", 2, 3.0, False)])
    >>> print("\\n".join(serving_lines(report)))  # doctest: +NORMALIZE_WHITESPACE
    aotcheck: server llm on v5e-8x1: 2 buckets, start-up bill 3.00s of compile CPU
    bucket           peak/device  of HBM  compile CPU  memory spaces  KV budget  verdict
    ---------------  -----------  ------  -----------  -------------  ---------  -------
    step[tokens=64]  3.00 GiB     18.8%   1.50s        fit            -          pass
    step[tokens=16]  1.00 GiB     6.2%    1.50s        fit            -          pass
"""

from __future__ import annotations

from collections.abc import Sequence

from aotcheck.figures.table import fit_max
from aotcheck.gate.bill import Bill
from aotcheck.gate.boot import Boot, Start
from aotcheck.targets.usable import Usable
from aotcheck.gate.compare import Change
from aotcheck.gate.outcome import Outcome
from aotcheck.gate.report import Report
from aotcheck.programs.serving import KV_KNOB
from aotcheck.render.accept import accept_all_command, golden_dir_option
from aotcheck.render.tables import fmt_value, hbm_fraction, table, verdict_label
from aotcheck.units import fmt_bytes, fmt_share

HEADERS = ["bucket", "peak/device", "of HBM", "compile CPU", "memory spaces", "KV budget", "verdict"]


def memory_spaces(outcome: Outcome) -> str:
    """``fit`` when it compiled; the space an op overflows (``VMEM 340.00 KiB > 330.00 KiB``) when XLA
    refused it for one; ``-`` otherwise."""
    overflow = outcome.error.overflow if outcome.error is not None else None
    if overflow is not None:
        where = f" ({overflow.instruction})" if overflow.instruction else ""
        return f"{overflow.space.upper()} {fmt_bytes(overflow.size_bytes)} > {fmt_bytes(overflow.limit_bytes)}{where}"
    return "fit" if outcome.figures else "-"


def bucket_rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    """One row per bucket, in the order given (:meth:`aotcheck.gate.report.Report.served`'s)."""
    rows = []
    for o in outcomes:
        figures = o.figures or {}
        pages = figures.get(fit_max(KV_KNOB))
        rows.append([o.case.program_id, fmt_bytes(figures.get("peak_bytes")) if figures else "-", fmt_share(hbm_fraction(o)),
                     fmt_value("compile_cpu_seconds", figures.get("compile_cpu_seconds")), memory_spaces(o),
                     f"{int(pages):,} pages" if pages is not None else "-", verdict_label(o)])
    return rows


def bill_line(bill: Bill, *, accept: str | None = None) -> str:
    """What compiling the server's matrix costs on the target, against the goldens' sum when judged;
    a bill that grew ends with ``accept``, the command that accepts it."""
    line = (f"aotcheck: server {bill.config} on {bill.target}: {bill.buckets} buckets, start-up bill "
            f"{fmt_value('compile_cpu_seconds', bill.seconds)} of compile CPU")
    row = bill.row
    if row is None or row.golden is None:
        return line
    golden = fmt_value('compile_cpu_seconds', row.golden)
    if bill.accepted:
        return (f"{line} (the goldens kept summed {golden}, beyond its tolerance {row.tolerance}: accepted, "
                f"each bucket's compile_cpu_seconds written as measured)")
    verdict = "REGRESSION, beyond" if bill.grew else "within" if row.change is Change.OK else "below"
    line = f"{line} (goldens {golden}: {verdict} its tolerance {row.tolerance})"
    if bill.grew and accept is not None:
        line += f"; if expected, accept it: {accept}"
    return line


def usable_words(usable: Usable) -> str:
    """Where what a device may hold comes from."""
    if usable.fraction is None:
        return f"the runtime's bytes_limit, {usable.bytes:,} B"
    if usable.source is not None:
        return f"{usable.fraction:g} of memory ({usable.source})"
    return f"{usable.fraction:g} of memory (JAX's default; {usable.variable} sets another)"


def _pool(boot: Boot, size: int, pages: int | None) -> str:
    return f"{fmt_bytes(size)}{f' ({pages:,} pages)' if pages is not None else ''}"


def boot_line(bill: Bill) -> str | None:
    """Whether the server starts on the target (from the runtime's rules, :mod:`aotcheck.gate.boot`):
    what it holds at its most demanding run against what a device may hold, the bucket that asks the
    most, what tips it, and the largest KV pool with which it starts (None: not known)."""
    boot = bill.boot
    if boot is None:
        return None
    io = f" + its I/O {fmt_bytes(boot.io_bytes)}" if boot.io_bytes else ""
    parts = (f"weights {fmt_bytes(boot.weights_bytes)} + KV pool {fmt_bytes(boot.kv_bytes)} + code of {boot.programs} "
             f"programs {fmt_bytes(boot.code_bytes)} + {boot.running}'s temporaries {fmt_bytes(boot.temp_bytes)}{io} = "
             f"{fmt_bytes(boot.total_bytes)} of the {fmt_bytes(boot.usable_bytes)} a device may hold ({usable_words(boot.usable)})")
    if boot.kv_max_bytes:
        largest = (f"the largest KV pool that starts: {_pool(boot, boot.kv_max_bytes, boot.kv_max_pages)}, "
                   f"{boot.kv_max_fraction:.3f} of memory as an engine's utilization")
        if boot.kv_evict_max_bytes > boot.kv_max_bytes:
            largest += (f"; up to {_pool(boot, boot.kv_evict_max_bytes, boot.kv_evict_max_pages)} with programs "
                        f"reloading on every switch")
    elif boot.kv_evict_max_bytes:
        largest = (f"no KV pool starts with every program resident; up to "
                   f"{_pool(boot, boot.kv_evict_max_bytes, boot.kv_evict_max_pages)} with programs reloading on every switch")
    else:
        largest = "no KV pool starts: weights and programs alone do not fit"
    lost = "REGRESSION: it started better by its goldens' figures and " if bill.boot_lost else ""
    if boot.start is Start.STARTS:
        return f"  boots: {parts}; {fmt_bytes(boot.usable_bytes - boot.total_bytes)} to spare; {largest}"
    if boot.start is Start.RELOADS:
        return (f"  {lost}starts, but programs reload on every switch: {parts}; it starts only because the runtime "
                f"evicts idle programs' code to run each; {largest}")
    if boot.tips == "weights":
        tips = "the weights alone do not fit"
    elif boot.tips == "kv":
        tips = "the KV pool tips it"
    else:
        tips = (f"running {boot.tips} asks {fmt_bytes(boot.asked_bytes)} of temporaries with "
                f"{fmt_bytes(boot.free_bytes)} free, idle programs' code evicted (libtpu's E0101: \"Error loading "
                f"program\"; programs run in the order the server warms them up)"
                if boot.io_bytes or boot.usable.fraction is None else
                f"running {boot.tips} tips it (programs run in the order the server warms them up)")
    return f"  {lost}WILL NOT START: {parts}; {tips}; {largest}"


def serving_lines(report: Report, *, accept_args: Sequence[str] = ()) -> list[str]:
    """The terminal's serving section: per server and target, the bill's line and the bucket table
    (``accept_args``: the run's options an accept command repeats)."""
    lines: list[str] = []
    for bill, outcomes in report.served():
        accept = accept_all_command([o.case for o in outcomes],
                                    extra=[*golden_dir_option(report.golden_dir), *accept_args])
        boot = boot_line(bill)
        lines += [*([""] if lines else []), bill_line(bill, accept=accept), *([boot] if boot else []),
                  table(HEADERS, bucket_rows(outcomes))]
    return lines
