"""Process setup for deviceless TPU compiles, and the toolchain versions.

libtpu reads its environment once, when it loads, so everything here must run
before the first topology is requested. Importing :mod:`aotcheck` does it.

Example:
    >>> sorted(toolchain()), os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"]
    (['jax', 'jaxlib', 'libtpu'], '1')
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import sys
import tempfile
from collections.abc import Iterator

# Several processes (pytest-xdist workers) load libtpu at once; without this the
# second one fails on libtpu's multi-process lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# No metadata server to ask on a CPU machine (axlearn sets the same).
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

# Lines libtpu prints on every deviceless load; they say nothing to our users.
_LIBTPU_NOISE = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "Logging before InitGoogle",
    "Source Location Trace",
    "libtpu_init_utils.cc",
    "Failed to find host bounds",
)


@contextlib.contextmanager
def quiet_libtpu_stderr() -> Iterator[None]:
    """Captures file descriptor 2 and re-emits what is not libtpu start-up noise.

    libtpu writes from C++ straight to the descriptor, so redirecting
    ``sys.stderr`` would not catch it.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # No real descriptor (e.g. an embedded interpreter).
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [
                line
                for line in sink.read().decode(errors="replace").splitlines()
                if line.strip() and not any(noise in line for noise in _LIBTPU_NOISE)
            ]
            if kept:
                print("\n".join(kept), file=sys.stderr)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def toolchain() -> dict[str, str | None]:
    """The versions that determine compiled figures: jax, jaxlib and libtpu.

    Golden figures are only comparable when these match.
    """
    return {name: _version(name) for name in ("jax", "jaxlib", "libtpu")}


def libtpu_available() -> bool:
    """Whether the ``libtpu`` package (XLA's TPU compiler) is installed."""
    return _version("libtpu") is not None
