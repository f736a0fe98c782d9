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

``--toolchains PY,PY,...`` searches a list of toolchains instead (jax and libtpu releases, oldest
first), each a venv's python (or the venv's directory) as the toolchain leg builds them: this checkout
is checked by each, in a fresh process. The first toolchain's figure is the baseline and the last's is
compiled too (the one that must have crossed); those between are bisected.

Example (the search alone: a figure that grew at the fifth of 64 commits, found in 6 visits):
    >>> first, visited = search(64, lambda i: i >= 4)
    >>> first, visited
    (4, [31, 15, 7, 3, 5, 4])
"""

from __future__ import annotations

import argparse
import math
import os
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
        tree = Path(tmp) / "tree"
        _git(repo, "worktree", "add", "--detach", "--quiet", str(tree), sha)
        try:
            return checked(sys.executable, tree, case, figure, cache_dir, Path(tmp))[:2]
        finally:
            _git(repo, "worktree", "remove", "--force", str(tree))


def checked(python: str, tree: Path, case: Case, figure: str, cache_dir: Path | None,
            tmp: Path) -> tuple[float | None, str, dict[str, str | None]]:
    """``python -m aotcheck check --case`` in ``tree`` (goldens of its own, so none is judged or written):
    the figure (None where the case did not compile), why not, and the toolchain it ran."""
    report = tmp / "report.json"
    cache = ["--cache-dir", str(cache_dir)] if cache_dir else ["--no-cache"]
    # Each python loads its own libtpu: jax sets TPU_LIBRARY_PATH to the libtpu.so it loaded here, and a
    # child's jax would load that one whatever its venv holds (the oldest toolchain would compile with ours).
    environ = {k: v for k, v in os.environ.items() if k != "TPU_LIBRARY_PATH"}
    done = subprocess.run([python, "-m", "aotcheck", "check", "--case", case.id, "--report", str(report),
                           "--golden-dir", str(tmp / "golden"), *cache], cwd=tree, capture_output=True, text=True,
                          env=environ)
    try:
        loaded = load_report(report)
        [outcome] = [o for o in loaded.outcomes if o.case == case]
    except (ReportError, ValueError):
        return None, (done.stderr.strip().splitlines() or ["no report"])[-1], {}
    if outcome.figures is None or figure not in outcome.figures:
        return None, f"{outcome.verdict.value}: no {figure}", dict(loaded.toolchain)
    return float(outcome.figures[figure]), "", dict(loaded.toolchain)


def toolchain_python(given: str) -> str:
    """A toolchain's python: the path given, or a venv directory's ``bin/python``."""
    path = Path(given).expanduser()
    python = path / "bin" / "python" if path.is_dir() else path
    if not python.is_file():
        raise BisectError(f"--toolchains {given}: no such python (give a venv's python, or its directory, as the "
                          "toolchain leg builds them; oldest first)")
    return str(python)


def cmd_bisect(args: argparse.Namespace) -> int:
    ini = find_ini(Path.cwd())
    settings = GateSettings.parse(rootdir=ini.rootdir, front_end="cli", **read_settings(
        option=lambda s: None, ini=ini_values(ini)))
    case, repo = Case.parse(args.case), Path(args.repo).resolve()
    if args.figure not in figure_names() and parse(args.figure) is None:
        raise BisectError(f"--figure {args.figure}: not a figure aotcheck measures (e.g. peak_bytes, temp_bytes, flops; "
                          "docs/figures.md lists them)")
    if args.toolchains:
        return bisect_toolchains(args, settings, case, repo)
    if not args.good:
        raise BisectError("--good: give a revision where the figure was within its tolerance (or --toolchains)")
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


def bisect_toolchains(args: argparse.Namespace, settings: GateSettings, case: Case, repo: Path) -> int:
    """The first toolchain of ``--toolchains`` (oldest first) at which the figure crossed the tolerance
    against the first one's: the first and the last compiled, those between bisected."""
    pythons = [toolchain_python(t) for t in args.toolchains.split(",") if t]
    if len(pythons) < 2:
        raise BisectError(f"--toolchains {args.toolchains}: give two toolchains or more, oldest first")
    tolerance = tolerance_for(args.figure, settings.tolerances)

    def visit(i: int) -> tuple[float | None, str]:
        with tempfile.TemporaryDirectory(prefix="aotcheck-bisect-") as tmp:
            value, why, toolchain = checked(pythons[i], repo, case, args.figure, settings.cache_dir, Path(tmp))
        versions = ", ".join(f"{k} {v}" for k, v in toolchain.items() if v) or pythons[i]
        print(f"  {versions}: {fmt_value(args.figure, value) if value is not None else f'does not compile ({why})'}",
              flush=True)
        return value, versions

    print(f"aotcheck bisect: {case.id}'s {args.figure} over {len(pythons)} toolchains (tolerance {tolerance})")
    baseline, first_said = visit(0)
    if baseline is None:
        raise BisectError(f"{case.id} does not compile with the first toolchain ({first_said}): nothing to compare with")
    said: dict[int, str] = {}

    def bad(i: int) -> bool:
        value, said[i] = visit(i)
        row = compare_metric(args.figure, baseline, value, tolerance) if value is not None else None
        return row is None or row.change in (Change.REGRESSION, Change.IMPROVEMENT)

    if not bad(len(pythons) - 1):
        print(f"aotcheck bisect: {args.figure} is within its tolerance of {first_said}'s with every toolchain "
              f"({len(said) + 1} compiles)")
        return 0
    found, visited = search(len(pythons) - 1, lambda i: bad(i + 1))
    print(f"aotcheck bisect: the first toolchain past the tolerance is {said[found + 1]}, found in "
          f"{len(visited) + 2} compiles")
    return 0


def add_command(sub: Any) -> None:
    """``aotcheck bisect``'s parser."""
    p = sub.add_parser("bisect", help="the first commit where a case's figure crossed its golden's tolerance")
    p.add_argument("case", help="the case's id, e.g. 'lm/train_step@v5e-16x1'")
    p.add_argument("--figure", required=True, help="the figure to follow, e.g. peak_bytes")
    p.add_argument("--good", help="a revision where the figure was within its tolerance")
    p.add_argument("--bad", default="HEAD", help="a revision where it is not (default: HEAD)")
    p.add_argument("--repo", default=".", help="the git repository (default: here)")
    p.add_argument("--toolchains", help="toolchains to search instead of commits, oldest first: venvs' pythons "
                                        "(or their directories), comma-separated")
    p.set_defaults(func=cmd_bisect)
