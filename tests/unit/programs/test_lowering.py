"""A FunctionConfig's argument kinds (``arg_kinds``): what each argument holds, so a train step given
as a function splits its peak as a TrainerConfig's does (parameters, optimizer state, batch).

What each test shows: an MLP train step with optax.adam, compiled for real, has its parameters'
per-device bytes as ``peak_params_bytes`` and its moments' (and count's) as ``peak_opt_state_bytes``,
given ``arg_kinds`` or inferred from a train-state dict; an ``other`` input counts with the batch and
is not linted as one; the kinds are inferred only where it is safe (optax's states, a dict or object
with ``params`` and ``opt_state``); bad kinds, a wrong count or a prefix that does not fit are config
errors naming ``arg_kinds`` and the fix; the figures cache keys on the kinds.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import aotcheck
from aotcheck.errors import ConfigError
from aotcheck.figures.attribution import PEAK_FIGURES
from aotcheck.figures.hlo import parse_module
from aotcheck.figures.sharding import batch_inputs
from aotcheck.pipeline.case import Case
from aotcheck.pipeline.stages import lower
from aotcheck.programs.lowering import LoweringError, argument_kinds, arguments, lower_config, place
from aotcheck.targets.topology import Target

TARGET = "v4-8"  # 4 devices on one data axis; the attribution reads libtpu's dump.
WIDTH, HIDDEN, BATCH = 256, 1024, 64
OPTIMIZER = optax.adam(1e-3)


def per_device_bytes(tree) -> int:
    """Bytes on one device of a tree of sharded ShapeDtypeStructs, from shapes and shardings alone."""
    return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
               for leaf in jax.tree_util.tree_leaves(tree))


def mlp_args(mesh):
    """Parameters sharded over the data axis, adam's moments following them (its count replicated), a batch."""
    rows, cols, whole = (NamedSharding(mesh, s) for s in (P("data", None), P(None, "data"), P()))
    f32 = jnp.float32
    params = {"w1": jax.ShapeDtypeStruct((WIDTH, HIDDEN), f32, sharding=cols),
              "b1": jax.ShapeDtypeStruct((HIDDEN,), f32, sharding=NamedSharding(mesh, P("data"))),
              "w2": jax.ShapeDtypeStruct((HIDDEN, WIDTH), f32, sharding=rows)}
    shardings = jax.tree_util.tree_map(lambda leaf: leaf.sharding, params)
    opt_state = optax.tree_map_params(
        OPTIMIZER, lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        jax.eval_shape(OPTIMIZER.init, params), shardings,
        transform_non_params=lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=whole),
        is_leaf=lambda x: isinstance(x, NamedSharding))
    batch = {"x": jax.ShapeDtypeStruct((BATCH, WIDTH), f32, sharding=rows),
             "y": jax.ShapeDtypeStruct((BATCH, WIDTH), f32, sharding=rows)}
    return params, opt_state, batch


def loss_fn(params, batch):
    hidden = jax.nn.relu(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] - batch["y"]) ** 2)


def train_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def state_step(state, batch):
    params, opt_state, loss = train_step(state["params"], state["opt_state"], batch)
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, loss


def state_args(mesh):
    params, opt_state, batch = mlp_args(mesh)
    step = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))
    return {"params": params, "opt_state": opt_state, "step": step}, batch


EXPLICIT = aotcheck.FunctionConfig(fn=train_step, make_args=mlp_args, donate_argnums=(0, 1),
                                   arg_kinds=("params", "opt_state", "batch"))
INFERRED = aotcheck.FunctionConfig(fn=state_step, make_args=state_args, donate_argnums=(0,))


@pytest.mark.heavy
@pytest.mark.parametrize("config", [EXPLICIT, INFERRED], ids=["arg_kinds", "inferred-train-state"])
def test_a_train_step_as_a_function_splits_its_peak_like_a_trainer(config):
    """Compiled for real: the parameters' class is their bytes per device, the optimizer state's is
    adam's moments and count (and the train state's step), the batch's is the batch's."""
    lowered = lower(Case.of("mlp", "step", TARGET), config)
    with lowered.compile() as compiled:
        figures = compiled.measure().figures
    params, opt_state, batch = mlp_args(place(config, Target.of(TARGET)).mesh)
    step = 4 if config is INFERRED else 0  # The train state's int32 step counts with the optimizer state.
    assert per_device_bytes(opt_state) == 2 * per_device_bytes(params) + 4  # mu, nu and adam's int32 count.
    assert figures["peak_params_bytes"] == per_device_bytes(params) > 0
    assert figures["peak_opt_state_bytes"] == per_device_bytes(opt_state) + step
    assert figures["peak_batch_bytes"] == per_device_bytes(batch)
    assert sum(figures[name] for name in PEAK_FIGURES) == figures["peak_bytes"]
    prefix = "args[0]/params/" if config is INFERRED else "args[0]/"
    assert {a.path: a.kind for a in lowered.arguments}[prefix + "w1"] == "params"


