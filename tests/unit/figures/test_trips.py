"""A while loop's trip count (aotcheck.figures.trips), read from programs XLA compiled for host CPU
devices; the truth is the loop's bounds as written."""

import jax
import jax.numpy as jnp
import pytest

from aotcheck import compile_function
from aotcheck.figures.hlo import parse_module
from aotcheck.figures.trips import trip_count

X = jax.ShapeDtypeStruct((8, 8), jnp.float32)


def trip_counts(fn, *args):
    module = parse_module(compile_function(fn, *args, topology="cpu-1").as_text())
    return [trip_count(inst, comp, module) for comp in module.values() for inst in comp.instructions.values()
            if inst.opcode == "while"]


@pytest.mark.parametrize("lower, upper", [(0, 4), (3, 10), (5, 21)])  # One trip XLA unrolls: no loop.
def test_a_fori_loops_count_is_its_bounds(lower, upper):
    assert trip_counts(lambda x, w: jax.lax.fori_loop(lower, upper, lambda i, y: jnp.tanh(y @ w), x), X, X) == [
        upper - lower]


def test_a_scan_counts_its_length():
    def scanned(x, w):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=7)[0]
    assert trip_counts(scanned, X, X) == [7]


def test_a_loop_whose_bound_is_data_has_no_count():
    n = jax.ShapeDtypeStruct((), jnp.int32)
    assert trip_counts(lambda x, w, n: jax.lax.while_loop(lambda c: c[1] < n, lambda c: (c[0] @ w, c[1] + 1),
                                                          (x, 0))[0], X, X, n) == [None]
