"""Building abstract, sharded programs: placement (devices and mesh), train state and batch,
the train step, and lowering for each config kind. Nothing here runs XLA's compiler.

The trainer owns *what* (the step, built from its loss and optimizer); :mod:`aotcheck.targets` owns *where*.

Example:
    >>> from aotcheck.models import lm
    >>> placement = place(lm.trainer_config(lm.TINY), "v5e-16", 2)
    >>> placement.target.name, dict(placement.mesh.shape)
    ('v5e-16x2', {'data': 16, 'model': 2})
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from aotcheck.errors import ConfigError
from aotcheck.programs.config import ARGUMENT_KINDS, Config, FunctionConfig
from aotcheck.programs.model import as_functions, function_for
from aotcheck.programs.on_mesh import off_the_mesh
from aotcheck.targets.mesh import build_mesh
from aotcheck.targets.devices import get_devices_for_topology, traced_as
from aotcheck.targets.topology import Target, Topology


class LoweringError(ConfigError):
    """A config that cannot be lowered as asked (e.g. an inference method it does not define)."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a program is laid out: its target and the mesh over the target's devices."""

    target: Target
    mesh: jax.sharding.Mesh


def place(config: Config, topology: str | Topology | Target, num_slices: int = 1) -> Placement:
    """Devices and mesh for ``config`` on ``num_slices`` x ``topology`` (or a :class:`Target`)."""
    target = topology if isinstance(topology, Target) else Target.of(topology, num_slices)
    devices, _ = get_devices_for_topology(target.topology, target.num_slices)
    return Placement(target, build_mesh(config.mesh, target.topology, devices, num_slices=target.num_slices))


@dataclasses.dataclass(frozen=True)
class Argument:
    """One entry parameter of a lowered program: its pytree path and what it holds.

    ``kind`` is one of ``ARGUMENT_KINDS``: ``"params"``, ``"opt_state"`` (a train state's
    optimizer state and step), ``"batch"`` (every other input: the batch, a function's arguments
    unless its ``arg_kinds`` say otherwise), ``"kv_cache"`` (a server's KV pool, declared so: its
    own class at the peak) or ``"other"`` (a function's input declared none of these: counted
    with the batch at the peak, never linted as one).
    """

    path: str
    kind: str
    shape: tuple[int, ...] = dataclasses.field(default=(), repr=False, compare=False)  # Global, as traced.

    @property
    def peak_class(self) -> str:
        """The class of the peak's split its buffer counts in: its kind, an ``other`` input as ``batch``
        (the split's class ``other`` is XLA's padding and fragmentation, not an input's)."""
        return "batch" if self.kind == "other" else self.kind


def argument_kinds(config: FunctionConfig, args: Sequence[Any]) -> list[list[str]]:
    """The kind of each leaf of each positional argument (in pytree order) of a FunctionConfig's
    program: its ``arg_kinds``, or inferred (see :class:`FunctionConfig`). LoweringError, naming the
    field and the fix, when ``arg_kinds`` does not fit the arguments.

    Example:
        >>> import optax
        >>> params = {"w": jax.ShapeDtypeStruct((4, 4), "float32")}
        >>> sgd = jax.eval_shape(optax.sgd(0.1, momentum=0.9).init, params)  # (TraceState(trace), EmptyState())
        >>> state = {"params": params, "opt_state": sgd, "step": jax.ShapeDtypeStruct((), "int32")}
        >>> config = FunctionConfig(fn=abs, make_args=abs)  # Inferred: leaves opt_state/0/trace/w, params/w, step
        >>> argument_kinds(config, (state, sgd, params))
        [['opt_state', 'params', 'opt_state'], ['opt_state'], ['batch']]
        >>> config = FunctionConfig(fn=abs, make_args=abs, arg_kinds=({"params": "params", "opt_state": "other"},))
        >>> argument_kinds(config, (params,))
        Traceback (most recent call last):
        ...
        aotcheck.programs.lowering.LoweringError: FunctionConfig.arg_kinds[0] ({'params': 'params', ...
    """
    args = tuple(args)
    if config.arg_kinds is None:
        return [_inferred_kinds(arg) for arg in args]
    if len(config.arg_kinds) != len(args):
        raise LoweringError(
            f"FunctionConfig.arg_kinds gives {len(config.arg_kinds)} kind(s), but the program {config.program!r} "
            f"takes {len(args)} positional argument(s) from make_args; give one kind per argument, in order "
            f"(each one of {', '.join(ARGUMENT_KINDS)}, or a pytree prefix of its argument), or leave arg_kinds "
            "out to have them inferred.")
    out = []
    for position, (entry, arg) in enumerate(zip(config.arg_kinds, args)):
        if isinstance(entry, str):
            out.append([entry] * len(jax.tree_util.tree_leaves(arg)))
            continue
        try:
            out.append(jax.tree_util.tree_leaves(jax.tree.broadcast(entry, arg)))
        except (ValueError, TypeError, KeyError) as e:
            by_name = _kinds_by_top_name(entry, arg)
            if by_name is not None:  # A dict of kinds over another mapping-like node (flax's nnx.State).
                out.append(by_name)
                continue
            raise LoweringError(
                f"FunctionConfig.arg_kinds[{position}] ({entry!r}) is not a pytree prefix of argument {position} "
                f"(a {type(arg).__name__} of {', '.join(map(str, _top_names(arg))) or 'no entries'}); give one kind "
                f"for the whole argument, or a pytree of kinds shaped like its top levels ({str(e).splitlines()[0]})."
            ) from None
    return out


