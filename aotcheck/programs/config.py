"""What a registered config declares: a trainer, an inference model, or any function.

Configs are plain frozen dataclasses. They describe programs abstractly (init
functions are only ever traced through :func:`jax.eval_shape`), so building one
is cheap and never touches a device.

Example:
    >>> from aotcheck.models import lm
    >>> lm.trainer_config(lm.TINY).programs, lm.inference_config(lm.TINY).programs
    (('train_step', 'eval_step'), ('prefill', 'sample_decode'))
    >>> lm.trainer_config(lm.TINY, eval_step=None).programs
    ('train_step',)
    >>> TrainerConfig(lm.TINY)
    Traceback (most recent call last):
    ...
    TypeError: TrainerConfig.__init__() takes 1 positional argument but 2 were given
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from aotcheck.errors import ConfigError
from aotcheck.programs.knob import Knob, check_callable, check_knobs
from aotcheck.programs.names import Bucket, program_id
from aotcheck.programs.options import parse_libtpu_init_args
from aotcheck.targets import platform as platforms
from aotcheck.targets.mesh import MeshSpec
from aotcheck.targets.partition import Rules
from aotcheck.targets.globs import unmatched_globs
from aotcheck.targets.topology import closest_name

BatchSpec = Mapping[str, jax.ShapeDtypeStruct]

PLATFORMS = tuple(platforms.PLATFORMS)
"""The platforms a config may name (:attr:`_Common.platforms`)."""

ARGUMENT_KINDS = ("params", "opt_state", "batch", "kv_cache", "other")
"""What an argument of a program holds (:attr:`FunctionConfig.arg_kinds`, ``Argument.kind``)."""


def _check_globs(field: str, globs: Sequence[str]) -> None:
    """ConfigError naming a glob of ``field`` that no target matches (the config would be skipped, or
    searched, nowhere), with the nearest target name."""
    for glob in unmatched_globs(globs):
        near = closest_name(glob)
        raise ConfigError(f"{field}={tuple(globs)!r}: {glob!r} names no target (a target is TOPOLOGYxSLICES, e.g. "
                          "v5e-1x1; a topology alone, v5e-1, means each of its slices; globs such as 7x-8x* and v5e-* "
                          "work too)" + (f"; did you mean {near!r}?" if near else "."))

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
        platforms: The platforms (``"tpu"``, ``"gpu"``, ``"cpu"``) whose targets the config
            compiles for (empty: all): a model running Pallas TPU kernels says ``("tpu",)``, and
            other targets are skipped with that reason.
        targets: The targets the config is deployed on, as names or globs (``v5e-1x1``, ``7x-8x*``; one
            alone is taken as a tuple of one): a server sized for one slice says so, and the run's
            other targets are skipped with that reason. A full name (``v5e-1x1``, not ``v5e-1``) is also
            compiled when the run does not list it, and the run's header says so.
        memory_fraction: The share of a GPU's memory the served process runs with, where its launch sets
            one (its ``XLA_PYTHON_CLIENT_MEM_FRACTION``): a server's boot budget holds against it, over the
            ini's ``aot_memory_fraction`` and the environment. None: those, else JAX's default, 0.75.
        trace_in_mesh: Trace under the target's abstract mesh, so bare
            PartitionSpecs in sharding constraints resolve. Turn it off for code that
            keeps arrays it computed while tracing (Equinox's rotary tables): made under
            one target's mesh, they would break the next target's trace in the process.
        trace_as_target: While the program is traced and lowered, ``jax.devices()``,
            ``jax.local_devices()``, the device counts and ``jax.default_backend()`` answer with the
            target's (deviceless) devices, not this host's: a kernel that picks its block sizes from
            ``jax.devices()[0].device_kind`` (jax's ragged paged attention), or model code that takes
            its TPU path only on a TPU backend, traces as it would on the target. What runs eagerly
            while tracing still runs on this host.
        settings: What the config was built with that a person tunes and the code may never read
            (MaxText's overrides, a tile size, a remat policy), by name: recorded in each golden with the
            knobs' sizes and a digest of the lowered module, so that a setting that changed while the
            program did not is said ("changed, and the program did not").
    """

    mesh: MeshSpec = MeshSpec()
    compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    libtpu_init_args: str = ""
    min_devices: int = 1
    platforms: tuple[str, ...] = ()
    targets: tuple[str, ...] = ("*",)
    memory_fraction: float | None = None
    trace_in_mesh: bool = True
    trace_as_target: bool = True
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.settings, Mapping) or not all(isinstance(k, str) for k in self.settings):
            raise ConfigError(f"settings={self.settings!r}: give what the config was built with by name, e.g. "
                              "settings={'remat_policy': 'full'}.")
        parse_libtpu_init_args(self.libtpu_init_args, what="libtpu_init_args")  # Bad flags fail at build time.
        if isinstance(self.platforms, str) or any(p not in PLATFORMS for p in self.platforms):
            raise ConfigError(f"platforms={self.platforms!r}: give a tuple of {', '.join(map(repr, PLATFORMS))}, "
                              f"e.g. platforms=('tpu',)")
        if isinstance(self.targets, str):  # One glob alone: iterating "v5e-1x1" by character would match anything.
            object.__setattr__(self, "targets", (self.targets,))
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise ConfigError(f"targets={self.targets!r}: give globs over target names, e.g. targets=('v5e-1x1',) "
                              "or targets=('7x-8x*',); ('*',), the default, is every target.")
        _check_globs("targets", self.targets)
        fraction = self.memory_fraction
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                     or not 0 < fraction <= 1):
            raise ConfigError(f"memory_fraction={fraction!r}: give the share of a GPU's memory the process runs with, "
                              "a number in (0, 1] (its XLA_PYTHON_CLIENT_MEM_FRACTION), e.g. memory_fraction=0.9; "
                              "None for the ini's aot_memory_fraction, the environment's, or JAX's default 0.75.")
        for name in ("trace_in_mesh", "trace_as_target"):  # "no" is true to Python: a switch given as words is refused.
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{type(self).__name__}.{name}={getattr(self, name)!r} is not a bool; give "
                                  f"{name}=True or {name}=False.")

    @property
    def options(self) -> dict[str, Any]:
        """The config's own compiler options: its launch flags, then ``compiler_options`` over them."""
        return {**parse_libtpu_init_args(self.libtpu_init_args, what="libtpu_init_args"), **self.compiler_options}


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Bounded(_Common):
    """Where a fit search runs and how far it goes (fields of every config that has one).

    Attributes:
        fit_upper: The largest size the fit search tries (None: 4096 x the configured
            size). A small model's real limit can be far away, where compiles are slow.
        fit_targets: Globs over the targets (``v5e-16x1``, ``v4-8x*``; one glob alone is
            taken as a tuple of one) where the gate runs the search, the config's ``fit`` or
            the gate's ``--aot-fit`` alike: each costs compiles, and one target per chip can be
            enough. ``aotcheck fit`` runs anywhere.
    """

    fit_upper: int | None = None
    fit_targets: tuple[str, ...] = ("*",)

    def __post_init__(self) -> None:
        super().__post_init__()
        # One glob alone is a tuple of one: iterating "*x1" by character would match every target.
        if isinstance(self.fit_targets, str):
            object.__setattr__(self, "fit_targets", (self.fit_targets,))
        _check_globs("fit_targets", self.fit_targets)

    def _searched(self) -> tuple[str, int | None]:
        """The knob a fit search moves (what ``fit_upper`` caps) and its configured size, when known."""
        return "batch", None

    def _check_fit_upper(self) -> None:
        """ConfigError for a ``fit_upper`` the search would misread: 0 (read as no cap: a search of
        minutes), a negative one, or one below the configured size of the knob searched (the search
        would stop at once, saying the configured size is the largest that fits)."""
        upper, field = self.fit_upper, f"{type(self).__name__}.fit_upper"
        if upper is None:
            return
        knob, size = self._searched()
        example = f"fit_upper={8 * size}" if size else "fit_upper=256"
        default = "or None for the default (4096 x the configured size)"
        if isinstance(upper, bool) or not isinstance(upper, int):
            raise ConfigError(f"{field}={upper!r} is not a size; give the largest {knob} the fit search may try as "
                              f"an int, e.g. {example}, {default}.")
        if upper < 1:
            why = "0 would be read as no cap at all, a search of minutes" if upper == 0 else \
                f"a negative cap would stop the search at once, reporting the configured {knob}"
            raise ConfigError(f"{field}={upper}: the fit search's cap must be a size >= 1 ({why}); give the largest "
                              f"{knob} to try, e.g. {example}, {default}.")
        if size and upper < size:
            raise ConfigError(f"{field}={upper} is below the configured {knob} ({size}): the search would stop at "
                              f"once and report {size} as the largest that fits. Give a cap >= {size}, e.g. "
                              f"{example}, {default}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Searchable(_Bounded):
    """The sizes a fit search may move on a config (fields every config kind shares), and where it runs.

    Attributes:
        fit: Search the largest size of this knob that fits HBM (``"batch"``, or a
            name in ``knobs``) on every case, as the gated figure ``fit_max_<knob>``
            (a few compiles each; see :mod:`aotcheck.figures.fit`); over the gate's ``--aot-fit``. None: no search.
        knobs: Other sizes a fit search may move, by name (sequence length, KV-cache
            length, a per-device batch, ...): each a :class:`Knob` that rebuilds the config at a size.

    and ``fit_upper``, ``fit_targets`` (:class:`_Bounded`).
    """

    fit: str | None = None
    knobs: Mapping[str, "Knob"] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_knobs(self.knobs, f"{type(self).__name__}.knobs")
        self._check_fit_upper()

    def _searched(self) -> tuple[str, int | None]:
        knob = self.fit or "batch"
        return knob, self._configured_size(knob)

    def _configured_size(self, knob: str) -> int | None:
        """The configured size of ``knob`` (a knob of ``knobs`` by that name, ``batch`` included: a
        function's batch is one; else the batch inputs' shared leading size), when it is known here."""
        own = self.knobs.get(knob) if isinstance(self.knobs, Mapping) else None
        if own is not None or knob != "batch":
            return own.size if isinstance(own, Knob) and isinstance(own.size, int) else None
        spec = getattr(self, "batch_spec", None) or getattr(self, "input_batch_spec", None)
        sizes = {leaf.shape[0] for leaf in spec.values() if getattr(leaf, "shape", None)} \
            if isinstance(spec, Mapping) else set()
        return sizes.pop() if len(sizes) == 1 and isinstance(next(iter(sizes)), int) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Model(_Searchable):
    """A model with abstract parameters sharded by partition rules.

    Attributes:
        init_fn: ``rng -> params``; only traced (``jax.eval_shape``), never run.
        partition_rules: ``(regex over parameter paths, PartitionSpec)`` pairs or callables
            ``(path, shape, axis_sizes) -> PartitionSpec | None`` such as :func:`aotcheck.fsdp`;
            the first that decides a parameter wins (see :mod:`aotcheck.targets.partition`).
        batch_partition: PartitionSpec of every batch input; by default the
            leading dimension over the first mesh axis.

    and the fit search's fields (``fit``, ``knobs``, ``fit_upper``, ``fit_targets``).
    """

    init_fn: Callable[[jax.Array], Any]
    partition_rules: Rules
    batch_partition: PartitionSpec | None = None


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
        eval_step: The eval step, compiled and gated as a second program (``eval_step``): ``"loss"``
            (the default) is ``loss_fn`` forward, no gradients, no optimizer; a function
            ``(params, batch) -> metrics`` is the job's own (one that runs its kernels in f32, say,
            as an eval often does); None: no eval step (the run's header says so once).
            A job whose first eval fails to compile fails hours in; this compiles it before launch.
        eval_batch_spec: The eval batch's global shapes and dtypes (None: ``batch_spec``).
    """

    loss_fn: Callable[[Any, Mapping[str, jax.Array]], jax.Array]
    optimizer: Any
    batch_spec: BatchSpec
    eval_step: Callable[[Any, Mapping[str, jax.Array]], Any] | str | None = "loss"
    eval_batch_spec: BatchSpec | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_step is not None and self.eval_step != "loss":
            check_callable("TrainerConfig.eval_step", self.eval_step, forms=[("params", "batch")],
                            gives="metrics (or 'loss': loss_fn forward; None: no eval step)")
        if self.eval_batch_spec is not None and not isinstance(self.eval_batch_spec, Mapping):
            raise ConfigError(f"TrainerConfig.eval_batch_spec={self.eval_batch_spec!r}: give the eval batch's "
                              "ShapeDtypeStructs by input name, as batch_spec, or None for batch_spec.")

    @property
    def programs(self) -> tuple[str, ...]:
        """``train_step``, then ``eval_step`` unless ``eval_step=None``."""
        return ("train_step",) if self.eval_step is None else ("train_step", "eval_step")


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
class FunctionConfig(_Searchable):
    """The escape hatch: any function and the abstract, sharded arguments it takes.

    Give either ``fn`` and ``make_args`` (a function fixed up front, its arguments made per target),
    or ``make_program``, for a step that owns its mesh: its jit's shardings and donation depend on
    the target, so the function itself is made per target (MaxText's train step, built by
    :mod:`aotcheck.adapters.maxtext`, is one).

    Besides ``mesh``, ``compiler_options``, ``min_devices`` and the fit search's fields (``fit``,
    ``knobs``, ``fit_upper``, ``fit_targets``: a function has no batch aotcheck can move, so a search
    names a knob of ``knobs``):

    Attributes:
        fn: The function (jitted or not) to compile.
        make_args: ``mesh -> args`` or ``(mesh, target) -> args``: ShapeDtypeStructs carrying
            NamedShardings on that mesh (or any pytree of them). ``target`` is the
            :class:`~aotcheck.targets.topology.Target` compiled for (its ``topology.name``,
            ``num_slices``, ``num_devices``).
        make_program: ``(mesh, target) -> (fn, args)``: the function to compile (jitted with its
            own shardings and donation, or anything with a ``.lower(*args)``) and its abstract
            arguments, made for ``target``. ``mesh`` is aotcheck's mesh over the target's devices
            (``mesh.devices``), which the step may rearrange into its own; such a step usually
            wants ``trace_in_mesh=False``, so it traces under its own mesh, not aotcheck's.
        program: The program's name in reports and golden files.
        donate_argnums: Arguments whose buffers the program may reuse (``fn`` not jitted).
        arg_kinds: What each positional argument of ``fn`` holds, in order: one of
            ``ARGUMENT_KINDS`` per argument, or for an argument that mixes them a pytree
            prefix of it whose leaves are kinds (``{"params": "params", "opt_state":
            "opt_state", "rng": "other"}``, as jit's ``in_shardings`` are). The peak's split
            counts ``params`` and ``opt_state`` as ``peak_params_bytes`` and
            ``peak_opt_state_bytes``, ``kv_cache`` (a server's KV pool) as ``peak_kv_cache_bytes``,
            ``batch`` and ``other`` as ``peak_batch_bytes``
            (``peak_other_bytes`` is XLA's padding and fragmentation, never an input's); only
            ``batch`` inputs are checked by the sharding lint (a leading dimension split over
            devices is a batch's). None (the default): inferred per argument: an optax
            state (a NamedTuple whose class optax defines, or a tuple or list of them, as
            ``optax.chain`` makes) is ``opt_state``; a train state (a dict with keys, or an
            object with pytree attributes, named both ``params`` and ``opt_state``, as
            ``{"params": ..., "opt_state": ..., "step": ...}`` or flax's ``TrainState``) has its
            ``params`` as ``params`` and the rest (``opt_state``, the step) as ``opt_state``,
            as a ``TrainerConfig``'s state; every other argument is ``batch``.
        arg_names: What each positional argument is called in argument paths (``params/embed``);
            ``""`` names an argument's entries by their own names (a train state's ``params/...``,
            ``opt_state/...``). None: ``args[0]``, ``args[1]``, ...
        bucket: The serving bucket the program is compiled at (``{"tokens": 64}``), a value its case
            carries and its id shows (``step[tokens=64]``); empty for a program that is not a bucket.
        run_inputs: For a run on a chip (``aotcheck calibrate``): ``zeros -> args``, given the arguments
            as zeros (arrays on the chip, in ``make_args``'s structure), the arguments to run on, with
            any a kernel must not see as zeros replaced by valid ones (numpy arrays or jax arrays) (a paged attention's sequence metadata: on
            zeros, jax's ragged paged attention kernel halts the chip). None: zeros. Never compiled.

    Example (a step made per target; the number of devices sizes its batch):
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> def make_program(mesh, target):
        ...     x = jax.ShapeDtypeStruct((2 * target.num_devices, 8), "float32", sharding=NamedSharding(mesh, P("data")))
        ...     return jax.jit(lambda x: x * 2, donate_argnums=0), (x,)
        >>> from aotcheck.programs.lowering import lower_config
        >>> from aotcheck.targets.topology import Target
        >>> lowered = lower_config(FunctionConfig(make_program=make_program), Target.of("cpu-4"))
        >>> lowered["step"].args_info[0][0].shape
        (8, 8)

    Example (a train step ``(params, opt_state, batch)``; a kind is checked when the config is built):
        >>> step = FunctionConfig(fn=lambda p, o, b: p, make_args=lambda mesh: (),
        ...                       arg_kinds=("params", "opt_state", "batch"))
        >>> FunctionConfig(fn=step.fn, make_args=step.make_args, arg_kinds=("params", "optimizer", "batch"))
        Traceback (most recent call last):
        ...
        aotcheck.errors.ConfigError: FunctionConfig.arg_kinds[1]: 'optimizer' is not an argument kind; ...
    """

    fn: Callable[..., Any] | None = None
    make_args: Callable[..., Sequence[Any]] | None = None
    make_program: Callable[[jax.sharding.Mesh, Any], tuple[Callable[..., Any], Sequence[Any]]] | None = None
    program: str = "step"
    donate_argnums: tuple[int, ...] = ()
    arg_kinds: Sequence[Any] | None = None
    arg_names: tuple[str, ...] | None = None
    bucket: Mapping[str, int] = dataclasses.field(default_factory=Bucket)
    run_inputs: Callable[[tuple[Any, ...]], Sequence[Any]] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_program()
        object.__setattr__(self, "bucket", Bucket(self.bucket))  # A value: hashed with its case.
        if self.arg_names is not None and (isinstance(self.arg_names, str) or not all(
                isinstance(n, str) for n in self.arg_names)):
            raise ConfigError(f"FunctionConfig.arg_names={self.arg_names!r}: give one name per positional argument, "
                              "e.g. arg_names=(\"params\", \"batch\") (\"\" shows an argument's entries by their own names).")
        if self.arg_names is not None:
            object.__setattr__(self, "arg_names", tuple(self.arg_names))
        if self.arg_kinds is None:
            return
        if isinstance(self.arg_kinds, str) or not isinstance(self.arg_kinds, Sequence):
            raise ConfigError(
                f"FunctionConfig.arg_kinds is {self.arg_kinds!r}; give a sequence of one kind per positional "
                f"argument of fn, in order, e.g. arg_kinds=(\"params\", \"opt_state\", \"batch\") "
                f"(kinds: {', '.join(ARGUMENT_KINDS)}).")
        object.__setattr__(self, "arg_kinds", tuple(self.arg_kinds))
        for position, entry in enumerate(self.arg_kinds):
            leaves = jax.tree_util.tree_leaves(entry)
            if not leaves:
                raise ConfigError(
                    f"FunctionConfig.arg_kinds[{position}] is {entry!r}, which names no kind; give one of "
                    f"{', '.join(ARGUMENT_KINDS)}, or a pytree prefix of argument {position} whose leaves are kinds.")
            for leaf in leaves:
                if not isinstance(leaf, str) or leaf not in ARGUMENT_KINDS:
                    close = difflib.get_close_matches(str(leaf), ARGUMENT_KINDS, n=1)
                    raise ConfigError(
                        f"FunctionConfig.arg_kinds[{position}]: {leaf!r} is not an argument kind; use one of "
                        f"{', '.join(ARGUMENT_KINDS)}" + (f" (did you mean {close[0]!r}?)" if close else "") + ".")

    def _check_program(self) -> None:
        """ConfigError unless the program is given one way: ``make_program``, or ``fn`` with ``make_args``."""
        given = [name for name in ("fn", "make_args", "make_program") if getattr(self, name) is not None]
        if given == ["fn", "make_args"]:
            check_callable("FunctionConfig.make_args", self.make_args, forms=[("mesh",), ("mesh", "target")],
                            gives="its abstract arguments")
            return
        if given == ["make_program"]:
            check_callable("FunctionConfig.make_program", self.make_program, forms=[("mesh", "target")],
                            gives="(fn, args)")
            return
        how = ("give fn=<the function> and make_args=<mesh -> its abstract arguments>, or make_program="
               "<(mesh, target) -> (fn, args)> for a step whose jit is built per target")
        if "make_program" in given:
            raise ConfigError(f"FunctionConfig got make_program and {' and '.join(given[:-1])}: make_program makes "
                              f"the function and its arguments itself; {how}.")
        raise ConfigError(f"FunctionConfig got {' and '.join(given) or 'neither fn nor make_program'}: {how}.")

    @property
    def programs(self) -> tuple[str, ...]:
        """Its program's id: the name, with its bucket where it is one (``step[tokens=64]``)."""
        return (program_id(self.program, self.bucket),)


Config = TrainerConfig | InferenceConfig | FunctionConfig

