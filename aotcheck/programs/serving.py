"""A server's programs over the shape buckets it compiles at start-up, one case per bucket.

Every JAX serving engine compiles a matrix of shapes when it starts: tpu-inference (vLLM on
TPU) compiles token counts doubling from 16 to ``max_num_batched_tokens`` and request counts
doubling to ``max_num_seqs``, and their products for logits and sampling; JetStream and
MaxText's offline inference compile power-of-two prefill lengths. A :class:`ServingConfig`
declares a server's programs (:class:`Bucketed`: a function, its inputs at a bucket, the axes
it is bucketed over), its KV pool and the scheduler's :class:`Limits`. :meth:`ServingConfig.expand`
makes one :class:`~aotcheck.programs.config.FunctionConfig` per bucket, carrying the bucket as a
value (:class:`~aotcheck.programs.names.Bucket`; its case's id shows it: ``llm/step[tokens=64]@v5e-8x1``), the KV pool a donated
argument whose size is the knob ``pages``, searched on each program's largest bucket: the KV
budget.

Building a config checks its buckets against its limits (:func:`bucket_problems`): a shape the
scheduler can send that no bucket covers (a compile mid-traffic) and a bucket the scheduler never
fills (a wasted compile at start-up) are each named, with the fix.

Example:
    >>> doubling(16, 128), padded(16, 600, gap=256)
    ((16, 32, 64, 128), (16, 32, 64, 128, 256, 512, 768))
    >>> from aotcheck.models import serve
    >>> step = serve.serving_config(serve.TINY).expand()[2]
    >>> step.program, step.bucket, step.programs
    ('step', Bucket(tokens=64), ('step[tokens=64]',))
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from aotcheck.records import Record
from aotcheck.errors import ConfigError
from aotcheck.programs.config import FunctionConfig, _Bounded, _Common
from aotcheck.programs.knob import Knob
from aotcheck.programs.model import abstract_params, param_shardings
from aotcheck.programs.names import Bucket
from aotcheck.targets.partition import Rules, with_shardings
from aotcheck.targets.topology import Topology
from aotcheck.targets.usable import Usable, first_share, usable_memory

Point = Mapping[str, int]
"""One bucket: a size per axis (``{"tokens": 64, "seqs": 8}``)."""

KV_KNOB = "pages"
"""The knob of a bucket that holds the KV pool: the pool's size in pages (``fit_max_pages``)."""


class BucketError(ConfigError):
    """Buckets that do not match the scheduler's limits: a shape it can send that no bucket covers, a
    bucket over its budget, an axis that is not a list of sizes. The message names each and the fix."""


def doubling(minimum: int, maximum: int) -> tuple[int, ...]:
    """``minimum``, twice that, ... up to the first size >= ``maximum``, as the engines make their
    token and request buckets (tpu-inference's paddings with no gap, JetStream's prefill lengths).

    Example:
        >>> doubling(8, 8), doubling(16, 100)
        ((8,), (16, 32, 64, 128))
    """
    _check_sizes(minimum, maximum)
    sizes = [minimum]
    while sizes[-1] < maximum:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def padded(minimum: int, maximum: int, *, gap: int) -> tuple[int, ...]:
    """Doubling from ``minimum`` up to ``gap``, then every ``gap`` up to the first size >= ``maximum``:
    vLLM's token paddings with a padding gap (fewer, closer buckets where the sizes are large).

    Example:
        >>> padded(16, 1024, gap=512)
        (16, 32, 64, 128, 256, 512, 1024)
    """
    _check_sizes(minimum, maximum)
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < minimum:
        raise BucketError(f"padded(gap={gap!r}): the gap is a size >= the minimum ({minimum}), e.g. gap=512.")
    sizes = [size for size in doubling(minimum, min(gap, maximum)) if size <= gap]
    while sizes[-1] < maximum:
        sizes.append(sizes[-1] + gap)
    return tuple(sizes)


