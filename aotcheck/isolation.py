"""One chip family per process: libtpu carries compiler state from one family to the next.

Measured with libtpu 0.0.42.1: after one compile for v5e, v5p or v6e, a process
compiles the *same* lowered v4 multi-slice program differently (lm-1b prefill on
v4-8 x2: 308 all-gathers instead of 200, +3.4 GiB of collectives per device),
while a fresh process, or one that only ever compiled for v4, always gives the
same figures. Loading a topology does not do it; compiling does. A golden must
not depend on which cases happened to run before it in a process, so:

- a case runs in this process only if this process has compiled for no other
  chip family; otherwise it runs in a child process that serves only its family
  (started on first use, kept for the session, one per family);
- :func:`note_family` warns once when library code compiles a second family in
  one process, so scripts that mix families know their figures may shift.

The child speaks JSON lines on a private pipe: a request names a case, the files
that register configs and the figures cache; the reply carries the figures or
the error text.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from aotcheck.case import Case
from aotcheck.topology import Topology, parse_topology

_compiled: set[str] = set()  # Families this process has compiled for.
_warned = False
_lock = threading.Lock()


def family_of(topology: str | Topology) -> str:
    """``"v4"``, ``"v5e"``, ... or ``"cpu"``."""
    topo = parse_topology(topology)
    return topo.chip.family if topo.chip else "cpu"


def is_clean_for(topology: str | Topology) -> bool:
    """True if this process has compiled for no chip family but ``topology``'s."""
    return _compiled <= {family_of(topology)}


def note_family(topology: str | Topology) -> None:
    """Records a compile for ``topology``'s family; warns once when a second family follows."""
    global _warned
    family = family_of(topology)
    with _lock:
        others = _compiled - {family}
        _compiled.add(family)
        if not others or _warned:
            return
        _warned = True
    warnings.warn(
        f"aotcheck: this process compiled for {', '.join(sorted(others))} and now compiles for {family}. "
        f"libtpu carries compiler state across chip families, so these figures may differ from a fresh "
        f"process's. The pytest plugin isolates families; in scripts, compile one family per process.",
        RuntimeWarning,
        stacklevel=3,
    )


class FamilyWorker:
    """A child process that runs cases of one chip family."""

    def __init__(self, family: str) -> None:
        self.family = family
        read_fd, write_fd = os.pipe()  # Replies come on their own pipe: stdout stays free for noise.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aotcheck.isolation", str(write_fd)],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
            text=True,
        )
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "r")

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        line = self.replies.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"aotcheck's {self.family} compile process died (exit code {code}).")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.replies.close()


_workers: dict[str, FamilyWorker] = {}


def close_workers() -> None:
    """Stops every child process (the plugin calls this at session end)."""
    while _workers:
        _workers.popitem()[1].close()


atexit.register(close_workers)


def run_case_isolated(case: Case, *, config_files: Sequence[str], cache_dir: str | None) -> Any:
    """Runs ``case`` here if its family is this process's, else in that family's child process.

    Returns a :class:`aotcheck.runner.CaseResult`; raises what :func:`run_case` raises.
    """
    from aotcheck.cache import FiguresCache
    from aotcheck.compile import CompileError
    from aotcheck.runner import CaseResult, run_case

    cache = FiguresCache(cache_dir) if cache_dir else None
    if is_clean_for(case.topology):
        return run_case(case, cache=cache)
    family = family_of(case.topology)
    worker = _workers.get(family) or _workers.setdefault(family, FamilyWorker(family))
    reply = worker.request({"case": case.id, "config_files": list(config_files), "cache_dir": cache_dir})
    if reply["ok"]:
        return CaseResult(case, reply["figures"], reply["compiler_options"], reply["compile_seconds"],
                          cached=reply["cached"])
    if reply["error"] == "compile":
        raise CompileError(reply["message"])
    if reply["error"] == "value":
        raise ValueError(reply["message"])
    raise RuntimeError(f"{case.id} failed in the {family} compile process:\n{reply['message']}")


def _serve(reply_fd: int) -> None:
    """The child's loop: one request per line on stdin, one reply per line on ``reply_fd``."""
    import traceback

    from aotcheck.cache import FiguresCache
    from aotcheck.compile import CompileError
    from aotcheck.loader import load_config_modules
    from aotcheck.runner import run_case

    replies = os.fdopen(reply_fd, "w")
    os.dup2(2, 1)  # Anything printed to stdout (libtpu, user code) goes to stderr.
    for line in sys.stdin:
        request = json.loads(line)
        try:
            load_config_modules(request["config_files"])
            cache = FiguresCache(request["cache_dir"]) if request["cache_dir"] else None
            result = run_case(Case.parse(request["case"]), cache=cache)
            reply = {"ok": True, "figures": result.figures, "compiler_options": result.compiler_options,
                     "compile_seconds": result.compile_seconds,
                     "cached": result.cached}
        except CompileError as e:
            reply = {"ok": False, "error": "compile", "message": str(e)}
        except (ValueError, KeyError) as e:
            message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            reply = {"ok": False, "error": "value", "message": str(message)}
        except Exception:  # Reported to the parent, which fails the case with it.
            reply = {"ok": False, "error": "internal", "message": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
