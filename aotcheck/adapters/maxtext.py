"""MaxText's own train step, built as its ``train_compile`` builds it, for every target aotcheck asks for.

MaxText (``pip install 'aotcheck[maxtext]'``) owns its mesh, its logical axis rules, its parameter
and zero-1 optimizer shardings, its donation, its PRNG and its launch flags; this adapter asks
MaxText for each of them, target by target, and hands aotcheck the jitted step and its abstract
arguments through :attr:`FunctionConfig.make_program <aotcheck.programs.config.FunctionConfig>`::

    from aotcheck.adapters import maxtext
    aotcheck.register("llama-small", lambda: maxtext.adapt("configs/base.yml", per_device_batch_size=2,
                                                           base_num_decoder_layers=4).trainer())

What ``train_compile`` does and this adapter does the same way, per target (MaxText 0.2.5):

- its config from ``pyconfig.initialize`` with ``compile_topology`` and ``compile_topology_num_slices``
  set from the target (a topology MaxText does not know is refused by MaxText, by name);
- its mesh (``maxtext_utils.create_device_mesh`` over the target's devices, its axis names and
  types, ``jax_remove_size_one_mesh_axis_from_type`` as its config says);
- its shaped state and batch (``get_shaped_inputs``), zero-1 shardings, data sharding and the
  functional train step with its in/out shardings and donation, lowered under its mesh and logical
  axis rules;
- its PRNG (``jax_default_prng_impl=unsafe_rbg``) and launch flag
  (``--xla_tpu_spmd_rng_bit_generator_unsafe=true``, with the config's ``compile_xla_flags``) as the
  case's compiler options.

The jax flags MaxText sets are set only while the step is made and lowered, then put back, so no
other case (and no later target of this one) sees them. MaxText's config setup turns on JAX's
persistent compilation cache: aotcheck never compiles with it (see ``no_persistent_cache``). MaxText
prints on stdout while it is imported and its config is read: held back here (shown on stderr with an
error), so ``aotcheck compile --json`` keeps stdout for its JSON; its log warnings there (about running
a job: no output directory) are off.

The state's ``model`` is classed as parameters and its ``optimizer`` (moments and step) as optimizer
state in the peak's split; the batch as batch. Any integer override can be a knob of the fit search
(``knobs=("per_device_batch_size",)``, the default), so ``aotcheck fit`` searches MaxText's per-device
batch, and ``.trainer(fit="per_device_batch_size")`` gates it as ``fit_max_per_device_batch_size``.

The program is ``train_compile``'s; the compiler options are MaxText's flags over aotcheck's per-chip
presets, as for every config, unless the presets are off (``aot_default_options = none``: then
exactly what ``train_compile`` sends, and its memory figures to the byte).

Example (no MaxText needed to describe a config; it is imported when a program is made):
    >>> import pathlib, tempfile
    >>> base = pathlib.Path(tempfile.mkdtemp(), "base.yml")
    >>> _ = base.write_text("per_device_batch_size: 12.0")
    >>> adapted = adapt(base, per_device_batch_size=2, base_num_decoder_layers=2)
    >>> adapted.argv("v5e-16", 1)[2:4], adapted.argv("7x-8", 2)[2:4]
    (['compile_topology=v5e-16', 'compile_topology_num_slices=1'], ['compile_topology=tpu7x-8', 'compile_topology_num_slices=2'])
    >>> config, = adapted.trainer(fit="per_device_batch_size")  # No eval: MaxText's eval_interval is -1 by default.
    >>> config.program, config.fit, config.knobs["per_device_batch_size"].size
    ('train_step', 'per_device_batch_size', 2)
    >>> config.knobs["per_device_batch_size"].rebuild(8).make_program.__self__.overrides
    (('per_device_batch_size', 8), ('base_num_decoder_layers', 2))
    >>> [c.program for c in adapt(base, eval_interval=100, per_device_batch_size=2).trainer()]
    ['train_step', 'eval_step']
    >>> adapted.trainer(knobs=("base_emb_dim",))
    Traceback (most recent call last):
    ...
    aotcheck.adapters.base.AdapterError: MaxText knob 'base_emb_dim' is not an integer override of this config; ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax

from aotcheck.adapters.base import AdapterError, require
from aotcheck.programs.config import FunctionConfig
from aotcheck.programs.knob import Knob
from aotcheck.targets.platform import TPU
from aotcheck.targets.topology import parse_topology

RNG_FLAG = "--xla_tpu_spmd_rng_bit_generator_unsafe=true"
"""The launch flag MaxText's ``train_compile`` adds to ``LIBTPU_INIT_ARGS`` for its unsafe RBG PRNG."""

