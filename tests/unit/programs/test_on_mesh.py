"""aotcheck.programs.on_mesh: whether a lowered program is the target's (through lower_config in
test_lowering.py; here the question alone, over real deviceless v4-8 lowerings)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from aotcheck.programs.on_mesh import off_the_mesh
from aotcheck.targets.devices import get_devices_for_topology


def test_a_program_on_the_whole_mesh_passes_and_one_on_half_or_none_is_named():
    devices = get_devices_for_topology("v4-8").devices
    whole, half = Mesh(np.array(devices), ("d",)), Mesh(np.array(devices[:2]), ("d",))
    on = lambda mesh: jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(mesh, P("d")))  # noqa: E731
    ask = lambda arg: off_the_mesh("step", "make_args", (arg,), set(devices), "v4-8x1",  # noqa: E731
                                   jax.jit(lambda x: x * 2).lower(arg))
    assert ask(on(whole)) is None
    assert ask(on(half)).startswith("step for v4-8x1: its arguments are on 2 of the target's 4 devices")
    assert "no argument make_args gave is on the target's mesh" in ask(jax.ShapeDtypeStruct((8, 8), jnp.float32))
