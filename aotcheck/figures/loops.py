"""Loop-aware FLOPs and collectives from a compiled program's optimized HLO text.

XLA's ``cost_analysis()`` counts a while loop's body once, so a model whose
layers run under ``lax.scan`` (or whose matmuls the SPMD partitioner turned
into windowed-einsum loops) reports a fraction of its real work. Here every
computation is weighed by how often it runs: a while body by its trip count
(read from the loop condition, the loop's initial tuple and the body's counter
update), a fusion or call by its caller's count.

Each instruction is read by its rule in the ledger (:mod:`aotcheck.figures.ledger`):
- FLOPs (:mod:`aotcheck.figures.flops`) of the matrix ops, dots XLA rewrote as multiply +
  reduce, and custom kernels (a cost registered for the kernel's name, else the one it
  declares), wherever they sit (fusions, loop bodies, async computations), times the trip
  counts around them. A kernel with neither, an op without a rule and a loop whose trip
  count the program does not say are named in :meth:`HloAnalysis.uncounted`. Elementwise
  work is not counted: the figure is the matrix-unit work.
- Collectives by kind, each once (an async ``*-start`` counts, its ``*-done`` does not),
  with the bytes of its larger side (all-gather: the gathered result; reduce-scatter: the
  input; ragged-all-to-all: its output buffer), per device; where they run when not over
  ICI between TensorCores (7x's SparseCore, DCN between slices).

Example (a loop of 4 matmuls, compiled for host CPU devices):
    >>> import jax, jax.numpy as jnp
    >>> from aotcheck import compile_function
    >>> x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    >>> compiled = compile_function(lambda x, w: jax.lax.fori_loop(0, 4, lambda i, y: y @ w, x), x, x,
    ...                             topology="cpu-1")
    >>> analysis = analyze_hlo(compiled.as_text())
    >>> [(loop.trip_count, loop.flops_per_trip) for loop in iter_loops(analysis)]
    [(4, 1024.0)]
    >>> analysis.flops  # 4 trips x 2 x 8^3
    4096.0
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from aotcheck.records import Record, field, same_line
from aotcheck.figures import kernels
from aotcheck.figures.flops import Outer, instruction_flops, kernel_count
from aotcheck.figures.frames import instruction_library, instruction_source, metadata, stack_frames
from aotcheck.figures.hlo import Computation, Instruction, parse_module
from aotcheck.figures.trips import trip_count
from aotcheck.figures.ledger import SPARSECORE, KERNEL_TARGETS, Rule, base_opcode, custom_call_target, engine_of, rule_of

# The collectives every program's figures list (zeros included, as goldens always had them); any other
# kind the ledger counts (ragged-all-to-all, collective-broadcast, send, ...) appears where a program has it.
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

# --- The walk ------------------------------------------------------------------------


@dataclasses.dataclass
class CollectiveStats:
    count: int = 0
    bytes: float = 0.0


@dataclasses.dataclass
class Loop:
    """A while loop and what one trip of it costs."""

    name: str
    op_name: str
    trip_count: int | None
    multiplier: int  # How often the loop itself runs.
    flops_per_trip: float = 0.0
    source: str | None = None


@dataclasses.dataclass(frozen=True)
class Uncounted(Record):
    """Work the figures may miss, named so that a reader can check it by hand.

    ``kind``: ``loop`` (a while loop whose trip count the HLO does not say: its body is counted
    once), ``kernel`` (a custom kernel that declares no cost and has none registered: its FLOPs are
    not in ``flops``), ``op`` (an instruction the ledger has no rule for, :mod:`aotcheck.figures.ledger`:
    neither its FLOPs nor its communication are counted), ``below_xla`` (``flops`` came out below XLA's
    own raw count, which counts every loop body once: something is missed) or ``xla_cost`` (XLA's raw
    cost analysis failed, ``name`` saying how: its raw figures are absent, and ``flops`` is not checked
    against them). ``count``: how often it runs per step (for ``below_xla`` and ``xla_cost``, 0).

    Example:
        >>> Uncounted("kernel", "splash_mha_fwd", "model.py:88", 16).describe()
        'kernel splash_mha_fwd (model.py:88, 16 per step) declares no cost: its FLOPs are not in flops'
        >>> Uncounted("op", "custom-call my_target", "model.py:9", 2).incomplete
        ('flops', 'comm_*')
        >>> Uncounted("xla_cost", "RuntimeError: UNIMPLEMENTED", None, 0).describe()  # doctest: +ELLIPSIS
        "XLA's raw cost analysis failed (RuntimeError: UNIMPLEMENTED): flops_xla, ... are absent, ..."
    """

    kind: str
    name: str
    source: str | None
    count: int

    @property
    def incomplete(self) -> tuple[str, ...]:
        """The figures (or globs of them) this may leave short."""
        return {"loop": ("flops", "comm_*"), "op": ("flops", "comm_*"), "xla_cost": ()}.get(self.kind, ("flops",))

    def describe(self) -> str:
        """One line, as data: what is missed (render words the rest)."""
        where = f" ({self.source}, {self.count} per step)" if self.source else f" ({self.count} per step)"
        if self.kind == "loop":
            return f"loop {self.name}{where} has a trip count the program does not say: its body is counted once"
        if self.kind == "kernel":
            return f"kernel {self.name}{where} declares no cost: its FLOPs are not in flops"
        if self.kind == "op":
            return (f"{self.name}{where} has no rule in aotcheck's ledger: its FLOPs and communication are not "
                    "in flops and comm_*")
        if self.kind == "xla_cost":
            return (f"XLA's raw cost analysis failed ({self.name}): flops_xla, bytes_accessed_xla and "
                    "transcendentals_xla are absent, and flops is not checked against XLA's raw count")
        return ("flops is below three quarters of XLA's own raw count, which counts each loop body once: "
                "matrix work is missed")


@dataclasses.dataclass(frozen=True)
class KernelRun(Record):
    """A custom kernel of the program, loop-aware: how many run per step, the FLOPs they count per
    step and on what basis (``declared``, ``registered`` or ``none``: see
    :class:`aotcheck.figures.flops.KernelCount`); ``bound``: the count is over the kernel's whole
    static buffer, an upper bound on its run-time work (:func:`aotcheck.figures.kernels.counts_buffer`).

    Example:
        >>> run = KernelRun("gmm", "moe.py:40", 8, 1.5e9, "declared", bound=True)
        >>> KernelRun.from_json(run.to_json()) == run
        True
        >>> run.describe()
        'kernel gmm (moe.py:40, 8 per step) counts its whole static buffer (declared): flops holds an upper bound on its run-time work'
    """

    name: str
    source: str | None
    count: int
    flops: float
    basis: str
    bound: bool = False

    def describe(self) -> str | None:
        """One line, as data, where the count is a bound (render words the rest); None where it is not."""
        if not self.bound or self.basis == "none":
            return None
        where = f" ({self.source}, {self.count} per step)" if self.source else f" ({self.count} per step)"
        return (f"kernel {self.name}{where} counts its whole static buffer ({self.basis}): flops holds an upper "
                "bound on its run-time work")


@dataclasses.dataclass
class HloAnalysis:
    """Loop-aware totals of one program, per device."""

    flops: float = 0.0
    collectives: dict[str, CollectiveStats] = dataclasses.field(
        default_factory=lambda: {k: CollectiveStats() for k in COLLECTIVES}
    )
    loops: list[Loop] = dataclasses.field(default_factory=list)
    unknown_trip_counts: int = 0
    top_ops: list[tuple[float, str, int]] = dataclasses.field(default_factory=list)  # (flops, op, multiplier)
    # (kind, op_name, source line, library line, engine) -> count and bytes, loop-aware.
    collective_ops: dict[tuple[str, str, str | None, str | None, str | None], CollectiveStats] = \
        dataclasses.field(default_factory=dict)
    # Custom kernels: (name, source line, basis) -> [runs per step, FLOPs per step].
    kernels: dict[tuple[str, str | None, str], list[float]] = dataclasses.field(default_factory=dict)
    # Instructions without a rule in the ledger: (what, source line) -> how many run per step.
    unknown_ops: dict[tuple[str, str | None], int] = dataclasses.field(default_factory=dict)

    def kernel_runs(self) -> list[KernelRun]:
        """Every custom kernel that does floating-point work, the most FLOPs first."""
        runs = [KernelRun(name, source, int(count), flops, basis,
                          bound=basis in ("declared", "registered") and kernels.counts_buffer(name))
                for (name, source, basis), (count, flops) in self.kernels.items() if basis != "integer"]
        return sorted(runs, key=lambda r: (-r.flops, r.name))

    def uncounted(self) -> list[Uncounted]:
        """Loops of unknown trip count, kernels without a cost, ops without a rule, as records."""
        loops = [Uncounted("loop", loop.op_name, loop.source, loop.multiplier)
                 for loop in self.loops if loop.trip_count is None]
        kernels = [Uncounted("kernel", name, source, int(count))
                   for (name, source, basis), (count, _) in sorted(self.kernels.items(), key=lambda kv: kv[0][0])
                   if basis == "none"]
        ops = [Uncounted("op", name, source, count) for (name, source), count in sorted(self.unknown_ops.items())]
        return loops + kernels + ops


def _collective_bytes(kind: str, inst: Instruction, comp: Computation) -> float:
    """What a collective moves per device. ``ragged-all-to-all``: its output buffer (operand 1), the
    most it can receive (the sizes it really sends are known only at run time); ``send``: its
    operand; ``recv``: its data; any other, the larger side: its largest result array or its
    operands' total (all-gather: the gathered result; reduce-scatter: the input)."""
    def operand(i: int) -> float:
        src = comp.instructions.get(inst.operands[i]) if i < len(inst.operands) else None
        return src.arrays[0].bytes if src is not None and src.arrays else 0.0

    if kind == "ragged-all-to-all":
        return operand(1)
    if kind == "send":
        return operand(0)
    if kind == "recv":
        return inst.arrays[0].bytes if inst.arrays else 0.0
    result = max((a.bytes for a in inst.arrays), default=0.0)
    return max(result, sum(operand(i) for i in range(len(inst.operands))))