def table_step(x, table):
    return jnp.tanh(x @ table.T)


def table_args(mesh):
    rows = NamedSharding(mesh, P("data", None))
    return (jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32, sharding=rows),
            jax.ShapeDtypeStruct((HIDDEN, WIDTH), jnp.float32, sharding=rows))  # Rows split: not a batch.


@pytest.mark.heavy
def test_an_other_input_counts_with_the_batch_and_is_not_linted_as_one():
    """``other``: at the peak in ``peak_batch_bytes`` (``peak_other_bytes`` stays XLA's padding and
    fragmentation), kept out of the sharding lint's batch inputs (its split leading dimension is no batch)."""
    split = {}
    for kinds in (None, ("batch", "other")):
        config = aotcheck.FunctionConfig(fn=table_step, make_args=table_args, arg_kinds=kinds)
        lowered = lower(Case.of("table", "step", TARGET), config)
        with lowered.compile() as compiled:
            figures = compiled.measure().figures
            module = parse_module(compiled.compiled.as_text())
        split[kinds] = {name: figures[name] for name in (*PEAK_FIGURES, "peak_bytes")}
        assert figures["peak_batch_bytes"] == (BATCH + HIDDEN) * WIDTH * 4 // 4  # Both, a quarter per device.
        inputs = [i.path for i in batch_inputs(lowered.arguments, module)]
        assert [a.kind for a in lowered.arguments] == (["batch", "other"] if kinds else ["batch", "batch"])
        assert inputs == (["args[0]"] if kinds else ["args[0]", "args[1]"])
    assert split[None] == split[("batch", "other")]  # The same program, the same split.


class Moments(NamedTuple):  # A user's optimizer state: not optax's, so not inferred.
    mu: jax.ShapeDtypeStruct


def test_kinds_are_inferred_only_where_it_is_safe():
    """No compile: optax's states are opt_state (by their classes' module), a dict or object with both
    params and opt_state is a train state split as a TrainerConfig's, everything else stays batch."""
    params = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32)}
    adam = jax.eval_shape(optax.adam(1e-3).init, params)  # (ScaleByAdamState(count, mu, nu), EmptyState())
    sgd = jax.eval_shape(optax.sgd(0.1).init, params)  # (EmptyState(), EmptyState()): no leaves at all.
    schedule = jax.eval_shape(optax.inject_hyperparams(optax.adam)(learning_rate=0.1).init, params)
    state = {"params": params, "opt_state": sgd, "step": jax.ShapeDtypeStruct((), jnp.int32)}
    plain = aotcheck.FunctionConfig(fn=abs, make_args=abs)
    got = argument_kinds(plain, (adam, sgd, schedule, state, params, {"params": params, "rng": params},
                                 Moments(params["w"]), [adam, adam]))
    assert got == [["opt_state"] * 3, [], ["opt_state"] * len(jax.tree_util.tree_leaves(schedule)),
                   ["params", "opt_state"], ["batch"], ["batch", "batch"], ["batch"], ["opt_state"] * 6]
    train_state = pytest.importorskip("flax.training.train_state")
    flax_state = jax.eval_shape(lambda: train_state.TrainState.create(
        apply_fn=None, params={"w": jnp.zeros((8, 8))}, tx=optax.adam(1e-3)))
    leaves = jax.tree_util.tree_flatten_with_path(flax_state)[0]
    kinds = argument_kinds(plain, (flax_state,))[0]
    assert {jax.tree_util.keystr(p): k for (p, _), k in zip(leaves, kinds)} == {
        ".step": "opt_state", ".params['w']": "params", ".opt_state[0].count": "opt_state",
        ".opt_state[0].mu['w']": "opt_state", ".opt_state[0].nu['w']": "opt_state"}


def test_a_prefix_of_kinds_splits_one_argument():
    params = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32)}
    state = {"params": params, "opt_state": jax.eval_shape(optax.adam(1e-3).init, params),
             "rng": jax.ShapeDtypeStruct((2,), jnp.uint32)}
    config = aotcheck.FunctionConfig(fn=abs, make_args=abs, arg_kinds=(
        {"params": "params", "opt_state": "opt_state", "rng": "other"}, "batch"))
    assert argument_kinds(config, (state, params)) == [["opt_state"] * 3 + ["params", "other"], ["batch"]]


