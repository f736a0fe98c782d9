"""XLA's raw cost figures where its own cost analysis answers nothing (a deviceless GPU executable):
taken from jax's internal binding (figures/program.py's ``_cost_model``), and where that fails too,
absent (never zeros, which the gate would read as an improvement) with the failure in the details."""

import json

import jax
import jax.numpy as jnp
import pytest

from aotcheck import compile_function
from aotcheck.figures.loops import Uncounted
from aotcheck.figures.program import Details, cost_figures, measure_program, program_figures

RAW = {"flops_xla", "transcendentals_xla", "bytes_accessed_xla"}


class NoCostAnalysis:
    """A real compiled program whose own ``cost_analysis()`` answers nothing, as a deviceless GPU
    executable's does (UNIMPLEMENTED, which jax turns into None): a fake wrapper, so that this unit
    test of the fallback's logic runs on the host without a GPU toolchain."""

    def __init__(self, compiled):
        self._compiled = compiled

    def cost_analysis(self):
        return None

    def __getattr__(self, name):
        return getattr(self._compiled, name)


@pytest.fixture(scope="module")
def compiled():
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    return compile_function(lambda a, b: a @ b, x, x, topology="cpu-1")


def test_raw_cost_from_the_binding_where_the_executable_has_none(compiled):
    """The binding answers (for real, on the host's client): the figures and details are as the
    executable's own analysis gives them, nothing recorded."""
    assert cost_figures(NoCostAnalysis(compiled)) == cost_figures(compiled)
    assert measure_program(NoCostAnalysis(compiled)) == measure_program(compiled)
    assert measure_program(compiled).uncounted == []


def test_a_failed_raw_cost_leaves_its_figures_absent_and_says_why(compiled, monkeypatch):
    """The binding fails (a fake: monkeypatched to raise as XLA would): the raw figures are absent,
    not zero; the loop-aware ones are as before; the details record why, and keep it through JSON."""
    from jax._src.lib import _jax

    def refuse(client, module):
        raise RuntimeError("UNIMPLEMENTED: no cost analysis for this module\n(a second line of XLA's)")

    monkeypatch.setattr(_jax, "hlo_module_cost_analysis", refuse)
    whole = program_figures(compiled)
    figures, uncounted = measure_program(NoCostAnalysis(compiled))
    assert not RAW & set(figures)
    assert figures == {k: v for k, v in whole.items() if k not in RAW}
    problem = Uncounted("xla_cost", "RuntimeError: UNIMPLEMENTED: no cost analysis for this module", None, 0)
    assert uncounted == [problem]
    assert cost_figures(NoCostAnalysis(compiled)).problem == problem
    assert problem.describe() == (
        "XLA's raw cost analysis failed (RuntimeError: UNIMPLEMENTED: no cost analysis for this module): flops_xla, "
        "bytes_accessed_xla and transcendentals_xla are absent, and flops is not checked against XLA's raw count")
    details = Details(uncounted=uncounted)
    assert Details.from_json(json.loads(json.dumps(details.to_json()))) == details
    assert "flops_xla" not in program_figures(NoCostAnalysis(compiled))


def test_the_cache_takes_an_entry_whose_raw_costs_are_absent_together():
    from aotcheck.figures.program import RAW_COST_FIGURES, REQUIRED_FIGURES, figures_problem

    whole = dict.fromkeys(REQUIRED_FIGURES, 1.0)
    assert figures_problem({k: v for k, v in whole.items() if k not in RAW_COST_FIGURES}) is None  # A failed analysis.
    assert figures_problem({k: v for k, v in whole.items() if k != "flops_xla"}) == "figure 'flops_xla' is missing"
