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


def test_the_lock_pins_the_toolchain_and_the_package_only_ranges_it():
    """requirements.lock holds the exact toolchain the goldens were made with; pyproject.toml gives
    compatible ranges (no exact pins: aotcheck must not pick a user's pytest or optax) that the lock
    satisfies; README names the locked toolchain."""
    import tomllib

    from packaging.requirements import Requirement

    lock = dict(l.split("==") for l in (ROOT / "requirements.lock").read_text().split() if "==" in l)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    for requirement in requirements:
        assert not any(spec.operator in ("==", "===") for spec in requirement.specifier), requirement
        assert requirement.name in lock, f"{requirement.name} is a dependency but not in requirements.lock"
        assert requirement.specifier.contains(lock[requirement.name]), (requirement, lock[requirement.name])
    assert {"jax", "jaxlib", "libtpu", "optax", "pytest"} <= set(lock)
    readme = (ROOT / "README.md").read_text()
    assert f"jax {lock['jax']}, jaxlib {lock['jaxlib']}, libtpu" in readme
    assert lock["libtpu"] in readme