def argument_kinds_key(lowered: jax.stages.Lowered, config: FunctionConfig) -> str:
    """What the figures cache keys on besides the lowered program: its argument kinds where any is
    not ``batch`` ("" otherwise, so a key made before argument kinds stays valid)."""
    kinds = [kind for leaves in argument_kinds(config, lowered.args_info[0]) for kind in leaves]
    return "" if all(kind == "batch" for kind in kinds) else "\n// aotcheck argument kinds: " + ",".join(kinds)


def _key_name(key: Any) -> Any:
    return getattr(key, "key", getattr(key, "name", getattr(key, "idx", None)))


def _top_names(arg: Any) -> list[Any]:
    """The names of an argument's top-level entries (dict keys, attributes, indices), empty ones too."""
    entries = jax.tree_util.tree_flatten_with_path(arg, is_leaf=lambda x: x is not arg)[0]
    return [_key_name(path[0]) for path, _ in entries if path]


def _kinds_by_top_name(entry: Any, arg: Any) -> list[str] | None:
    """The kind of each leaf of ``arg`` by the name of its top-level entry, for a dict ``entry`` of kinds
    naming every top-level entry of ``arg`` (a node of another type than dict, such as flax's
    ``nnx.State``, whose entries have names); None otherwise."""
    if not isinstance(entry, Mapping) or not all(isinstance(kind, str) for kind in entry.values()):
        return None
    leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
    if not leaves or set(_top_names(arg)) != set(entry):
        return None
    return [entry[_key_name(path[0])] for path, _ in leaves]


def _is_optax_state(tree: Any) -> bool:
    """An optax state: a NamedTuple whose class optax defines, or a tuple or list of them (``optax.chain``)."""
    cls = type(tree)
    if isinstance(tree, tuple) and hasattr(cls, "_fields"):
        return cls.__module__.split(".")[0] == "optax"
    return cls in (tuple, list) and len(tree) > 0 and all(_is_optax_state(x) for x in tree)


def _inferred_kinds(arg: Any) -> list[str]:
    leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
    if _is_optax_state(arg):
        return ["opt_state"] * len(leaves)
    if {"params", "opt_state"} <= set(_top_names(arg)):  # A train state, split as a TrainerConfig's.
        return ["params" if _key_name(path[0]) == "params" else "opt_state" for path, _ in leaves]
    return ["batch"] * len(leaves)


