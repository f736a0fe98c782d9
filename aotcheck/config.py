"""What a registered config declares: a trainer, an inference model, or any function.

Configs are plain frozen dataclasses. They describe programs abstractly (init
functions are only ever traced through :func:`jax.eval_shape`), so building one
is cheap and never touches a device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from aotcheck.mesh import MeshSpec
from aotcheck.partition import Rules

BatchSpec = Mapping[str, jax.ShapeDtypeStruct]


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """A training step: ``(state, batch) -> (state, metrics)`` with an optax optimizer.

    Attributes:
        init_fn: ``rng -> params``; only traced (``jax.eval_shape``), never run.
        loss_fn: ``(params, batch) -> scalar loss``.
        optimizer: The optax transformation whose state the train step carries.
        batch_spec: Global batch shapes and dtypes, by input name.
        partition_rules: ``(regex over parameter paths, PartitionSpec)`` pairs.
            The optimizer state follows its parameters.
        mesh: Mesh axes, shape and per-topology overrides.
        batch_partition: PartitionSpec of every batch input; by default the
            leading dimension over the first mesh axis.
        compiler_options: XLA options for this config, over aotcheck's defaults.
        min_devices: Smallest total device count the config supports; smaller
            targets are skipped with that reason.
    """

    init_fn: Callable[[jax.Array], Any]
    loss_fn: Callable[[Any, Mapping[str, jax.Array]], jax.Array]
    optimizer: Any
    batch_spec: BatchSpec
    partition_rules: Rules
    mesh: MeshSpec = MeshSpec()
    batch_partition: PartitionSpec | None = None
    compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    min_devices: int = 1

    programs = ("train_step",)


@dataclasses.dataclass(frozen=True)
class InferenceConfig:
    """A model served by one or more methods, e.g. ``prefill`` and ``sample_decode``.

    Attributes:
        init_fn: ``rng -> params``; only traced.
        methods: ``name -> fn(params, batch)``; each compiles to one program.
        input_batch_spec: Default global input shapes, by input name.
        partition_rules: ``(regex over parameter paths, PartitionSpec)`` pairs.
        mesh: Mesh axes, shape and per-topology overrides.
        batch_partition: PartitionSpec of every input; by default the leading
            dimension over the first mesh axis.
        compiler_options: XLA options for this config, over aotcheck's defaults.
        min_devices: Smallest total device count the config supports.
    """

    init_fn: Callable[[jax.Array], Any]
    methods: Mapping[str, Callable[[Any, Mapping[str, jax.Array]], Any]]
    input_batch_spec: BatchSpec
    partition_rules: Rules
    mesh: MeshSpec = MeshSpec()
    batch_partition: PartitionSpec | None = None
    compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    min_devices: int = 1

    @property
    def programs(self) -> tuple[str, ...]:
        return tuple(self.methods)


@dataclasses.dataclass(frozen=True)
class FunctionConfig:
    """The escape hatch: any function and the abstract, sharded arguments it takes.

    Attributes:
        fn: The function (jitted or not) to compile.
        make_args: ``mesh -> args``: ShapeDtypeStructs carrying NamedShardings on
            that mesh (or any pytree of them).
        program: The program's name in reports and golden files.
        mesh: Mesh axes, shape and per-topology overrides.
        donate_argnums: Arguments whose buffers the program may reuse.
        compiler_options: XLA options over aotcheck's defaults.
        min_devices: Smallest total device count the config supports.
    """

    fn: Callable[..., Any]
    make_args: Callable[[jax.sharding.Mesh], Sequence[Any]]
    program: str = "step"
    mesh: MeshSpec = MeshSpec()
    donate_argnums: tuple[int, ...] = ()
    compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    min_devices: int = 1

    @property
    def programs(self) -> tuple[str, ...]:
        return (self.program,)


Config = TrainerConfig | InferenceConfig | FunctionConfig