def _check_sizes(minimum: int, maximum: int) -> None:
    for name, size in (("minimum", minimum), ("maximum", maximum)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise BucketError(f"A bucket's {name} is a size >= 1, got {size!r}.")
    if maximum < minimum:
        raise BucketError(f"The largest bucket ({maximum}) is below the smallest ({minimum}); swap them.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """What the scheduler may send: the engines' own settings, under their own names.

    Attributes:
        max_num_seqs: Requests in one step.
        max_num_batched_tokens: Tokens in one step (the token budget).
        max_model_len: Tokens of one sequence, prompt and output.
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BucketError(f"Limits.{field.name}={value!r}: give the engine's setting, an int >= 1.")


LIMIT_NAMES = tuple(f.name for f in dataclasses.fields(Limits))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bucketed:
    """One program of a server and the buckets it is compiled at.

    Attributes:
        fn: ``(params, kv, inputs) -> (out, kv)`` (the KV pool donated, updated in place), or
            ``(params, inputs) -> out`` with ``uses_kv=False`` (logits and sampling).
        inputs: ``point -> {name: jax.ShapeDtypeStruct}``: the program's global inputs at a bucket.
        axes: ``axis -> sizes``, the buckets of each axis (:func:`doubling`, :func:`padded`, or a
            list); the program compiles at every point of their product that ``when`` keeps.
        covers: ``axis -> a field of Limits`` the axis must cover (``{"tokens":
            "max_num_batched_tokens"}``): its largest bucket is that limit, neither below (a shape
            no bucket covers) nor above (a bucket the scheduler never fills).
        partition: ``input name -> PartitionSpec``; an input not named is replicated.
        uses_kv: Whether ``fn`` reads and writes the KV pool.
        when: ``point -> bool``: the points of the product that are compiled (e.g. no more requests
            than tokens); None: all.
        run_inputs: ``point -> {name: array}``: for a run on a chip (``aotcheck calibrate``), the
            inputs a kernel must not see as zeros (a paged attention's sequence lengths and page
            table), made valid; every other input is zeros. None: all zeros.
    """

    fn: Callable[..., Any]
    inputs: Callable[[Point], Mapping[str, jax.ShapeDtypeStruct]]
    axes: Mapping[str, Sequence[int]]
    covers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    partition: Mapping[str, PartitionSpec] = dataclasses.field(default_factory=dict)
    uses_kv: bool = True
    when: Callable[[Point], bool] | None = None
    run_inputs: Callable[[Point], Mapping[str, Any]] | None = None

    def points(self) -> list[dict[str, int]]:
        """Every bucket compiled, smallest first (the product of the axes, as ``when`` keeps it)."""
        names = list(self.axes)
        product = (dict(zip(names, sizes)) for sizes in itertools.product(*(sorted(self.axes[a]) for a in names)))
        return [point for point in product if self.when is None or self._kept(point)]

    def _kept(self, point: Point) -> bool:
        """``when(point)``; a BucketError naming the point and what ``when`` is given when it raises."""
        assert self.when is not None
        try:
            return bool(self.when(point))
        except Exception as e:  # The user's predicate: its error named with the point it was asked about.
            raise BucketError(f"Bucketed.when raised {type(e).__name__}: {e} at the point {point}; when is given "
                              f"each point as a dict of axis -> size (axes: {', '.join(self.axes)}), e.g. "
                              f"when=lambda p: p[{next(iter(self.axes), 'tokens')!r}] >= 16.") from e


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServingConfig(_Bounded):
    """A server: its programs over their buckets, the KV pool they share, the scheduler's limits.

    Besides ``mesh``, ``compiler_options``, ``libtpu_init_args``, ``min_devices``, ``platforms``,
    ``targets`` (the slices it is deployed on: ``("v5e-1x1",)``), ``memory_fraction`` (a GPU
    server's share of memory, for its boot budget), ``trace_in_mesh`` and ``trace_as_target``:

    Attributes:
        init_fn: ``rng -> params``; only traced.
        partition_rules: How the parameters are sharded (as a model config's).
        bucketed: The server's programs, ``name -> Bucketed``.
        kv: ``pages -> the KV pool`` (a pytree of ``jax.ShapeDtypeStruct``, global shapes).
        kv_partition: ``PartitionSpec`` of every leaf of the pool (e.g. its KV heads over ``model``).
        pages: The pool's configured size, in pages.
        limits: The scheduler's :class:`Limits`: buckets are checked against them when the config is built.
        kv_budget: Search the largest pool (``fit_max_pages``) on each KV program's largest bucket:
            how many pages fit per device beside the weights and that bucket's activations.
        fit_upper: The most pages the search tries (None: 4096 x ``pages``).
        fit_targets: Globs over the targets where the search runs.
    """

    init_fn: Callable[[jax.Array], Any]
    partition_rules: Rules
    bucketed: Mapping[str, Bucketed]
    kv: Callable[[int], Any]
    kv_partition: PartitionSpec = PartitionSpec()
    pages: int
    limits: Limits | None = None
    kv_budget: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.pages, bool) or not isinstance(self.pages, int) or self.pages < 1:
            raise BucketError(f"ServingConfig.pages={self.pages!r}: give the KV pool's size in pages, an int >= 1.")
        self._check_fit_upper()  # As pages, the knob its search moves (not as its buckets' batch).
        wrong = [name for name, program in self.bucketed.items() if not isinstance(program, Bucketed)] \
            if isinstance(self.bucketed, Mapping) else None
        if not self.bucketed or wrong is None or wrong:
            raise BucketError(f"ServingConfig.bucketed={self.bucketed!r}: give the server's programs by name, each a "
                              "Bucketed, e.g. bucketed={'step': Bucketed(fn=step, inputs=step_inputs, "
                              "axes={'tokens': doubling(16, 512)})}" + (f" (not one: {', '.join(map(repr, wrong))})"
                                                                        if wrong else ""))
        if not callable(self.kv):
            raise BucketError(f"ServingConfig.kv={self.kv!r}: give a function of the pool's size in pages that returns "
                              "its abstract arrays, e.g. kv=lambda pages: jax.ShapeDtypeStruct((pages, 16, 8, 128), "
                              "jnp.bfloat16).")
        problems = bucket_problems(self.bucketed, self.limits)
        if problems:
            raise BucketError("The buckets do not match the scheduler's limits:\n  " + "\n  ".join(problems))

    def _searched(self) -> tuple[str, int | None]:
        return KV_KNOB, self.pages

    def expand(self) -> list[FunctionConfig]:
        """One FunctionConfig per bucket of every program, carrying its bucket; the largest bucket of
        each program that uses the pool searches its size (``kv_budget``).

        Example:
            >>> from aotcheck.models import serve
            >>> configs = serve.serving_config(serve.TINY).expand()
            >>> [(c.programs[0], c.fit) for c in configs][:4]
            [('step[tokens=16]', None), ('step[tokens=32]', None), ('step[tokens=64]', 'pages'), ('sample[tokens=16,seqs=8]', None)]
        """
        out = []
        for name, program in self.bucketed.items():
            points = program.points()
            for point in points:
                largest = point is points[-1] and program.uses_kv and self.kv_budget
                out.append(self.bucket(name, point, pages=self.pages, search=largest))
        return out

    def bucket(self, name: str, point: Point, *, pages: int, search: bool = False) -> FunctionConfig:
        """The FunctionConfig of program ``name`` at ``point`` with a pool of ``pages``."""
        program = self.bucketed[name]
        common = {f.name: getattr(self, f.name) for f in dataclasses.fields(_Common)}
        kinds = ("params", "kv_cache", "batch") if program.uses_kv else ("params", "batch")
        knobs = {KV_KNOB: Knob(pages, lambda n: self.bucket(name, point, pages=n, search=search))} \
            if program.uses_kv else {}
        # Every bucket keeps the weights it does not read (jit would leave them out): a server holds them all
        # whichever program runs, so each bucket's peak, and the boot budget's weights, count them.
        return FunctionConfig(
            **common, fn=jax.jit(program.fn, donate_argnums=(1,) if program.uses_kv else (), keep_unused=True),
            make_args=lambda mesh: self._args(program, point, pages, mesh), program=name, bucket=Bucket(point),
            arg_kinds=kinds, knobs=knobs, fit=KV_KNOB if search else None,
            fit_upper=self.fit_upper, fit_targets=self.fit_targets,
            run_inputs=None if program.run_inputs is None else
            lambda zeros: (*zeros[:-1], {**zeros[-1], **program.run_inputs(point)}))

    def _args(self, program: Bucketed, point: Point, pages: int, mesh: jax.sharding.Mesh) -> tuple[Any, ...]:
        params = abstract_params(self)  # As a model config's: its init traced, its rules matched.
        params = with_shardings(params, param_shardings(self, params, mesh))
        inputs = {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                          sharding=NamedSharding(mesh, program.partition.get(k, PartitionSpec())))
                  for k, v in program.inputs(point).items()}
        if not program.uses_kv:
            return params, inputs
        pool = jax.tree_util.tree_map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, self.kv_partition)),
            self.kv(pages))
        return params, pool, inputs


