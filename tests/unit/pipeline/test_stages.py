"""aotcheck.pipeline.stages: lower -> compile -> measure, each stage an object carrying what the next
needs; the whole path through the figures cache answers as a fresh compile does. Host CPU devices
(XLA's CPU compiler: quick; a TPU topology takes the same stages through libtpu)."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.pipeline.cache import FiguresCache
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.stages import lower

CASE = Case.of("mm", "step", "cpu-4")


def matmul(width=256, **fields):
    def make_args(mesh):
        return (jax.ShapeDtypeStruct((64, width), jnp.float32, sharding=NamedSharding(mesh, P("data"))),
                jax.ShapeDtypeStruct((width, width), jnp.float32, sharding=NamedSharding(mesh, P())))
    return aotcheck.FunctionConfig(fn=lambda x, w: jnp.tanh(x @ w), make_args=make_args, **fields)


def test_each_stage_carries_what_the_next_needs_and_the_figures_are_the_programs():
    lowered = lower(CASE, matmul())
    assert [a.path for a in lowered.arguments] == ["args[0]", "args[1]"] and lowered.case == CASE
    with lowered.compile() as compiled:
        measured = compiled.measure()
    assert measured.figures["flops"] == 2 * 16 * 256 * 256  # Per device: 16 of the 64 rows, times the weight.
    assert measured.figures["argument_bytes"] == 16 * 256 * 4 + 256 * 256 * 4 and not measured.cached
    with pytest.raises(RuntimeError, match=r"call it inside `with lowered.compile\(\) as compiled:`"):
        compiled.measure()  # Its dump went with the context.


def test_the_cache_answers_as_a_fresh_compile_does_and_only_for_the_same_program(tmp_path):
    cache = FiguresCache(tmp_path)
    fresh = lower(CASE, matmul()).measure(cache)
    again = lower(CASE, matmul()).measure(cache)
    assert again.cached and not fresh.cached
    assert (again.figures, again.details) == (fresh.figures, fresh.details)
    assert lower(CASE, matmul()).key == lower(CASE, matmul()).key
    wider = lower(CASE, matmul(width=512))
    assert wider.key != lower(CASE, matmul()).key and wider.cached(cache) is None  # Another program: a miss.
    options = lower(CASE, matmul(compiler_options={"xla_cpu_enable_fast_math": "false"}))
    assert options.key != lower(CASE, matmul()).key  # The compiler's options are part of what it answers for.