_COMPILER_ENVIRON = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")

STATE_KINDS = {"model": "params", "optimizer": "opt_state"}
"""How the train state's top entries count in the peak's split (an NNX ``TrainStateNNX``)."""


def adapt(config_file: str | os.PathLike[str], /, **overrides: Any) -> "MaxText":
    """MaxText's config file (``base.yml`` or one of its model configs) with ``key=value`` overrides,
    as ``train_compile <config_file> key=value ...`` takes them (``compile_topology`` and
    ``compile_topology_num_slices`` come from each target)."""
    if not os.path.isfile(config_file):
        raise AdapterError(f"MaxText config file {os.fspath(config_file)!r} not found (from {os.getcwd()}); give its "
                           "path, or maxtext.packaged('base.yml') for a config MaxText ships.")
    for key in ("compile_topology", "compile_topology_num_slices"):
        if key in overrides:
            raise AdapterError(f"maxtext.adapt({key}=...): aotcheck sets {key} from each target it compiles for; "
                               "leave it out and choose targets with --aot-topologies/--aot-slices.")
    return MaxText(os.path.abspath(config_file), tuple(overrides.items()))


def packaged(name: str = "base.yml") -> str:
    """The path of a config file MaxText ships (``base.yml``, ``models/llama2-7b.yml``, ...)."""
    require("maxtext", extra="maxtext", library="MaxText")
    import maxtext  # noqa: PLC0415

    path = os.path.join(os.path.dirname(maxtext.__file__), "configs", name)
    if not os.path.isfile(path):
        raise AdapterError(f"MaxText ships no config {name!r} (looked in {os.path.dirname(path)}).")
    return path


