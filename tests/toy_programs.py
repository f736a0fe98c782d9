"""Small function configs the config and knob tests share: a step made per target, and a program
whose size is a knob."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import aotcheck

MiB = 2**20


def per_target(mesh, target):
    """A step whose batch is 2 rows per device and whose own jit donates its input."""
    x = jax.ShapeDtypeStruct((2 * target.num_devices, 128), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    return jax.jit(lambda x: x * 2, donate_argnums=0), (x,)


def rows_program(rows: int):
    """``x * 2`` over ``rows`` MiB rows of float32 on one v5e chip: input and output, about 2 x rows MiB."""

    def make_program(mesh, target):
        x = jax.ShapeDtypeStruct((rows, MiB // 4), jnp.float32, sharding=NamedSharding(mesh, P()))
        return jax.jit(lambda x: x * 2), (x,)

    return aotcheck.FunctionConfig(make_program=make_program, program="double",
                                   knobs={"rows": aotcheck.Knob(rows, rows_program, step=1)}, fit_upper=16384)