def arguments(lowered: jax.stages.Lowered, config: FunctionConfig) -> list[Argument]:
    """The lowered program's entry parameters in order, each with its path (the argument's name
    from ``arg_names``, then the leaf's) and kind.

    Example:
        >>> from aotcheck.models import lm
        >>> step = as_functions(lm.trainer_config(lm.TINY))[0]
        >>> found = arguments(lower_function(step, Target.of("cpu-4"))["train_step"], step)
        >>> [a for a in found if a.path in ("params/embed", "batch/tokens")]
        [Argument(path='params/embed', kind='params'), Argument(path='batch/tokens', kind='batch')]
        >>> sorted({a.kind for a in found})
        ['batch', 'opt_state', 'params']
    """
    leaves = jax.tree_util.tree_flatten_with_path(lowered.args_info)[0]
    positional = [(path[1:], leaf) for path, leaf in leaves if path and getattr(path[0], "idx", None) == 0]
    kinds = [kind for leaves in argument_kinds(config, lowered.args_info[0]) for kind in leaves]
    names = config.arg_names or ()
    out = []
    for number, (path, leaf) in enumerate(positional):
        position = getattr(path[0], "idx", 0)
        rest = jax.tree_util.keystr(path[1:], simple=True, separator="/")
        name = names[position] if position < len(names) else f"args[{position}]"
        found = "/".join(part for part in (name, rest) if part) or f"args[{position}]"
        out.append(Argument(found, kinds[number], shape=tuple(getattr(leaf, "shape", ()))))
    # jit leaves unused arguments out of the program (keep_unused=False): keep the parameter numbering.
    kept = kept_arguments(lowered.as_text(debug_info=True),
                          [(path, tuple(getattr(leaf, "shape", ()))) for path, leaf in positional])
    return out if kept is None else [out[i] for i in kept]


def kept_arguments(lowered_text: str, leaves: Sequence[tuple[tuple[Any, ...], tuple[int, ...]]]) -> list[int] | None:
    """Which of the flat arguments (each its pytree path, top-level position first, and global shape)
    the lowered program kept as parameters, in order: jit drops the unused ones. Read from the entry's
    parameters in ``lowered.as_text(debug_info=True)``: the name jax gives each (the argument's name,
    then the leaf's path) and its shape. None when they cannot be matched one way only.

    Example:
        >>> text = 'func.func public @main(%arg0: tensor<3xf32> loc("a.p"), %arg1: tensor<3xf32> loc("c")) -> ('
        >>> p, q = jax.tree_util.GetAttrKey("p"), jax.tree_util.GetAttrKey("q")
        >>> kept_arguments(text, [((0, p), (3,)), ((0, q), (2,)), ((1,), (4,)), ((2,), (3,))])
        [0, 3]
        >>> kept_arguments(text, [((0, p), (3,)), ((1,), (3,)), ((2,), (3,))]) is None  # b or c? Either.
        True
    """
    aliases = dict(re.findall(r'^#(loc\d*) = loc\("((?:[^"\\]|\\.)*)"', lowered_text, re.M))
    main = re.search(r"func\.func public @main\((.*?)\) ->", lowered_text)
    if main is None:
        return None
    params = [(name or aliases.get(alias), tuple(int(d) for d in dims.split("x")[:-1]))
              for dims, name, alias in re.findall(
                  r'%arg\d+: tensor<([^>]*)>.*?loc\((?:"((?:[^"\\]|\\.)*)"|#(loc\d*))\)', main[1])]
    if len(params) == len(leaves):
        return list(range(len(leaves)))

    def greedy(order: Sequence[int], wanted: list[tuple[str | None, tuple[int, ...]]]) -> list[int] | None:
        kept: list[int] = []
        prefixes: dict[Any, str] = {}  # Each top-level argument's name, as its first kept leaf shows it.
        for i in order:
            if len(kept) == len(wanted):
                break
            (path, shape), (name, dims) = leaves[i], wanted[len(kept)]
            suffix = jax.tree_util.keystr(tuple(path[1:]))
            if name is None or tuple(shape) != dims or not name.endswith(suffix):
                continue
            prefix = name[: len(name) - len(suffix)]
            if prefixes.get(path[0], prefix) != prefix or (path[0] not in prefixes and prefix in prefixes.values()):
                continue
            prefixes[path[0]] = prefix
            kept.append(i)
        return kept if len(kept) == len(wanted) else None

    forward = greedy(range(len(leaves)), params)
    backward = greedy(range(len(leaves) - 1, -1, -1), params[::-1])
    return forward if forward is not None and backward is not None and forward == backward[::-1] else None


