"""The SPMD partitioner's fallbacks as a figure (aotcheck.figures.fallbacks, read from libtpu's own log
by aotcheck._runtime.compiler_warnings): real deviceless compiles.

Independent truth: a resharding with no collective path (from P(None, a, b) to P((a, b), None, None))
that XLA's partitioner warns about, once per compile, in a process that compiled it before too (libtpu
does not deduplicate the warning: each compile must say it again).
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.stages import lower


def _config(*, reshard: bool):
    def make_program(mesh, target):
        mesh = jax.sharding.Mesh(np.asarray(mesh.devices).reshape(2, -1), ("a", "b"))
        last = P(("a", "b"), None, None) if reshard else P(None, "a", "b")

        def f(x):
            y = jax.lax.with_sharding_constraint(jnp.sin(x), NamedSharding(mesh, P(None, "a", "b")))  # The line.
            return jax.lax.with_sharding_constraint(jnp.cos(y), NamedSharding(mesh, last)) * 3

        return jax.jit(f), (jax.ShapeDtypeStruct((8, 64, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "a", "b"))),)

    return aotcheck.FunctionConfig(make_program=make_program, trace_in_mesh=False)


def _measure(config, topology):
    with lower(Case.of("reshard", "step", topology), config).compile() as compiled:
        return compiled.measure()


def test_a_full_rematerialization_is_counted_and_named_with_its_line_on_every_compile():
    for _ in range(2):  # The second compile in this process says it again.
        measured = _measure(_config(reshard=True), "v5e-8")
        assert measured.figures["sharding_fallbacks"] == 1
        [fallback] = measured.details.fallbacks
        assert fallback.kind == "remat" and fallback.source == f"tests/unit/figures/test_fallbacks.py:{_line()}"
        assert "-> {mesh['a'=2,'b'=4], [{'a', 'b'}, {}, {}]}" in fallback.moved
    assert _measure(_config(reshard=False), "v5e-8").figures["sharding_fallbacks"] == 0


def _line():
    source = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(source, 1) if text.rstrip().endswith("# The line."))


def test_a_gpu_target_has_no_fallback_figure_rather_than_a_zero_not_read():
    measured = _measure(_config(reshard=True), "h100-8")
    assert "sharding_fallbacks" not in measured.figures and measured.details.fallbacks == []
