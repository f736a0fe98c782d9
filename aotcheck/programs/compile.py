"""The public compile API: lowered programs -> compiled executables, for TPU topologies on a CPU.

The entry points mirror axlearn's ``aot_compilation`` module::

    compile_trainer_programs(cfg, topology="v5e-16")            # {"train_step": Compiled}
    compile_inference_programs(cfg, input_batch_spec=None, topology="v4-8")  # {"sample_decode": ...}

and :func:`compile_function` takes any function with abstract sharded
arguments. Each has a ``lower_*`` twin that stops before XLA, which is cheap.

Example:
    >>> import aotcheck
    >>> from aotcheck.models import lm
    >>> lowered = lower_trainer_programs(lm.trainer_config(lm.TINY), topology="v5e-16", topology_num_slices=2)
    >>> list(lowered), lowered["train_step"].args_info[0][0]["step"].donated
    (['train_step'], True)
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from aotcheck import _runtime
from aotcheck.errors import CompileError, OutOfMemory, OutOfMemorySpace, Overflow, out_of_memory
from aotcheck.programs.config import BatchSpec, TrainerConfig, InferenceConfig
from aotcheck.programs.lowering import LoweringError, lower_config, lower_function
from aotcheck.programs.model import as_functions
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
        if out_of_memory(message):  # Said here, once, as a type: nothing downstream reads the message for it.
            overflow = overflow_of(message)
            if overflow is not None:  # Another memory space than HBM (a Pallas kernel's VMEM, SMEM).
                raise OutOfMemorySpace(f"Compiling {what} failed: {message}", overflow=overflow) from e
            raise OutOfMemory(f"Compiling {what} failed: {message}") from e
        raise CompileError(f"Compiling {what} failed: {message}") from e


_SIZE = r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?"
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# XLA's three ways of saying an op overflowed a memory space (libtpu 0.0.42-0.0.50): a scoped
# allocation over its limit (E1001), the space's capacity with the largest allocations listed, and
# one allocation larger than the memory itself.
_SCOPED = re.compile(
    r"Ran out of memory in memory space (?P<space>\w+) while allocating on stack for %?(?P<instruction>[\w.\-]+) = "
    r"(?P<shape>\([^)]*\)|\S+) (?P<opcode>[\w\-]+)\((?P<rest>.*?)\. Scoped allocation with size " + _SIZE.replace("(", "(?P<size>", 1)
    + r" and limit " + _SIZE.replace("(", "(?P<limit>", 1) + r" exceeded scoped \w+ limit by "
    + _SIZE.replace("(", "(?P<excess>", 1), re.S)
_CAPACITY = re.compile(
    r"Ran out of memory in memory space (?P<space>\w+)\. Used " + _SIZE.replace("(", "(?P<size>", 1) + r" of "
    + _SIZE.replace("(", "(?P<limit>", 1) + r" (?P=space)\.(?: Exceeded (?P=space) capacity by "
    + _SIZE.replace("(", "(?P<excess>", 1) + ")?")
_ALLOCATION = re.compile(
    r"Allocation \(size=(?P<size>\d+)\) would exceed memory \(size=(?P<limit>\d+)\) :: #\S+ "
    r"\[shape = '(?P<shape>[^']*)', space=(?P<space>\w+), size = \S+, (?P<scoped>scoped, )?tag = '(?P<tag>[^']*)'\]"
    r"(?: :: (?P<instruction>[\w.\-]+))?")


_ANY_SPACE = re.compile(r"(?:Ran out of memory in memory space|space=)\s*(?P<space>\w+)")


def _bytes(match: re.Match[str], name: str) -> int | None:
    number = match.group(name)
    if number is None:
        return None
    unit = match.group(match.re.groupindex[name] + 1)
    return round(float(number) * _UNIT[unit.upper()])


def _shape(text: str | None) -> str | None:
    """``f32[4096,4096]{1,0:T(8,128)}`` -> ``f32[4096,4096]`` (the layout is XLA's business)."""
    return re.sub(r"\{[^}]*\}", "", text).strip() if text else None


def overflow_of(message: str) -> Overflow | None:
    """What XLA's out-of-memory ``message`` says of a memory space other than HBM, or None (HBM's, or
    words this reader does not know: the error is then a plain :class:`OutOfMemory`).

    Example (libtpu 0.0.50.1, v5e-1: a Pallas kernel's VMEM scratch, then SMEM scratch):
        >>> o = overflow_of('RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\\nRan out of memory in memory '
        ...     'space vmem while allocating on stack for %f.1 = f32[4096,4096]{1,0:T(8,128)} custom-call(%x_ref.1), '
        ...     'custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/pallas_call" stack_frame_id=3}. '
        ...     'Scoped allocation with size 128.00M and limit 16.00M exceeded scoped vmem limit by 112.00M.')
        >>> o.space, o.size_bytes, o.limit_bytes, o.limit, o.instruction, o.op_name, o.op_shape, o.kernel
        ('vmem', 134217728, 16777216, 'scoped', 'f.1', 'jit(f)/pallas_call', 'f32[4096,4096]', True)
        >>> o = overflow_of('RESOURCE_EXHAUSTED: Ran out of memory in memory space smem. Used 1.00M of 1.00M smem. '
        ...     'Exceeded smem capacity by 136B.\\n\\n  Largest program allocations in smem:\\n\\n  1. Size: 1.00M\\n'
        ...     '     Operator: op_name="jit(f)/pallas_call"\\n     Shape: f32[262144]{0:T(128)}\\n'
        ...     '     Tag: scratch operand\\n     XLA label: f.1 = custom-call(x_ref.1), custom_call_target="tpu_custom_call"')
        >>> o.space, o.size_bytes, o.limit_bytes, o.excess_bytes, o.limit, o.allocation_shape, o.tag, o.instruction
        ('smem', 1048712, 1048576, 136, 'capacity', 'f32[262144]', 'scratch operand', 'f.1')
        >>> o = overflow_of("RESOURCE_EXHAUSTED: Allocation (size=268435456) would exceed memory (size=134217728) :: "
        ...     "#allocation3 [shape = 'f32[16384,4096]{1,0:T(8,128)}', space=vmem, size = 0x10000000, scoped, "
        ...     "tag = 'scratch operand'] :: f.1")
        >>> o.space, o.size_bytes, o.limit_bytes, o.limit, o.allocation_shape, o.instruction
        ('vmem', 268435456, 134217728, 'capacity', 'f32[16384,4096]', 'f.1')
        >>> overflow_of("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.00G of 15.75G hbm.") is None
        True

    A kernel with several results prints a tuple type; words not known in full still name the space:
        >>> o = overflow_of('Ran out of memory in memory space vmem while allocating on stack for %f.1 = '
        ...     '(f32[8,128]{1,0}, f32[8,128]{1,0}) custom-call(%x), custom_call_target="tpu_custom_call". '
        ...     'Scoped allocation with size 32.00M and limit 16.00M exceeded scoped vmem limit by 16.00M.')
        >>> o.space, o.size_bytes, o.op_shape, o.kernel
        ('vmem', 33554432, '(f32[8,128], f32[8,128])', True)
        >>> o = overflow_of("RESOURCE_EXHAUSTED: Ran out of memory in memory space cmem in some new words")
        >>> o.space, o.size_bytes
        ('cmem', None)
    """
    found = _SCOPED.search(message)
    if found:
        rest = found["rest"]
        file, line = re.search(r'source_file="([^"]+)"', rest), re.search(r"source_line=(\d+)", rest)
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        return _unless_hbm(Overflow(
            found["space"], _bytes(found, "size"), _bytes(found, "limit"), "scoped", _bytes(found, "excess"),
            instruction=found["instruction"], op_name=_op_name(rest), op_shape=_shape(found["shape"]),
            kernel=bool(target and target[1] == "tpu_custom_call"),
            source=f"{file[1]}:{line[1]}" if file and line else None))
    found = _CAPACITY.search(message)
    if found:
        size, limit, excess = _bytes(found, "size"), _bytes(found, "limit"), _bytes(found, "excess")
        if excess is not None and limit is not None:
            size = limit + excess  # XLA rounds both sizes ("Used 1.00M of 1.00M"): its excess is exact.
        first = message[found.end():].split("\n\n  2.")[0]  # The largest allocation XLA lists.
        label = re.search(r"XLA label: %?([\w.\-]+) = ", first)
        shape = re.search(r"Shape: (\S+)", first)
        tag = re.search(r"Tag: ([^\n]+)", first)
        return _unless_hbm(Overflow(
            found["space"], size, limit, "capacity", excess, instruction=label[1] if label else None,
            op_name=_op_name(first), allocation_shape=_shape(shape[1]) if shape else None,
            tag=tag[1].strip() if tag else None, kernel='custom_call_target="tpu_custom_call"' in first))
    found = _ALLOCATION.search(message)
    if found:
        size, limit = int(found["size"]), int(found["limit"])
        return _unless_hbm(Overflow(
            found["space"], size, limit, "capacity", size - limit, instruction=found["instruction"],
            allocation_shape=_shape(found["shape"]), tag=found["tag"], kernel=found["tag"] == "scratch operand"))
    found = _ANY_SPACE.search(message)
    if found:  # Words this reader does not know in full: the space is still said, never HBM's table.
        return _unless_hbm(Overflow(found["space"], None, None, "capacity", op_name=_op_name(message),
                                    kernel='custom_call_target="tpu_custom_call"' in message))
    return None


def _op_name(text: str) -> str | None:
    found = re.search(r'op_name="([^"]*)"', text)
    return found[1] if found else None


def _unless_hbm(overflow: Overflow) -> Overflow | None:
    return None if overflow.space.lower() == "hbm" else overflow


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
