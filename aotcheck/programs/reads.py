"""What a project's code reads besides its code: the environment variables it looks up and the files it
opens, recorded so that an answer from the inputs index is one a fresh compile would give.

A config sized by ``os.environ["WIDTH"]`` at import, or by a JSON file its builder opens, lowers to
another program when the variable or the file changes, though its code (:mod:`aotcheck.programs.closure`)
did not. From :func:`install` on (aotcheck's import), every lookup of ``os.environ`` (``os.getenv`` and
``in`` too) and every file opened for reading is recorded when the code asking is the project's: the
first frame up the stack that is neither the standard library's, an installed package's nor
aotcheck's own (``np.load(path)`` in a config's module counts; jax reading ``JAX_*`` does not, the
inputs key has those already). Code files are the closure's business and are not recorded.

:func:`recorded` is what was read so far, each variable by a digest of its value (a secret read by a
config never reaches a cache entry or a shared store) and each file by a digest of its bytes;
:func:`changed` says what differs now. The inputs index stores the first beside each answer and does
not answer when the second finds anything (:func:`aotcheck.pipeline.measure.by_inputs`).

Example:
    >>> install()
    >>> changed({"environment": {"HOME": digest_value("HOME", os.environ.get("HOME"))}, "files": {}}) is None
    True
    >>> changed({"environment": {"AOTCHECK_DOCTEST_UNSET": digest_value("AOTCHECK_DOCTEST_UNSET", "1")}, "files": {}})
    "the environment variable AOTCHECK_DOCTEST_UNSET, read by the project's code, changed since"
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_ENV: dict[str, str] = {}  # Variable -> digest of its value when read (unset: a digest of None).
_FILES: set[str] = set()  # Absolute paths opened for reading.
_INSTALLED = False
_BUSY = threading.local()  # Set while this module reads a file itself (its own opens are not the project's).
_AOTCHECK = str(Path(__file__).resolve().parents[1]) + os.sep
_PREFIXES = tuple({os.path.abspath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
_CODE_SUFFIXES = (".py", ".pyc", ".pyi", ".so", ".pyd", ".pth")
# Large files are known by size and modification time (hashing a dataset on every run costs more than
# the compile it saves); below this, by their bytes, the same on every runner sharing a store.
_HASHED_BYTES = 64 << 20


def digest_value(name: str, value: str | None) -> str:
    """A variable's value as recorded: a digest, never the value.

    Example:
        >>> digest_value("A", "1") == digest_value("A", "1") != digest_value("A", None)
        True
    """
    return hashlib.sha256(f"{name}\0{value}".encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=4096)
def _projects(filename: str) -> bool | None:
    """Whether code in ``filename`` is the project's (True), aotcheck's (False), or neither (None: the
    standard library, an installed package, frozen or generated code), which the walk passes over."""
    if filename.startswith("<"):
        return None
    path = os.path.abspath(filename)
    if path.startswith(_AOTCHECK):
        return False
    from aotcheck.programs.closure import installed_file  # noqa: PLC0415  (closure imports no module of this one)

    return None if installed_file(path) else True


def _projects_asking(frame: Any, *, through_packages: bool) -> bool:
    """Whether the code asking, from ``frame`` up past the standard library's, is the project's:
    the first frame that is not the standard library's, or with ``through_packages`` the first that is
    the project's or aotcheck's (an installed package reading a file for the project: ``np.load``)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        mine = _projects(filename)
        if mine is not None:
            return mine
        if not through_packages and not _stdlib(filename):
            return False  # An installed package's own lookup (pytest's, jax's): not the project's.
        frame = frame.f_back
    return False


@functools.lru_cache(maxsize=4096)
def _stdlib(filename: str) -> bool:
    from aotcheck.programs.closure import standard_library_file  # noqa: PLC0415

    return filename.startswith("<") or standard_library_file(os.path.abspath(filename))


@functools.lru_cache(maxsize=4096)
def _projects_file(path: str) -> bool:
    """Whether a file opened may be the project's data: not under Python's prefixes or an installed
    package, not in a hidden directory (a tool's cache: ``.hypothesis``, ``.pytest_cache``), not metadata."""
    from aotcheck.programs.closure import installed_file  # noqa: PLC0415

    if path.startswith(_PREFIXES) or installed_file(path):
        return False
    return not any((part.startswith(".") and part not in (".", "..")) or part.endswith((".egg-info", ".dist-info"))
                   for part in Path(path).parts)  # Nor a distribution's metadata (an editable install's).


class _RecordingEnviron(os._Environ):  # type: ignore[name-defined,misc]  # os.environ's own class, recording.
    def __getitem__(self, key: str) -> str:
        try:
            value = super().__getitem__(key)
        except KeyError:
            _note(key, None)
            raise
        _note(key, value)
        return value


def _note(key: str, value: str | None) -> None:
    if isinstance(key, str) and _projects_asking(sys._getframe(2), through_packages=False):  # The last read is used.
        _ENV[key] = digest_value(key, value)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or getattr(_BUSY, "on", False):
        return
    path, mode, flags = args
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # A file descriptor: opened before, as a path, if it was.
    reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) else not flags & (os.O_WRONLY | os.O_RDWR)
    name = os.path.abspath(os.fsdecode(path))
    if not reading or name.endswith(_CODE_SUFFIXES):
        return
    _BUSY.on = True  # Telling whose file it is may open others (a distribution's RECORD): not the project's.
    try:
        if _projects_file(name) and _projects_asking(sys._getframe(1), through_packages=True):
            _FILES.add(name)
    finally:
        _BUSY.on = False


def install() -> None:
    """Starts recording, once per process (the audit hook stays: Python has no removing one)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    os.environ.__class__ = _RecordingEnviron
    sys.addaudithook(_audit)


def _file_digest(path: str) -> str:
    _BUSY.on = True
    try:
        stat = os.stat(path)
        if stat.st_size > _HASHED_BYTES:
            return f"{stat.st_size} bytes, modified {stat.st_mtime_ns}"
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:32]
    except OSError:
        return "absent"
    finally:
        _BUSY.on = False


def recorded() -> dict[str, dict[str, str]] | None:
    """What the project's code read so far in this process; None when nothing recorded it (no
    :func:`install`): the inputs index then stores no answer, having no way to vouch for one."""
    if not _INSTALLED:
        return None
    return {"environment": dict(sorted(_ENV.items())), "files": {p: _file_digest(p) for p in sorted(_FILES)}}


def changed(reads: Mapping[str, Mapping[str, str]], environ: Mapping[str, str] | None = None) -> str | None:
    """What differs now from ``reads`` (as :func:`recorded` gave it), in words; None when nothing does
    (``environ``: the environment of the process that would run the project's code; default: this one's)."""
    environ = os.environ if environ is None else environ
    for name, value in reads.get("environment", {}).items():
        if digest_value(name, environ.get(name)) != value:
            return f"the environment variable {name}, read by the project's code, changed since"
    for path, digest in reads.get("files", {}).items():
        if _file_digest(path) != digest:
            return f"the file {path}, read by the project's code, changed since"
    return None


def well_formed(reads: Any) -> bool:
    """Whether ``reads`` is what :func:`recorded` gives (an index entry's, read back)."""
    return isinstance(reads, dict) and set(reads) == {"environment", "files"} and all(
        isinstance(part, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in part.items())
        for part in reads.values())


__all__ = ["changed", "digest_value", "install", "recorded", "well_formed"]
