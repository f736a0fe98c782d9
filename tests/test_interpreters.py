"""aotcheck installs and gates on every supported Python: a fresh virtual environment per interpreter
(3.12 and 3.13; this suite itself runs on 3.11), the lock installed, then ``pip install -e .`` with
its dependency ranges resolved against it, then lm-tiny's gate on v5e-16 against the committed goldens.

An interpreter this machine lacks is skipped with the reason; pyenv's versions are found directly,
since its shims only answer for the versions a project selected.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
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


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_installs_and_gates_on(version, tmp_path):
    python = find_python(version)
    if python is None:
        pytest.skip(f"Python {version} is not installed here (neither python{version} on PATH nor in pyenv)")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")

    def pip(*args):
        out = subprocess.run([py, "-m", "pip", "install", "-q", *args], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, f"pip install {' '.join(args)} on {version}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"

    pip("-r", "requirements.lock")
    pip("-e", ".")  # With its dependencies: the package's ranges must accept the lock's versions.
    report = tmp_path / "report.json"
    out = subprocess.run([py, "-m", "aotcheck", "check", "--configs", "lm-tiny", "--topologies", "v5e-16", "--slices",
                          "1", "--no-cache", f"--report={report}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    cases = json.loads(report.read_text())["cases"]
    assert len(cases) == 3 and all(c["verdict"] == "pass" for c in cases), cases
    versions = subprocess.run([py, "-c", "import sys, jax, aotcheck; print(sys.version_info[:2], jax.__version__)"],
                              capture_output=True, text=True).stdout
    assert f"({version.replace('.', ', ')})" in versions and "0.10.2" in versions, versions
