"""The reference LM: analytic parameter counts against the traced model."""

import math

import jax
import pytest

from aotcheck.models import lm


@pytest.mark.parametrize("cfg", [lm.TINY, lm.ONE_B], ids=["tiny", "1b"])
def test_analytic_parameter_count_matches_traced(cfg):
    params = jax.eval_shape(lambda key: lm.init_params(cfg, key), jax.random.key(0))
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == cfg.num_params()


def test_one_b_is_a_1b_class_model():
    assert 0.9e9 < lm.ONE_B.num_params() < 1.2e9
