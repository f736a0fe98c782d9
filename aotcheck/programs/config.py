"""What a registered config declares: a trainer, an inference model, or any function.

Configs are plain frozen dataclasses. They describe programs abstractly (init
functions are only ever traced through :func:`jax.eval_shape`), so building one
is cheap and never touches a device.

Example:
    >>> from aotcheck.models import lm
    >>> lm.trainer_config(lm.TINY).programs, lm.inference_config(lm.TINY).programs
    (('train_step',), ('prefill', 'sample_decode'))
    >>> TrainerConfig(lm.TINY)
    Traceback (most recent call last):
    ...
    TypeError: TrainerConfig.__init__() takes 1 positional argument but 2 were given
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
from jax.sharding import PartitionSpec

from aotcheck.programs.options import parse_libtpu_init_args
from aotcheck.targets.mesh import MeshSpec
from aotcheck.targets.partition import Rules

BatchSpec = Mapping[str, jax.ShapeDtypeStruct]


class Knob(NamedTuple):
    """A size a fit search may move: its configured value, the config rebuilt at another, its step.

    Example:
        >>> from aotcheck.models import lm
        >>> import dataclasses
        >>> seq = Knob(128, lambda n: lm.trainer_config(dataclasses.replace(lm.TINY, seq_len=n)), step=128)
        >>> seq.rebuild(256).batch_spec["tokens"].shape
        (32, 256)
    """

    size: int
    rebuild: Callable[[int], Any]
    step: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Common:
    """Where and how any config compiles (fields shared by every config kind).

    Attributes:
        mesh: Mesh axes, shape and per-topology overrides.
        compiler_options: XLA options for this config, over aotcheck's presets.
        libtpu_init_args: The job's ``LIBTPU_INIT_ARGS`` string, as its launch script sets it
            (``"--xla_tpu_scoped_vmem_limit_kib=98304 ..."``); parsed as libtpu parses it,
            runtime-only flags dropped. ``compiler_options`` win over it.
        min_devices: Smallest total device count the config supports; smaller
            targets are skipped with that reason.
        trace_in_mesh: Trace under the target's abstract mesh, so bare
            PartitionSpecs in sharding constraints resolve. Turn it off for code that
            keeps arrays it computed while tracing (Equinox's rotary tables): made under
            one target's mesh, they would break the next target's trace in the process.
    """

    mesh: MeshSpec = MeshSpec()
    compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    libtpu_init_args: str = ""
    min_devices: int = 1
    trace_in_mesh: bool = True

    def __post_init__(self) -> None:
        parse_libtpu_init_args(self.libtpu_init_args, what="libtpu_init_args")  # Bad flags fail at build time.

    @property
    def options(self) -> dict[str, Any]:
        """The config's own compiler options: its launch flags, then ``compiler_options`` over them."""
        return {**parse_libtpu_init_args(self.libtpu_init_args, what="libtpu_init_args"), **self.compiler_options}


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Model(_Common):
    """A model with abstract parameters sharded by partition rules.

    Attributes:
        init_fn: ``rng -> params``; only traced (``jax.eval_shape``), never run.
        partition_rules: ``(regex over parameter paths, PartitionSpec)`` pairs or callables
            ``(path, shape, axis_sizes) -> PartitionSpec | None`` such as :func:`aotcheck.fsdp`;
            the first that decides a parameter wins (see :mod:`aotcheck.targets.partition`).
        batch_partition: PartitionSpec of every batch input; by default the
            leading dimension over the first mesh axis.
        fit: Search the largest size of this knob that fits HBM (``"batch"``, or a
            name in ``knobs``) on every case, as the gated figure ``fit_max_batch``
            (a few compiles each; see :mod:`aotcheck.figures.fit`); over the gate's ``--aot-fit``. None: no search.
        knobs: Other sizes a fit search may move, by name (sequence length, KV-cache
            length, ...): each a :class:`Knob` that rebuilds the config at a size.
        fit_upper: The largest size the fit search tries (None: 4096 x the configured
            size). A small model's real limit can be far away, where compiles are slow.
        fit_targets: Globs over the targets (``v5e-16x1``, ``v4-8x*``; one glob alone is
            taken as a tuple of one) where the gate runs the search, the config's ``fit`` or
            the gate's ``--aot-fit`` alike: each costs compiles, and one target per chip can be
            enough. ``aotcheck fit`` runs anywhere.
    """

    init_fn: Callable[[jax.Array], Any]
    partition_rules: Rules
    batch_partition: PartitionSpec | None = None
    fit: str | None = None
    knobs: Mapping[str, "Knob"] = dataclasses.field(default_factory=dict)
    fit_upper: int | None = None
    fit_targets: tuple[str, ...] = ("*",)

    def __post_init__(self) -> None:
        super().__post_init__()
        # One glob alone is a tuple of one: iterating "*x1" by character would match every target.
        if isinstance(self.fit_targets, str):
            object.__setattr__(self, "fit_targets", (self.fit_targets,))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig(_Model):
    """A training step: ``(state, batch) -> (state, metrics)`` with an optax optimizer.

    Besides the fields of every model config (``init_fn``, ``partition_rules``,
    ``batch_partition``, ``mesh``, ``compiler_options``, ``min_devices``):

    Attributes:
        loss_fn: ``(params, batch) -> scalar loss``.
        optimizer: The optax transformation whose state the train step carries;
            its moments follow their parameters' shardings.
        batch_spec: Global batch shapes and dtypes, by input name.
    """

    loss_fn: Callable[[Any, Mapping[str, jax.Array]], jax.Array]
    optimizer: Any
    batch_spec: BatchSpec

    programs = ("train_step",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class InferenceConfig(_Model):
    """A model served by one or more methods, e.g. ``prefill`` and ``sample_decode``.

    Besides the fields of every model config:

    Attributes:
        methods: ``name -> fn(params, batch)``; each compiles to one program.
        input_batch_spec: Default global input shapes, by input name.
    """

    methods: Mapping[str, Callable[[Any, Mapping[str, jax.Array]], Any]]
    input_batch_spec: BatchSpec

    @property
    def programs(self) -> tuple[str, ...]:
        return tuple(self.methods)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FunctionConfig(_Common):
    """The escape hatch: any function and the abstract, sharded arguments it takes.

    Besides ``mesh``, ``compiler_options`` and ``min_devices``:

    Attributes:
        fn: The function (jitted or not) to compile.
        make_args: ``mesh -> args``: ShapeDtypeStructs carrying NamedShardings on
            that mesh (or any pytree of them).
        program: The program's name in reports and golden files.
        donate_argnums: Arguments whose buffers the program may reuse.
    """

    fn: Callable[..., Any]
    make_args: Callable[[jax.sharding.Mesh], Sequence[Any]]
    program: str = "step"
    donate_argnums: tuple[int, ...] = ()

    @property
    def programs(self) -> tuple[str, ...]:
        return (self.program,)


Config = TrainerConfig | InferenceConfig | FunctionConfig