@dataclasses.dataclass(frozen=True)
class Server(Record):
    """A server as the gate needs it once its config is expanded (:func:`server_of`): what a boot budget
    and a start-up bill read besides its buckets' figures, so nothing past the plan asks the registry.

    Attributes:
        name: The registered config.
        programs: Its programs in the order it declares them (the order it warms them up in).
        knob: The knob that sizes its KV pool (``pages``); None where no program uses a pool.
        pages: The pool's configured size in pages (the knob's value); None as ``knob``.
        memory_fraction: Its own share of a GPU's memory (its config's ``memory_fraction``); None: not given.

    Example:
        >>> from aotcheck.models import serve
        >>> server = server_of("llm", serve.serving_config(serve.TINY).expand())
        >>> server.programs, server.knob, server.pages == serve.TINY.pages, server.memory_fraction
        (('step', 'sample'), 'pages', True, None)
    """

    name: str
    programs: tuple[str, ...]
    knob: str | None = None
    pages: int | None = None
    memory_fraction: float | None = None

    def usable(self, topology: Topology, fallback: tuple[float | None, str] = (None, "")) -> Usable | None:
        """What a device of ``topology`` may hold for this server: its own memory fraction, else
        ``fallback`` (the ini's share and how the run names it), else the environment's
        (:func:`aotcheck.targets.usable.usable_memory`)."""
        return usable_memory(topology, fraction=first_share((self.memory_fraction, f"{self.name}'s memory_fraction"),
                                                            fallback))


