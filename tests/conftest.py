"""Fixtures shared by the test modules."""

import jax
import pytest

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