@dataclasses.dataclass(frozen=True)
class MaxText:
    """A MaxText config: its file and overrides; :meth:`trainer` makes aotcheck's config of its train step."""

    config_file: str
    overrides: tuple[tuple[str, Any], ...] = ()

    def argv(self, topology: str, num_slices: int) -> list[str]:
        """The command line ``pyconfig.initialize`` reads for one target (``argv[0]`` is a placeholder), its
        topology as MaxText spells it (``tpu7x-8`` for aotcheck's ``7x-8``)."""
        return ["aotcheck", self.config_file, f"compile_topology={parse_topology(topology).spelled('maxtext')}",
                f"compile_topology_num_slices={num_slices}", *(f"{k}={v}" for k, v in self.overrides)]

    def trainer(self, *, knobs: Sequence[str] | None = None, fit: str | None = None,
                fit_upper: int | None = None, fit_targets: tuple[str, ...] = ("*",),
                compiler_options: Mapping[str, Any] | None = None,
                eval_step: bool | None = None) -> list[FunctionConfig]:
        """aotcheck's configs of MaxText's train step (program ``train_step``) and, where the job runs
        one, its eval step (``eval_step``, MaxText's own ``train.eval_step`` at its eval batch), made per target.

        ``knobs``: integer overrides a fit search may move, each given to :func:`adapt` (None: the
        per-device batch, where it is an int); ``fit``, ``fit_upper``,
        ``fit_targets``: as on every config (the train step's). ``compiler_options`` go over MaxText's own
        flags. ``eval_step``: None compiles the eval step where the config evaluates (``eval_interval > 0``
        given to :func:`adapt` or in its config file), as the job does; True or False decide.
        """
        given = dict(self.overrides)
        sizes: dict[str, int] = {}
        for name in knobs if knobs is not None else ("per_device_batch_size",):
            value = given.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                sizes[name] = value
            elif knobs is not None:
                raise AdapterError(
                    f"MaxText knob {name!r} is not an integer override of this config; give it to maxtext.adapt "
                    f"({name}=<int>) to let a fit search move it, or leave it out of knobs=.")
        if fit is not None and fit not in sizes:
            raise AdapterError(
                f"MaxText fit={fit!r} is not a knob of this config (knobs: {', '.join(sizes) or 'none'}); give it to "
                f"maxtext.adapt as an int ({fit}=<int>) and name it in knobs=.")
        options = dict(compiler_options or {})

        def rebuild(name: str, program: str) -> Any:
            def at(size: int) -> FunctionConfig:
                moved = dataclasses.replace(self, overrides=tuple(
                    (k, size if k == name else v) for k, v in self.overrides))
                return next(f for f in moved.trainer(knobs=knobs, fit=fit, fit_upper=fit_upper, fit_targets=fit_targets,
                                                     compiler_options=options, eval_step=True) if f.program == program)
            return at

        def config(program: str, make_program: Any, **search: Any) -> FunctionConfig:
            return FunctionConfig(
                make_program=make_program, program=program, platforms=(TPU.name,),
                arg_kinds=(STATE_KINDS, "batch"), trace_in_mesh=False,  # MaxText traces under its own mesh.
                libtpu_init_args=f"{_flags_text(given.get('compile_xla_flags', ''))} {RNG_FLAG}".strip(),
                compiler_options=options, settings=given,  # Recorded in each golden: a no-op override is said.
                knobs={name: Knob(size, rebuild(name, program)) for name, size in sizes.items()}, **search)

        train = config("train_step", self.train_program, fit=fit, fit_upper=fit_upper, fit_targets=fit_targets)
        evaluates = self.evaluates() if eval_step is None else eval_step
        return [train, config("eval_step", self.eval_program)] if evaluates else [train]

    def evaluates(self) -> bool:
        """Whether the job runs an eval step: ``eval_interval > 0`` in the overrides, else in the config file
        or the files it names as ``base_config`` (MaxText's default, -1, runs none)."""
        given = dict(self.overrides)
        if "eval_interval" in given:
            return int(given["eval_interval"]) > 0
        path, seen = self.config_file, set()
        while path and path not in seen and os.path.isfile(path):
            seen.add(path)
            import yaml  # noqa: PLC0415 (MaxText reads its configs with PyYAML, which it depends on)

            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f) or {}
            if "eval_interval" in data:
                return int(data["eval_interval"]) > 0
            base = data.get("base_config")
            path = os.path.join(os.path.dirname(path), base) if isinstance(base, str) else None
        return False

    def inference(self, **_: Any) -> FunctionConfig:
        """Not offered: MaxText 0.2.5's engine makes its prefill and decode programs from concrete
        parameters only (``MaxEngine.load_params`` runs the model's init on the mesh's devices through
        ``create_nnx_sharded_model``, and ``aot_compile`` lowers against those arrays), which deviceless
        TPU devices cannot run. An AdapterError says so."""
        raise AdapterError(
            "maxtext.adapt(...).inference() is not available: MaxText 0.2.5's MaxEngine builds its prefill and "
            "generate programs from parameters it materializes on the devices (load_params runs the init), which "
            "a deviceless TPU target cannot run. Register the train step (.trainer()), or wrap MaxEngine.prefill "
            "yourself in a FunctionConfig(make_program=...) over abstract parameters.")

    def train_program(self, mesh: jax.sharding.Mesh, target: Any) -> tuple["_Step", tuple[Any, Any]]:
        """``(step, (state, batch))`` for ``target``, as ``train_compile`` makes them, on ``mesh``'s devices."""
        with _maxtext_flags() as flags, _quiet():  # MaxText prints as it is imported.
            made = self._made(mesh, target, flags)
            from maxtext.trainers.pre_train import train  # noqa: PLC0415
            from maxtext.utils import maxtext_utils, sharding  # noqa: PLC0415

            config, own = made.config, made.mesh
            params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
                config, made.state_shardings)
            input_shardings = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings,
                                                                              params_shardings)
            data_sharding = sharding.get_input_data_sharding(config, own)
            fn, in_shardings, out_shardings, static, donate = maxtext_utils.get_functional_train_with_signature(
                train.train_step, data_sharding, input_shardings, made.model, config, params_shardings)
        jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, static_argnums=static,
                         donate_argnums=donate)
        return _Step(jitted, own, made.rules(config.logical_axis_rules), dict(flags)), tuple(made.args)

    def eval_program(self, mesh: jax.sharding.Mesh, target: Any) -> tuple["_Step", tuple[Any, Any]]:
        """``(step, (state, eval batch))`` for ``target``, as MaxText's ``train_utils.jit_eval_step`` makes them:
        its ``eval_step`` over the state's shardings (nothing donated) and the eval batch
        (``eval_per_device_batch_size``) sharded by ``logical_axis_rules_for_eval``."""
        with _maxtext_flags() as flags, _quiet():
            made = self._made(mesh, target, flags)
            from maxtext.trainers.pre_train import train  # noqa: PLC0415
            from maxtext.utils import maxtext_utils, sharding  # noqa: PLC0415

            config, own = made.config, made.mesh
            data_sharding = sharding.get_input_data_sharding(config, own, rules=config.logical_axis_rules_for_eval)
            batch = maxtext_utils.get_shaped_batch(config, batch_sharding=data_sharding, is_eval=True)
            fn, in_shardings, out_shardings, static, donate = maxtext_utils.get_functional_eval_with_signature(
                train.eval_step, data_sharding, made.state_shardings, made.model, config)
        jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, static_argnums=static,
                         donate_argnums=donate)
        return _Step(jitted, own, made.rules(config.logical_axis_rules_for_eval), dict(flags)), (made.args[0], batch)

    def _made(self, mesh: jax.sharding.Mesh, target: Any, flags: dict[str, Any]) -> "_Made":
        """MaxText's config, mesh and shaped train state for ``target`` (``train_compile``'s own steps), inside
        :func:`_maxtext_flags` and :func:`_quiet`."""
        require("maxtext", extra="maxtext", library="MaxText")
        from flax.core.spmd import logical_axis_rules  # noqa: PLC0415 (MaxText's extra brings flax)
        from jax.sharding import AxisType, Mesh  # noqa: PLC0415
        from maxtext.common.common_types import ShardMode  # noqa: PLC0415
        from maxtext.configs import pyconfig  # noqa: PLC0415
        from maxtext.trainers.pre_train import train_compile  # noqa: PLC0415
        from maxtext.utils import maxtext_utils  # noqa: PLC0415

        config = pyconfig.initialize(self.argv(target.topology.name, target.num_slices))
        train_compile.validate_config(config)
        if _flags_text(config.compile_xla_flags) != _flags_text(dict(self.overrides).get("compile_xla_flags", "")):
            raise AdapterError(
                f"MaxText's config sets compile_xla_flags={config.compile_xla_flags!r} (from its file or "
                "M_COMPILE_XLA_FLAGS), which aotcheck sends as compiler options only when given to "
                "maxtext.adapt: pass compile_xla_flags=... to adapt, or to aotcheck as launch flags "
                "(aot_libtpu_init_args).")
        if config.enable_diloco:  # train_compile wraps DiLoCo's step its own way: not built here.
            raise AdapterError("maxtext adapter: enable_diloco=true configs are not supported (train_compile "
                               "builds DiLoCo's outer step another way); compile them with train_compile.")
        flags["jax_remove_size_one_mesh_axis_from_type"] = config.remove_size_one_mesh_axis_from_type
        jax.config.update("jax_remove_size_one_mesh_axis_from_type", config.remove_size_one_mesh_axis_from_type)
        # MaxText's mesh over the target's devices (train_compile.get_topology_mesh, from aotcheck's devices).
        devices = sorted(mesh.devices.flat, key=lambda d: d.id)
        axis_type = AxisType.Explicit if config.shard_mode == ShardMode.EXPLICIT else AxisType.Auto
        own = Mesh(maxtext_utils.create_device_mesh(config, devices), config.mesh_axes,
                   axis_types=(axis_type,) * len(config.mesh_axes))
        args, _, state_shardings, _, model = train_compile.get_shaped_inputs(own, config)
        return _Made(config, own, args, state_shardings, model, logical_axis_rules)


