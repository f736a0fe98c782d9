"""The repository's promises: CI runs README's test command; the pins agree."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"# The test suite \(what CI runs\):\n(.+)\n", readme)
    assert block, "README must give the test command under '# The test suite (what CI runs):'"
    ci_lines = [l.strip() for l in (ROOT / ".ci/run").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert ci_lines[-1] == block[1].strip()


def test_toolchain_pins_agree():
    lock = dict(l.split("==") for l in (ROOT / "requirements.lock").read_text().split() if "==" in l)
    pyproject = (ROOT / "pyproject.toml").read_text()
    for name in ("jaxlib", "libtpu", "optax"):
        assert f'"{name}=={lock[name]}"' in pyproject
    assert f'"jax[tpu]=={lock["jax"]}"' in pyproject
