"""The ledger: a rule for every instruction the HLO reader can meet, so that no work becomes a silent zero.

Every HLO opcode and every custom-call target aotcheck knows maps to one :class:`Rule`:

- ``FLOPS``: matrix work, counted in ``flops`` (:mod:`aotcheck.figures.flops` says how much);
- ``COLLECTIVE``: communication, counted in ``comm_<kind>_count``/``_bytes``;
- ``FOLLOW``: runs the computations it names (a loop, a fusion, a call, an async start, a custom call
  that carries computations of its own: 7x's SparseCore offload), which are walked and weighed by how
  often it runs;
- ``FREE``: neither (elementwise and layout work, bookkeeping, an async op's ``-update``/``-done``,
  whose ``-start`` was counted);
- ``UNKNOWN``: not in this ledger. Never a zero: it is named in the details' ``uncounted`` with its
  count and source line, and ``flops`` and the collectives are said to be incomplete.

Async forms are read as what they run: ``all-gather-start`` is an all-gather, ``custom-call-start`` a
custom call, ``call-start`` a call (XLA prints an async op that wraps one instruction as that
instruction's name with ``-start``), and their ``-update``/``-done`` are free. ``tests/unit/figures/
test_ledger.py`` walks every opcode of the XLA in the lock and fails on any without a rule here, so a
new toolchain's new op is a failing test, not a silent zero.

Example:
    >>> from aotcheck.figures.hlo import parse_instruction
    >>> [str(rule_of(parse_instruction(line))) for line in (
    ...     "%d = f32[8,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
    ...     "%g = f32[64]{0} all-gather-start(%a), dimensions={0}",
    ...     "%x = f32[64]{0} all-gather-done(%g)",
    ...     "%e = f32[8]{0} exponential(%a)",
    ...     '%c = f32[8]{0} custom-call(%a), custom_call_target="my_new_thing"',
    ...     "%n = f32[8]{0} brand-new-op(%a)")]
    ['flops', 'collective', 'free', 'free', 'unknown', 'unknown']
    >>> base_opcode("custom-call-start"), base_opcode("all-gather-done"), base_opcode("async-start")
    ('custom-call', 'all-gather', 'async-start')
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping

from aotcheck.figures.hlo import Instruction


class Rule(enum.StrEnum):
    """What an instruction adds to the figures."""

    FLOPS = "flops"
    COLLECTIVE = "collective"
    FOLLOW = "follow"
    FREE = "free"
    UNKNOWN = "unknown"


def _rules(rule: Rule, names: str) -> dict[str, Rule]:
    return dict.fromkeys(names.split(), rule)


# Every opcode of XLA's HloOpcode (jaxlib 0.12.0.1), in its text form.
OPCODES: Mapping[str, Rule] = {
    # Matrix work. `reduce` counts only where it contracts a product (a dot the algebraic simplifier
    # rewrote as multiply + reduce: aotcheck.figures.flops.rewritten_dot_flops), else nothing.
    **_rules(Rule.FLOPS, "dot ragged-dot scaled-dot convolution cholesky triangular-solve fft reduce custom-call"),
    # Communication between devices; their async halves are read through `base_opcode`.
    **_rules(Rule.COLLECTIVE, "all-reduce all-gather reduce-scatter all-to-all ragged-all-to-all collective-permute "
                              "collective-broadcast collective-reduce send recv"),
    # Runs computations of its own: followed (a reducer's `to_apply`, scalar arithmetic, is not).
    **_rules(Rule.FOLLOW, "while conditional call fusion async-start"),
    # Elementwise arithmetic: not matrix work (the figure is the matrix unit's).
    **_rules(Rule.FREE, "abs acos acosh add and asin asinh atan2 atanh cbrt ceil clamp compare complex cosh cosine "
                        "count-leading-zeros divide erf exp2 exponential exponential-minus-one floor imag is-finite log "
                        "log-plus-one log2 logistic maximum minimum mulhi multiply negate not or popcnt power real "
                        "remainder round-nearest-afz round-nearest-even rsqrt select shift-left shift-right-arithmetic "
                        "shift-right-logical sign sine sinh sqrt stochastic-convert subtract tan tanh xor convert "
                        "reduce-precision bitcast-convert batch-norm-grad batch-norm-inference batch-norm-training map"),
    # Data movement and layout: bytes, not FLOPs (XLA's bytes_accessed_xla counts them).
    **_rules(Rule.FREE, "bitcast broadcast concatenate copy copy-start copy-done dynamic-reshape dynamic-slice "
                        "dynamic-update-slice gather iota pad reshape reverse scatter slice sort topk transpose "
                        "reduce-window select-and-scatter"),
    # Bookkeeping, random bits, the host's queues; an async op's update and done (its start is counted).
    **_rules(Rule.FREE, "parameter constant tuple get-tuple-element add-dependency after-all domain opt-barrier "
                        "partition-id replica-id get-dimension-size set-dimension-size rng rng-bit-generator "
                        "rng-get-and-update-state infeed outfeed async-update async-done"),
}

# Opcodes of XLA's HloOpcode that no program of this toolchain prints (no text form to meet) and
# that aotcheck cannot count: the test of the ledger requires each to be listed here or above.
UNPRINTED = frozenset({"kScan", "kShuffle"})

# Custom-call targets, by what they run. A kernel compiled from user code (Pallas/Mosaic on TPUs,
# Triton and Mosaic GPU on GPUs) counts the cost it declares or one registered for it by name
# (aotcheck.figures.kernels); cuBLAS gemms their dot.
KERNEL_TARGETS = frozenset({"tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "mosaic_gpu_v2"})
GEMM_TARGETS = frozenset({"__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8"})
CUSTOM_CALLS: Mapping[str, Rule] = {
    **dict.fromkeys(KERNEL_TARGETS | GEMM_TARGETS, Rule.FLOPS),
    # Annotations JAX and the SPMD partitioner leave, moves between memories, layout: no work.
    **_rules(Rule.FREE, "Sharding SPMDFullToShardShape SPMDShardToFullShape LayoutConstraint MoveToHost "
                        "MoveToDevice AllocateBuffer annotate_device_placement PadToStatic SliceToDynamic "
                        "X64Combine X64SplitLow X64SplitHigh xla.sdy.FuncResultSharding "
                        "xla.sdy.GlobalToLocalShape xla.sdy.LocalToGlobalShape InspectSharding"),
    # The TPU compiler's own: the async halves of a collective it fused (the collective is an
    # instruction of its own, counted), the slice's id, zeroing a tile's padding, gather indices'
    # bounds and packing (integer bookkeeping), a concatenation laid out as a bitcast.
    **_rules(Rule.FREE, "AsyncCollectiveStart AsyncCollectiveDone SliceId ZeroCrop AssumeGatherIndicesInBound "
                        "GatherScatterIndicesBitpacked ConcatBitcast"),
}

_ASYNC_PHASE = re.compile(r"^(.*)-(start|update|done)$")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
# An op offloaded to 7x's SparseCore: an async call on its thread (libtpu 0.0.50.1: `call-start(),
# async_execution_thread="sparsecore", to_apply=...`), or a custom call with an offload config whose
# target is a placeholder (0.0.51: `custom-call-start(), custom_call_target="TODO(b/...)",
# called_computations={...}, ... "sparse_core_config":{"offload":"OFFLOAD_COLLECTIVE"}`).
SPARSECORE = re.compile(r'async_execution_thread="sparsecore"|"sparse_core_config"\s*:\s*\{\s*"offload"')
# A send or recv to the host: a callback's (free: not between devices), or the cross-slice (DCN) leg of a
# collective that XLA runs through its megascale runtime (counted, as the collective it carries).
_HOST_TRANSFER = re.compile(r"\bis_host_transfer=true")
_MEGASCALE = re.compile(r'_xla_host_transfer_handler_name="xla_megascale_runtime"')


def base_opcode(opcode: str) -> str:
    """The opcode an async form runs (``custom-call-start`` -> ``custom-call``, ``all-gather-done`` ->
    ``all-gather``); the opcode itself otherwise (``async-start`` is one of its own)."""
    match = _ASYNC_PHASE.match(opcode)
    return match[1] if match and match[1] in OPCODES else opcode


def opcode_rule(opcode: str) -> Rule:
    """The rule of an opcode's text: an async form's ``-start`` as what it runs, its ``-update`` and
    ``-done`` free (the start was counted).

    Example:
        >>> [str(opcode_rule(o)) for o in ("all-reduce-start", "all-reduce-done", "call-start", "shiny-op")]
        ['collective', 'free', 'follow', 'unknown']
    """
    base = base_opcode(opcode)
    if base != opcode and not opcode.endswith("-start"):
        return Rule.FREE
    return OPCODES.get(base, Rule.UNKNOWN)


def custom_call_target(inst: Instruction) -> str | None:
    match = _TARGET.search(inst.attrs)
    return match[1] if match else None


def rule_of(inst: Instruction) -> Rule:
    """The ledger's rule for one instruction (an async form read as what it runs)."""
    rule = opcode_rule(inst.opcode)
    opcode = base_opcode(inst.opcode)
    if rule is Rule.FLOPS and opcode == "custom-call":
        if inst.called("called_computations") and SPARSECORE.search(inst.attrs):
            return Rule.FOLLOW  # 7x's SparseCore offload: what it runs is read (a collective, counted as one).
        return CUSTOM_CALLS.get(custom_call_target(inst) or "", Rule.UNKNOWN)
    if rule is Rule.COLLECTIVE and opcode in ("send", "recv") and _HOST_TRANSFER.search(inst.attrs):
        return rule if _MEGASCALE.search(inst.attrs) else Rule.FREE
    return rule


def engine_of(inst: Instruction) -> str | None:
    """Where a collective runs when not between TensorCores over ICI: ``sparsecore`` (offloaded to
    7x's SparseCore: said by the call that reaches it, see :data:`SPARSECORE`) or ``dcn`` (between
    slices, a send or recv of XLA's megascale runtime); None otherwise."""
    return "dcn" if _MEGASCALE.search(inst.attrs) else None