@contextlib.contextmanager
def lowering_context(config: Config, mesh: jax.sharding.Mesh) -> Iterator[None]:
    """The mesh a program is traced under, visible wherever model code may look for it:
    ``jax.sharding.get_abstract_mesh()`` (the abstract mesh, ``use_abstract_mesh``) and the legacy
    physical-mesh context of ``with mesh:`` (``thread_resources``), where this jax still has it. A
    model whose sharding helper returns ``x`` unchanged when it finds no mesh would otherwise
    compile without its activation constraints: not the program the TPU runs.

    No concrete mesh (``jax.set_mesh``): its devices are deviceless TPUs, so what user code
    evaluates eagerly while tracing (``jax.ensure_compile_time_eval``, e.g. Equinox's rotary
    tables) would be sent to devices that cannot run it. Nothing for a config with
    ``trace_in_mesh=False``.
    """
    if not config.trace_in_mesh:
        yield
        return
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), _legacy_mesh(mesh):
        yield


def _legacy_mesh(mesh: jax.sharding.Mesh) -> contextlib.ExitStack:
    """``with mesh:`` (deprecated since jax 0.10.1, still read by older model code), entered quietly;
    nothing where this jax no longer has it or the user disabled it."""
    stack = contextlib.ExitStack()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Ours to enter, not the user's to fix.
        with contextlib.suppress(AttributeError, RuntimeError, TypeError, ValueError):
            stack.enter_context(mesh)
    return stack


def lower_function(config: FunctionConfig, target: Target) -> dict[str, jax.stages.Lowered]:
    """``{config.program: Lowered}`` for the escape hatch: its arguments (``make_args``), or its function
    and arguments (``make_program``), made for the target on the target's mesh."""
    placement = place(config, target)
    with lowering_context(config, placement.mesh), _as_target(config, placement), _mesh_clash(config, placement.mesh):
        if config.make_program is not None:
            fn, args = _made_program(config, placement)
        else:
            fn, args = _jitted(config, config.fn), config.make_args(*_mesh_and_target(config.make_args, placement))
        lowered = fn.lower(*args)
    problem = off_the_mesh(config.program, "make_program" if config.make_program is not None else "make_args", args,
                           set(placement.mesh.devices.flat), str(placement.target), lowered)
    if problem is not None:
        raise LoweringError(problem)
    argument_kinds(config, lowered.args_info[0])  # arg_kinds that do not fit fail here, before any compile.
    return {config.programs[0]: lowered}


