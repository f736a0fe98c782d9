"""The public compile API: lowered programs -> compiled executables, for TPU topologies on a CPU.

The entry points mirror axlearn's ``aot_compilation`` module::

    compile_trainer_programs(cfg, topology="v5e-16")            # {"train_step": Compiled, "eval_step": ...}
    compile_inference_programs(cfg, input_batch_spec=None, topology="v4-8")  # {"sample_decode": ...}

and :func:`compile_function` takes any function with abstract sharded
arguments. Each has a ``lower_*`` twin that stops before XLA, which is cheap.

Example:
    >>> import aotcheck
    >>> from aotcheck.models import lm
    >>> lowered = lower_trainer_programs(lm.trainer_config(lm.TINY), topology="v5e-16", topology_num_slices=2)
    >>> list(lowered), lowered["train_step"].args_info[0][0]["step"].donated
    (['train_step', 'eval_step'], True)
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from aotcheck import _runtime
from aotcheck.errors import CompileError, OutOfMemory, OutOfMemorySpace, out_of_memory
from aotcheck.programs.config import BatchSpec, TrainerConfig, InferenceConfig
from aotcheck.programs.lowering import LoweringError, lower_config, lower_function
from aotcheck.programs.model import as_functions
from aotcheck.programs.oom import overflow_of
from aotcheck.programs.options import resolve_compiler_options
from aotcheck.targets.presets import tiny_lowered
from aotcheck.targets.families import note_family
from aotcheck.targets.topology import Target, Topology, parse_topology


def lower_trainer_programs(
    trainer_config: TrainerConfig, *, topology: str | Topology, topology_num_slices: int = 1
) -> dict[str, jax.stages.Lowered]:
    """Lowers the train step (no XLA compile). See :func:`compile_trainer_programs`."""
    return lower_config(trainer_config, Target.of(topology, topology_num_slices))


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
        raise LoweringError(f"Inference method {method!r} is not defined; this config offers "
                            f"{', '.join(inferencer_config.methods)}.")
    function, = (f for f in as_functions(inferencer_config, input_batch_spec=input_batch_spec) if f.program == method)
    return lower_function(function, Target.of(topology, topology_num_slices))


def compile_lowered(
    lowered: jax.stages.Lowered, options: Mapping[str, str], *, what: str, topology: str | Topology
) -> jax.stages.Compiled:
    """Runs XLA on ``lowered`` for ``topology``; a rejected option or a compile failure names ``what``."""
    note_family(topology)  # libtpu state crosses chip families: see aotcheck.targets.families.
    try:
        with _runtime.quiet_compiler_stderr(), _runtime.no_persistent_cache():
            return lowered.compile(compiler_options=dict(options))
    except Exception as e:  # jax raises JaxRuntimeError; its message is what matters.
        message = str(e)
        option = re.search(r"No such compile option: '([^']+)'", message)
        compiler = compiler_name(topology)
        if option:
            raise CompileError(
                f"XLA rejected compiler option {option[1]!r} while compiling {what}: {compiler} does not "
                f"know it. Remove it from the config's or the caller's compiler_options (or launch flags)."
            ) from e
        first = message.splitlines()[0] if message else ""
        refused = [k for k in options if re.search(rf"\b{re.escape(k)}\b", first)]
        if refused and first.startswith(("FAILED_PRECONDITION", "INVALID_ARGUMENT")):
            # An option named by libtpu's refusal, before any compiling: aotcheck sends only the presets
            # this libtpu accepts (programs/options.py), so it is one of the user's.
            raise CompileError(
                f"{compiler[0].upper()}{compiler[1:]} refuses compiler option {refused[0]!r} (= "
                f"{options[refused[0]]}) for {parse_topology(topology).name}, while compiling {what}. Remove it from "
                f"the config's compiler_options or your launch flags (aot_libtpu_init_args) for this chip. "
                f"It says: {message}"
            ) from e
        if out_of_memory(message):  # Read here, once, into a record: nothing downstream reads the message.
            overflow = overflow_of(message)
            if overflow is not None and not overflow.hbm:  # An op's memory space (a Pallas kernel's VMEM, SMEM).
                raise OutOfMemorySpace(f"Compiling {what} failed: {message}", overflow=overflow) from e
            raise OutOfMemory(f"Compiling {what} failed: {message}", overflow=overflow) from e
        raise CompileError(f"Compiling {what} failed: {message}") from e


def compiler_name(topology: str | Topology) -> str:
    """Which compiler builds ``topology``'s programs, in words.

    Example:
        >>> compiler_name("v5e-16"), compiler_name("h100-8")
        ('this libtpu', "the CUDA plugin's XLA")
    """
    return parse_topology(topology).platform.compiler


def warm_up(family: str) -> None:
    """Compiles a tiny program for ``family``'s smallest topology, so that libtpu's and jax's one-time
    start-up is not counted in the first real case's compile cost (``compile_cpu_seconds``)."""
    from aotcheck.targets.topology import topologies  # noqa: PLC0415

    smallest = next((t for t in topologies() if t.family == family), None)
    if smallest is None:
        return
    with contextlib.suppress(Exception), _runtime.quiet_compiler_stderr(), _runtime.no_persistent_cache():
        # The real case says what is wrong.
        tiny_lowered(smallest).compile()


