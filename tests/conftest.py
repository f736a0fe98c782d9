"""Fixtures shared by the test modules."""

import jax
import pytest
from faults import FAULTS
from toy import INI, ToyEditor

from aotcheck.targets import families

# cpu-N topologies need host devices, fixed when JAX's CPU backend starts.
jax.config.update("jax_num_cpu_devices", 8)

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def fresh_family_books(monkeypatch):
    """Each test keeps its own books of the chip families compiled for, so the warning about
    mixing families (aotcheck.targets.families) speaks of that test's compiles only: a test that
    mixes families on purpose says so (pytest.warns), and no ini filter hides the warning."""
    monkeypatch.setattr(families, "_compiled", set())
    monkeypatch.setattr(families, "_warned", False)


@pytest.fixture
def project(pytester):
    """A pytest project with the toy config (tests/toy.py) and one plain test."""
    ToyEditor(pytester)()
    pytester.makeini(INI)
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    return pytester


@pytest.fixture
def edit_toy(project):
    """Rewrites the project's toy between two runs as a user edits a config: ``edit_toy(width=512)``."""
    return ToyEditor(project)


@pytest.fixture
def toy(project, edit_toy):
    """The toy project plus a tiny FSDP LM (config ``lm``), without the plain test."""
    edit_toy(lm="fsdp")
    (project.path / "test_plain.py").unlink()
    return project


@pytest.fixture
def faults(project):
    """The toy project with configs that fail in every way tests/faults.py's FAULTS lists."""
    project.makeconftest(FAULTS)
    (project.path / "test_plain.py").unlink()
    return project