def test_the_kinds_reach_the_arguments_of_a_lowered_program():
    """Lowered on host devices (no compile): the entry's parameters carry the kinds, paths unchanged."""
    config = aotcheck.FunctionConfig(fn=train_step, make_args=mlp_args, arg_kinds=("params", "opt_state", "batch"))
    found = arguments(lower_config(config, Target.of("cpu-4"))["step"], config)
    assert [(a.path, a.kind) for a in found if a.path.endswith(("w1", "count", "/x"))] == [
        ("args[0]/w1", "params"), ("args[1]/0/count", "opt_state"), ("args[1]/0/mu/w1", "opt_state"),
        ("args[1]/0/nu/w1", "opt_state"), ("args[2]/x", "batch")]
    assert {a.kind for a in arguments(lower_config(INFERRED, Target.of("cpu-4"))["step"], INFERRED)} == {
        "params", "opt_state", "batch"}


@pytest.mark.parametrize("kinds, message", [
    (("params", "optimizer", "batch"), r"FunctionConfig\.arg_kinds\[1\]: 'optimizer' is not an argument kind; "
                                       r"use one of params, opt_state, batch, kv_cache, other"),
    (("param", "opt_state", "batch"), r"arg_kinds\[0\]: 'param' is not an argument kind.*did you mean 'params'\?"),
    (({"params": "params", "opt_state": 3}, "batch"), r"arg_kinds\[0\]: 3 is not an argument kind"),
    ("params", r"FunctionConfig\.arg_kinds is 'params'; give a sequence of one kind per positional argument"),
    (("batch", {}), r"arg_kinds\[1\] is \{\}, which names no kind"),
])
def test_a_bad_kind_is_a_config_error_when_the_config_is_built(kinds, message):
    with pytest.raises(ConfigError, match=message):
        aotcheck.FunctionConfig(fn=train_step, make_args=mlp_args, arg_kinds=kinds)


def test_kinds_that_do_not_fit_the_arguments_fail_at_lowering():
    """Before any compile: a count other than one per argument, a prefix not shaped like its argument."""
    short = aotcheck.FunctionConfig(fn=train_step, make_args=mlp_args, arg_kinds=("params", "opt_state"))
    with pytest.raises(LoweringError, match=r"FunctionConfig\.arg_kinds gives 2 kind\(s\), but the program 'step' "
                                            r"takes 3 positional argument\(s\) from make_args; give one kind per"):
        lower_config(short, Target.of("cpu-4"))
    assert issubclass(LoweringError, ConfigError)
    wrong = aotcheck.FunctionConfig(fn=train_step, make_args=mlp_args,
                                    arg_kinds=({"params": "params"}, "opt_state", "batch"))
    with pytest.raises(LoweringError, match=r"arg_kinds\[0\] \(\{'params': 'params'\}\) is not a pytree prefix of "
                                            r"argument 0 \(a dict of b1, w1, w2\); give one kind for the whole"):
        lower_config(wrong, Target.of("cpu-4"))


@pytest.mark.heavy
def test_the_figures_cache_keys_on_the_kinds():
    """Kinds split the same program differently, so they key the cache; all batch (as before kinds
    existed) keeps the key a config had."""
    keys = {kinds: lower(Case.of("table", "step", "cpu-4"), aotcheck.FunctionConfig(
        fn=table_step, make_args=table_args, arg_kinds=kinds)).key
        for kinds in (None, ("batch", "batch"), ("batch", "other"), ("params", "batch"))}
    assert keys[None] == keys[("batch", "batch")]
    assert len({keys[None], keys[("batch", "other")], keys[("params", "batch")]}) == 3


def _unplaced(kind):
    """make_args whose arguments are not on the mesh, by kind (ShapeDtypeStructs without a sharding,
    a NumPy array, a concrete jax.Array on the host)."""
    import numpy as np

    def make_args(mesh):
        return {"sds": (jax.ShapeDtypeStruct((16, 64), jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float32)),
                "numpy": (np.ones((16, 64), np.float32), np.ones((64,), np.float32)),
                "array": (jnp.ones((16, 64)), jnp.ones((64,)))}[kind]

    return aotcheck.FunctionConfig(fn=lambda x, b: x + b, make_args=make_args)


@pytest.mark.parametrize("topology", ["v4-8", "v5e-1", "h100-8"])
@pytest.mark.parametrize("kind, what", [("sds", "a ShapeDtypeStruct without a sharding"),
                                        ("numpy", "a concrete ndarray (host memory)"), ("array", "a concrete")])
def test_arguments_off_the_mesh_are_refused_before_anything_compiles(topology, kind, what):
    """Compiled as they are, they make a host CPU program (generated code 0 B) whatever the target."""
    with pytest.raises(LoweringError) as raised:
        lower_config(_unplaced(kind), Target.of(topology))
    message = str(raised.value)
    assert f"so JAX would compile the program for the host CPU, not {topology}x1" in message
    assert f"the first, args[0], is {what}" in message and "sharding=NamedSharding(mesh" in message


