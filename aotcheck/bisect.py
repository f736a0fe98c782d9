"""``aotcheck bisect``: the first commit at which a case's figure crossed its golden's tolerance.

    python -m aotcheck bisect 'lm/train_step@v5e-16x1' --figure peak_bytes --good v1.2 --bad HEAD

It lists the first-parent commits after ``--good`` up to ``--bad`` and binary-searches them, compiling
only the commits it visits: ``ceil(log2(N))`` compiles for N commits. Each visit checks out the commit
in a git worktree of its own (the checkout in use is never touched) and runs ``aotcheck check --case``
there in a fresh process (the project's code as it was then), with the figures cache of this checkout
(a program unchanged between two commits is answered, not compiled again). A commit is bad where the
figure moved beyond the tolerance this checkout's settings give it against this checkout's golden (or,
without one, against the figure at ``--good``), or where the case does not compile at all. Like ``git
bisect``, it takes ``--good`` as good and ``--bad`` as bad without compiling them.

Example (the search alone: a figure that grew at the fifth of 64 commits, found in 6 visits):
    >>> first, visited = search(64, lambda i: i >= 4)
    >>> first, visited
    (4, [31, 15, 7, 3, 5, 4])
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aotcheck.errors import AotcheckError
from aotcheck.gate.compare import Change, Row, compare_metric, tolerance_for
from aotcheck.gate.golden import GoldenStore
from aotcheck.gate.report import ReportError, load_report
from aotcheck.ini import find_ini
from aotcheck.cmdline import ini_values
from aotcheck.figures.table import parse
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.measurement import figure_names
from aotcheck.render.tables import fmt_value
from aotcheck.settings import GateSettings, read_settings


class BisectError(AotcheckError, ValueError):
    """A bisection that cannot run: a revision git does not know, a figure the case does not have."""


def search(n: int, bad: Callable[[int], bool]) -> tuple[int, list[int]]:
    """The first index of ``0..n-1`` that is bad, ``n - 1`` taken as bad unasked (the ``--bad`` commit), and
    the indices asked, in order: ``ceil(log2(n))`` of them for a history whose badness, once it starts, stays."""
    lo, hi, visited = -1, n - 1, []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        visited.append(mid)
        if bad(mid):
            hi = mid
        else:
            lo = mid
    return hi, visited


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BisectError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def commits_between(repo: Path, good: str, bad: str) -> list[tuple[str, str]]:
    """``(sha, subject)`` of each first-parent commit after ``good`` up to ``bad``, oldest first."""
    for flag, rev in (("--good", good), ("--bad", bad)):
        if subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True).returncode != 0:
            raise BisectError(f"{flag} {rev}: not a commit of the git repository {repo} (a branch, tag or sha)")
    lines = _git(repo, "log", "--first-parent", "--reverse", "--format=%H %s", f"{good}..{bad}").splitlines()
    if not lines:
        raise BisectError(f"no commit after --good {good} up to --bad {bad}: is --good an ancestor of --bad?")
    return [(line[:40], line[41:]) for line in lines]


def figure_at(repo: Path, sha: str, case: Case, figure: str, cache_dir: Path | None) -> tuple[float | None, str]:
    """The figure the case has at commit ``sha`` (None where it did not compile there), with why not."""
    with tempfile.TemporaryDirectory(prefix="aotcheck-bisect-") as tmp:
        tree, report = Path(tmp) / "tree", Path(tmp) / "report.json"
        _git(repo, "worktree", "add", "--detach", "--quiet", str(tree), sha)
        try:
            cache = ["--cache-dir", str(cache_dir)] if cache_dir else ["--no-cache"]
            done = subprocess.run([sys.executable, "-m", "aotcheck", "check", "--case", case.id, "--report",
                                   str(report), "--golden-dir", str(Path(tmp) / "golden"), *cache],
                                  cwd=tree, capture_output=True, text=True)
            try:
                [outcome] = [o for o in load_report(report).outcomes if o.case == case]
            except (ReportError, ValueError):
                return None, (done.stderr.strip().splitlines() or ["no report"])[-1]
            if outcome.figures is None or figure not in outcome.figures:
                return None, f"{outcome.verdict.value}: no {figure}"
            return float(outcome.figures[figure]), ""
        finally:
            _git(repo, "worktree", "remove", "--force", str(tree))


def cmd_bisect(args: argparse.Namespace) -> int:
    ini = find_ini(Path.cwd())
    settings = GateSettings.parse(rootdir=ini.rootdir, front_end="cli", **read_settings(
        option=lambda s: None, ini=ini_values(ini)))
    case, repo = Case.parse(args.case), Path(args.repo).resolve()
    if args.figure not in figure_names() and parse(args.figure) is None:
        raise BisectError(f"--figure {args.figure}: not a figure aotcheck measures (e.g. peak_bytes, temp_bytes, flops; "
                          "docs/figures.md lists them)")
    commits = commits_between(repo, args.good, args.bad)
    tolerance = tolerance_for(args.figure, settings.tolerances)
    golden = GoldenStore(settings.golden_dir).read(case)
    said = "its golden"
    if golden is not None and args.figure in golden.figures:
        baseline = float(golden.figures[args.figure])
    else:
        value, why = figure_at(repo, args.good, case, args.figure, settings.cache_dir)
        if value is None:
            raise BisectError(f"{case.id} has no golden {args.figure} and none at --good {args.good} ({why})")
        baseline, said = value, f"--good {args.good}'s"
    print(f"aotcheck bisect: {case.id}'s {args.figure} against {said} {fmt_value(args.figure, baseline)} "
          f"(tolerance {tolerance}): {len(commits)} commits, at most {math.ceil(math.log2(len(commits)))} to compile")

    def bad(i: int) -> bool:
        sha, subject = commits[i]
        value, why = figure_at(repo, sha, case, args.figure, settings.cache_dir)
        row: Row | None = compare_metric(args.figure, baseline, value, tolerance) if value is not None else None
        moved = row is None or row.change in (Change.REGRESSION, Change.IMPROVEMENT)
        now = fmt_value(args.figure, value) if value is not None else f"does not compile ({why})"
        print(f"  {sha[:12]} {subject[:60]}: {now}: {'bad' if moved else 'good'}", flush=True)
        return moved

    first, visited = search(len(commits), bad)
    sha, subject = commits[first]
    print(f"aotcheck bisect: the first bad commit is {sha} ({subject}), found in {len(visited)} compiles")
    return 0


def add_command(sub: Any) -> None:
    """``aotcheck bisect``'s parser."""
    p = sub.add_parser("bisect", help="the first commit where a case's figure crossed its golden's tolerance")
    p.add_argument("case", help="the case's id, e.g. 'lm/train_step@v5e-16x1'")
    p.add_argument("--figure", required=True, help="the figure to follow, e.g. peak_bytes")
    p.add_argument("--good", required=True, help="a revision where the figure was within its tolerance")
    p.add_argument("--bad", default="HEAD", help="a revision where it is not (default: HEAD)")
    p.add_argument("--repo", default=".", help="the git repository (default: here)")
    p.set_defaults(func=cmd_bisect)
