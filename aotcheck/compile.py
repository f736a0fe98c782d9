"""The compile path: configs -> meshes -> lowered programs -> compiled executables.

The two entry points mirror axlearn's ``aot_compilation`` module::

    compile_trainer_programs(cfg, topology="v5e-16")            # {"train_step": Compiled}
    compile_inference_programs(cfg, input_batch_spec=None, topology="v4-8")  # {"sample_decode": ...}

and :func:`compile_function` takes any function with abstract sharded
arguments. Each has a ``lower_*`` twin that stops before XLA, which is cheap.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

from aotcheck import _runtime
from aotcheck.config import BatchSpec, Config, FunctionConfig, InferenceConfig, TrainerConfig
from aotcheck.isolation import note_family
from aotcheck.mesh import build_mesh
from aotcheck.partition import check_spec, match_partition_specs, named_shardings, with_shardings
from aotcheck.topology import Topology, check_num_slices, get_devices_for_topology, parse_topology


class CompileError(RuntimeError):
    """XLA refused to compile a program; the message says which and why."""


# Production defaults for TPU training (from MaxText's and axlearn's launch
# flags); each is accepted by this libtpu in AOT compiles (tests check it).
_TPU_DEFAULTS: dict[str, str] = {
    "xla_tpu_enable_latency_hiding_scheduler": "true",
    "xla_tpu_spmd_rng_bit_generator_unsafe": "true",
    "xla_tpu_enable_async_collective_fusion": "true",
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": "true",
    "xla_tpu_enable_async_collective_fusion_multiple_steps": "true",
    "xla_tpu_overlap_compute_collective_tc": "true",
    "xla_enable_async_all_gather": "true",
}
_TPU_FAMILY_DEFAULTS: dict[str, dict[str, str]] = {
    "v6e": {"xla_tpu_scoped_vmem_limit_kib": "98304"},  # As axlearn ships for v6e.
}
_MULTI_SLICE_DEFAULTS = {
    # Overlaps the cross-slice (DCN) gradient all-reduce with compute.
    "xla_tpu_enable_data_parallel_all_reduce_opt": "true",
    "xla_tpu_data_parallel_opt_different_sized_ops": "true",
}
# Options that only mean something to a running job (launch barriers, the
# megascale DCN transport, dumps): they do not change the program, so drop them.
_RUNTIME_ONLY = re.compile(
    r"^(megascale_.*|xla_tpu_use_enhanced_launch_barrier|xla_tpu_enable_megascale_barrier|xla_dump_.*)$"
)


def default_compiler_options(topology: str | Topology, num_slices: int = 1) -> dict[str, str]:
    """aotcheck's per-chip defaults (empty for ``cpu-N``)."""
    topo = parse_topology(topology)
    if not topo.is_tpu:
        return {}
    options = dict(_TPU_DEFAULTS)
    options.update(_TPU_FAMILY_DEFAULTS.get(topo.chip.family, {}))
    if num_slices > 1:
        options.update(_MULTI_SLICE_DEFAULTS)
    return options


def _as_option_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def resolve_compiler_options(
    topology: str | Topology, num_slices: int, *layers: Mapping[str, Any] | None
) -> dict[str, str]:
    """Merges the defaults with each later layer (config, then caller), as strings.

    Runtime-only options are dropped; a value of None removes a default.
    """
    options: dict[str, Any] = dict(default_compiler_options(topology, num_slices))
    for layer in layers:
        for key, value in (layer or {}).items():
            key = key.lstrip("-")
            if value is None:
                options.pop(key, None)
            else:
                options[key] = value
    return {k: _as_option_value(v) for k, v in sorted(options.items()) if not _RUNTIME_ONLY.match(k)}


@dataclasses.dataclass(frozen=True)
class Target:
    """Where to compile: a topology, a slice count, the devices and the mesh."""

    topology: Topology
    num_slices: int
    mesh: jax.sharding.Mesh


def make_target(config: Config, topology: str | Topology, num_slices: int = 1) -> Target:
    """Devices and mesh for ``config`` on ``num_slices`` x ``topology``."""
    topo = parse_topology(topology)
    num_slices = check_num_slices(num_slices)
    devices, _ = get_devices_for_topology(topo, num_slices)
    return Target(topo, num_slices, build_mesh(config.mesh, topo, devices, num_slices=num_slices))


def _axis_sizes(mesh: jax.sharding.Mesh) -> dict[str, int]:
    return dict(zip(mesh.axis_names, mesh.devices.shape))


def _batch_args(
    batch_spec: BatchSpec, partition: PartitionSpec | None, mesh: jax.sharding.Mesh
) -> dict[str, jax.ShapeDtypeStruct]:
    spec = partition if partition is not None else PartitionSpec(mesh.axis_names[0])
    out = {}
    for name, leaf in batch_spec.items():
        check_spec(f"batch/{name}", leaf.shape, spec, _axis_sizes(mesh))
        out[name] = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))
    return out


