"""The repository's promises: CI runs README's test commands; the pins agree with the ranges."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each lock and the Python it is tested on (tests/e2e/test_toolchains.py; CI itself runs the first).
LOCKS = {"requirements.lock": "3.12", "requirements-oldest.lock": "3.11"}


def readme_test_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"# The test suite \(what CI runs\):\n((?:[^\n#`][^\n]*\n)+)", readme)
    assert block, "README must give the test commands under '# The test suite (what CI runs):'"
    return [line.strip() for line in block[1].splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_test_commands():
    commands = readme_test_commands()
    ci_lines = [l.strip() for l in (ROOT / ".ci/run").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert ci_lines[-len(commands):] == commands
    assert any("-m toolchains" in c for c in commands), "the toolchain legs run in CI"
    assert any("-m heavy" in c for c in commands), "the heavy tests, left out of the default run, run in CI"
    assert "PYENV_VERSION=3.12 python3.12 -m venv" in (ROOT / ".ci/run").read_text()


def read_lock(name: str) -> dict[str, str]:
    return dict(l.split("==") for l in (ROOT / name).read_text().split() if "==" in l)


@pytest.mark.parametrize("lock_name", sorted(LOCKS))
def test_each_lock_pins_a_toolchain_the_package_ranges_admit(lock_name):
    """Each lock holds an exact toolchain; pyproject.toml gives ranges (no exact pins: aotcheck must not
    pick a user's pytest or optax) that every lock satisfies on its own Python; README names both."""
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
    readme = (ROOT / "README.md").read_text()
    assert f"jax {lock['jax']}, jaxlib {lock['jaxlib']}, libtpu {lock['libtpu']}" in readme


def test_flax_is_ranged_apart_where_jax_outgrew_it():
    # flax <= 0.12.8 breaks under jax >= 0.11.1, which only exists for Python >= 3.12.
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    flax = [Requirement(r) for r in project["optional-dependencies"]["flax"]]
    on_312 = [r for r in flax if r.marker.evaluate({"python_version": "3.12"})]
    assert len(on_312) == 1 and not on_312[0].specifier.contains("0.12.8") and on_312[0].specifier.contains("0.12.12")


def test_readme_shows_the_figure_table_comparison_reads():
    from aotcheck.render.markdown import figures_table

    assert figures_table() in (ROOT / "README.md").read_text(), \
        "README's figure table is not aotcheck/figures/table.py's: paste figures_table() into README"


def _help(*args: str) -> str:
    """``python -m aotcheck ARGS --help``'s text."""
    import contextlib
    import io

    from aotcheck.cli import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*args, "--help"])
    return out.getvalue()


def test_every_command_the_docs_name_exists():
    """Hardening round 4: README named `aotcheck merge-reports`, a command that never existed. Every
    ``aotcheck WORD`` the docs show as code (a code block's line, an inline code span) is a subcommand,
    and every ``--flag`` shown with it is one of that subcommand's options."""
    commands = re.search(r"\{([a-z,-]+)\}", _help())[1].split(",")
    shown = []
    for doc in ("README.md", "ARCHITECTURE.md"):
        text = (ROOT / doc).read_text()
        blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
        spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        for code in [*blocks, *spans]:  # A command line: a line or span that starts with the command.
            shown += re.findall(r"^\s*(?:\$ )?(?:python -m )?aotcheck ([a-z][a-z-]*)((?: [^\n|;&#]*)?)", code, re.M)
    assert len(shown) > 10, shown  # The pattern reads the docs (else this test would check nothing).
    for command, rest in shown:
        assert command in commands, f"the docs show `aotcheck {command}`; the commands are {commands}"
        options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", _help(command)))
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
            assert flag in options, f"the docs show `aotcheck {command} ... {flag}`; it takes {sorted(options)}"
