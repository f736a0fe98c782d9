"""Trainer and inference configs as the one compiled kind: each program a :class:`FunctionConfig`.

A :class:`~aotcheck.programs.config.TrainerConfig` is two functions: the train step aotcheck builds
from its loss and optimizer (the state donated, its shardings from the partition rules), and its eval
step (the loss forward, or the job's own eval function, at the eval batch; none with ``eval_step=None``); an
:class:`~aotcheck.programs.config.InferenceConfig` is one function per method. Each carries its
argument kinds, its names in reports (``params/embed``, ``batch/tokens``), its ``batch`` knob
and the fit search's fields, so everything past :mod:`aotcheck.programs` knows one kind. A
server (:meth:`~aotcheck.programs.serving.ServingConfig.expand`) and MaxText's adapter make the
same kind; :func:`as_functions` is where every config becomes it.

The trainer owns *what* (the step); :mod:`aotcheck.targets` owns *where* (devices, mesh).

Example:
    >>> from aotcheck.models import lm
    >>> [(f.program, f.arg_kinds[1], list(f.knobs)) for f in as_functions(lm.inference_config(lm.TINY))]
    [('prefill', 'batch', ['batch']), ('sample_decode', 'batch', ['batch'])]
    >>> step, evaluate = as_functions(lm.trainer_config(lm.TINY))
    >>> step.program, step.arg_names, step.knobs["batch"].size
    ('train_step', ('', 'batch'), 32)
    >>> evaluate.program, evaluate.arg_kinds, evaluate.fit  # Gated; the train step's search bounds the batch.
    ('eval_step', ('params', 'batch'), None)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

from aotcheck.errors import ConfigError
from aotcheck.programs.config import BatchSpec, Config, FunctionConfig, InferenceConfig, TrainerConfig, _Common
from aotcheck.programs.knob import Knob
from aotcheck.targets.devices import get_devices_for_topology
from aotcheck.targets.mesh import build_mesh
from aotcheck.targets.partition import check_spec, match_partition_specs, named_shardings, with_shardings
from aotcheck.targets.topology import Target

# What a train state holds, by its top-level names: the step counts with the optimizer's state.
TRAIN_STATE_KINDS = {"params": "params", "opt_state": "opt_state", "step": "opt_state"}


def as_functions(config: Config, *, input_batch_spec: BatchSpec | None = None) -> list[FunctionConfig]:
    """The config's programs, each as the one compiled kind (a FunctionConfig is itself).
    ``input_batch_spec``: an inference config's inputs at other shapes than its own."""
    if isinstance(config, TrainerConfig):
        return [_trainer_function(config), *([] if config.eval_step is None else [_eval_function(config)])]
    if isinstance(config, InferenceConfig):
        spec = input_batch_spec if input_batch_spec is not None else config.input_batch_spec
        return [_inference_function(config, method, spec) for method in config.methods]
    if isinstance(config, FunctionConfig):
        return [config]
    raise ConfigError(f"a {type(config).__name__} is not a config: give a TrainerConfig, InferenceConfig or "
                      "FunctionConfig.")


def function_for(config: Config, program: str) -> FunctionConfig:
    """The function config of ``config``'s program ``program`` (its id: ``step[tokens=64]`` for a
    bucket); a ConfigError names the programs it has."""
    functions = as_functions(config)
    for function in functions:
        if function.programs[0] == program:
            return function
    raise ConfigError(f"Program {program!r} is not defined; this config offers "
                      f"{', '.join(f.programs[0] for f in functions)}.")


def abstract_params(config: Any) -> Any:
    """``config.init_fn``'s parameters, traced, never run: a 100B-parameter init costs nothing here."""
    return jax.eval_shape(config.init_fn, jax.ShapeDtypeStruct((2,), jax.numpy.uint32))


def param_shardings(config: Any, params: Any, mesh: jax.sharding.Mesh) -> Any:
    """The parameters' NamedShardings on ``mesh``, by the config's partition rules."""
    specs = match_partition_specs(params, config.partition_rules, axis_sizes=_axis_sizes(mesh))
    return named_shardings(specs, mesh)