@dataclasses.dataclass(frozen=True)
class _Made:
    """What MaxText made for one target, that its train and eval steps share."""

    config: Any
    mesh: jax.sharding.Mesh
    args: Any
    state_shardings: Any
    model: Any
    rules: Any  # flax's logical_axis_rules context manager


def _flags_text(flags: Any) -> str:
    """Flags as one line, as MaxText writes them across lines (``\\`` continuations)."""
    return " ".join(str(flags or "").replace("\\", " ").split())


@dataclasses.dataclass(frozen=True)
class _Step:
    """MaxText's jitted train step, lowered as ``train_compile.jit_and_compile`` lowers it: under its mesh,
    its logical axis rules and its jax flags (put back afterwards)."""

    jitted: Any
    mesh: jax.sharding.Mesh
    rules: Any
    flags: Mapping[str, Any]

    def lower(self, *args: Any) -> jax.stages.Lowered:
        with _maxtext_flags(**self.flags), _quiet(), jax.set_mesh(self.mesh), self.rules:
            return self.jitted.lower(*args)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """MaxText's chatter while it is imported, reads its config and makes its step (``[NO-OP] ...`` prints,
    ``base_output_directory is not provided`` for every probe of a fit search) is about running a job,
    not compiling one: its prints are held back (shown on stderr if MaxText fails, with the error) and
    its log warnings are off."""
    printed = io.StringIO()
    was = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(printed):
            yield
    except BaseException as e:
        if not isinstance(e, AdapterError):  # MaxText's own failure: what it printed may explain it.
            sys.stderr.write(printed.getvalue())
        raise
    finally:
        logging.disable(was)