def compile_programs(
    lowered: Mapping[str, jax.stages.Lowered], options: Mapping[str, str], *, what: str, topology: str | Topology
) -> dict[str, jax.stages.Compiled]:
    """Compiles each lowered program, naming it in any error."""
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
    presets: bool = True,
) -> dict[str, jax.stages.Compiled]:
    """AOT-compiles the train step of ``trainer_config`` for a TPU topology.

    The state (params, optimizer state, step) is donated; state and batch
    shardings are explicit, from the config's partition rules.

    Args:
        trainer_config: The trainer.
        topology: e.g. ``"v5e-16"``.
        topology_num_slices: Slices over DCN.
        compiler_options: XLA options over the presets and the config's.
        presets: Send aotcheck's per-chip presets (those this libtpu accepts) under them.

    Returns:
        ``{"train_step": jax.stages.Compiled}``.
    """
    options = resolve_compiler_options(
        topology, topology_num_slices, trainer_config.options, compiler_options, presets=presets
    )
    target = Target.of(topology, topology_num_slices)
    return compile_programs(lower_config(trainer_config, target), options, what=f"the trainer on {target}",
                            topology=target.topology)


def compile_inference_programs(
    inferencer_config: InferenceConfig,
    *,
    input_batch_spec: BatchSpec | None,
    topology: str | Topology,
    topology_num_slices: int = 1,
    compiler_options: Mapping[str, Any] | None = None,
    method: str = "sample_decode",
    presets: bool = True,
) -> dict[str, jax.stages.Compiled]:
    """AOT-compiles one inference method (default ``sample_decode``).

    Args:
        inferencer_config: The model and its methods.
        input_batch_spec: Global input shapes; None takes the config's.
        topology: e.g. ``"v4-8"``.
        topology_num_slices: Slices over DCN.
        compiler_options: XLA options over the presets and the config's.
        method: Which method to compile.
        presets: Send aotcheck's per-chip presets (those this libtpu accepts) under them.

    Returns:
        ``{method: jax.stages.Compiled}``.
    """
    options = resolve_compiler_options(
        topology, topology_num_slices, inferencer_config.options, compiler_options, presets=presets
    )
    target = Target.of(topology, topology_num_slices)
    lowered = lower_inference_programs(inferencer_config, input_batch_spec=input_batch_spec, topology=target.topology,
                                       topology_num_slices=target.num_slices, method=method)
    return compile_programs(lowered, options, what=f"{method} on {target}", topology=target.topology)


def compile_function(
    fn: Callable[..., Any],
    *args: Any,
    topology: str | Topology,
    topology_num_slices: int = 1,
    donate_argnums: Sequence[int] = (),
    compiler_options: Mapping[str, Any] | None = None,
    presets: bool = True,
) -> jax.stages.Compiled:
    """AOT-compiles any function for abstract sharded ``args`` (built on that topology's mesh).

    ``topology`` selects the default compiler options; the devices come from
    the shardings already on ``args``.
    """
    options = resolve_compiler_options(topology, topology_num_slices, compiler_options, presets=presets)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn, donate_argnums=tuple(donate_argnums))
    return compile_lowered(jitted.lower(*args), options, what=getattr(fn, "__name__", "function"), topology=topology)


__all__ = [
    "CompileError",
    "OutOfMemory",
    "OutOfMemorySpace",
    "compile_function",
    "compile_inference_programs",
    "compile_lowered",
    "compile_trainer_programs",
    "lower_inference_programs",
    "lower_trainer_programs",
    "warm_up",
]
