"""Timings as data: every measured duration is a row of ``benchmarks/timings.csv``, never prose.

A row says when (``date``, UTC), at which ``commit``, on what ``machine`` with how many ``cores``, which
``command`` ran and its wall ``seconds``. Rows measured side by side share a ``run`` id; a row whose ``of``
names another command of its run is a ratio's numerator (``gate -n 0`` of ``bare lower+compile``), since
only the same work measured in one run compares (this machine's speed drifts 2x within a day).

``python benchmarks/timed.py -- COMMAND`` times a command and appends its row; ``benchmarks/bench.py``
appends its own; ``python tools/gendocs.py`` renders docs/performance.md's tables from the file.

Example:
    >>> row = Row("2026-12-07T15:00Z", "abc1234", "x86_64 (2 cores)", 2, "python -m pytest -n 2", 512.0)
    >>> Row.from_csv(row.to_csv()) == row
    True
    >>> ratios([row, Row(*row[:4], "bare", 256.0, run="r"), Row(*row[:4], "gate", 300.0, run="r", of="bare")])
    [('gate', 'bare', 300.0, 256.0, Row(date='2026-12-07T15:00Z', commit='abc1234', machine='x86_64 (2 cores)', cores=2, command='gate', seconds=300.0, run='r', of='bare'))]
"""

from __future__ import annotations

import csv
import datetime
import io
import os
import platform
import subprocess
import uuid
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = ROOT / "benchmarks" / "timings.csv"
FIELDS = ("date", "commit", "machine", "cores", "command", "seconds", "run", "of")


class Row(NamedTuple):
    """One measured duration (see the module's docstring)."""

    date: str
    commit: str
    machine: str
    cores: int
    command: str
    seconds: float
    run: str = ""
    of: str = ""

    def to_csv(self) -> dict[str, str]:
        return {**{k: str(v) for k, v in self._asdict().items()}, "seconds": f"{self.seconds:.1f}"}

    @classmethod
    def from_csv(cls, data: dict[str, str]) -> "Row":
        return cls(data["date"], data["commit"], data["machine"], int(data["cores"]), data["command"],
                   float(data["seconds"]), data.get("run", ""), data.get("of", ""))


def read(path: Path = TIMINGS) -> list[Row]:
    """Every row of ``path``, in the order measured."""
    if not path.exists():
        return []
    return [Row.from_csv(r) for r in csv.DictReader(io.StringIO(path.read_text()))]


def here(command: str, seconds: float, *, run: str = "", of: str = "") -> Row:
    """A row measured now, on this machine, at this checkout's commit (``+`` when it has local edits)."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = (git("rev-parse", "--short", "HEAD") or "unknown") + ("+" if git("status", "--porcelain", "--", "aotcheck", "tests") else "")
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("model name")),
                 platform.machine())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    return Row(date, commit, model, cores, command, seconds, run, of)


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def new_run() -> str:
    """An id for rows measured side by side."""
    return uuid.uuid4().hex[:8]


def append(rows: list[Row], path: Path = TIMINGS) -> None:
    """Appends ``rows`` (the header first when the file is new), whole lines only."""
    new = not path.exists()
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
    if new:
        writer.writeheader()
    writer.writerows(r.to_csv() for r in rows)
    with path.open("a") as f:
        f.write(buffer.getvalue())


def ratios(rows: list[Row]) -> list[tuple[str, str, float, float, Row]]:
    """(numerator's command, denominator's, their seconds, the numerator's row) of each row with an ``of``
    whose denominator was measured in the same run."""
    out = []
    for row in rows:
        if not row.of:
            continue
        base = next((r for r in rows if r.run == row.run and r.command == row.of), None)
        if base is not None:
            out.append((row.command, row.of, row.seconds, base.seconds, row))
    return out