def trainer_state_specs(config: TrainerConfig, mesh: jax.sharding.Mesh) -> tuple[Any, Any]:
    """Abstract, sharded train state (``params``, ``opt_state``, ``step``) and batch on ``mesh``.

    Example:
        >>> from aotcheck.models import lm
        >>> mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4])
        >>> state, batch = trainer_state_specs(lm.trainer_config(lm.TINY), mesh)
        >>> sorted(state), batch["tokens"].sharding.spec
        (['opt_state', 'params', 'step'], P('data',))
    """
    params = abstract_params(config)
    params_shardings = param_shardings(config, params, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_state = jax.eval_shape(config.optimizer.init, params)
    # Optimizer moments follow their parameters; counts and the like replicate.
    opt_shardings = optax.tree_map_params(
        config.optimizer,
        lambda _, sharding: sharding,
        opt_state,
        params_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    state = {"params": params, "opt_state": opt_state, "step": jax.ShapeDtypeStruct((), jax.numpy.int32)}
    shardings = {"params": params_shardings, "opt_state": opt_shardings, "step": replicated}
    return with_shardings(state, shardings), batch_args(config.batch_spec, config.batch_partition, mesh)


def make_train_step(config: TrainerConfig) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The train step aotcheck compiles: loss, gradients, one optimizer update."""

    def train_step(state: Any, batch: Any) -> tuple[Any, Any]:
        loss, grads = jax.value_and_grad(config.loss_fn)(state["params"], batch)
        updates, opt_state = config.optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1}
        return new_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    return train_step


def batch_args(batch_spec: BatchSpec, partition: PartitionSpec | None,
               mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """The batch inputs on ``mesh``: by default their leading dimension over the first mesh axis."""
    spec = partition if partition is not None else PartitionSpec(mesh.axis_names[0])
    out = {}
    for name, leaf in batch_spec.items():
        check_spec(f"batch/{name}", leaf.shape, spec, _axis_sizes(mesh))
        out[name] = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))
    return out


def _axis_sizes(mesh: jax.sharding.Mesh) -> dict[str, int]:
    return dict(zip(mesh.axis_names, mesh.devices.shape))


def _common(config: Any) -> dict[str, Any]:
    """The fields every config shares, and the fit search's, as the function's."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(_Common)}
    return {**fields, "fit": config.fit, "fit_upper": config.fit_upper, "fit_targets": config.fit_targets}


def _shardings(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda s: s.sharding, tree)


def _trainer_function(config: TrainerConfig) -> FunctionConfig:
    """The train step: ``(state, batch) -> (state, metrics)``, the state donated, state and batch
    shardings explicit."""

    def make_program(mesh: jax.sharding.Mesh, target: Target) -> tuple[Any, tuple[Any, Any]]:
        state, batch = trainer_state_specs(config, mesh)
        step = jax.jit(make_train_step(config), in_shardings=(_shardings(state), _shardings(batch)),
                       out_shardings=(_shardings(state), NamedSharding(mesh, PartitionSpec())), donate_argnums=(0,))
        return step, (state, batch)

    return FunctionConfig(**_common(config), make_program=make_program, program="train_step",
                          arg_kinds=(TRAIN_STATE_KINDS, "batch"), arg_names=("", "batch"),
                          knobs=_with_batch_knob(config, "batch_spec", method="train_step"))


def make_eval_step(config: TrainerConfig) -> Callable[[Any, Any], Any]:
    """The eval step aotcheck compiles: the config's own, or its loss forward (no gradients, no update)."""
    if config.eval_step != "loss":
        return config.eval_step

    def eval_step(params: Any, batch: Any) -> Any:
        return {"loss": config.loss_fn(params, batch)}

    return eval_step


def _eval_function(config: TrainerConfig) -> FunctionConfig:
    """The eval step: ``(params, batch) -> metrics`` at the eval batch, nothing donated (the train state
    lives on). Gated, never searched: its batch is the eval's, and the train step's search bounds the job."""
    at = config if config.eval_batch_spec is not None else dataclasses.replace(config, eval_batch_spec=config.batch_spec)

    def make_program(mesh: jax.sharding.Mesh, target: Target) -> tuple[Any, tuple[Any, Any]]:
        params = abstract_params(at)
        shardings = param_shardings(at, params, mesh)
        batch = batch_args(at.eval_batch_spec, at.batch_partition, mesh)
        fn = jax.jit(make_eval_step(at), in_shardings=(shardings, _shardings(batch)))
        return fn, (with_shardings(params, shardings), batch)

    return FunctionConfig(**{**_common(at), "fit": None, "fit_upper": None}, make_program=make_program,
                          program="eval_step", arg_kinds=("params", "batch"), arg_names=("params", "batch"),
                          knobs=_with_batch_knob(at, "eval_batch_spec", method="eval_step"))


def _inference_function(config: InferenceConfig, method: str, spec: BatchSpec) -> FunctionConfig:
    """One method: ``(params, batch) -> out``, parameters and batch sharded."""

    def make_program(mesh: jax.sharding.Mesh, target: Target) -> tuple[Any, tuple[Any, Any]]:
        params = abstract_params(config)
        shardings = param_shardings(config, params, mesh)
        batch = batch_args(spec, config.batch_partition, mesh)
        fn = jax.jit(config.methods[method], in_shardings=(shardings, _shardings(batch)))
        return fn, (with_shardings(params, shardings), batch)

    at = dataclasses.replace(config, input_batch_spec=spec) if spec is not config.input_batch_spec else config
    return FunctionConfig(**_common(config), make_program=make_program, program=method,
                          arg_kinds=("params", "batch"), arg_names=("params", "batch"),
                          knobs=_with_batch_knob(at, "input_batch_spec", method=method))


def _with_batch_knob(config: TrainerConfig | InferenceConfig, field: str, *, method: str) -> dict:
    """The config's knobs with ``batch`` first: the batch inputs' shared leading size, the function
    rebuilt at another, stepped by the devices the batch is split over on a target. No ``batch`` knob
    where the inputs share no leading size (a search then names the knobs offered)."""
    spec: BatchSpec = getattr(config, field)
    sizes = {leaf.shape[0] for leaf in spec.values() if leaf.shape}
    if len(sizes) != 1 or "batch" in config.knobs:
        return {**config.knobs}

    def rebuild(size: int) -> FunctionConfig:
        at = dataclasses.replace(config, **{field: {
            k: jax.ShapeDtypeStruct((size, *leaf.shape[1:]), leaf.dtype) for k, leaf in spec.items()}})
        return next(f for f in as_functions(at) if f.program == method)

    def step_on(target: Target) -> int:
        devices, _ = get_devices_for_topology(target.topology, target.num_slices)
        mesh = build_mesh(config.mesh, target.topology, devices, num_slices=target.num_slices)
        partition = config.batch_partition
        first = partition[0] if partition is not None and len(partition) else mesh.axis_names[0]
        axes = first if isinstance(first, tuple) else (first,) if first is not None else ()
        return math.prod(_axis_sizes(mesh)[a] for a in axes)

    return {"batch": Knob(sizes.pop(), rebuild, step_on=step_on), **config.knobs}

