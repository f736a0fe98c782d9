"""The repository's promises: CI runs README's test command; the pins agree with the ranges."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each lock and the Python it is tested on (tests/e2e/test_toolchains.py; CI itself runs the first).
LOCKS = {"requirements.lock": "3.12", "requirements-oldest.lock": "3.11"}


def readme_quick_start() -> dict[str, list[str]]:
    """README's quick start: each ``# Heading:`` comment of its first bash block -> the commands under it."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert block, "README must open its quick start with a bash block"
    steps: dict[str, list[str]] = {}
    for line in block[1].splitlines():
        if line.startswith("# "):
            steps[line[2:].strip()] = []
        elif line.strip():
            steps[list(steps)[-1]].append(line.strip())
    return steps


def test_readme_gives_three_commands_and_ci_runs_its_test_command_alone():
    """Issue 54: install, the main job, the tests: one command each; .ci/run calls the test one as it is."""
    steps = readme_quick_start()
    assert list(steps) == ["Install:", "The main job:", "The test suite (what CI runs):"], steps
    assert all(len(commands) == 1 for commands in steps.values()), steps
    [test] = steps["The test suite (what CI runs):"]
    ci = (ROOT / ".ci/run").read_text()
    ci_lines = [l.strip() for l in ci.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    assert ci_lines[-1] == test and sum("pytest" in l for l in ci_lines) == 1, ci_lines
    # Every test but the main job's: the default run's markers are all undone (tox.ini's addopts).
    assert "-m 'not main_job'" in test and "--dist worksteal" in test
    assert "PYENV_VERSION=3.12 python3.12 -m venv" in ci and steps["Install:"][0].startswith("PYENV_VERSION=3.12")
    [main_job] = steps["The main job:"]
    assert "--aot-configs='*'" in main_job and "--aot-topologies" not in main_job


def read_lock(name: str) -> dict[str, str]:
    return dict(l.split("==") for l in (ROOT / name).read_text().split() if "==" in l)


@pytest.mark.parametrize("lock_name", sorted(LOCKS))
def test_each_lock_pins_a_toolchain_the_package_ranges_admit(lock_name):
    """Each lock holds an exact toolchain; pyproject.toml gives ranges (no exact pins: aotcheck must not
    pick a user's pytest or optax) that every lock satisfies on its own Python; docs/toolchains.md names both."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    lock = read_lock(lock_name)
    python = LOCKS[lock_name]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert SpecifierSet(project["requires-python"]).contains(python + ".0")
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for name, extra in project["optional-dependencies"].items() for r in extra
                     if name != "maxtext"]
    # aotcheck[maxtext] is pinned apart, over the lock (tests/e2e/test_maxtext.py installs it with both).
    maxtext = [Requirement(r) for r in project["optional-dependencies"]["maxtext"]]
    pins = {**lock, **read_lock("requirements-maxtext.lock")}
    applied = 0
    for requirement, pinned in [*((r, lock) for r in requirements), *((r, pins) for r in maxtext)]:
        assert not any(spec.operator in ("==", "===") for spec in requirement.specifier), requirement
        if requirement.marker and not requirement.marker.evaluate({"python_version": python}):
            continue
        applied += 1
        name = next((k for k in pinned if k.lower().replace("_", "-") == requirement.name.lower()), requirement.name)
        assert name in pinned, f"{requirement.name} is a dependency but not in {lock_name}"
        assert requirement.specifier.contains(pinned[name]), (requirement, pinned[name])
    assert applied >= 8 and {"jax", "jaxlib", "libtpu", "optax", "pytest", "flax"} <= set(lock)
    toolchains = (ROOT / "docs" / "toolchains.md").read_text()
    assert f"jax {lock['jax']}, jaxlib {lock['jaxlib']}, libtpu {lock['libtpu']}" in toolchains


def test_flax_is_ranged_apart_where_jax_outgrew_it():
    # flax <= 0.12.8 breaks under jax >= 0.11.1, which only exists for Python >= 3.12.
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    flax = [Requirement(r) for r in project["optional-dependencies"]["flax"]]
    on_312 = [r for r in flax if r.marker.evaluate({"python_version": "3.12"})]
    assert len(on_312) == 1 and not on_312[0].specifier.contains("0.12.8") and on_312[0].specifier.contains("0.12.12")


def test_every_main_job_test_runs_in_the_main_job():
    """A test marked main_job is left out of CI's command (-m 'not main_job'); the main job (-m aotcheck)
    runs it only if it is marked aotcheck too: one with the first mark alone would run nowhere."""
    import ast

    marked = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                marks = {ast.unparse(d).split("(")[0].removeprefix("pytest.mark.") for d in node.decorator_list}
                if "main_job" in marks:
                    marked.append((path.name, node.name, "aotcheck" in marks))
    assert len(marked) >= 2 and all(ok for *_, ok in marked), marked
