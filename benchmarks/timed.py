"""Runs a command and appends its wall time to benchmarks/timings.csv (a row, never prose).

    python benchmarks/timed.py -- python -m pytest -n 2 --dist worksteal -m 'not main_job'
    python benchmarks/timed.py --as "the main job" -- python -m pytest -n 2 -m aotcheck --aot-configs='*'

The command's output goes to the terminal as it runs; the exit status is the command's. Then
``python tools/gendocs.py`` renders docs/performance.md from the rows.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time

from timings import append, here


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--as", dest="name", help="the row's command (default: the command line itself)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to time after --, e.g. timed.py -- python -m pytest -n 2")
    start = time.monotonic()
    code = subprocess.call(command)
    seconds = time.monotonic() - start
    row = here(args.name or shlex.join(command), seconds)
    append([row])
    print(f"timed: {row.command}: {seconds:.1f} s (exit {code}), recorded in benchmarks/timings.csv", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