def server_of(name: str, functions: Iterable[FunctionConfig]) -> Server | None:
    """The server a registered config's functions make where any is a bucket (what
    :meth:`ServingConfig.expand` gives); None where none is (no server). Its programs are every function's,
    in order; its pool's pages the first ``pages`` knob's; its memory fraction its first bucket's."""
    functions = list(functions)
    served = [f for f in functions if f.bucket]
    if not served:
        return None
    pages = next((f.knobs[KV_KNOB].size for f in functions if KV_KNOB in f.knobs), None)
    return Server(name, tuple(dict.fromkeys(f.program for f in functions)), KV_KNOB if pages is not None else None,
                  pages, served[0].memory_fraction)


def bucket_problems(programs: Mapping[str, Bucketed], limits: Limits | None) -> list[str]:
    """What is wrong with the programs' buckets against the scheduler's limits, one line each: an
    axis that is not a list of sizes, a shape no bucket covers, a bucket over its limit.

    Example:
        >>> step = Bucketed(fn=None, inputs=None, axes={"tokens": (16, 32)}, covers={"tokens": "max_num_batched_tokens"})
        >>> bucket_problems({"step": step}, Limits(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512))
        ['step: a step of 64 tokens (max_num_batched_tokens=64) has no bucket, the largest is tokens=32: add 64 to its tokens buckets, or lower max_num_batched_tokens to 32']
    """
    problems = []
    for name, program in programs.items():
        bad = {axis for axis, sizes in program.axes.items() if not _sizes(sizes)}
        problems += [f"{name}: axis {axis!r} is {program.axes[axis]!r}; give its sizes, e.g. doubling(16, 512)"
                     for axis in program.axes if axis in bad]
        # A case's id shows its bucket's axes (step[tokens=64]): a name that is not a word could not be read back.
        problems += [f"{name}: axis {axis!r} is not a name (letters, digits and _, not starting with a digit): its "
                     f"buckets could not be told apart; rename it, e.g. {re.sub(r'[^0-9A-Za-z_]', '_', str(axis))!r}"
                     for axis in program.axes if not (isinstance(axis, str) and axis.isidentifier())]
        if not program.axes or (not bad and not program.points()):
            problems.append(f"{name}: no bucket is compiled (its axes are {dict(program.axes)!r}"
                            + (", and when= keeps none of their product" if program.axes else "") + "); give it at "
                            "least one axis with sizes, and a when= that keeps some of them")
        for axis, limit in program.covers.items():
            if axis not in program.axes:
                problems.append(f"{name}: covers names axis {axis!r}, which it does not have ({', '.join(program.axes)})")
                continue
            if limit not in LIMIT_NAMES:
                problems.append(f"{name}: covers {axis!r} by {limit!r}, not a limit ({', '.join(LIMIT_NAMES)})")
                continue
            if limits is None or axis in bad:
                continue
            sizes = sorted(program.axes[axis])
            most = getattr(limits, limit)
            what = _UNITS.get(limit, axis)
            if sizes[-1] < most:
                problems.append(f"{name}: a step of {most} {what} ({limit}={most}) has no bucket, the largest is "
                                f"{axis}={sizes[-1]}: add {most} to its {axis} buckets, or lower {limit} to {sizes[-1]}")
            # The smallest bucket that holds the budget is used (a 48-token step runs in a 64 bucket); only
            # the buckets above it are never used.
            used = next(s for s in sizes if s >= most) if sizes[-1] >= most else sizes[-1]
            over = [s for s in sizes if s > used]
            if over:
                problems.append(f"{name}: bucket{'s' if len(over) > 1 else ''} {', '.join(f'{axis}={s}' for s in over)} "
                                f"over the budget ({limit}={most}): the scheduler never sends more than {most} {what}, "
                                f"so {'they are' if len(over) > 1 else 'it is'} compiled at start-up for nothing; "
                                f"make the largest bucket {used} (the smallest that holds {most} {what})")
    return problems


def _sizes(sizes: Any) -> bool:
    """Whether an axis's buckets are a non-empty sequence of sizes >= 1."""
    return isinstance(sizes, Sequence) and not isinstance(sizes, (str, bytes)) and bool(sizes) and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes)


_UNITS = {"max_num_batched_tokens": "tokens", "max_num_seqs": "requests", "max_model_len": "tokens of one sequence"}


def pages_for(length: int, page_size: int) -> int:
    """Pages a sequence of ``length`` tokens holds: ``ceil(length / page_size)``."""
    return math.ceil(length / page_size)