@pytest.mark.parametrize("topology", ["v4-8", "h100-8"])
@pytest.mark.parametrize("args, said", [((), "it takes none"), ((2, 3.0), "it takes Python scalars only")])
def test_a_function_of_no_array_is_refused_unless_its_out_shardings_place_it(topology, args, said):
    """Issue 52, V74: no argument to place it, so a host CPU program, gated as the target."""
    config = aotcheck.FunctionConfig(fn=lambda *a: jnp.ones((8, 8)) * sum(a), make_args=lambda mesh: args)
    with pytest.raises(LoweringError) as raised:
        lower_config(config, Target.of(topology))
    assert f"({said}), so JAX would compile the program for the host CPU, not {topology}x1" in str(raised.value)
    assert "out_shardings on that mesh" in str(raised.value)

    def make_program(mesh, target):
        return jax.jit(lambda: jnp.ones((8, 8)), out_shardings=NamedSharding(mesh, P())), ()

    lowered = lower_config(aotcheck.FunctionConfig(make_program=make_program), Target.of(topology))
    assert f"mhlo.num_partitions = {Target.of(topology).num_devices}" in lowered["step"].as_text()


def test_arguments_on_a_mesh_of_half_the_targets_devices_are_refused():
    """Issue 52, V75: a 2-partition program gated as v4-8 (4 devices)."""
    def make_args(mesh):
        half = jax.sharding.Mesh(mesh.devices.flat[:2], ("half",))
        return (jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(half, P("half"))),)

    with pytest.raises(LoweringError) as raised:
        lower_config(aotcheck.FunctionConfig(fn=lambda x: x * 2, make_args=make_args), Target.of("v4-8"))
    assert ("its arguments are on 2 of the target's 4 devices, so JAX would compile a program of 2 partition(s), not "
            "one for v4-8x1. Place them on the mesh make_args is given (all 4 devices") in str(raised.value)


def test_one_argument_on_the_mesh_places_the_program_and_a_function_with_its_own_shardings_passes():
    def make_args(mesh):  # A step counter without a sharding beside a sharded batch: JAX places it.
        return (jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P("data"))),
                jax.ShapeDtypeStruct((), jnp.int32))

    lowered = lower_config(aotcheck.FunctionConfig(fn=lambda x, i: x * i, make_args=make_args), Target.of("v5e-16"))
    assert "mhlo.num_partitions = 16" in lowered["step"].as_text()

    def make_program(mesh, target):  # Shardings on the function, none on the arguments.
        fn = jax.jit(lambda x: x * 2, in_shardings=NamedSharding(mesh, P("data")))
        return fn, (jax.ShapeDtypeStruct((16, 64), jnp.float32),)

    lowered = lower_config(aotcheck.FunctionConfig(make_program=make_program), Target.of("v5e-16"))
    assert "mhlo.num_partitions = 16" in lowered["step"].as_text()
    # On one device there are no partitions to count: the function's own shardings place it all the same.
    lowered = lower_config(aotcheck.FunctionConfig(make_program=make_program), Target.of("v5e-1"))
    assert "sharding" in lowered["step"].as_text().split("@main(")[1].split(")")[0]
    with pytest.raises(LoweringError, match="no argument make_program gave is on the target's mesh"):
        lower_config(aotcheck.FunctionConfig(make_program=lambda mesh, target: (
            jax.jit(lambda x: x * 2), (jax.ShapeDtypeStruct((16, 64), jnp.float32),))), Target.of("v5e-1"))


def test_eager_work_on_the_targets_devices_names_trace_as_target():
    """Hardening round 4: an array put on jax.devices()[0] in make_args was jax's `UNIMPLEMENTED:
    MakeArraysFromHostBufferShards not available with compile-only client`, the cure not said."""
    import numpy as np

    def make_args(mesh):
        jax.device_put(np.ones(8), jax.devices()[0])  # Eager work: under trace_as_target, a deviceless device.
        return (jax.ShapeDtypeStruct((8 * mesh.devices.size,), jnp.float32, sharding=NamedSharding(mesh, P("data"))),)

    with pytest.raises(LoweringError) as e:
        lower_config(aotcheck.FunctionConfig(fn=jnp.sin, make_args=make_args), Target.of("v4-8"))
    assert str(e.value).startswith("step for v4-8x1: code run while the program was built put an array on a device "
                                   "(UNIMPLEMENTED: ")
    assert "or build the config with trace_as_target=False so that eager work runs on this host's CPU" in str(e.value)
    lowered = lower_config(aotcheck.FunctionConfig(fn=jnp.sin, make_args=make_args, trace_as_target=False), Target.of("v4-8"))
    assert list(lowered) == ["step"]  # The cure works.
