"""Where a case is measured: here, or in a child process that serves only its chip family.

libtpu carries compiler state across chip families within one process (see
:mod:`aotcheck.targets.families`), and a golden must not depend on which cases
happened to run before it. So a case is measured in this process only while the
process has compiled for no other family; otherwise in a child process for its
family (started on first use, kept until :meth:`Measurer.close`).

The child speaks JSON lines on a private pipe: a request names a case, the
modules that register configs (imported in the child exactly as the parent
imported them) and the figures cache; a reply carries the figures, or the
error's type and message, so the parent re-raises the same exception class.
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import subprocess
import sys
from typing import Any

from aotcheck.gate.cache import FiguresCache
from aotcheck.gate.case import Case
from aotcheck.gate.measure import Measurement, measure
from aotcheck.programs.loader import import_sources
from aotcheck.programs.registry import REGISTRY, Registry
from aotcheck.targets.families import family_of, is_clean_for


class WorkerError(RuntimeError):
    """A compile process failed in a way that has no exception class here (or died)."""


def encode_error(error: BaseException) -> dict[str, str]:
    """An exception as JSON: its class's import path and its message."""
    cls = type(error)
    return {"type": f"{cls.__module__}.{cls.__qualname__}", "message": str(error.args[0]) if
            isinstance(error, KeyError) and error.args else str(error)}


def decode_error(data: dict[str, str]) -> Exception:
    """The exception :func:`encode_error` described: the same class when it is importable
    (aotcheck's own, Python's built-in ones), else a :class:`WorkerError` naming it.

    Example:
        >>> from aotcheck.programs.registry import ConfigNotFound
        >>> error = decode_error(encode_error(ConfigNotFound("No config named 'x'.")))
        >>> type(error).__name__, str(error)
        ('ConfigNotFound', "No config named 'x'.")
        >>> decode_error({"type": "somewhere.Else", "message": "boom"})
        WorkerError('somewhere.Else: boom')
    """
    module_name, _, name = data["type"].rpartition(".")
    cls: Any = None
    if module_name == "builtins":
        cls = getattr(builtins, name, None)
    elif module_name.startswith("aotcheck.") or module_name.startswith("jax"):
        try:
            cls = importlib.import_module(module_name)
            for part in name.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError):
            cls = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(data["message"])
        except Exception:  # A class whose constructor wants more than a message.
            pass
    return WorkerError(f"{data['type']}: {data['message']}")


class FamilyWorker:
    """A child process that measures cases of one chip family."""

    def __init__(self, family: str) -> None:
        self.family = family
        read_fd, write_fd = os.pipe()  # Replies come on their own pipe: stdout stays free for noise.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aotcheck.gate.isolation", str(write_fd)],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
            text=True,
            env=env,
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
            raise WorkerError(f"aotcheck's {self.family} compile process died (exit code {code}).")
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


class Measurer:
    """Measures cases with family isolation: ``measurer(case) -> Measurement``.

    Raises what :func:`aotcheck.gate.measure.measure` raises, with the same
    exception classes whichever process measured the case.
    """

    def __init__(self, *, registry: Registry = REGISTRY, cache: FiguresCache | None = None) -> None:
        self.registry = registry
        self.cache = cache
        self._workers: dict[str, FamilyWorker] = {}

    def __call__(self, case: Case) -> Measurement:
        if is_clean_for(case.topology):
            return measure(case, registry=self.registry, cache=self.cache)
        family = family_of(case.topology)
        worker = self._workers.get(family) or self._workers.setdefault(family, FamilyWorker(family))
        reply = worker.request({
            "case": case.id,
            "sources": self.registry.sources(),
            "cache_dir": str(self.cache.root) if self.cache else None,
        })
        if "error" in reply:
            raise decode_error(reply["error"])
        return Measurement(case, reply["figures"], reply["compiler_options"], reply["compile_seconds"],
                           cached=reply["cached"])

    def close(self) -> None:
        """Stops every child process."""
        while self._workers:
            self._workers.popitem()[1].close()


def _serve(reply_fd: int) -> None:
    """The child's loop: one request per line on stdin, one reply per line on ``reply_fd``."""
    replies = os.fdopen(reply_fd, "w")
    os.dup2(2, 1)  # Anything printed to stdout (libtpu, user code) goes to stderr.
    caches: dict[str, FiguresCache] = {}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            import_sources(request["sources"])
            cache_dir = request["cache_dir"]
            cache = caches.setdefault(cache_dir, FiguresCache(cache_dir)) if cache_dir else None
            result = measure(Case.parse(request["case"]), cache=cache)
            reply: dict[str, Any] = {"figures": result.figures, "compiler_options": result.compiler_options,
                                     "compile_seconds": result.compile_seconds, "cached": result.cached}
        except Exception as e:  # Reported to the parent, which re-raises it as its own class.
            reply = {"error": encode_error(e)}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
