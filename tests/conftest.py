"""Fixtures shared by the test modules."""

import jax
import pytest
from toy import CONFTEST, FIT, INI

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
def project(pytester, monkeypatch):
    """A pytest project with the toy config (tests/toy.py) and one plain test."""
    monkeypatch.setenv("TOY_WIDTH", "256")
    monkeypatch.delenv("TOY_EXTRAS", raising=False)
    monkeypatch.delenv("TOY_LM", raising=False)
    monkeypatch.delenv("TOY_FIT", raising=False)
    monkeypatch.delenv("TOY_FIT_FIELD", raising=False)
    monkeypatch.delenv("TOY_FIT_TARGETS", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(toy_fit=FIT)
    pytester.makeini(INI)
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    return pytester


@pytest.fixture
def toy(project, monkeypatch):
    """The toy project plus a tiny FSDP LM (config ``lm``), without the plain test."""
    monkeypatch.setenv("TOY_LM", "fsdp")
    (project.path / "test_plain.py").unlink()
    return project