def _abstract_params(config: TrainerConfig | InferenceConfig) -> Any:
    # Traced, never run: a 100B-parameter init costs nothing here.
    return jax.eval_shape(config.init_fn, jax.ShapeDtypeStruct((2,), jax.numpy.uint32))


def _param_shardings(config: TrainerConfig | InferenceConfig, params: Any, mesh: jax.sharding.Mesh) -> Any:
    specs = match_partition_specs(params, config.partition_rules, axis_sizes=_axis_sizes(mesh))
    return named_shardings(specs, mesh)


def trainer_state_specs(config: TrainerConfig, target: Target) -> tuple[Any, Any]:
    """Abstract, sharded train state and batch for ``config`` on ``target``."""
    mesh = target.mesh
    params = _abstract_params(config)
    param_shardings = _param_shardings(config, params, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_state = jax.eval_shape(config.optimizer.init, params)
    # Optimizer moments follow their parameters; counts and the like replicate.
    opt_shardings = optax.tree_map_params(
        config.optimizer,
        lambda _, sharding: sharding,
        opt_state,
        param_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    state = {"params": params, "opt_state": opt_state, "step": jax.ShapeDtypeStruct((), jax.numpy.int32)}
    shardings = {"params": param_shardings, "opt_state": opt_shardings, "step": replicated}
    return with_shardings(state, shardings), _batch_args(config.batch_spec, config.batch_partition, mesh)


def make_train_step(config: TrainerConfig) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The train step aotcheck compiles: loss, gradients, one optimizer update."""

    def train_step(state: Any, batch: Any) -> tuple[Any, Any]:
        loss, grads = jax.value_and_grad(config.loss_fn)(state["params"], batch)
        updates, opt_state = config.optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1}
        return new_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    return train_step


def lower_trainer_programs(
    trainer_config: TrainerConfig, *, topology: str | Topology, topology_num_slices: int = 1
) -> dict[str, jax.stages.Lowered]:
    """Lowers the train step (no XLA compile). See :func:`compile_trainer_programs`."""
    target = make_target(trainer_config, topology, topology_num_slices)
    state, batch = trainer_state_specs(trainer_config, target)
    state_shardings = jax.tree_util.tree_map(lambda s: s.sharding, state)
    replicated = NamedSharding(target.mesh, PartitionSpec())
    step = jax.jit(
        make_train_step(trainer_config),
        in_shardings=(state_shardings, jax.tree_util.tree_map(lambda s: s.sharding, batch)),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,),
    )
    with jax.set_mesh(target.mesh):
        return {"train_step": step.lower(state, batch)}


def lower_inference_programs(
    inferencer_config: InferenceConfig,
    *,
    input_batch_spec: BatchSpec | None = None,
    topology: str | Topology,
    topology_num_slices: int = 1,
    method: str = "sample_decode",
) -> dict[str, jax.stages.Lowered]:
    """Lowers one inference method (no XLA compile). See :func:`compile_inference_programs`."""
    if method not in inferencer_config.methods:
        raise CompileError(
            f"Inference method {method!r} is not defined; this config offers "
            f"{', '.join(inferencer_config.methods)}."
        )
    target = make_target(inferencer_config, topology, topology_num_slices)
    params = _abstract_params(inferencer_config)
    param_shardings = _param_shardings(inferencer_config, params, target.mesh)
    batch = _batch_args(
        input_batch_spec if input_batch_spec is not None else inferencer_config.input_batch_spec,
        inferencer_config.batch_partition,
        target.mesh,
    )
    fn = jax.jit(
        inferencer_config.methods[method],
        in_shardings=(param_shardings, jax.tree_util.tree_map(lambda s: s.sharding, batch)),
    )
    with jax.set_mesh(target.mesh):
        return {method: fn.lower(with_shardings(params, param_shardings), batch)}


def lower_function_programs(
    config: FunctionConfig, *, topology: str | Topology, topology_num_slices: int = 1
) -> dict[str, jax.stages.Lowered]:
    """Lowers a :class:`FunctionConfig` on its mesh for ``topology``."""
    target = make_target(config, topology, topology_num_slices)
    fn = config.fn if hasattr(config.fn, "lower") else jax.jit(config.fn, donate_argnums=config.donate_argnums)
    with jax.set_mesh(target.mesh):
        return {config.program: fn.lower(*config.make_args(target.mesh))}


def compile_lowered(
    lowered: jax.stages.Lowered, options: Mapping[str, str], *, what: str, topology: str | Topology
) -> jax.stages.Compiled:
    """Runs XLA on ``lowered`` for ``topology``; a rejected option or a compile failure names ``what``."""
    note_family(topology)  # libtpu state crosses chip families: see aotcheck.isolation.
    try:
        with _runtime.quiet_libtpu_stderr():
            return lowered.compile(compiler_options=dict(options))
    except Exception as e:  # jax raises JaxRuntimeError; its message is what matters.
        message = str(e)
        option = re.search(r"No such compile option: '([^']+)'", message)
        if option:
            raise CompileError(
                f"XLA rejected compiler option {option[1]!r} while compiling {what}: this "
                f"libtpu does not know it. Remove it from the config's or the caller's "
                f"compiler_options."
            ) from e
        raise CompileError(f"Compiling {what} failed: {message}") from e


def compile_programs(
    lowered: Mapping[str, jax.stages.Lowered], options: Mapping[str, str], *, what: str, topology: str | Topology
) -> dict[str, jax.stages.Compiled]:
    return {
        name: compile_lowered(low, options, what=f"{name} of {what}", topology=topology)
        for name, low in lowered.items()
    }


def compile_trainer_programs(
    trainer_config: TrainerConfig,
    *,
    topology: str | Topology,
    topology_num_slices: int = 1,
    compiler_options: Mapping[str, Any] | None = None,
) -> dict[str, jax.stages.Compiled]:
    """AOT-compiles the train step of ``trainer_config`` for a TPU topology.

    The state (params, optimizer state, step) is donated; state and batch
    shardings are explicit, from the config's partition rules.

    Args:
        trainer_config: The trainer.
        topology: e.g. ``"v5e-16"``.
        topology_num_slices: Slices over DCN.
        compiler_options: XLA options over the defaults and the config's.

    Returns:
        ``{"train_step": jax.stages.Compiled}``.
    """
    options = resolve_compiler_options(
        topology, topology_num_slices, trainer_config.compiler_options, compiler_options
    )
    lowered = lower_trainer_programs(trainer_config, topology=topology, topology_num_slices=topology_num_slices)
    return compile_programs(
        lowered, options, what=f"the trainer on {_where(topology, topology_num_slices)}", topology=topology
    )


def compile_inference_programs(
    inferencer_config: InferenceConfig,
    *,
    input_batch_spec: BatchSpec | None,
    topology: str | Topology,
    topology_num_slices: int = 1,
    compiler_options: Mapping[str, Any] | None = None,
    method: str = "sample_decode",
) -> dict[str, jax.stages.Compiled]:
    """AOT-compiles one inference method (default ``sample_decode``).

    Args:
        inferencer_config: The model and its methods.
        input_batch_spec: Global input shapes; None takes the config's.
        topology: e.g. ``"v4-8"``.
        topology_num_slices: Slices over DCN.
        compiler_options: XLA options over the defaults and the config's.
        method: Which method to compile.

    Returns:
        ``{method: jax.stages.Compiled}``.
    """
    options = resolve_compiler_options(
        topology, topology_num_slices, inferencer_config.compiler_options, compiler_options
    )
    lowered = lower_inference_programs(
        inferencer_config,
        input_batch_spec=input_batch_spec,
        topology=topology,
        topology_num_slices=topology_num_slices,
        method=method,
    )
    return compile_programs(
        lowered, options, what=f"{method} on {_where(topology, topology_num_slices)}", topology=topology
    )


def compile_function(
    fn: Callable[..., Any],
    *args: Any,
    topology: str | Topology,
    topology_num_slices: int = 1,
    donate_argnums: Sequence[int] = (),
    compiler_options: Mapping[str, Any] | None = None,
) -> jax.stages.Compiled:
    """AOT-compiles any function for abstract sharded ``args`` (built on that topology's mesh).

    ``topology`` selects the default compiler options; the devices come from
    the shardings already on ``args``.
    """
    options = resolve_compiler_options(topology, topology_num_slices, compiler_options)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn, donate_argnums=tuple(donate_argnums))
    return compile_lowered(jitted.lower(*args), options, what=getattr(fn, "__name__", "function"), topology=topology)


def lower_config_programs(
    config: Config, *, topology: str | Topology, num_slices: int = 1, program: str | None = None
) -> dict[str, jax.stages.Lowered]:
    """Lowers one program (or all) of any config kind."""
    if isinstance(config, TrainerConfig):
        return lower_trainer_programs(config, topology=topology, topology_num_slices=num_slices)
    if isinstance(config, InferenceConfig):
        methods = [program] if program else list(config.methods)
        out: dict[str, jax.stages.Lowered] = {}
        for method in methods:
            out.update(
                lower_inference_programs(config, topology=topology, topology_num_slices=num_slices, method=method)
            )
        return out
    return lower_function_programs(config, topology=topology, topology_num_slices=num_slices)


def _where(topology: str | Topology, num_slices: int) -> str:
    name = parse_topology(topology).name
    return f"{name} x{num_slices} slice(s)"


__all__ = [
    "CompileError",
    "compile_function",
    "compile_inference_programs",
    "compile_trainer_programs",
    "default_compiler_options",
    "lower_inference_programs",
    "lower_trainer_programs",
    "resolve_compiler_options",
]
