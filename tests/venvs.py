"""Fresh virtual environments for the toolchain and MaxText legs: a Python found through PATH or pyenv,
a lock installed, then this package; and the environment a child runs in, without what this process's
jax and aotcheck set when they loaded libtpu."""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def find_python(version: str) -> str | None:
    """A working ``python{version}``: on PATH, or in pyenv's versions."""
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}"),
                  *sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True)]
    for candidate in filter(None, candidates):
        out = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    return None


def make_env(version: str, lock: str, where: Path, install: tuple[str, ...] = ("-e", ".")) -> str:
    """A fresh venv on Python ``version`` with ``lock`` installed, then this package with its ranges
    (``install``: pip's arguments for it, e.g. an extra and constraints)."""
    python = find_python(version)
    if python is None:
        if os.environ.get("CI"):
            pytest.fail(f"Python {version} is not installed on this CI machine, so this toolchain leg proves nothing")
        pytest.skip(f"Python {version} is not installed here (neither python{version} on PATH nor in pyenv)")
    venv = where / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")

    def pip(*args: str) -> None:
        out = subprocess.run([py, "-m", "pip", "install", "-q", *args], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, f"pip install {' '.join(args)} on {version}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"

    pip("-r", lock)
    with open(os.path.join(tempfile.gettempdir(), "aotcheck-editable-install.lock"), "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # Builds in the repository: one at a time.
        pip(*install)  # With its dependencies: the package's ranges must accept the lock's versions.
    return py


def shared_env(factory: pytest.TempPathFactory, key: str, version: str, lock: str,
               install: tuple[str, ...] = ("-e", ".")) -> str:
    """:func:`make_env` once per test run, whichever xdist worker asks first: the others wait on a file lock
    in the run's shared temporary directory, then use it. (xdist's ``--dist loadgroup`` would keep a venv's
    tests on one worker, but it silently stops grouping under pytest 9.2: pytest-dev/pytest-xdist#1386.)"""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # popen-gwN's parent: the run's.
    where, done = root / f"venv-{key}", root / f"venv-{key}.python"
    with open(root / f"venv-{key}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if done.exists():
            return done.read_text()
        shutil.rmtree(where, ignore_errors=True)  # A build that failed half-way is built again, whole.
        where.mkdir()
        py = make_env(version, lock, where, install)
        done.write_text(py)
        return py


# What this process's jax and aotcheck put into the environment when they loaded libtpu. TPU_LIBRARY_PATH
# above all: jax sets it to the libtpu.so it loaded, and a child's jax would load that one, whatever
# libtpu the child's own environment has (the oldest leg would compile with the current libtpu).
INHERITED = ("PYTEST_", "AOTCHECK_", "TPU_LIBRARY_PATH", "JAX_PLATFORMS", "ALLOW_MULTIPLE_LIBTPU_LOAD",
             "TPU_SKIP_MDS_QUERY", "TF_CPP_MIN_LOG_LEVEL")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(INHERITED)}