def _mesh_and_target(make_args: Callable[..., Any], placement: Placement) -> tuple[Any, ...]:
    """``(mesh, target)`` for a ``make_args`` whose second parameter is required or named ``target``
    (never into a defaulted one such as ``dtype=jnp.float32``), ``(mesh,)`` otherwise."""
    try:
        parameters = [p for p in inspect.signature(make_args).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # No signature to read (a builtin): the documented one-argument form.
        return (placement.mesh,)
    if len(parameters) >= 2 and (parameters[1].default is parameters[1].empty or parameters[1].name == "target"):
        return (placement.mesh, placement.target)
    return (placement.mesh,)


def _made_program(config: FunctionConfig, placement: Placement) -> tuple[Any, Sequence[Any]]:
    """``make_program(mesh, target)``, checked: a LoweringError naming the field for anything but
    ``(function, arguments)``."""
    assert config.make_program is not None
    made = config.make_program(placement.mesh, placement.target)
    fits = isinstance(made, tuple) and len(made) == 2 and (callable(made[0]) or hasattr(made[0], "lower")) \
        and isinstance(made[1], Sequence) and not isinstance(made[1], (str, bytes))
    if not fits:
        raise LoweringError(
            f"FunctionConfig.make_program returned {_shape_of(made)} for {placement.target}; it must return "
            "(fn, args): the function to compile (jitted with its shardings and donation, or anything with a "
            ".lower(*args)) and the tuple of its abstract arguments.")
    return _jitted(config, made[0]), tuple(made[1])


def _shape_of(made: Any) -> str:
    """What ``make_program`` gave instead of ``(fn, args)``, in words.

    Example:
        >>> _shape_of((print, (), {})), _shape_of({"fn": print}), _shape_of((1, ())), _shape_of((print, "x"))
        ('a tuple of 3 items', 'a dict (keys fn)', 'a tuple whose first item, a int, is no function', 'a tuple whose second item, a str, is not a sequence of arguments')
    """
    if isinstance(made, tuple) and len(made) == 2:
        if not (callable(made[0]) or hasattr(made[0], "lower")):
            return f"a tuple whose first item, a {type(made[0]).__name__}, is no function"
        return f"a tuple whose second item, a {type(made[1]).__name__}, is not a sequence of arguments"
    if isinstance(made, tuple):
        return f"a tuple of {len(made)} items"
    if isinstance(made, Mapping):
        return f"a dict (keys {', '.join(map(str, list(made)[:4]))})"
    return f"a {type(made).__name__}"


def _jitted(config: FunctionConfig, fn: Any) -> Any:
    """``fn`` as it is when it can lower itself (jitted with its own shardings), else jitted with the
    config's ``donate_argnums``."""
    return fn if hasattr(fn, "lower") else jax.jit(fn, donate_argnums=config.donate_argnums)


_MISSING_AXIS = re.compile(r"Resource axis: (?P<axis>\S+) of .* is not found in mesh")


@contextlib.contextmanager
def _mesh_clash(config: Config, mesh: jax.sharding.Mesh) -> Iterator[None]:
    """A program that names a mesh axis aotcheck's context mesh lacks (a step that owns its own mesh,
    traced under aotcheck's ``{data: N}``) fails as a LoweringError that names the cure."""
    try:
        yield
    except ValueError as e:
        found = _MISSING_AXIS.search(str(e))
        if not config.trace_in_mesh or found is None:
            raise
        raise LoweringError(
            f"Tracing {'/'.join(config.programs)} under aotcheck's mesh (axes {', '.join(mesh.axis_names)}) "
            f"failed: {e} The program names a mesh axis of its own ({found['axis']}). If it builds its own mesh "
            f"(MaxText and other trainers that own their mesh do), give its config trace_in_mesh=False so that it "
            f"traces under its own mesh only; otherwise give the config a mesh=MeshSpec(...) with that axis."
        ) from e


@contextlib.contextmanager
def _as_target(config: Config, placement: Placement) -> Iterator[None]:
    """jax's device questions answered as the target while tracing (``trace_as_target``). Eager work that
    puts an array on ``jax.devices()[0]`` then meets a deviceless device, and jax's error (``UNIMPLEMENTED:
    ... compile-only client``) names neither the cause nor the cure: a LoweringError names both."""
    if not config.trace_as_target:
        yield
        return
    try:
        with traced_as(placement.mesh.devices.flat, placement.target.topology):
            yield
    except Exception as e:
        if "compile-only client" not in str(e):
            raise
        raise LoweringError(
            f"{config.programs[0]} for {placement.target}: "
            f"code run while the program was built put an array on a device ({str(e).strip().splitlines()[0]}). "
            "Under trace_as_target (the default) jax.devices() are the target's deviceless devices, which hold no "
            "array. Make what is computed eagerly (in make_args, a model's init, tables built at trace time) "
            "abstract (jax.ShapeDtypeStruct, jax.eval_shape), or build the config with trace_as_target=False so "
            "that eager work runs on this host's CPU.") from e


def lower_config(config: Config, target: Target, *, program: str | None = None) -> dict[str, jax.stages.Lowered]:
    """Lowers one program (by its id) or all of any config kind, each as its function config.

    Example:
        >>> from aotcheck.models import lm
        >>> sorted(lower_config(lm.inference_config(lm.TINY), Target.of("cpu-4")))
        ['prefill', 'sample_decode']
    """
    if program is not None:
        try:
            function = function_for(config, program)
        except ConfigError as e:  # Only "no such program": a partitioning error inside keeps its own type.
            raise LoweringError(str(e)) from None
        return lower_function(function, target)
    return {name: lowered for function in as_functions(config) for name, lowered in lower_function(function, target).items()}