@contextlib.contextmanager
def _maxtext_flags(**flags: Any) -> Iterator[dict[str, Any]]:
    """MaxText's PRNG (and ``flags``) set for a block; every jax flag the block changed (MaxText's own
    setup sets more) put back after it, and every environment variable it changed that was set before
    (``XLA_FLAGS`` and ``LIBTPU_INIT_ARGS`` whatever they were), so nothing leaks into other cases."""
    saved, environ = dict(jax.config.values), dict(os.environ)
    # Its config sets a compilation cache directory: off, so nothing made in the block can start using it.
    wanted = {"jax_default_prng_impl": "unsafe_rbg", "jax_enable_compilation_cache": False, **flags}
    try:
        for name, value in wanted.items():
            jax.config.update(name, value)
        yield wanted
    finally:
        for name, value in saved.items():
            if jax.config.values.get(name) != value:
                jax.config.update(name, value)
        # MaxText's config writes XLA_FLAGS (its dump_hlo_xla_flags, "" by default): put back every variable
        # that was there, and the compiler's own; what its imports add (HF_DATASETS_DISABLE_DILL) stays.
        for name in set(environ) | set(os.environ):
            if environ.get(name) != os.environ.get(name) and (name in environ or name in _COMPILER_ENVIRON):
                if name in environ:
                    os.environ[name] = environ[name]
                else:
                    del os.environ[name]


__all__ = ["MaxText", "RNG_FLAG", "STATE_KINDS", "adapt", "packaged"]