def _op_name(inst: Instruction) -> str:
    return metadata(inst, "op_name") or inst.name


@dataclasses.dataclass(frozen=True)
class CollectiveOp(Record):
    """The collectives one JAX op became, loop-aware: how many run per step and their bytes per device.
    ``engine``: where they run when not on the TensorCore (``sparsecore``: offloaded to 7x's SparseCore)."""

    kind: str
    name: str  # JAX's name stack (``op_name``) of the op, or the HLO instruction's name.
    source: str | None  # The user's line ("train.py:88").
    count: int
    bytes: int
    library: str | None = field(default=None, omit=same_line)  # The model library's line, where it is another ("esm2quinox/_esm2.py:123").
    engine: str | None = field(default=None, omit="empty")

    @property
    def key(self) -> tuple[str, str, str | None, str | None, str | None]:
        """What identifies a collective across two compiles of one case (one op can make several)."""
        return self.kind, self.name, self.source, self.library, self.engine


def top_collectives(analysis: "HloAnalysis", limit: int = 10) -> list[CollectiveOp]:
    """The ``limit`` collectives that move the most bytes per step."""
    ops = [CollectiveOp(kind, name, source, stats.count, int(stats.bytes), library, engine)
           for (kind, name, source, library, engine), stats in analysis.collective_ops.items()]
    return sorted(ops, key=lambda op: (-op.bytes, -op.count, op.kind, op.name))[:limit]


def analyze_hlo(text: str, *, module: dict[str, Computation] | None = None,
                constants: Mapping[str, Instruction] | None = None) -> HloAnalysis:
    """Walks the module from its entry, weighing each computation by how often it runs, and gives each
    instruction its ledger's rule (:mod:`aotcheck.figures.ledger`).

    ``module``: the text's parse, when the caller has one already; ``constants``: the program's
    constants printed whole (:func:`aotcheck.figures.hlo.constants` of XLA's dump), for the costs of
    kernels that read one (:mod:`aotcheck.figures.known_kernels`).
    """
    module = module if module is not None else parse_module(text)
    entry = next((c for c in module.values() if c.is_entry), None)
    if entry is None:
        return HloAnalysis()
    walker = _Walker(module, stack_frames(text), constants)
    walker.result.flops = walker.walk(entry, 1)
    walker.result.top_ops = sorted(((f, name, m) for name, (f, m) in walker.ops.items()), reverse=True)[:10]
    return walker.result


class _Walker:
    """One walk of a module: each instruction counted by its ledger rule, ``multiplier`` times (how
    often its computation runs per step); the totals land in :attr:`result`."""

    def __init__(self, module: dict[str, Computation], frames: Any,
                 constants: Mapping[str, Instruction] | None) -> None:
        self.module, self.frames, self.constants = module, frames, constants
        self.result = HloAnalysis()
        self.ops: dict[str, list] = defaultdict(lambda: [0.0, 0])  # op name -> [FLOPs per step, largest multiplier]

    def walk(self, comp: Computation, multiplier: int, depth: int = 0, *, outer: Outer = (),
             engine: str | None = None) -> float:
        """The FLOPs of one run of ``comp``; its collectives, kernels and unknown ops tallied."""
        if depth > 64:
            return 0.0
        total = 0.0
        for inst in comp.instructions.values():
            rule = rule_of(inst)
            flops = 0.0
            if rule is Rule.FLOPS:
                flops = self._flops(inst, comp, multiplier, outer)
            elif rule is Rule.COLLECTIVE:
                self._collective(inst, comp, multiplier, engine)
            elif rule in (Rule.UNKNOWN, Rule.FOLLOW):
                if rule is Rule.UNKNOWN:  # Named, and what it runs still read: nothing inside it is lost with it.
                    what = inst.opcode if base_opcode(inst.opcode) != "custom-call" else \
                        f"{inst.opcode} {custom_call_target(inst) or '(no target)'}"
                    key = (what, instruction_source(inst, self.frames))
                    self.result.unknown_ops[key] = self.result.unknown_ops.get(key, 0) + multiplier
                total += self.follow(inst, comp, multiplier, depth, outer=outer, engine=engine)
            if flops:
                total += flops
                tally = self.ops[_op_name(inst)]
                tally[0] += flops * multiplier
                tally[1] = max(tally[1], multiplier)
        return total

    def _flops(self, inst: Instruction, comp: Computation, multiplier: int, outer: Outer) -> float:
        """One run's FLOPs of an instruction that does work: a custom kernel's as its cost says (tallied
        with its basis), any other's by its shape."""
        if base_opcode(inst.opcode) != "custom-call" or custom_call_target(inst) not in KERNEL_TARGETS:
            return instruction_flops(inst, comp, self.module, outer)
        counted = kernel_count(inst, comp, _op_name(inst), module=self.module, outer=outer, constants=self.constants)
        tally = self.result.kernels.setdefault((counted.name, instruction_source(inst, self.frames), counted.basis),
                                               [0, 0.0])
        tally[0] += multiplier
        tally[1] += counted.flops * multiplier
        return counted.flops

    def _collective(self, inst: Instruction, comp: Computation, multiplier: int, engine: str | None) -> None:
        kind = base_opcode(inst.opcode)
        size = multiplier * _collective_bytes(kind, inst, comp)
        origin = (kind, _op_name(inst), instruction_source(inst, self.frames),
                  instruction_library(inst, self.frames), engine_of(inst) or engine)
        for stats in (self.result.collectives.setdefault(kind, CollectiveStats()),
                      self.result.collective_ops.setdefault(origin, CollectiveStats())):
            stats.count += multiplier
            stats.bytes += size

    def follow(self, inst: Instruction, comp: Computation, multiplier: int, depth: int, *, outer: Outer,
               engine: str | None) -> float:
        """What an instruction that runs computations of its own runs, weighed by how often."""
        engine = "sparsecore" if SPARSECORE.search(inst.attrs) else engine
        opcode = base_opcode(inst.opcode)
        if opcode == "while":
            return self._loop(inst, comp, multiplier, depth, outer=outer, engine=engine)
        if opcode == "conditional":
            branches = inst.called("branch_computations") or (
                inst.called("true_computation") + inst.called("false_computation"))
            # One branch runs: FLOPs of the costliest (an upper bound); collectives of all.
            return max((self.walk(self.module[b], multiplier, depth + 1, engine=engine)
                        for b in branches if b in self.module), default=0.0)
        # A fusion's parameters come from its operands (a rewritten dot's broadcast may sit outside it);
        # a call's, an async start's and a custom call's computations run as often as they do.
        inner_outer = ((comp, inst), *outer) if opcode in ("fusion", "call") else ()
        names = inst.called("calls") + inst.called("to_apply") + inst.called("called_computations")
        return sum(self.walk(self.module[name], multiplier, depth + 1, outer=inner_outer, engine=engine)
                   for name in dict.fromkeys(names) if name in self.module)

    def _loop(self, inst: Instruction, comp: Computation, multiplier: int, depth: int, *, outer: Outer,
              engine: str | None) -> float:
        """A while loop: its body walked once, weighed by its trip count (1 where it is unknown, and said)."""
        count = trip_count(inst, comp, self.module)
        if count is None:
            self.result.unknown_trip_counts += 1
        inner = Loop(inst.name, _op_name(inst), count, multiplier, source=instruction_source(inst, self.frames))
        self.result.loops.append(inner)
        body = self.module.get((inst.called("body") or [""])[0])
        if body is None:
            return 0.0
        inner.flops_per_trip = self.walk(body, multiplier * (count if count is not None else 1), depth + 1,
                                         outer=((comp, inst), *outer), engine=engine)
        return inner.flops_per_trip * (count if count is not None else 1)


def iter_loops(analysis: HloAnalysis) -> Iterator[Loop]:
    return iter(sorted(analysis.loops, key=lambda l: -(l.flops_per_trip * (l.trip_count or 1) * l.multiplier)))
